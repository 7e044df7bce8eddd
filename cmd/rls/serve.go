package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rls-project/rls/pkg/descriptors"

	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/reload"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store"
	redisstore "github.com/rls-project/rls/pkg/store/redis"
	"github.com/rls-project/rls/pkg/tlsconfig"
	adminv1 "github.com/rls-project/rls/proto/rls/admin/v1"
)

// rlsServiceName is the gRPC service whose health Envoy and Kubernetes check.
const rlsServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// storeHealthName is the gRPC health service that reflects whether the store
// answers; rls itself stays SERVING (degraded) while it does not.
const storeHealthName = "rls.store"

func newLogger(cfg *Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated already
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs the servers until ctx is cancelled, then shuts down in order:
// health NOT_SERVING, drain, bounded GracefulStop, HTTP servers, store last.
func serve(ctx context.Context, cfg *Config, logw io.Writer) error {
	log := newLogger(cfg, logw)
	if cfg.Store == "memory" {
		log.Info("rls starting on the embedded memory store: counters are per process, not shared by a fleet", "config_dir", cfg.ConfigDir)
	} else {
		log.Info("rls starting on redis", "mode", cfg.RedisMode, "url", redactURL(cfg.RedisURL), "config_dir", cfg.ConfigDir)
	}

	rules, notes, err := descriptors.Load(cfg.ConfigDir)
	for _, n := range notes {
		log.Info(n)
	}
	if err != nil {
		return fmt.Errorf("load config: %w", err)
	}
	log.Info("config loaded", "domains", rules.Domains(), "hash", rules.Hash())

	reg := newRegistry()
	cfgMetrics := newConfigMetrics(reg)
	cfgMetrics.set(rules)
	rawStore, ready, err := openStore(cfg, log)
	if err != nil {
		return err
	}
	if rs, ok := rawStore.(*redisstore.Store); ok {
		registerBreakers(reg, rs)
	}
	st := newTimedStore(rawStore, reg)
	defer func() {
		if err := st.Close(); err != nil {
			log.Warn("close store", "err", err)
		}
		log.Info("store closed")
	}()

	grpcLis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	svcMetrics := service.NewMetrics(reg, cfg.DetailedMetricMax)
	creds, err := grpcCreds(cfg, log)
	if err != nil {
		grpcLis.Close()
		return err
	}
	srv := grpc.NewServer(append(creds,
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.MaxRecvMsgSize(cfg.GRPCMaxRecvBytes),
		// Static flow-control windows: grpc-go otherwise estimates bandwidth
		// with a PING per burst of received data, an extra frame to write
		// and read for nearly every request at moderate load. Requests are
		// small; the windows only bound what a peer may have in flight.
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		// Reuse handler goroutines (whose stacks have already grown to the
		// depth of a decision) rather than start one per call.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.ChainUnaryInterceptor(service.RecoverUnary(svcMetrics, log)),
	)...)
	fleet := newFleet(cfg, rawStore, log)
	lim := limiter.New(st, limiter.Options{
		FleetSize:    fleet.Size,
		CacheSize:    cfg.LocalMaxKeys,
		BucketsSize:  cfg.LocalMaxKeys,
		DisableCache: !cfg.OverLimitCache,
		Log:          log,
	})
	registerLocal(reg, lim, fleet)
	svc := service.New(rules, lim, service.Options{
		FailClosed:      cfg.OnStoreError == "fail_closed",
		ResponseHeaders: cfg.ResponseHeaders,
		Limits: service.Limits{Descriptors: cfg.MaxDescriptors, Entries: cfg.MaxEntries,
			KeyBytes: cfg.MaxKeyBytes, ValueBytes: cfg.MaxValueBytes, Hits: cfg.MaxHits},
		Metrics: svcMetrics,
		Log:     log,
	})
	if cfg.Admin {
		adminv1.RegisterAdminServiceServer(srv, service.NewAdmin(svc, st, lim))
		log.Warn("admin API on: rls.admin.v1.AdminService can read and reset counters", "addr", cfg.GRPCAddr)
	}
	watcher := reload.New(rules, reload.Options{
		Dir:  cfg.ConfigDir,
		Poll: pollInterval(cfg.ConfigPoll),
		Apply: func(c *descriptors.Config) {
			svc.SetConfig(c)
			cfgMetrics.set(c)
		},
		Report: func(r reload.Result, _ *descriptors.Config) { cfgMetrics.reloads.WithLabelValues(string(r)).Inc() },
		Log:    log,
	})
	rlsv3.RegisterRateLimitServiceServer(srv, svc)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)

	// Readiness: serving from start-up to SIGTERM. A store outage does not
	// make rls unready (it decides in fallback); it shows as degraded on
	// /healthcheck and as NOT_SERVING of the gRPC health service "rls.store".
	var storeOK, shuttingDown atomic.Bool
	setStore := func(ok bool) {
		if storeOK.Swap(ok) == ok {
			return
		}
		s := healthpb.HealthCheckResponse_NOT_SERVING
		if ok {
			s = healthpb.HealthCheckResponse_SERVING
		}
		hs.SetServingStatus(storeHealthName, s)
		log.Info("store health", "serving", ok)
	}
	hs.SetServingStatus(storeHealthName, healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(rlsServiceName, healthpb.HealthCheckResponse_SERVING)

	var wg sync.WaitGroup
	errc := make(chan error, 3)
	gcCtx, stopGC := context.WithCancel(ctx)
	defer stopGC()
	go tuneGC(gcCtx, cfg.GCPercent, log)
	wg.Go(func() {
		if err := srv.Serve(grpcLis); err != nil {
			errc <- fmt.Errorf("grpc server: %w", err)
		}
	})
	log.Info("grpc listening", "addr", grpcLis.Addr().String())

	var httpSrvs []*http.Server
	startHTTP := func(name, addr string, h http.Handler) error {
		if addr == "" {
			return nil
		}
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("--%s: %w", name, err)
		}
		hsrv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		httpSrvs = append(httpSrvs, hsrv)
		wg.Go(func() {
			if err := hsrv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s: %w", name, err)
			}
		})
		log.Info("http listening", "flag", name, "addr", lis.Addr().String())
		return nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case shuttingDown.Load():
			http.Error(w, "NOT_SERVING: shutting down", http.StatusServiceUnavailable)
		case !storeOK.Load() || lim.Degraded(5*time.Second):
			io.WriteString(w, "DEGRADED: the store is not answering; deciding locally (fail_open rules at this replica's share, fail_closed rules deny)\n")
		default:
			io.WriteString(w, "OK\n")
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	dbg := http.NewServeMux()
	dbg.HandleFunc("GET /rlconfig", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		dumpConfig(w, svc.Config())
	})
	dbg.HandleFunc("/debug/pprof/", pprof.Index)
	dbg.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	dbg.HandleFunc("/debug/pprof/profile", pprof.Profile)
	dbg.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	dbg.HandleFunc("/debug/pprof/trace", pprof.Trace)

	stopAll := func() {
		srv.Stop()
		for _, h := range httpSrvs {
			h.Close()
		}
		wg.Wait()
	}
	if err := startHTTP("http-addr", cfg.HTTPAddr, mux); err != nil {
		stopAll()
		return err
	}
	if err := startHTTP("debug-addr", cfg.DebugAddr, dbg); err != nil {
		stopAll()
		return err
	}

	readyCtx, stopReady := context.WithCancel(ctx)
	var readyWG sync.WaitGroup
	readyWG.Go(func() { watchReadiness(readyCtx, ready, setStore, log) })
	readyWG.Go(func() { fleet.Run(readyCtx) })
	readyWG.Go(func() {
		if err := watcher.Run(readyCtx); err != nil {
			log.Error("cannot watch the config directory; config changes need a restart", "dir", cfg.ConfigDir, "err", err)
		}
	})

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutdown requested")
	case runErr = <-errc:
		log.Error("server failed; shutting down", "err", runErr)
	}

	// Ordered shutdown: stop advertising, drain, finish in-flight calls.
	stopReady()
	readyWG.Wait()
	shuttingDown.Store(true)
	hs.Shutdown() // every service NOT_SERVING
	log.Info("health", "serving", false)
	fleet.Leave()
	if cfg.ShutdownDrain > 0 && runErr == nil {
		log.Info("draining", "for", cfg.ShutdownDrain)
		time.Sleep(cfg.ShutdownDrain)
	}
	t := time.AfterFunc(cfg.ShutdownTimeout, func() {
		log.Warn("graceful stop timed out; closing connections", "timeout", cfg.ShutdownTimeout)
		srv.Stop()
	})
	srv.GracefulStop()
	t.Stop()
	log.Info("grpc stopped")
	shCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	for _, h := range httpSrvs {
		if err := h.Shutdown(shCtx); err != nil {
			h.Close()
		}
	}
	wg.Wait()
	return runErr
}

