package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rls-project/rls/pkg/jsonapi"
	"github.com/rls-project/rls/pkg/upstreamstats"
)

// validateDropin checks the settings of envoyproxy/ratelimit compatibility.
func (c *Config) validateDropin() error {
	if _, err := upstreamstats.ParseTarget(c.StatsdAddr); c.StatsdAddr != "" && err != nil {
		return fmt.Errorf("%s %q: %v", flagRef("statsd-addr"), c.StatsdAddr, err)
	}
	if c.GRPCTLSClientSAN != "" && c.GRPCTLSClientCA == "" {
		return fmt.Errorf("%s needs %s: only a verified client certificate names a SAN", flagRef("grpc-tls-client-san"), flagRef("grpc-tls-client-ca"))
	}
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		return fmt.Errorf("%s %q: no '{' or '}': Redis Cluster would hash the prefix, not the key's tenant", flagRef("key-prefix"), c.KeyPrefix)
	}
	return nil
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
	mux := http.NewServeMux()
	mux.Handle("GET "+c.PrometheusPath, promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
	return a.startHTTP("PROMETHEUS_ADDR", c.PrometheusAddr, mux)
}

// listenGRPC listens on --grpc-uds, a Unix socket, when it is set (as
// upstream's GRPC_UDS, instead of --grpc-addr), else on --grpc-addr; it
// returns the listener and the port's name for connguard. A socket left by
// a process that died is replaced; any other file there is an error.
func listenGRPC(cfg *Config) (net.Listener, string, error) {
	if cfg.GRPCUDS == "" {
		lis, err := net.Listen("tcp", cfg.GRPCAddr)
		if err != nil {
			return nil, "", fmt.Errorf("--grpc-addr: %w", err)
		}
		return lis, "grpc-addr", nil
	}
	if st, err := os.Lstat(cfg.GRPCUDS); err == nil && st.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(cfg.GRPCUDS)
	}
	lis, err := net.Listen("unix", cfg.GRPCUDS)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", flagRef("grpc-uds"), err)
	}
	return lis, "grpc-uds", nil
}

// addJSON serves upstream's /json (ShouldRateLimit as JSON over HTTP) when
// rls runs as upstream does: the gRPC message bound bounds the body, the
// service its request, --redis-timeout the decision.
func (a *app) addJSON(mux *http.ServeMux) {
	if a.cfg.EnvCompat == "upstream" {
		mux.Handle("POST /json", jsonapi.Handler(a.svc, jsonapi.Options{MaxBytes: grpcMaxRecvBytes, Timeout: a.cfg.RedisTimeout, Log: a.log}))
	}
}
