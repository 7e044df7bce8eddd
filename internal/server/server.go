// Package server runs rls's ports: the gRPC port with its bounds, the
// admin API's (AdminServer), the HTTP and debug ports, each capped by
// connguard, and their stop in order. cmd/rls builds what they serve.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/rls-project/rls/pkg/connguard"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/tlsconfig"
)

// Fixed bounds of the gRPC server. MaxStreams is each connection's
// concurrent calls (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): Envoy opens
// another connection beyond it, and one refused twice as many streams
// within a second is closed (connguard.RefusedStreams). MaxRecvBytes is
// the largest request message; larger is ResourceExhausted. Requests are
// a few hundred bytes; what one may ask is bounded by service.Limits.
const (
	MaxStreams   = 256
	MaxRecvBytes = 1 << 20
)

// streamsPerConn bounds the streaming calls (RLQS, health Watch,
// reflection) open at once on the gRPC port: this many per connection of
// its cap. A stream does not hold its connection busy: at the cap,
// connections with only streams are evicted like idle ones.
const streamsPerConn = 4

// handshakeTimeout bounds a new connection's TLS handshake and HTTP/2
// preface, or its HTTP request headers: one that sends nothing is closed
// and frees its slot of the connection cap.
const handshakeTimeout = 5 * time.Second

// maxConnAgeGrace is how long calls in flight on a connection past its
// maximum age may take before it is closed.
const maxConnAgeGrace = 10 * time.Second

// Flow-control windows of the gRPC server (see grpc.InitialWindowSize).
const (
	streamWindow = 1 << 20
	connWindow   = 16 << 20
)

// streamWorkers is the number of goroutines kept to run gRPC calls; a call
// that finds none free runs on a goroutine of its own.
const streamWorkers = 128

// HTTP servers' timeouts besides handshakeTimeout and Options.Idle. A
// request is a GET without a body; the largest answer is /metrics. The
// debug port allows pprof's profiles and traces up to 5 min.
const (
	httpReadTimeout   = 10 * time.Second
	httpWriteTimeout  = 30 * time.Second
	debugWriteTimeout = 5 * time.Minute
)

// stopIdleGrace is how long a graceful stop lets connections without a
// unary call in flight close by themselves before it closes them.
const stopIdleGrace = time.Second

// GRPCOptions are the gRPC server's options besides TLS. A connection has
// at most MaxStreams calls at once and must finish its handshake within
// handshakeTimeout. One without a call for idle, or older than maxAge, is
// sent a GOAWAY and closed once its calls end, or after maxConnAgeGrace.
// A panic in a call is recovered (service.RecoverUnary); requests decode
// with service.Codec.
func GRPCOptions(idle, maxAge time.Duration, m *service.Metrics, log *slog.Logger) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     idle,
			MaxConnectionAge:      maxAge,
			MaxConnectionAgeGrace: maxConnAgeGrace,
		}),
		grpc.MaxConcurrentStreams(MaxStreams),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.MaxRecvMsgSize(MaxRecvBytes),
		// Static flow-control windows: grpc-go otherwise estimates bandwidth
		// with a PING per burst of received data, an extra frame to write
		// and read for nearly every request at moderate load. Requests are
		// small; the windows only bound what a peer may have in flight.
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		// Reuse handler goroutines, whose stacks have grown to a
		// decision's depth. A handler waits on Redis for most of its call:
		// keep enough for the calls usually in flight.
		grpc.NumStreamWorkers(uint32(streamWorkers)),
		grpc.ChainUnaryInterceptor(service.RecoverUnary(m, log)),
		// Protobuf, but RateLimitRequests may carry strings that are not UTF-8
		// (Envoy forwards header bytes as they come): see service.DecodeRequest.
		grpc.ForceServerCodecV2(service.Codec()),
	}
}

