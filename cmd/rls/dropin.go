package main

import (
	"net/http"

	"github.com/rls-project/rls/pkg/compat"
	"github.com/rls-project/rls/pkg/jsonapi"
	"github.com/rls-project/rls/pkg/upstreamstats"
)

// validateDropin checks the settings of envoyproxy/ratelimit compatibility.
func (c *Config) validateDropin() error {
	return compat.CheckFlags(c.StatsdAddr, c.GRPCTLSClientSAN, c.GRPCTLSClientCA, c.KeyPrefix,
		func(s string) error { _, err := upstreamstats.ParseTarget(s); return err })
}

// buildUpstreamStats makes upstream's stats when --statsd-addr or
// USE_PROMETHEUS asks for them; the initial config counts as a load.
func (a *app) buildUpstreamStats() (err error) {
	sc := upstreamstats.Config{StatsdAddr: a.cfg.StatsdAddr, MaxDetailed: a.cfg.DetailedMetricMax,
		NearLimitRatio: a.cfg.NearLimitRatio, Log: a.log}
	if a.cfg.Compat.UpstreamPrometheus {
		sc.Prometheus = a.reg
	}
	a.upstream, err = upstreamstats.FromConfig(sc)
	a.upstream.Loaded(map[bool]string{true: "success"}[a.configReady.Load() && !a.cfg.fromXDS()])
	return err
}

// startUpstreamPrometheus serves /metrics on PROMETHEUS_ADDR at
// PROMETHEUS_PATH too, where upstream's USE_PROMETHEUS serves it, so that
// scrapes configured for upstream keep working.
func (a *app) startUpstreamPrometheus() error {
	c := a.cfg.Compat
	if !c.UpstreamPrometheus || c.PrometheusAddr == a.cfg.HTTPAddr {
		return nil
	}
	return a.startHTTP("PROMETHEUS_ADDR", c.PrometheusAddr, upstreamstats.MetricsHandler(a.reg, c.PrometheusPath))
}

// addJSON serves upstream's /json (ShouldRateLimit as JSON over HTTP) when
// rls runs as upstream does: the gRPC message bound bounds the body, the
// service its request, --redis-timeout the decision.
func (a *app) addJSON(mux *http.ServeMux) {
	if a.cfg.EnvCompat == "upstream" {
		mux.Handle("POST /json", jsonapi.Handler(a.svc, jsonapi.Options{MaxBytes: grpcMaxRecvBytes, Timeout: a.cfg.RedisTimeout, Log: a.log}))
	}
}
