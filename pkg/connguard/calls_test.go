package connguard

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
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
// next one evicts the one whose only call is a stream (its Watch ends
// Unavailable, which its client retries), never the one with a unary call
// in flight, whose call ends normally.
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
	testkit.WaitForEvery(t, "one unary call in flight, one stream", 5*time.Second, 5*time.Millisecond, func() bool {
		return busy(l) == 1 && l.Streams() == 1
	})

	evicted := func() float64 { return testutil.ToFloat64(m.closed.WithLabelValues("grpc-addr", ReasonIdleEvicted)) }
	// A new connection with a unary call in flight: it evicts the idle one.
	second := client()
	done2 := make(chan error, 1)
	go func() { done2 <- second.Invoke(ctx, "/test.Block/Wait", new(emptypb.Empty), new(emptypb.Empty)) }()
	testkit.WaitForEvery(t, "a connection evicted for the new one", 5*time.Second, 5*time.Millisecond, func() bool { return evicted() == 1 })
	testkit.WaitForEvery(t, "the connection whose call ended closed", 5*time.Second, 5*time.Millisecond, func() bool {
		return ended.GetState() != connectivity.Ready
	})
	if watching.GetState() != connectivity.Ready {
		t.Errorf("the watching connection is %v: an idle one went first, want it still ready", watching.GetState())
	}
	testkit.WaitForEvery(t, "two unary calls in flight", 5*time.Second, 5*time.Millisecond, func() bool { return busy(l) == 2 })
	// The next one finds only the watching connection without a unary call.
	next, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	testkit.WaitForEvery(t, "the watching connection evicted", 5*time.Second, 5*time.Millisecond, func() bool { return evicted() == 2 })
	if _, err := w.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("the Watch of the evicted connection: %v, want Unavailable (its client retries)", err)
	}
	if got := testutil.ToFloat64(m.refused); got != 0 {
		t.Errorf("refused = %v, want 0: an idle connection, then one holding only a stream, could make room", got)
	}

	// A graceful stop closes the connections without a unary call in
	// flight (here the one that never called), not the two in calls.
	if n := l.CloseIdle(); n != 1 {
		t.Errorf("CloseIdle closed %d connections, want 1: the two with a unary call in flight stay", n)
	}
	close(release)
	for _, d := range []chan error{done, done2} {
		if err := <-d; err != nil {
			t.Errorf("a unary call in flight at the evictions: %v, want its answer", err)
		}
	}
	if unary.GetState() != connectivity.Ready {
		t.Errorf("the connection with a unary call in flight: %v, want still ready", unary.GetState())
	}
}

// TestLimitStreamsPerPort: streams beyond MaxStreams over all the port's
// connections are refused ResourceExhausted naming the cap; one more may
// open once one ends. Unix-socket connections are told apart (each its
// own peer address), so their calls are tracked as TCP ones are.
func TestLimitStreamsPerPort(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			m := NewMetrics(prometheus.NewRegistry())
			addr := "127.0.0.1:0"
			if network == "unix" {
				addr = t.TempDir() + "/grpc.sock"
			}
			raw, err := net.Listen(network, addr)
			if err != nil {
				t.Fatal(err)
			}
			l := Limit(raw, LimitOptions{Port: "grpc-addr", MaxStreams: 2, Metrics: m, FirstCall: time.Hour})
			srv := grpc.NewServer(l.ServerOptions()...)
			healthpb.RegisterHealthServer(srv, health.NewServer())
			go srv.Serve(l)
			t.Cleanup(srv.Stop)
			target := raw.Addr().String()
			if network == "unix" {
				target = "unix://" + addr
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			watch := func(ctx context.Context) error {
				c, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				w, err := healthpb.NewHealthClient(c).Watch(ctx, &healthpb.HealthCheckRequest{})
				if err != nil {
					return err
				}
				_, err = w.Recv()
				return err
			}
			first, endFirst := context.WithCancel(ctx)
			defer endFirst()
			for _, c := range []context.Context{first, ctx} {
				if err := watch(c); err != nil {
					t.Fatalf("a stream within the cap: %v", err)
				}
			}
			if err := watch(ctx); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "has 2 streams open") {
				t.Fatalf("a third stream: %v, want ResourceExhausted naming the cap of 2", err)
			}
			l.mu.Lock()
			peers := map[string]bool{}
			for c := range l.conns {
				peers[c.RemoteAddr().String()] = true
			}
			n := len(l.conns)
			l.mu.Unlock()
			if len(peers) != n {
				t.Errorf("%d connections with %d peer addresses, want one each", n, len(peers))
			}
			endFirst()
			testkit.WaitFor(t, "a stream slot freed", 5*time.Second, func() bool { return l.Streams() == 1 })
			if err := watch(ctx); err != nil {
				t.Errorf("a stream after one ended: %v, want it open", err)
			}
		})
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

// TestLimitUnixIdleEvicted: on a Unix socket, whose peers share one
// address, a connection whose call ended is idle like a TCP one: a new
// connection at the cap evicts it (they were counted busy for good, and
// the port refused every new client once full).
func TestLimitUnixIdleEvicted(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	sock := t.TempDir() + "/grpc.sock"
	raw, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l := Limit(raw, LimitOptions{Port: "grpc-uds", Max: 1, Metrics: m, FirstCall: time.Hour})
	srv := grpc.NewServer(l.ServerOptions()...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	call := func() error {
		c, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	for i := range 2 {
		if err := call(); err != nil {
			t.Fatalf("client %d on a Unix socket of one connection: %v", i+1, err)
		}
	}
	if got := testutil.ToFloat64(m.closed.WithLabelValues("grpc-uds", ReasonIdleEvicted)); got != 1 {
		t.Errorf("idle_evicted = %v, want 1", got)
	}
}
