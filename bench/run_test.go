package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
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
	// -timeout 30s: the counts below hold however slowly a busy machine
	// answers; the default 1 s deadline would turn slow calls into errors.
	r, log := runJSON(t, "-addr", addr, "-domain", "bench", "-n", "1000", "-c", "8", "-connections", "3",
		"-keys", "10", "-dist", "roundrobin", "-warmup", "20ms", "-server-pid", "1", "-timeout", "30s")
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
		"-warmup", "0", "-d", "api_key=%k;route=/x", "-keys", "100", "-dist", "zipf", "-zipf-s", "0.9", "-timeout", "30s")
	s := r.Schedule
	// How many of the 600 due a busy machine sends in time is a figure,
	// not a property: every one is either sent or counted behind.
	if r.Mode != "open" || s == nil || s.Intended != 600 || s.Sent+s.BehindAtEnd != 600 || r.Requests != s.Sent {
		t.Fatalf("schedule %+v, report %+v", s, r)
	}
	// The fake's answers: OVER_LIMIT for k0, Unavailable for k1, else OK.
	if r.OK+r.OverLimit+r.Errors["Unavailable"] != r.Requests || len(r.Errors) > 1 {
		t.Fatalf("OK %d, OVER_LIMIT %d, errors %v: not the fake's answers to %d requests", r.OK, r.OverLimit, r.Errors, r.Requests)
	}
	// It stops at its end, give or take what a loaded machine adds.
	if r.ElapsedSec < 0.29 || r.ElapsedSec > 30 {
		t.Fatalf("a 300ms run took %.3fs", r.ElapsedSec)
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
	errw := &signalWriter{want: "measuring", seen: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", addr, "-domain", "bench", "-duration", "1m", "-warmup", "0", "-c", "2"}, &out, errw)
	}()
	select {
	case <-errw.seen:
	case err := <-done:
		t.Fatalf("ended early: %v %s", err, errw.b.String())
	}
	cancel()
	// A one-minute run stops on the interruption, long before its end.
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop within 30s of its interruption")
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

// signalWriter keeps what one goroutine writes and closes seen once it
// holds want. Read b only after the writer is done.
type signalWriter struct {
	b    bytes.Buffer
	want string
	seen chan struct{}
}

func (s *signalWriter) Write(p []byte) (int, error) {
	had := strings.Contains(s.b.String(), s.want)
	n, err := s.b.Write(p)
	if !had && strings.Contains(s.b.String(), s.want) {
		close(s.seen)
	}
	return n, err
}
