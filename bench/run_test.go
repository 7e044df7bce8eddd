package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeRLS answers OVER_LIMIT for key k0, fails key k1 with Unavailable and
// allows every other key.
type fakeRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	calls atomic.Int64
}

func (f *fakeRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	f.calls.Add(1)
	if req.Domain != "bench" {
		return nil, status.Error(codes.InvalidArgument, "unknown domain")
	}
	switch req.Descriptors[0].Entries[0].Value {
	case "k0":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
	case "k1":
		return nil, status.Error(codes.Unavailable, "store down")
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

func startFake(t *testing.T) (string, *fakeRLS) {
	t.Helper()
	f := &fakeRLS{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), f
}

func runJSON(t *testing.T, args ...string) (*Report, string) {
	t.Helper()
	var out, errw bytes.Buffer
	if err := run(context.Background(), append(args, "-json"), &out, &errw); err != nil {
		t.Fatalf("run %v: %v\n%s", args, err, errw.String())
	}
	var r Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	return &r, errw.String()
}

func TestRunClosedLoop(t *testing.T) {
	addr, f := startFake(t)
	r, log := runJSON(t, "-addr", addr, "-domain", "bench", "-n", "1000", "-c", "8", "-connections", "3",
		"-keys", "10", "-dist", "roundrobin", "-warmup", "20ms", "-server-pid", "1")
	if r.Requests != 1000 || r.OverLimit != 100 || r.Errors["Unavailable"] != 100 || r.OK != 800 || r.Decisions != 900 {
		t.Fatalf("counts: %+v", r)
	}
	if r.Latency.P50 == 0 && r.Latency.Max == 0 || r.Latency.P99 > r.Latency.Max || r.DecisionsPerSec <= 0 {
		t.Fatalf("latency: %+v", r.Latency)
	}
	if r.Server == nil || r.Schedule != nil || r.ServiceLatency != nil || r.Mode != "closed" {
		t.Fatalf("sections: %+v", r)
	}
	// 1000 measured + 3 preflight calls + the warm-up's.
	if f.calls.Load() < 1003 || !strings.Contains(log, "preflight bench [api_key=k0] -> OVER_LIMIT") {
		t.Fatalf("calls %d, log %s", f.calls.Load(), log)
	}
}

func TestRunOpenLoop(t *testing.T) {
	addr, _ := startFake(t)
	r, _ := runJSON(t, "-addr", addr, "-domain", "bench", "-rate", "2000", "-duration", "300ms", "-c", "4",
		"-warmup", "0", "-d", "api_key=%k;route=/x", "-keys", "100", "-dist", "zipf", "-zipf-s", "0.9")
	s := r.Schedule
	if r.Mode != "open" || s == nil || s.Intended != 600 || s.Sent+s.BehindAtEnd != 600 || r.Requests != s.Sent {
		t.Fatalf("schedule %+v, report %+v", s, r)
	}
	if s.Sent < 500 { // a loopback fake keeps up easily
		t.Fatalf("sent only %d of 600", s.Sent)
	}
	if r.ServiceLatency == nil || r.ServiceLatency.P50 > r.Latency.P50+1 || r.Request != "[api_key=k0, route=/x]" {
		t.Fatalf("latencies %+v / %+v, request %s", r.Latency, r.ServiceLatency, r.Request)
	}
	// -n bounds the open loop too.
	r, _ = runJSON(t, "-addr", addr, "-domain", "bench", "-rate", "5000", "-n", "50", "-warmup", "0")
	if r.Requests != 50 || r.Schedule.Intended != 50 {
		t.Fatalf("-n 50: %+v", r.Schedule)
	}
}

func TestRunInterrupted(t *testing.T) {
	addr, _ := startFake(t)
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	var errw syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", addr, "-domain", "bench", "-duration", "1m", "-warmup", "0", "-c", "2"}, &out, &errw)
	}()
	for !strings.Contains(errw.String(), "measuring") {
		select {
		case err := <-done:
			t.Fatalf("ended early: %v %s", err, errw.String())
		default:
		}
		// errw is only written before the run starts; poll until then.
		runtimeGosched()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "INTERRUPTED") || strings.Contains(out.String(), "Canceled") {
		t.Fatalf("%s", out.String())
	}
}

func TestRunRefuses(t *testing.T) {
	addr, _ := startFake(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-addr", addr}, "unbounded run is refused"},
		{[]string{"-addr", "10.1.2.3:8081", "-n", "1"}, "non-loopback"},
		{[]string{"-addr", "example.com:8081", "-n", "1"}, "non-loopback"},
		{[]string{"-addr", addr, "-n", "1", "-redis-addr", "192.168.0.1:6379"}, "non-loopback"},
		{[]string{"-addr", addr, "-duration", "11m"}, "at most 10m"},
		{[]string{"-addr", addr, "-n", "1", "-dist", "pareto"}, "-dist"},
		{[]string{"-addr", addr, "-n", "1", "-descriptors", "5"}, "-descriptors 5"},
		{[]string{"-addr", addr, "-n", "1", "-descriptors", "2", "-d", "a=b"}, "exclude each other"},
		{[]string{"-addr", addr, "-n", "1", "-d", "a"}, "not key=value"},
		{[]string{"-addr", addr, "-n", "1", "-c", "0"}, "-c 0"},
		{[]string{"-addr", addr, "-n", "1", "-client", "h2"}, "flag provided but not defined: -client"}, // grpc-go's is the only client
		{[]string{"-addr", addr, "-n", "1", "-server-pid", "x"}, "bad pid"},
		{[]string{"-addr", addr, "-n", "1", "extra"}, "unexpected arguments"},
		{[]string{"-addr", addr, "-n", "1", "-domain", "other"}, "preflight"},
		{[]string{"-addr", addr, "-n", "1", "-domain", "bench", "-server-pid", "999999999"}, "-server-pid 999999999"},
	} {
		var out, errw bytes.Buffer
		err := run(context.Background(), tc.args, &out, &errw)
		if err == nil || !strings.Contains(err.Error()+errw.String(), tc.want) {
			t.Errorf("%v: got %v, want %q", tc.args, err, tc.want)
		}
	}
}

func runtimeGosched() { time.Sleep(time.Millisecond) }

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
