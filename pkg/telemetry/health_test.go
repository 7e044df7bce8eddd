package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rls-project/rls/pkg/store"
)

// TestHealth: the rate limit service is SERVING only with a config in
// force and a store that does not refuse rls's credentials; an outage
// leaves it SERVING (only the store's service follows the probe).
func TestHealth(t *testing.T) {
	srv := health.NewServer()
	h := NewHealth(srv, slog.New(slog.DiscardHandler), "rls.store", "", "rl")
	get := func(name string) string {
		r, err := srv.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status.String()
	}
	state := func() string { return get("") + " " + get("rl") + " " + get("rls.store") }
	steps := []struct {
		do   func()
		want string
	}{
		{func() {}, "NOT_SERVING NOT_SERVING NOT_SERVING"},
		{func() { h.SetReady(true) }, "SERVING SERVING NOT_SERVING"},
		{func() { h.SetStore(StoreState{OK: true, Reason: ReasonNone}) }, "SERVING SERVING SERVING"},
		{func() { h.SetStore(StoreState{Reason: "unavailable", Err: store.ErrUnavailable}) }, "SERVING SERVING NOT_SERVING"},
		{func() {
			h.SetStore(StoreState{Reason: "auth", Err: fmt.Errorf("redis ping: %w: WRONGPASS", store.ErrAuth)})
		}, "NOT_SERVING NOT_SERVING NOT_SERVING"},
		{func() { h.SetReady(true) }, "NOT_SERVING NOT_SERVING NOT_SERVING"},
		{func() { h.SetStore(StoreState{OK: true, Reason: ReasonNone}) }, "SERVING SERVING SERVING"},
	}
	for i, s := range steps {
		s.do()
		if got := state(); got != s.want {
			t.Errorf("step %d: %s, want %s", i, got, s.want)
		}
	}
	if h.Auth() {
		t.Error("Auth after the store answered")
	}
}

// TestHealthcheckAnswer: NOT_SERVING wins in the order shutdown, no config,
// refused credentials; DEGRADED is still 200.
func TestHealthcheckAnswer(t *testing.T) {
	for _, tc := range []struct {
		shutting, ready, auth, degraded bool
		code                            int
		prefix                          string
	}{
		{false, true, false, false, 200, "OK"},
		{false, true, false, true, 200, "DEGRADED"},
		{false, true, true, true, 503, "NOT_SERVING: the store refuses"},
		{false, false, true, false, 503, "NOT_SERVING: no config"},
		{true, true, true, true, 503, "NOT_SERVING: shutting down"},
	} {
		code, body := HealthcheckAnswer(tc.shutting, tc.ready, tc.auth, tc.degraded)
		if code != tc.code || !strings.HasPrefix(body, tc.prefix) {
			t.Errorf("%+v: %d %q, want %d %q...", tc, code, body, tc.code, tc.prefix)
		}
	}
}
