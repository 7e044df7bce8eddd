package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/server"
	"github.com/rls-project/rls/pkg/compat"
	"github.com/rls-project/rls/pkg/connguard"
	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/fleet"
	"github.com/rls-project/rls/pkg/gctune"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/redisclient"
	"github.com/rls-project/rls/pkg/reload"
	"github.com/rls-project/rls/pkg/rlqs"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/store/redisstore"
	"github.com/rls-project/rls/pkg/store/upstream"
	"github.com/rls-project/rls/pkg/telemetry"
	"github.com/rls-project/rls/pkg/tlsconfig"
	"github.com/rls-project/rls/pkg/upstreamstats"
	"github.com/rls-project/rls/pkg/xds"
)

// rlsServiceName is the gRPC service whose health Envoy and Kubernetes check.
const rlsServiceName = "envoy.service.ratelimit.v3.RateLimitService"

func newLogger(cfg *Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated already
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs rls until ctx is cancelled or a server fails: it builds the
// components from the config, starts the servers, waits, and shuts down in
// order. The store is closed last, after everything that uses it stopped.
func serve(ctx context.Context, cfg *Config, logw io.Writer) error {
	a := &app{cfg: cfg, log: newLogger(cfg, logw)}
	defer a.closeStore()
	defer a.stopTracing() // before the store closes: the spans of the last calls
	if err := a.build(); err != nil {
		return err
	}
	if gctune.Wanted(cfg.GOGC, cfg.GOMEMLIMIT) {
		gcCtx, stopGC := context.WithCancel(ctx)
		defer stopGC()
		go gctune.Run(gcCtx, a.log)
	}
	if err := a.start(ctx); err != nil {
		return err
	}
	runErr := a.wait(ctx)
	a.shutdown(runErr)
	return runErr
}

// app is one serving rls: the components build makes from the config, in
// the order they depend on each other, and what start and shutdown need.
type app struct {
	cfg *Config
	log *slog.Logger

	reg        *prometheus.Registry
	cfgMetrics *telemetry.ConfigMetrics
	svcMetrics *service.Metrics

	rawStore  store.Store             // as opened (the fleet's heartbeats need Redis itself)
	st        *telemetry.MeteredStore // rawStore with metrics; closed last
	twemproxy bool                    // --redis-url is a twemproxy (twemproxy.go)

	evictions   *telemetry.EvictionWatch // Redis's evictions of counters; nil on the memory store
	redisClient redis.UniversalClient    // the Redis store's client (the store closes it); nil otherwise

	tracing  *telemetry.Tracing   // nil when tracing is off
	upstream *upstreamstats.Stats // envoyproxy/ratelimit's stats; nil when off

	fleet   *fleet.Fleet
	global  *globalShares // --region: shares of scope: global rules (global.go); nil otherwise
	lim     *limiter.Limiter
	svc     *service.Service
	rlqs    *rlqs.Server    // --rlqs; nil when off
	watcher *reload.Watcher // --config-source file
	xds     *xds.Client     // --config-source xds

	// configReady is set once a config is in force: at start-up from
	// files, with the first valid config from xDS. Until then the rate
	// limit service is NOT_SERVING and refuses calls.
	configReady  atomic.Bool
	xdsConnected prometheus.Gauge

	srv       *server.Servers // the ports: gRPC, admin, HTTP, debug
	grpcSrv   *grpc.Server
	admin     *server.AdminServer // --admin-addr; nil when off
	healthSrv *health.Server
	health    *telemetry.Health // the services' health, from the config and the store

	watches *telemetry.BoundedWatch // healthSrv as served: Watch streams bounded

	// probe follows the store's readiness; shuttingDown is set once
	// shutdown begins. /healthcheck reports both.
	probe        *telemetry.StoreProbe
	shuttingDown atomic.Bool

	background sync.WaitGroup // readiness probe, fleet heartbeats, config watcher
	stopBg     context.CancelFunc
}

// build turns the config into components, in dependency order: descriptor
// config, metrics registry, store, gRPC listener and server, fleet,
// limiter, service, admin API, config reloader, health. Nothing serves
// yet. On error, what build opened is closed (the store by closeStore).
func (a *app) build() error {
	a.logStart()
	rules := &descriptors.Config{} // none until the xDS server sends one
	if !a.cfg.fromXDS() {
		var err error
		if rules, err = loadRules(a.cfg, func(n string) { a.log.Info(n) }); err != nil {
			return err
		}
		a.log.Info("config loaded", "domains", rules.Domains(), "hash", rules.Hash())
		a.configReady.Store(true)
	} else if a.cfg.AllowEmptyConfig {
		// Serve at once, with no rule (every descriptor OK) until the xDS
		// server sends a config: upstream's FORCE_START_WITHOUT_INITIAL_CONFIG.
		a.configReady.Store(true)
	}
	a.reg = newRegistry()
	a.cfgMetrics = telemetry.NewConfigMetrics(a.reg)
	if a.configReady.Load() {
		a.cfgMetrics.Set(rules)
	}
	if err := a.buildStore(); err != nil {
		return err
	}
	if err := a.checkTwemproxy(rules); err != nil {
		return err
	}
	if err := a.buildTracing(); err != nil {
		return err
	}
	if err := a.buildUpstreamStats(); err != nil {
		return err
	}
	if err := a.buildGRPC(); err != nil {
		return err
	}
	if err := a.buildDecisions(rules); err != nil {
		return err
	}
	if a.cfg.fromXDS() {
		if err := a.buildXDS(); err != nil {
			return err
		}
	} else {
		a.buildReloader(rules)
	}
	a.registerGRPC()
	return nil
}

// logStart says which store rls starts on.
func (a *app) logStart() {
	cfg := a.cfg
	source := []any{"config_dir", cfg.ConfigDir}
	if cfg.fromXDS() {
		source = []any{"xds_server", cfg.XDSServer, "xds_node_id", cfg.XDSNodeID}
	}
	for _, w := range cfg.Compat.Warnings { // upstream's variables that change nothing
		a.log.Warn(w)
	}
	if len(cfg.StrayUpstream) > 0 { // an upstream Deployment's env: carried over to rls serve
		a.log.Warn("envoyproxy/ratelimit's variables are set but rls serve does not read them: run as ratelimit, or set "+
			flagRef("env-compat")+" upstream, for rls to read them; or use rls's flags (docs/MIGRATING.md)", "variables", strings.Join(cfg.StrayUpstream, ","))
	}
	if cfg.storeKind() == "memory" {
		a.log.Info("rls starting on the embedded memory store: counters are per process, not shared by a fleet", source...)
	} else {
		a.log.Info("rls starting on redis", append([]any{"mode", cfg.redisMode(), "url", redisclient.RedactURL(cfg.RedisURL)}, source...)...)
	}
}

// loadRules loads --config-dir as rls validate does (descriptors.LoadDir),
// telling note its notes.
func loadRules(cfg *Config, note func(string)) (*descriptors.Config, error) {
	rules, notes, err := descriptors.LoadDir(cfg.ConfigDir, loadOptions(cfg))
	for _, n := range notes {
		note(n)
	}
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	return rules, nil
}

// buildStore opens the configured store and wraps it with metrics. On
// Redis with --env-compat upstream, fixed windows count in upstream's
// keys (pkg/store/upstream) around the Redis store; behind twemproxy they
// are all there is (twemproxy.go).
func (a *app) buildStore() error {
	var tc *tls.Config
	if a.cfg.storeKind() == "redis" {
		var err error
		if tc, err = redisTLS(a.cfg, a.log); err != nil {
			return err
		}
		a.twemproxy = a.detectTwemproxy(tc)
	}
	var raw store.Store
	var ready func(context.Context) error
	if a.twemproxy {
		client, err := upstream.NewClient(a.cfg.upstreamClient(true, nil))
		if err != nil {
			return fmt.Errorf("%s: %w", flagRef("redis-url"), err)
		}
		us := upstream.New(upstream.Options{Client: client, KeyPrefix: a.cfg.KeyPrefix, Timeout: a.cfg.RedisTimeout})
		raw, ready = us, us.Ready
		if a.cfg.FleetSize == 0 {
			a.log.Warn("behind twemproxy rls cannot learn the fleet's size (its heartbeats need scripts): set " + flagRef("fleet-size") +
				", or each replica's fail-open share while Redis is down is the whole limit")
		}
	} else {
		var err error
		if raw, ready, a.redisClient, err = openStore(a.cfg, tc, a.log); err != nil {
			return err
		}
		ready = a.lateTwemproxy(ready, tc, a.fatal)
	}
	a.rawStore = raw // closed by closeStore from here on
	st := raw
	if rs, ok := raw.(*redisstore.Store); ok && a.cfg.EnvCompat == "upstream" {
		client, err := upstream.NewClient(a.cfg.upstreamClient(false, tc))
		if err != nil {
			return fmt.Errorf("%s: %w", flagRef("redis-url"), err)
		}
		st = upstream.New(upstream.Options{Inner: rs, Client: client, KeyPrefix: a.cfg.KeyPrefix, Timeout: a.cfg.RedisTimeout})
	}
	a.st = telemetry.NewMeteredStore(st, a.reg)
	if rs, ok := raw.(*redisstore.Store); ok {
		telemetry.RegisterBreakers(a.reg, rs, redisclient.Node(a.cfg.redisOptions()))
		telemetry.RegisterScriptMode(a.reg, rs)
		telemetry.RegisterRoutes(a.reg, rs)
		// Evictions of counters are a silent fail-open: made loud.
		a.evictions = telemetry.NewEvictionWatch(a.reg, telemetry.EvictionOptions{Client: a.redisClient, Timeout: a.cfg.RedisTimeout, Log: a.log})
	}
	if a.cfg.storeKind() == "redis" {
		// A wrong password is a mistake to fix, not an outage to serve through.
		if err := telemetry.RefusedCredentials(ready, a.cfg.RedisTimeout); err != nil {
			return fmt.Errorf("redis refused rls's credentials; set the right password in %s (or the %s's), "+
				"and the ACL user's permissions: %w", redisPasswordEnv, flagRef("redis-url"), err)
		}
	}
	a.probe = telemetry.NewStoreProbe(a.reg, telemetry.StoreProbeOptions{Ready: a.st.Ready(ready), OnChange: func(s telemetry.StoreState) {
		a.health.SetStore(s)
		if s.OK && a.lim != nil {
			a.lim.MarkStoreAnswered() // the store has worked: an outage from now on is served from fail-open shares
		}
	}, Log: a.log, Addr: a.storeAddr()})
	return nil
}

// buildTracing starts the tracer provider when OpenTelemetry's variables
// turn tracing on (a.tracing stays nil when they do not).
func (a *app) buildTracing() error {
	otlp, err := a.cfg.OTLP.Settings()
	if err != nil {
		return err // validated already
	}
	a.tracing, err = telemetry.NewTracing(telemetry.TracingOptions{OTLP: otlp, Store: a.cfg.storeKind(), RedisMode: a.cfg.redisMode(),
		DescriptorValues: a.cfg.TraceDescriptorValues, Registerer: a.reg, Log: a.log, SampleRatio: a.cfg.Compat.TracingSampleRatio})
	return err
}

// stopTracing exports the spans still queued and stops the exporter, within
// traceFlushTimeout. Spans ended later (there are none once gRPC has
// stopped) are not exported.
func (a *app) stopTracing() {
	if a.tracing == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	if err := a.tracing.Shutdown(ctx); err != nil {
		a.log.Warn("trace spans not all exported at shutdown", "err", err)
		return
	}
	a.log.Info("tracing stopped")
}

// newRegistry makes the process's metrics registry, with Go runtime and
// process series.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// closeStore closes the store if build opened it.
func (a *app) closeStore() {
	if a.st == nil {
		return
	}
	if err := a.st.Close(); err != nil {
		a.log.Warn("close store", "err", err)
	}
	a.log.Info("store closed")
}

// buildGRPC listens on --grpc-addr and makes the gRPC server, with TLS
// when --grpc-tls-cert is set, and the admin API's. Services are
// registered on them later.
func (a *app) buildGRPC() error {
	addrs := []string{a.cfg.GRPCAddr, a.cfg.HTTPAddr, a.cfg.DebugAddr}
	maxConns, err := connguard.Fit(flagRef("max-conns"), a.cfg.MaxConns, addrs, a.log)
	if err != nil {
		return err // caps fitted to the file-descriptor limit, so that idle connections can make room
	}
	lis, port, err := compat.ListenGRPC(a.cfg.GRPCUDS, a.cfg.GRPCAddr)
	if err != nil {
		return err
	}
	a.srv = server.New(server.Options{MaxConns: maxConns, FirstCall: a.cfg.FirstCallTimeout, Idle: a.cfg.IdleTimeout,
		ShutdownTimeout: a.cfg.ShutdownTimeout, Metrics: connguard.NewMetrics(a.reg), Log: a.log})
	a.svcMetrics = service.NewMetrics(a.reg, a.cfg.DetailedMetricMax)
	creds, err := grpcCreds(a.cfg, a.log)
	if err != nil {
		lis.Close()
		return err
	}
	// Each server's own listener learns which of its connections have a
	// call in flight from its outermost interceptors.
	opts := append([]grpc.ServerOption{grpc.Creds(a.srv.Creds(port, creds)), grpc.ChainUnaryInterceptor(a.upstream.Unary)},
		server.GRPCOptions(a.cfg.IdleTimeout, a.cfg.GRPCMaxConnAge, a.svcMetrics, a.log)...)
	if a.cfg.fromXDS() {
		opts = append(opts, grpc.ChainUnaryInterceptor(a.configGate))
	}
	a.grpcSrv = a.srv.NewGRPC(lis, port, opts...)
	a.admin, err = a.srv.ListenAdmin(a.cfg.AdminAddr, a.cfg.MaxConns, opts...) // nil when off; errors name --admin-addr
	return err
}

// buildDecisions makes what decides: the fleet-size source, the limiter on
// the store, the RateLimitService, and the admin API when --admin-addr is set.
func (a *app) buildDecisions(rules *descriptors.Config) error {
	cfg := a.cfg
	a.fleet = newFleet(cfg, a.rawStore, a.log)
	// One byte cap: each entry costs at least a byte, so a key cap equal
	// to the bytes never binds first.
	a.lim = limiter.New(a.tracing.Store(a.st), limiter.Options{
		FleetSize:             a.fleet.Size,
		OverLimitCacheSize:    int(cfg.LocalMaxBytes / 2),
		BucketsSize:           int(cfg.LocalMaxBytes / 4),
		OverLimitCacheBytes:   cfg.LocalMaxBytes / 2,
		BucketsBytes:          cfg.LocalMaxBytes / 4,
		DisableOverLimitCache: !cfg.OverLimitCache,
		// The memory store is local: a slice would save nothing.
		Reserve: cfg.Reserve && cfg.Store != "memory", ReserveBytes: cfg.LocalMaxBytes / 16,
		Log: a.log,
	})
	telemetry.RegisterLimiter(a.reg, a.lim, a.fleet.Size)
	a.svc = service.New(rules, a.lim, service.Options{
		FailClosed:       cfg.OnStoreError == "fail_closed",
		ResponseHeaders:  cfg.ResponseHeaders,
		HeaderNames:      service.HeaderNames{Limit: cfg.HeaderLimit, Remaining: cfg.HeaderRemaining, Reset: cfg.HeaderReset},
		ShadowMode:       cfg.ShadowMode,
		QuotaMode:        cfg.QuotaMode,
		ResponseMetadata: cfg.ResponseMetadata,
		WholeSeconds:     cfg.EnvCompat == "upstream", // as upstream sends them
		NearLimitRatio:   cfg.NearLimitRatio,
		Limits:           service.DefaultLimits, // fixed bounds, listed in docs/flags.md
		Metrics:          a.svcMetrics,
		Log:              a.log,
		Tracing:          a.tracing.Service(),
		RefuseRefunds:    !cfg.AllowNegativeHits,
		Observer:         a.upstream.Observer(),
		KeyPrefix:        cfg.KeyPrefix,
		UpstreamKeys:     cfg.EnvCompat == "upstream" && cfg.storeKind() == "redis" || a.twemproxy,
		Shares:           a.buildGlobal(),
	})
	a.admin.Register(service.NewAdmin(a.svc, a.st, a.lim))
	o := rlqs.Options{Store: a.tracing.Store(a.st), Resolver: a.svc, Fleet: a.fleet.Size, Log: a.log}
	if cfg.RLQS {
		var err error
		if o.Unmatched, err = rlqs.ParseAction(cfg.RLQSUnmatched); err != nil {
			return fmt.Errorf("%s: %w", flagRef("rlqs-unmatched"), err) // Validate refuses it first
		}
	}
	if rs, ok := a.rawStore.(*redisstore.Store); ok {
		o.Demand = rs.ShareDemand // replicas' parts of a limit follow their demand
	}
	a.rlqs = rlqs.Enable(cfg.RLQS, a.reg, o)
	return nil
}

// buildReloader makes the config directory's watcher: every valid new
// config goes to the service and the config metrics.
func (a *app) buildReloader(rules *descriptors.Config) {
	a.watcher = reload.New(rules, reload.Options{
		Dir:              a.cfg.ConfigDir,
		Poll:             a.cfg.ConfigPoll,
		MaxFileBytes:     a.cfg.ConfigMaxBytes,
		AllowEmpty:       a.cfg.AllowEmptyConfig,
		AllowEmptyName:   optionNames["reload.AllowEmpty"],
		MergeDomains:     a.cfg.MergeDomains,
		MergeDomainsName: optionNames["descriptors.MergeDomains"],
		DefaultAlgorithm: loadOptions(a.cfg).DefaultAlgorithm,
		Upstream:         loadOptions(a.cfg).Upstream,
		IgnoreDotFiles:   loadOptions(a.cfg).IgnoreDotFiles,
		Global:           a.cfg.Global.on(),
		Check:            a.checkTwemproxy,
		Apply:            a.applyConfig,
		Report:           func(r reload.Result, _ *descriptors.Config) { a.reportLoad(r) },
		Log:              a.log,
	})
}

// applyConfig puts c in force: in the service, the open RLQS buckets (at
// once) and the config metrics.
func (a *app) applyConfig(c *descriptors.Config) {
	a.svc.SetConfig(c)
	a.rlqs.Reconfigure()
	a.cfgMetrics.Set(c)
}

// reportLoad counts a load of the config in rls's metrics and upstream's
// (config_load_success, config_load_error).
func (a *app) reportLoad(r reload.Result) {
	a.cfgMetrics.Report(r)
	a.upstream.Loaded(string(r))
}

// registerGRPC registers RateLimitService, RLQS, health and reflection.
// rls is ready once the store has answered and a config is in force, until
// SIGTERM (telemetry.Health). A later outage leaves it ready: it decides
// in fallback, and shows it on /healthcheck and on "rls.store". A refusal
// of rls's credentials makes it unready.
func (a *app) registerGRPC() {
	a.svc.Register(a.grpcSrv) // decodes requests leniently: see service.Codec
	a.rlqs.Register(a.grpcSrv)
	a.healthSrv = health.NewServer()
	a.watches = telemetry.NewBoundedWatch(a.healthSrv, watchMaxAge)
	healthpb.RegisterHealthServer(a.grpcSrv, a.watches)
	reflection.Register(a.grpcSrv)
	// The store's health follows it; rls's, the config and the store's credentials.
	a.health = telemetry.NewHealth(a.healthSrv, a.log, telemetry.StoreHealth,
		append([]string{"", rlsServiceName, telemetry.UpstreamHealth}, a.rlqs.HealthNames()...)...)
	a.healthSrv.SetServingStatus(telemetry.LiveHealth, healthpb.HealthCheckResponse_SERVING) // NOT_SERVING only on shutdown
	a.health.SetReady(a.configReady.Load())
}

// start serves gRPC, then the HTTP and debug ports, then starts the
// background loops: the store's readiness probe, the fleet's heartbeats
// and the config watcher. If a port cannot be opened, it stops what it
// started and returns the error.
func (a *app) start(ctx context.Context) error {
	// Know the fleet before serving: a replica that counted itself alone
	// would give itself the whole limit in fallback.
	learnCtx, cancel := context.WithTimeout(ctx, a.cfg.RedisTimeout)
	a.fleet.Learn(learnCtx)
	cancel()
	a.srv.Serve()
	if err := a.srv.ServeHTTP("http-addr", a.cfg.HTTPAddr, a.httpHandler()); err != nil {
		a.srv.Close()
		return err
	}
	if err := a.srv.ServeHTTP("debug-addr", a.cfg.DebugAddr, server.DebugHandler(func(w io.Writer) error { return a.svc.Config().Dump(w) })); err != nil {
		a.srv.Close()
		return err
	}
	if err := a.startUpstreamPrometheus(); err != nil {
		a.srv.Close()
		return err
	}
	bgCtx, stopBg := context.WithCancel(ctx)
	a.stopBg = stopBg
	a.background.Go(func() { a.probe.Run(bgCtx) })
	if a.evictions != nil {
		a.background.Go(func() { a.evictions.Run(bgCtx) })
	}
	a.background.Go(func() { a.fleet.Run(bgCtx) })
	a.background.Go(func() { a.global.run(bgCtx) })
	a.background.Go(func() { <-a.upstream.Start(bgCtx) })
	if a.xds != nil {
		a.background.Go(func() { a.runXDS(bgCtx) })
		return nil
	}
	a.background.Go(func() {
		if err := a.watcher.Run(bgCtx); err != nil {
			a.log.Error("cannot watch the config directory; config changes need a restart", "dir", a.cfg.ConfigDir, "err", err)
		}
	})
	return nil
}

// httpHandler serves --http-addr: /healthcheck and /metrics.
func (a *app) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /healthcheck", telemetry.HealthcheckHandler(a.healthState))
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
	a.addJSON(mux)
	return mux
}

