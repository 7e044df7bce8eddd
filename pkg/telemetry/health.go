package telemetry

import (
	"log/slog"
	"net/http"
	"sync"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Health sets rls's gRPC health services from what it knows: the rate
// limit service's names are SERVING while a config is in force (SetReady),
// once the store has answered since start, and while it does not refuse
// rls's credentials (a later outage leaves them SERVING: rls decides in
// fallback); the store's name follows the store's readiness probe
// (SetStore). It is safe for concurrent use.
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

// HealthcheckAnswer is the status and body of /healthcheck: 503 once
// shutdown began, before a config is in force, while the store refuses
// rls's credentials, or until it has answered once since start; else
// 200 OK, or 200 DEGRADED while the store does not answer and rules
// decide locally.
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
