package connguard

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/rls-project/rls/pkg/testkit"
)

// blockDesc is a service with one unary method that blocks until its
// channel (the server's srv) is closed.
var blockDesc = grpc.ServiceDesc{
	ServiceName: "test.Block",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Wait", Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(emptypb.Empty)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, _ any) (any, error) {
			select {
			case <-srv.(chan struct{}):
			case <-ctx.Done():
			}
			return new(emptypb.Empty), nil
		}
		if ic == nil {
			return h(ctx, in)
		}
		return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/test.Block/Wait"}, h)
	}}},
}

// TestLimitGRPCCallsInFlight: a gRPC server with the listener's
// ServerOptions tells it which connections have a call in flight. At the
// cap, with one connection in a unary call, one watching a stream and one
// whose call ended, a new connection evicts the one whose call ended; the
// two with calls in flight are not taken, and their calls end normally.
func TestLimitGRPCCallsInFlight(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Limit(raw, LimitOptions{Port: "grpc-addr", Max: 3, Metrics: m, FirstCall: time.Hour})
	srv := grpc.NewServer(l.ServerOptions()...)
	release := make(chan struct{})
	srv.RegisterService(&blockDesc, release)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)

	client := func() *grpc.ClientConn {
		c, err := grpc.NewClient(raw.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	unary := client() // a call in flight until release
	done := make(chan error, 1)
	go func() { done <- unary.Invoke(ctx, "/test.Block/Wait", new(emptypb.Empty), new(emptypb.Empty)) }()
	watching := client() // a stream open throughout
	w, err := healthpb.NewHealthClient(watching).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	ended := client() // one call, ended
	if _, err := healthpb.NewHealthClient(ended).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitForEvery(t, "two calls in flight", 5*time.Second, 5*time.Millisecond, func() bool {
		return busy(l) == 2
	})

	evicted := func() float64 { return testutil.ToFloat64(m.closed.WithLabelValues("grpc-addr", ReasonIdleEvicted)) }
	fresh, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	testkit.WaitForEvery(t, "a connection evicted for the new one", 5*time.Second, 5*time.Millisecond, func() bool { return evicted() == 1 })
	testkit.WaitForEvery(t, "the connection whose call ended closed", 5*time.Second, 5*time.Millisecond, func() bool {
		return ended.GetState() != connectivity.Ready
	})
	if got := testutil.ToFloat64(m.refused); got != 0 {
		t.Errorf("refused = %v, want 0: an idle connection could make room", got)
	}

	close(release)
	if err := <-done; err != nil {
		t.Errorf("the unary call in flight at the evictions: %v, want its answer", err)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("the stream open at the evictions: %v, %v; want its next status", r, err)
	}
	if unary.GetState() != connectivity.Ready || watching.GetState() != connectivity.Ready {
		t.Errorf("connections with calls in flight: %v and %v, want both still ready", unary.GetState(), watching.GetState())
	}
}

// busy counts l's connections with a call in flight.
func busy(l *Listener) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for c := range l.conns {
		if c.active.Load() > 0 {
			n++
		}
	}
	return n
}