// healthState is what /healthcheck reports (telemetry.HealthcheckAnswer).
func (a *app) healthState() telemetry.HealthState {
	ps := a.probe.State()
	hs := telemetry.HealthState{ShuttingDown: a.shuttingDown.Load(), ConfigReady: a.configReady.Load(), AuthRefused: a.health.Auth(),
		Degraded: !ps.OK || a.lim.Degraded(degradedWindow)}
	if !ps.Answered {
		hs.Waiting = a.storeAddr() + " has not answered yet"
		if ps.Err != nil {
			hs.Waiting = fmt.Sprintf("%s: %v", a.storeAddr(), ps.Err)
		}
	}
	return hs
}

// storeAddr names the store in messages: its URL without the password.
func (a *app) storeAddr() string {
	if a.cfg.storeKind() == "memory" {
		return "the memory store"
	}
	return redisclient.RedactURL(a.cfg.RedisURL)
}

// wait blocks until ctx is cancelled (nil) or a server fails (its error).
func (a *app) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		a.log.Info("shutdown requested")
		return nil
	case err := <-a.srv.Err():
		a.log.Error("server failed; shutting down", "err", err)
		return err
	}
}

// shutdown stops in order: the background loops; health (NOT_SERVING
// everywhere); this replica's fleet entry; the drain (--shutdown-drain,
// not after a server failure); RLQS and Watch streams; gRPC, then HTTP,
// each within ShutdownTimeout; the limiter's work. serve then closes the
// store.
func (a *app) shutdown(runErr error) {
	a.stopBg()
	a.background.Wait()
	a.shuttingDown.Store(true)
	a.healthSrv.Shutdown() // every service NOT_SERVING
	a.log.Info("health", "serving", false)
	a.fleet.Leave()
	if a.cfg.ShutdownDrain > 0 && runErr == nil {
		a.log.Info("draining", "for", a.cfg.ShutdownDrain)
		time.Sleep(a.cfg.ShutdownDrain)
	}
	a.rlqs.ShutdownWithin(a.cfg.ShutdownTimeout) // TTL 0 to every Envoy, then its streams end
	a.watches.Stop()                             // NOT_SERVING to every Watch, then it ends: GracefulStop need not wait for them
	a.srv.Stop()                                 // gRPC, then HTTP
	a.writeBack()
}