// TLSCreds returns TLS credentials of files whose certificates (and
// client CA, for mutual TLS) are re-read from disk when they change, for
// new connections. It logs the certificate in use.
func TLSCreds(files tlsconfig.Files, log *slog.Logger) (credentials.TransportCredentials, error) {
	r, err := tlsconfig.NewReloader(files, log)
	if err != nil {
		return nil, err
	}
	leaf := r.Certificate().Leaf
	log.Info("grpc TLS on", "mutual", files.ClientCA != "", "subject", leaf.Subject.String(),
		"serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
	return credentials.NewTLS(r.ServerConfig()), nil
}

// Options configure Servers.
type Options struct {
	// MaxConns caps the connections open at once on the gRPC and HTTP
	// ports, fitted to the file-descriptor limit (connguard.Fit); 0 is none.
	MaxConns int
	// FirstCall closes a connection that makes no call this long after
	// opening; Idle, an HTTP connection without a request this long.
	FirstCall, Idle time.Duration
	// ShutdownTimeout bounds Stop's wait for calls in flight.
	ShutdownTimeout time.Duration
	Metrics         *connguard.Metrics // connections by port
	Log             *slog.Logger
}

// Servers are rls's ports and the goroutines serving them. Make them with
// New, the gRPC server with NewGRPC and the admin API with ListenAdmin;
// Serve and ServeHTTP start serving; Stop or Close ends it.
type Servers struct {
	opts    Options
	grpcLis *connguard.Listener
	grpc    *grpc.Server
	admin   *AdminServer
	https   []*http.Server

	wg      sync.WaitGroup
	errc    chan error
	serving atomic.Bool
}

// New returns Servers with nothing to serve yet.
func New(o Options) *Servers {
	return &Servers{opts: o, errc: make(chan error, 4)} // one per server
}

// Creds wraps creds (nil: plaintext) to close a connection of the gRPC
// port, named port in metrics, that has been refused too many streams
// (connguard.RefusedStreams).
func (s *Servers) Creds(port string, creds credentials.TransportCredentials) credentials.TransportCredentials {
	guard := connguard.NewRefusedStreams(connguard.RefusedOptions{Limit: connguard.RefusedLimit(MaxStreams),
		Port: port, Metrics: s.opts.Metrics, Log: s.opts.Log})
	return guard.Creds(creds)
}

// NewGRPC caps lis, the gRPC port named port, at MaxConns connections and
// streamsPerConn streams per connection, and returns its server, made with
// the listener's interceptors, which tell it the busy connections, then
// opts.
func (s *Servers) NewGRPC(lis net.Listener, port string, opts ...grpc.ServerOption) *grpc.Server {
	s.grpcLis = connguard.Limit(lis, connguard.LimitOptions{Port: port, Max: s.opts.MaxConns, MaxStreams: streamsPerConn * s.opts.MaxConns,
		FirstCall: s.opts.FirstCall, Metrics: s.opts.Metrics, Log: s.opts.Log})
	s.grpc = grpc.NewServer(append(s.grpcLis.ServerOptions(), opts...)...)
	return s.grpc
}

// ListenAdmin makes the admin API's server on addr (ListenAdmin), with
// maxConns connections at most, named --admin-addr.
func (s *Servers) ListenAdmin(addr string, maxConns int, opts ...grpc.ServerOption) (*AdminServer, error) {
	var err error
	s.admin, err = ListenAdmin(addr, connguard.LimitOptions{Port: "admin-addr", Max: maxConns, Metrics: s.opts.Metrics, Log: s.opts.Log}, opts...)
	return s.admin, err
}

// Serve serves the gRPC port and the admin API, if any.
func (s *Servers) Serve() {
	s.serving.Store(true)
	s.wg.Go(func() {
		if err := s.grpc.Serve(s.grpcLis); err != nil {
			s.errc <- fmt.Errorf("grpc server: %w", err)
		}
	})
	s.opts.Log.Info("grpc listening", "addr", s.grpcLis.Addr().String())
	if s.admin != nil { // a port of its own: whoever reaches the admin API can reset counters
		s.wg.Go(func() { s.errc <- s.admin.Serve() }) // nil only after Stop, once Err has been read
		s.opts.Log.Info("admin API listening: rls.admin.v1.AdminService reads and resets counters", "addr", s.admin.Addr().String())
		warnPublic(s.opts.Log, s.admin.Addr(), "--admin-addr", "the admin API (no authentication) lets whoever reaches it read and reset every counter")
	}
}

// ServeHTTP serves h on addr, the value of --name, unless addr is empty.
func (s *Servers) ServeHTTP(name, addr string, h http.Handler) error {
	if addr == "" {
		return nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--%s: %w", name, err)
	}
	capped := connguard.Limit(lis, connguard.LimitOptions{Port: name, Max: s.opts.MaxConns, FirstCall: s.opts.FirstCall, Metrics: s.opts.Metrics, Log: s.opts.Log})
	srv := &http.Server{
		ConnState:         capped.ConnState, // which connections are busy: the idle make room at the cap
		Handler:           h,
		ReadHeaderTimeout: handshakeTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       s.opts.Idle,
	}
	if name == "debug-addr" {
		// /debug/pprof/profile and /trace write after ?seconds= (30 by
		// default); pprof refuses a duration beyond WriteTimeout.
		srv.WriteTimeout = debugWriteTimeout
	}
	s.https = append(s.https, srv)
	s.wg.Go(func() {
		if err := srv.Serve(capped); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.errc <- fmt.Errorf("%s: %w", name, err)
		}
	})
	s.opts.Log.Info("http listening", "flag", name, "addr", capped.Addr().String())
	if name == "debug-addr" {
		warnPublic(s.opts.Log, capped.Addr(), "--"+name, "the debug port serves /debug/pprof (heap dumps, CPU profiles) and /rlconfig to whoever reaches it")
	}
	return nil
}