// watchReadiness reports SERVING while ready succeeds, probing once a second.
func watchReadiness(ctx context.Context, ready func(context.Context) error, set func(bool), log *slog.Logger) {
	lastErr := ""
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := ready(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		set(err == nil)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if msg != "" && msg != lastErr {
			log.Warn("store not ready", "err", err)
		}
		lastErr = msg
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// grpcCreds returns the gRPC server's TLS option when --grpc-tls-cert is
// set: certificates (and the client CA of mutual TLS) are re-read from disk
// when the files change, for new connections. The HTTP ports stay plaintext.
// Flow-control windows of the gRPC server (see grpc.InitialWindowSize).
const (
	streamWindow = 1 << 20
	connWindow   = 16 << 20
)

func grpcCreds(cfg *Config, log *slog.Logger) ([]grpc.ServerOption, error) {
	if cfg.GRPCTLSCert == "" {
		return nil, nil
	}
	r, err := tlsconfig.NewReloader(tlsconfig.Files{Cert: cfg.GRPCTLSCert, Key: cfg.GRPCTLSKey, ClientCA: cfg.GRPCTLSClientCA}, log)
	if err != nil {
		return nil, fmt.Errorf("--grpc-tls-cert: %w", err)
	}
	leaf := r.Certificate().Leaf
	log.Info("grpc TLS on", "mutual", cfg.GRPCTLSClientCA != "", "subject", leaf.Subject.String(),
		"serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(r.ServerConfig()))}, nil
}

// openStore builds the configured store and its readiness probe.
func openStore(cfg *Config, log *slog.Logger) (store.Store, func(context.Context) error, error) {
	switch cfg.Store {
	case "redis":
		rs, err := openRedis(cfg, log)
		if err != nil {
			return nil, nil, err
		}
		return rs, rs.Ping, nil
	default:
		m := store.NewMemory(store.MemoryOptions{MaxKeys: cfg.MemoryMaxKeys})
		return m, func(context.Context) error { return nil }, nil
	}
}

// pollInterval maps --config-poll to the watcher's option (0 disables).
func pollInterval(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// dumpConfig writes the config in force, one rule a line, for /rlconfig.
func dumpConfig(w io.Writer, cfg *descriptors.Config) {
	fmt.Fprintf(w, "# config %s, domains %v\n", cfg.Hash(), cfg.Domains())
	for _, r := range cfg.Rules() {
		fmt.Fprintf(w, "%s: %s", r.Domain, r.Path)
		if r.Name != "" {
			fmt.Fprintf(w, " name=%q", r.Name)
		}
		if r.Unlimited {
			fmt.Fprint(w, " unlimited")
		} else {
			fmt.Fprintf(w, " %d/%s %s", r.RequestsPerUnit, r.Unit, r.Algorithm)
			if r.Burst > 0 {
				fmt.Fprintf(w, " burst=%d", r.Burst)
			}
			if r.OnError != descriptors.OnErrorDefault {
				fmt.Fprintf(w, " on_error=%s", r.OnError)
			}
		}
		if r.ShadowMode {
			fmt.Fprint(w, " shadow_mode")
		}
		if r.DetailedMetric {
			fmt.Fprint(w, " detailed_metric")
		}
		if len(r.Replaces) > 0 {
			fmt.Fprintf(w, " replaces=%v", r.Replaces)
		}
		fmt.Fprintf(w, " (%s:%d)\n", r.File, r.Line)
	}
}