// writeBack stops the limiter's background work (refund retries and
// write-backs; what is not done is counted lost). Then it hands the store
// the unused hits of leases, for other replicas in the same window, and
// the hits admitted locally during an outage. Each step takes at most
// ShutdownTimeout.
func (a *app) writeBack() {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	if err := a.lim.Close(ctx); err != nil {
		a.log.Warn("limiter background work not done at shutdown", "err", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	if err := a.lim.HandOver(ctx); err != nil {
		a.log.Warn("handing reserved and locally admitted hits to the store at shutdown failed; see the counts logged", "err", err)
	}
}

// degradedWindow is how long after its last fallback decision /healthcheck
// still says DEGRADED. Short, so health is OK again within about a second of
// the store answering; during an outage the failing readiness probe keeps
// it DEGRADED however sparse the traffic.
const degradedWindow = time.Second

// watchMaxAge bounds the age of a health Watch stream: its client watches
// again on a new one (telemetry.BoundedWatch).
const watchMaxAge = 10 * time.Minute

// traceFlushTimeout bounds the export of the spans still queued at
// shutdown.
const traceFlushTimeout = 5 * time.Second

// grpcCreds returns the gRPC port's TLS credentials (server.TLSCreds) when
// --grpc-tls-cert is set; nil (plaintext) otherwise.
func grpcCreds(cfg *Config, log *slog.Logger) (credentials.TransportCredentials, error) {
	if cfg.GRPCTLSCert == "" {
		return nil, nil
	}
	creds, err := server.TLSCreds(tlsconfig.Files{Cert: cfg.GRPCTLSCert, Key: cfg.GRPCTLSKey, ClientCA: cfg.GRPCTLSClientCA,
		ClientSAN: cfg.GRPCTLSClientSAN}, log)
	if err != nil {
		return nil, fmt.Errorf("--grpc-tls-cert: %w", err)
	}
	return creds, nil
}

// openStore builds the configured store and its readiness probe.
func openStore(cfg *Config, tc *tls.Config, log *slog.Logger) (store.Store, func(context.Context) error, redis.UniversalClient, error) {
	switch cfg.storeKind() {
	case "redis":
		rs, client, err := openRedis(cfg, tc, log)
		if err != nil {
			return nil, nil, nil, err
		}
		return rs, rs.Ping, client, nil
	default:
		// One byte cap, as for the local tables.
		m := memory.New(memory.Options{MaxKeys: int(cfg.MemoryMaxBytes), MaxBytes: cfg.MemoryMaxBytes})
		return m, func(context.Context) error { return nil }, nil, nil
	}
}

// loadOptions are the options of loading the config files.
func loadOptions(cfg *Config) descriptors.LoadOptions {
	alg, _ := store.ParseAlgorithm(cfg.DefaultAlgorithm) // Validate refused a bad one
	return descriptors.LoadOptions{MaxFileBytes: cfg.ConfigMaxBytes, MergeDomains: cfg.MergeDomains,
		MergeDomainsName: optionNames["descriptors.MergeDomains"], DefaultAlgorithm: alg,
		AllowEmpty: cfg.AllowEmptyConfig, AllowEmptyName: flagRef("allow-empty-config"), Global: cfg.Global.on(),
		// As ratelimit, the files upstream's runtime loader reads.
		Upstream: cfg.EnvCompat == "upstream", IgnoreDotFiles: cfg.Compat.IgnoreDotFiles}
}
