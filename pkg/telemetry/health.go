package telemetry

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// gRPC health services besides the rate limit service's own name.
// UpstreamHealth is envoyproxy/ratelimit's, for probes written for it.
// StoreHealth follows the store; rls stays SERVING (degraded) while it
// does not answer. LiveHealth is SERVING from start to shutdown whatever
// the config and the store: a liveness probe never restarts a replica
// that waits for its store.
const (
	UpstreamHealth = "ratelimit"
	StoreHealth    = "rls.store"
	LiveHealth     = "rls.live"
)

// Health sets rls's gRPC health services. The rate limit service's names
// are SERVING while a config is in force (SetReady), once the store has
// answered since start, and while the store accepts rls's credentials; a
// later outage leaves them SERVING, as rls decides in fallback. The
// store's name follows its readiness probe (SetStore). Health is safe for
// concurrent use.
type Health struct {
	srv   *health.Server
	store string   // the store's health service name
	names []string // the rate limit service's
	log   *slog.Logger

	mu                     sync.Mutex
	ready, auth            bool
	storeServing, answered bool
}

// NewHealth returns the Health of srv, every service NOT_SERVING.
func NewHealth(srv *health.Server, log *slog.Logger, store string, names ...string) *Health {
	h := &Health{srv: srv, store: store, names: names, log: log}
	h.apply()
	return h
}

// SetReady sets whether a config is in force.
func (h *Health) SetReady(ok bool) {
	h.mu.Lock()
	h.ready = ok
	h.mu.Unlock()
	h.apply()
}

// SetStore is told each change of the store's state (StoreProbeOptions.OnChange).
func (h *Health) SetStore(s StoreState) {
	h.mu.Lock()
	h.storeServing, h.auth = s.OK, s.Auth()
	h.answered = h.answered || s.OK || s.Answered
	h.mu.Unlock()
	h.apply()
	h.log.Info("store health", "serving", s.OK, "reason", s.Reason, "answered_since_start", s.Answered)
}

// Auth reports whether the store refuses rls's credentials.
func (h *Health) Auth() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.auth
}

func (h *Health) apply() {
	h.mu.Lock()
	defer h.mu.Unlock()
	status := func(ok bool) healthpb.HealthCheckResponse_ServingStatus {
		if ok {
			return healthpb.HealthCheckResponse_SERVING
		}
		return healthpb.HealthCheckResponse_NOT_SERVING
	}
	h.srv.SetServingStatus(h.store, status(h.storeServing))
	for _, name := range h.names {
		h.srv.SetServingStatus(name, status(h.ready && !h.auth && h.answered))
	}
}

// HealthState is what /healthcheck answers from.
type HealthState struct {
	ShuttingDown bool // shutdown began
	ConfigReady  bool // a config is in force
	AuthRefused  bool // the store refuses rls's credentials
	// Waiting, when not empty, says which store has not answered since
	// start and why (its address and the probe's error).
	Waiting  string
	Degraded bool // the store does not answer now, or rules fell back lately
}

// HealthcheckHandler answers /healthcheck with HealthcheckAnswer(state()).
func HealthcheckHandler(state func() HealthState) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		code, body := HealthcheckAnswer(state())
		if code != http.StatusOK {
			http.Error(w, body, code)
			return
		}
		io.WriteString(w, body+"\n")
	})
}

// HealthcheckAnswer is the status and body of /healthcheck. It is 503 once
// shutdown began, before a config is in force, while the store refuses
// rls's credentials, and until the store has answered once. Otherwise it
// is 200: OK, or DEGRADED while rules decide locally.
func HealthcheckAnswer(s HealthState) (int, string) {
	switch {
	case s.ShuttingDown:
		return http.StatusServiceUnavailable, "NOT_SERVING: shutting down"
	case !s.ConfigReady:
		return http.StatusServiceUnavailable, "NOT_SERVING: no config yet, waiting for the first valid config from the xDS server"
	case s.AuthRefused:
		return http.StatusServiceUnavailable, "NOT_SERVING: the store refuses rls's credentials (wrong password or ACL); calls are answered Unavailable"
	case s.Waiting != "":
		return http.StatusServiceUnavailable, "NOT_SERVING: the store has not answered since rls started: " + s.Waiting
	case s.Degraded:
		return http.StatusOK, "DEGRADED: the store is not answering; deciding locally (fail_open rules at this replica's share, fail_closed rules deny)"
	}
	return http.StatusOK, "OK"
}

// BoundedWatch is grpc-go's health server with its Watch streams bounded
// in age. Each ends Unavailable past MaxAge, within a tenth more so that
// streams opened together do not return together; its client watches
// again, as gRPC's client-side health checking does. Stop ends every
// stream after sending the status in force. Check and List are the
// server's.
type BoundedWatch struct {
	*health.Server
	maxAge time.Duration
	stop   chan struct{}
	once   sync.Once
}

// NewBoundedWatch returns srv with its Watch streams bounded by maxAge.
func NewBoundedWatch(srv *health.Server, maxAge time.Duration) *BoundedWatch {
	return &BoundedWatch{Server: srv, maxAge: maxAge, stop: make(chan struct{})}
}

// Watch serves one Watch stream (healthpb.HealthServer).
func (w *BoundedWatch) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	age := w.maxAge + time.Duration(rand.Int64N(int64(w.maxAge/10)+1))
	aged := time.AfterFunc(age, cancel)
	defer aged.Stop()
	go func() {
		select {
		case <-w.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := w.Server.Watch(req, &watchStream{Health_WatchServer: stream, ctx: ctx})
	switch {
	case stream.Context().Err() != nil:
		return err
	case isClosed(w.stop):
		if r, cerr := w.Server.Check(stream.Context(), req); cerr == nil {
			_ = stream.Send(r) // the status in force last: NOT_SERVING at shutdown
		}
		return status.Error(codes.Unavailable, "rls is shutting down: watch another replica")
	case ctx.Err() != nil:
		return status.Errorf(codes.Unavailable, "this Watch stream is older than %v, the most rls keeps one: watch again", w.maxAge)
	}
	return err
}

// Stop ends every Watch stream, now and later.
func (w *BoundedWatch) Stop() { w.once.Do(func() { close(w.stop) }) }

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// watchStream is a Watch stream with its context replaced.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (s *watchStream) Context() context.Context { return s.ctx }
