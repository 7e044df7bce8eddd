package main

import (
	"github.com/rls-project/rls/pkg/buildinfo"

	"context"
	"errors"
	"fmt"
	"strings"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/reload"
	"github.com/rls-project/rls/pkg/tlsconfig"
	"github.com/rls-project/rls/pkg/xds"
)

// With --config-source xds the descriptor config comes from an xDS
// management server. rls is NOT_SERVING and decides nothing until the
// first valid config; with --allow-empty-config it serves at once, without
// rules (upstream's FORCE_START_WITHOUT_INITIAL_CONFIG). It keeps the last
// valid config through rejected updates and disconnections.

// buildXDS makes the xDS client; applyXDS receives its updates.
func (a *app) buildXDS() error {
	cfg := a.cfg
	meta, _ := xds.ParseNodeMetadata(cfg.XDSNodeMetadata) // validated already
	opts := xds.Options{
		Server:       cfg.XDSServer,
		NodeID:       cfg.XDSNodeID,
		NodeMetadata: meta,
		Version:      buildinfo.String(),
		MaxRecvBytes: cfg.XDSMaxRecvBytes,
		Update:       a.applyXDS,
		Rejected:     func(string, error) { a.cfgMetrics.Report(reload.Failure) },
		Connected:    func(up bool) { a.xdsConnected.Set(b2f(up)) },
		Log:          a.log,
	}
	if cfg.xdsTLSSet() {
		tc, err := tlsconfig.Client(tlsconfig.ClientOptions{CA: cfg.XDSTLSCA, Cert: cfg.XDSTLSCert, Key: cfg.XDSTLSKey}, a.log)
		if err != nil {
			return fmt.Errorf("--xds-tls-*: %w", err)
		}
		tc.ServerName = cfg.XDSTLSServerName
		opts.TLS = tc
	}
	c, err := xds.New(opts)
	if err != nil {
		return err
	}
	a.xds = c
	a.xdsConnected = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rls_xds_connected", Help: "1 while rls has a stream open to its xDS management server (--config-source xds), else 0: it serves the last valid config meanwhile."})
	a.reg.MustRegister(a.xdsConnected)
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// applyXDS puts the config of one response's resources in force, or
// returns why not: the response is NACKed and the config in force stays.
// A response without a domain is refused unless --allow-empty-config. The
// first valid config makes rls serve.
func (a *app) applyXDS(version string, res []*rlsconf.RateLimitConfig) error {
	cfg, err := xds.Build(res, descriptors.ParseOptions{MergeDomains: a.cfg.MergeDomains, DefaultAlgorithm: loadOptions(a.cfg).DefaultAlgorithm, Global: a.cfg.Global.on()})
	if err == nil && len(cfg.Domains()) == 0 && !a.cfg.AllowEmptyConfig {
		err = fmt.Errorf("version %q has no RateLimitConfig with a domain: it would remove every limit (%s allows it)", version, flagRef("allow-empty-config"))
	}
	if err == nil {
		err = a.checkTwemproxy(cfg)
	}
	if err != nil {
		a.reportLoad(reload.Failure)
		return err
	}
	if a.configReady.Load() && cfg.Hash() == a.svc.Config().Hash() {
		a.cfgMetrics.Report(reload.Unchanged)
		a.log.Debug("xds: config unchanged", "version", version, "hash", cfg.Hash())
		return nil
	}
	a.applyConfig(cfg)
	a.reportLoad(reload.Success) // as a file reload counts it
	a.log.Info("xds: config applied", "version", version, "domains", cfg.Domains(), "hash", cfg.Hash())
	if !a.configReady.Swap(true) {
		a.health.SetReady(true)
		a.log.Info("first valid config from the xDS server: serving", "version", version)
	}
	return nil
}

// errNoConfig answers rate limit calls before the first config: an outage,
// so Envoy's failure_mode_deny decides (envoyproxy/ratelimit does not
// serve at all until then).
var errNoConfig = status.Error(codes.Unavailable, "rls has no rate limit config yet: waiting for the first valid config from the xDS server")

// configGate refuses RateLimitService calls until a config is in force.
func (a *app) configGate(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !a.configReady.Load() && strings.HasPrefix(info.FullMethod, "/"+rlsServiceName+"/") {
		return nil, errNoConfig
	}
	return handler(ctx, req)
}

// runXDS runs the xDS client until ctx ends.
func (a *app) runXDS(ctx context.Context) {
	if err := a.xds.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		a.log.Error("xds client stopped; the config in force stays until restart", "server", a.cfg.XDSServer, "err", err)
	}
}