// DebugHandler serves the debug port: /rlconfig, the config in force as
// dump writes it, and /debug/pprof.
func DebugHandler(dump func(io.Writer) error) http.Handler {
	dbg := http.NewServeMux()
	dbg.HandleFunc("GET /rlconfig", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_ = dump(w) // the client's connection is gone
	})
	dbg.HandleFunc("/debug/pprof/", pprof.Index)
	dbg.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	dbg.HandleFunc("/debug/pprof/profile", pprof.Profile)
	dbg.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	dbg.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return dbg
}

// Err receives the error of a server that failed, or of Fail.
func (s *Servers) Err() <-chan error { return s.errc }

// Fail hands err to Err once the servers serve; before Serve, it is
// dropped.
func (s *Servers) Fail(err error) {
	if !s.serving.Load() {
		return
	}
	select {
	case s.errc <- err:
	default:
	}
}

// warnPublic logs at WARN that flag listens on addr, not a loopback
// address, and what that exposes: rls's defaults keep such ports on
// loopback, so one elsewhere was asked for and should be behind a network
// policy.
func warnPublic(log *slog.Logger, addr net.Addr, flag, what string) {
	if a, ok := addr.(*net.TCPAddr); ok && a.IP.IsLoopback() {
		return
	}
	log.Warn(flag+" listens beyond loopback: "+what+"; keep it on 127.0.0.1, or restrict who reaches it (a NetworkPolicy, a firewall)",
		"addr", addr.String())
}

// Close closes every server at once and waits for them, when start fails.
func (s *Servers) Close() {
	s.grpc.Stop()
	s.admin.Stop(0)
	for _, h := range s.https {
		h.Close()
	}
	s.wg.Wait()
}

// Stop stops gRPC, then the HTTP servers, and waits for them. Calls in
// flight may finish within ShutdownTimeout, then their connections are
// closed; gRPC connections without a unary call in flight are closed after
// stopIdleGrace.
func (s *Servers) Stop() {
	s.stopGRPC()
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()
	for _, h := range s.https {
		if err := h.Shutdown(ctx); err != nil {
			h.Close()
		}
	}
	s.wg.Wait()
}

func (s *Servers) stopGRPC() {
	timeout := s.opts.ShutdownTimeout
	t := time.AfterFunc(timeout, func() {
		s.opts.Log.Warn("graceful stop timed out; closing connections", "timeout", timeout)
		s.grpc.Stop()
	})
	// The streams have ended (RLQS, Watch): connections without a unary
	// call in flight by then are closed, not waited for (connguard.CloseIdle).
	idle := time.AfterFunc(stopIdleGrace, func() {
		if n := s.grpcLis.CloseIdle(); n > 0 {
			s.opts.Log.Info("graceful stop: closed connections without a call in flight", "conns", n)
		}
	})
	s.grpc.GracefulStop()
	t.Stop()
	idle.Stop()
	s.admin.Stop(timeout)
	s.opts.Log.Info("grpc stopped")
}
