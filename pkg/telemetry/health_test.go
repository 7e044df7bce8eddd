package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/rls-project/rls/pkg/store"
)

// TestHealth: the rate limit service is SERVING only with a config in
// force, once the store has answered, and while the store does not refuse
// rls's credentials; a later outage leaves it SERVING (only the store's
// service follows the probe).
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
		{func() { h.SetReady(true) }, "NOT_SERVING NOT_SERVING NOT_SERVING"},
		{func() { h.SetStore(StoreState{Reason: "unavailable", Err: store.ErrUnavailable}) }, "NOT_SERVING NOT_SERVING NOT_SERVING"},
		{func() { h.SetStore(StoreState{OK: true, Reason: ReasonNone, Answered: true}) }, "SERVING SERVING SERVING"},
		{func() { h.SetStore(StoreState{Reason: "unavailable", Err: store.ErrUnavailable, Answered: true}) }, "SERVING SERVING NOT_SERVING"},
		{func() {
			h.SetStore(StoreState{Reason: "auth", Err: fmt.Errorf("redis ping: %w: WRONGPASS", store.ErrAuth)})
		}, "NOT_SERVING NOT_SERVING NOT_SERVING"},
		{func() { h.SetReady(true) }, "NOT_SERVING NOT_SERVING NOT_SERVING"},
		{func() { h.SetStore(StoreState{OK: true, Reason: ReasonNone, Answered: true}) }, "SERVING SERVING SERVING"},
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
// refused credentials, a store never answered (with why); DEGRADED is
// still 200.
func TestHealthcheckAnswer(t *testing.T) {
	for _, tc := range []struct {
		s      HealthState
		code   int
		prefix string
	}{
		{HealthState{ConfigReady: true}, 200, "OK"},
		{HealthState{ConfigReady: true, Degraded: true}, 200, "DEGRADED"},
		{HealthState{ConfigReady: true, Waiting: "redis://h:1: refused", Degraded: true}, 503, "NOT_SERVING: the store has not answered since rls started: redis://h:1: refused"},
		{HealthState{ConfigReady: true, AuthRefused: true, Waiting: "x", Degraded: true}, 503, "NOT_SERVING: the store refuses"},
		{HealthState{AuthRefused: true}, 503, "NOT_SERVING: no config"},
		{HealthState{ShuttingDown: true, ConfigReady: true, AuthRefused: true, Degraded: true}, 503, "NOT_SERVING: shutting down"},
	} {
		code, body := HealthcheckAnswer(tc.s)
		if code != tc.code || !strings.HasPrefix(body, tc.prefix) {
			t.Errorf("%+v: %d %q, want %d %q...", tc.s, code, body, tc.code, tc.prefix)
		}
	}
}

// TestBoundedWatch: a Watch stream ends Unavailable once older than its
// bound; at Stop every Watch gets the status in force (NOT_SERVING after
// Shutdown) and then ends Unavailable.
func TestBoundedWatch(t *testing.T) {
	srv := health.NewServer()
	w := NewBoundedWatch(srv, 300*time.Millisecond)
	lis := bufconn.Listen(1 << 16)
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, w)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///buf", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	watch := func() healthpb.Health_WatchClient {
		s, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := s.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("first status %v, %v; want SERVING", r, err)
		}
		return s
	}
	s := watch()
	if _, err := s.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "older than") {
		t.Fatalf("an old Watch: %v, want Unavailable saying it is too old", err)
	}
	s = watch()
	srv.Shutdown()
	w.Stop()
	var last healthpb.HealthCheckResponse_ServingStatus
	for {
		r, err := s.Recv()
		if err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Errorf("a Watch at Stop: %v, want Unavailable", err)
			}
			break
		}
		last = r.Status
	}
	if last != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("last status before the end %v, want NOT_SERVING", last)
	}
}
