package main

import (
	"net/http"

	"github.com/rls-project/rls/internal/server"
	"github.com/rls-project/rls/pkg/compat"
	"github.com/rls-project/rls/pkg/jsonapi"
	"github.com/rls-project/rls/pkg/upstreamstats"
)

// validateDropin checks the settings of envoyproxy/ratelimit compatibility.
func (c *Config) validateDropin() error {
	return compat.CheckFlags(c.StatsdAddr, c.GRPCTLSClientSAN, c.GRPCTLSClientCA, c.KeyPrefix,
		func(s string) error { _, err := upstreamstats.ParseTarget(s); return err })
}

// buildUpstreamStats makes upstream's stats (--statsd-addr, USE_PROMETHEUS).
func (a *app) buildUpstreamStats() (err error) {
	sc := upstreamstats.Config{StatsdAddr: a.cfg.StatsdAddr, MaxDetailed: a.cfg.DetailedMetricMax, NearLimitRatio: a.cfg.NearLimitRatio, Log: a.log}
	if a.cfg.Compat.UpstreamPrometheus {
		sc.Prometheus = a.reg
	}
	a.upstream, err = upstreamstats.FromConfig(sc)
	a.upstream.Loaded(map[bool]string{true: "success"}[a.configReady.Load() && !a.cfg.fromXDS()])
	return err
}

// startUpstreamPrometheus serves /metrics where USE_PROMETHEUS serves it too.
func (a *app) startUpstreamPrometheus() error {
	if c := a.cfg.Compat; !c.UpstreamPrometheus || c.PrometheusAddr == a.cfg.HTTPAddr {
		return nil
	}
	return a.srv.ServeHTTP("PROMETHEUS_ADDR", a.cfg.Compat.PrometheusAddr, upstreamstats.MetricsHandler(a.reg, a.cfg.Compat.PrometheusPath))
}

// addJSON serves upstream's /json as ratelimit, bounded as gRPC calls are.
func (a *app) addJSON(mux *http.ServeMux) {
	if a.cfg.EnvCompat == "upstream" {
		mux.Handle("POST /json", jsonapi.Handler(a.svc, jsonapi.Options{MaxBytes: server.MaxRecvBytes, Timeout: a.cfg.RedisTimeout, Log: a.log}))
	}
}
