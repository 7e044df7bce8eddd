package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	common "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// h2TestRLS is a RateLimitService whose behaviour each test supplies.
type h2TestRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	fn func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)
}

func (s *h2TestRLS) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.fn(ctx, req)
}

func startH2GRPC(tb testing.TB, fn func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error), opts ...grpc.ServerOption) (string, *grpc.Server) {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(srv, &h2TestRLS{fn: fn})
	go srv.Serve(lis)
	tb.Cleanup(srv.Stop)
	return lis.Addr().String(), srv
}

func dialH2T(tb testing.TB, addr string) *h2conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := dialH2(ctx, addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// pending reports the open streams, for leak checks.
func (c *h2conn) pending() (calls int, active uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls), c.active
}

func checkNoPending(t *testing.T, c *h2conn) {
	t.Helper()
	if n, a := c.pending(); n != 0 || a != 0 {
		t.Errorf("pending calls %d, active streams %d; want 0, 0", n, a)
	}
}

func testReq(domain string, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{
		Domain: domain,
		Descriptors: []*common.RateLimitDescriptor{{
			Entries: []*common.RateLimitDescriptor_Entry{{Key: "k", Value: value}},
		}},
		HitsAddend: 1,
	}
}

func mustMarshal(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// call makes one call with a 10 s safety ctx, so a hang fails the test
// instead of blocking it.
func (c *h2conn) testCall(tb testing.TB, req *rlsv3.RateLimitRequest, timeout time.Duration) (*rlsv3.RateLimitResponse, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := c.Invoke(ctx, method, mustMarshal(tb, req), timeout, nil)
	if err != nil {
		return nil, err
	}
	resp := &rlsv3.RateLimitResponse{}
	if err := proto.Unmarshal(out, resp); err != nil {
		tb.Fatalf("unmarshal response: %v", err)
	}
	return resp, nil
}

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v (code %v), want code %v", err, status.Code(err), code)
	}
}

func TestH2RoundTrip(t *testing.T) {
	var seen atomic.Pointer[string]
	addr, _ := startH2GRPC(t, func(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		d := req.Domain + "/" + req.Descriptors[0].Entries[0].Value
		seen.Store(&d)
		return &rlsv3.RateLimitResponse{
			OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
				Code:           rlsv3.RateLimitResponse_OVER_LIMIT,
				LimitRemaining: 7,
			}},
		}, nil
	})
	c := dialH2T(t, addr)
	for i := range 3 { // later calls use HPACK-indexed headers both ways
		resp, err := c.testCall(t, testReq("dom", fmt.Sprint("v", i)), 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := *seen.Load(); got != fmt.Sprint("dom/v", i) {
			t.Errorf("server saw %q", got)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || len(resp.Statuses) != 1 ||
			resp.Statuses[0].LimitRemaining != 7 {
			t.Errorf("response %v", resp)
		}
	}
	// dst is reused: the message is appended to dst[:0].
	dst := make([]byte, 3, 1024)
	out, err := c.Invoke(context.Background(), method, mustMarshal(t, testReq("dom", "x")), 0, dst)
	if err != nil {
		t.Fatal(err)
	}
	if &out[0] != &dst[:1][0] {
		t.Error("response not appended into dst's array")
	}
	// A path too long for one frame goes out as HEADERS + CONTINUATION;
	// grpc-go parses it and answers Unimplemented.
	_, err = c.Invoke(context.Background(), "/"+strings.Repeat("p", 40<<10), mustMarshal(t, testReq("dom", "x")), 0, nil)
	wantCode(t, err, codes.Unimplemented)
	checkNoPending(t, c)
}

func TestH2ErrorStatus(t *testing.T) {
	addr, _ := startH2GRPC(t, func(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		switch req.Domain {
		case "pct":
			return nil, status.Error(codes.InvalidArgument, "bad: 100%")
		case "utf8":
			return nil, status.Error(codes.FailedPrecondition, "naïve ✓ %zz\r\n")
		}
		return nil, status.Error(codes.ResourceExhausted, "")
	})
	c := dialH2T(t, addr)
	for _, tc := range []struct {
		domain string
		code   codes.Code
		msg    string
	}{
		{"pct", codes.InvalidArgument, "bad: 100%"},
		{"utf8", codes.FailedPrecondition, "naïve ✓ %zz\r\n"},
		{"empty", codes.ResourceExhausted, ""},
	} {
		_, err := c.testCall(t, testReq(tc.domain, "v"), 0)
		st, _ := status.FromError(err)
		if st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("%s: got code %v message %q, want %v %q", tc.domain, st.Code(), st.Message(), tc.code, tc.msg)
		}
	}
	checkNoPending(t, c)
}

func TestDecodeGRPCMessage(t *testing.T) {
	for in, want := range map[string]string{
		"":               "",
		"plain":          "plain",
		"100%25":         "100%",
		"a%20b%e2%9c%93": "a b✓",
		"%":              "%",
		"%2":             "%2",
		"x%zz":           "x%zz",
		"%25%":           "%%",
		"50%":            "50%",
	} {
		if got := decodeGRPCMessage(in); got != want {
			t.Errorf("decodeGRPCMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestEncodeGRPCTimeout(t *testing.T) {
	for d, want := range map[time.Duration]string{
		1:                            "1n",
		99999999:                     "99999999n",
		100 * time.Millisecond:       "100000u",
		time.Second:                  "1000000u",
		1500 * time.Millisecond:      "1500000u",
		100*time.Second + 1:          "100001m", // rounded up
		27 * time.Hour:               "97200000m",
		28 * time.Hour:               "100800S",
		30000 * time.Hour:            "1800000M",
		time.Duration(1<<63 - 1):     "2562048H",
		99999999*time.Second + 1:     "1666667M",
		100000000 * time.Microsecond: "100000m",
	} {
		if got := encodeGRPCTimeout(d); got != want {
			t.Errorf("encodeGRPCTimeout(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestH2Timeout(t *testing.T) {
	addr, _ := startH2GRPC(t, func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		switch req.Domain {
		case "deadline":
			dl, ok := ctx.Deadline()
			if !ok {
				return nil, status.Error(codes.InvalidArgument, "no deadline")
			}
			if rem := time.Until(dl); rem <= 0 || rem > 3*time.Second {
				return nil, status.Errorf(codes.InvalidArgument, "deadline in %v", rem)
			}
			return &rlsv3.RateLimitResponse{}, nil
		case "wait": // honours its ctx
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(5 * time.Second):
				return &rlsv3.RateLimitResponse{}, nil
			}
		case "sleep": // ignores its ctx
			time.Sleep(time.Second)
			return &rlsv3.RateLimitResponse{}, nil
		}
		return nil, status.Error(codes.Unimplemented, req.Domain)
	})
	c := dialH2T(t, addr)

	if _, err := c.testCall(t, testReq("deadline", "v"), 3*time.Second); err != nil {
		t.Fatalf("deadline check: %v", err)
	}
	// Without a timeout the server sees no deadline.
	_, err := c.testCall(t, testReq("deadline", "v"), 0)
	wantCode(t, err, codes.InvalidArgument)

	// The server enforces grpc-timeout.
	start := time.Now()
	_, err = c.testCall(t, testReq("wait", "v"), 100*time.Millisecond)
	wantCode(t, err, codes.DeadlineExceeded)
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("server deadline took %v", el)
	}

	// The client's ctx ends first.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err = c.Invoke(ctx, method, mustMarshal(t, testReq("sleep", "v")), 100*time.Millisecond, nil)
	wantCode(t, err, codes.DeadlineExceeded)
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("client deadline took %v", el)
	}
	if _, err := c.testCall(t, testReq("deadline", "v"), time.Second); err != nil {
		t.Fatalf("after deadlines: %v", err)
	}
	checkNoPending(t, c)
}

func TestH2Cancel(t *testing.T) {
	started := make(chan struct{}, 1)
	serverCanceled := make(chan struct{}, 1)
	addr, _ := startH2GRPC(t, func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		if req.Domain == "block" {
			started <- struct{}{}
			<-ctx.Done()
			serverCanceled <- struct{}{}
			return nil, ctx.Err()
		}
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	})
	c := dialH2T(t, addr)

	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-started
			cancel()
		}()
		start := time.Now()
		_, err := c.Invoke(ctx, method, mustMarshal(t, testReq("block", "v")), 0, nil)
		cancel()
		wantCode(t, err, codes.Canceled)
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("cancel took %v", el)
		}
		select { // RST_STREAM(CANCEL) reached the server
		case <-serverCanceled:
		case <-time.After(5 * time.Second):
			t.Fatalf("call %d: server handler never saw the cancellation", i)
		}
		checkNoPending(t, c)
		resp, err := c.testCall(t, testReq("ok", "v"), 0)
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call after cancel: %v %v", resp, err)
		}
	}
	// An already-ended ctx fails at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Invoke(ctx, method, nil, 0, nil)
	wantCode(t, err, codes.Canceled)
	checkNoPending(t, c)
}

func TestH2Concurrent(t *testing.T) {
	addr, _ := startH2GRPC(t, func(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		return &rlsv3.RateLimitResponse{
			OverallCode: rlsv3.RateLimitResponse_OK,
			RawBody:     []byte(req.Domain + "|" + req.Descriptors[0].Entries[0].Value),
		}, nil
	})
	c := dialH2T(t, addr)
	const goroutines, calls = 50, 400
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			var dst []byte
			resp := &rlsv3.RateLimitResponse{}
			for i := range calls {
				domain, value := fmt.Sprint("d", g), fmt.Sprint(i, strings.Repeat("x", i%50))
				req, _ := proto.Marshal(testReq(domain, value))
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				out, err := c.Invoke(ctx, method, req, time.Minute, dst)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("goroutine %d call %d: %w", g, i, err)
					return
				}
				dst = out
				if err := proto.Unmarshal(out, resp); err != nil {
					errs <- err
					return
				}
				if want := domain + "|" + value; string(resp.RawBody) != want {
					errs <- fmt.Errorf("goroutine %d call %d: got %q, want %q", g, i, resp.RawBody, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	checkNoPending(t, c)
}

func TestH2FlowControl(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 200<<10/16) // 200 KiB
	addr, _ := startH2GRPC(t, func(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		v := req.Descriptors[0].Entries[0].Value
		if req.Domain == "bigresp" {
			return &rlsv3.RateLimitResponse{RawBody: big}, nil
		}
		return &rlsv3.RateLimitResponse{RawBody: fmt.Appendf(nil, "%d:%s", len(v), v[len(v)-8:])}, nil
	},
		grpc.MaxRecvMsgSize(1<<20),
		// Static 64 KiB windows: no BDP growth, so a 100 KiB request
		// needs the server's WINDOW_UPDATEs.
		grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
	c := dialH2T(t, addr)

	for i := range 20 {
		resp, err := c.testCall(t, testReq("bigresp", "v"), 0)
		if err != nil {
			t.Fatalf("big response %d: %v", i, err)
		}
		if !bytes.Equal(resp.RawBody, big) {
			t.Fatalf("big response %d: %d bytes, mismatch", i, len(resp.RawBody))
		}
	}
	bigReq := func(i int) *rlsv3.RateLimitRequest {
		return testReq("bigreq", strings.Repeat("v", 100<<10)+fmt.Sprintf("%08d", i))
	}
	for i := range 10 {
		resp, err := c.testCall(t, bigReq(i), 0)
		if err != nil {
			t.Fatalf("big request %d: %v", i, err)
		}
		if want := fmt.Sprintf("%d:%08d", 100<<10+8, i); string(resp.RawBody) != want {
			t.Fatalf("big request %d: got %q want %q", i, resp.RawBody, want)
		}
	}
	// Both directions at once, concurrently: callers queue on the windows.
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for i := range 5 {
				if g%2 == 0 {
					resp, err := c.testCall(t, bigReq(g*100+i), 0)
					if err != nil || string(resp.RawBody) != fmt.Sprintf("%d:%08d", 100<<10+8, g*100+i) {
						t.Errorf("concurrent big request: %v %v", err, resp)
						return
					}
				} else {
					resp, err := c.testCall(t, testReq("bigresp", "v"), 0)
					if err != nil || !bytes.Equal(resp.RawBody, big) {
						t.Errorf("concurrent big response: %v", err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	checkNoPending(t, c)
}

func TestH2MaxConcurrentStreams(t *testing.T) {
	var cur, peak atomic.Int32
	addr, _ := startH2GRPC(t, func(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		n := cur.Add(1)
		defer cur.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(5 * time.Millisecond)
		return &rlsv3.RateLimitResponse{RawBody: []byte(req.Domain)}, nil
	}, grpc.MaxConcurrentStreams(2))
	c := dialH2T(t, addr)
	var wg sync.WaitGroup
	for g := range 10 {
		wg.Go(func() {
			for i := range 5 {
				d := fmt.Sprint(g, "-", i)
				resp, err := c.testCall(t, testReq(d, "v"), 0)
				if err != nil || string(resp.RawBody) != d {
					t.Errorf("%s: %v %v", d, resp, err) // REFUSED_STREAM would show here
					return
				}
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > 2 {
		t.Errorf("server saw %d concurrent calls, limit 2", p)
	}
	checkNoPending(t, c)
}

func TestH2ServerStop(t *testing.T) {
	var inflight atomic.Int32
	addr, srv := startH2GRPC(t, func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		if req.Domain == "block" {
			inflight.Add(1)
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return &rlsv3.RateLimitResponse{}, nil
	})
	c := dialH2T(t, addr)
	if _, err := c.testCall(t, testReq("ok", "v"), 0); err != nil {
		t.Fatal(err)
	}
	const n = 5
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.testCall(t, testReq("block", "v"), 0)
			errs <- err
		}()
	}
	for deadline := time.Now().Add(5 * time.Second); inflight.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("calls never reached the server")
		}
	}
	srv.Stop()
	for range n {
		wantCode(t, <-errs, codes.Unavailable)
	}
	_, err := c.testCall(t, testReq("ok", "v"), 0)
	wantCode(t, err, codes.Unavailable)
	checkNoPending(t, c)
	if err := c.Close(); err != nil {
		t.Error(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := dialH2(ctx, addr); status.Code(err) != codes.Unavailable {
		t.Errorf("dial stopped server: %v", err)
	}
}

func TestH2GracefulStop(t *testing.T) {
	release := make(chan struct{})
	var inflight atomic.Int32
	addr, srv := startH2GRPC(t, func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		if req.Domain == "block" {
			inflight.Add(1)
			<-release
		}
		return &rlsv3.RateLimitResponse{RawBody: []byte(req.Domain)}, nil
	})
	c := dialH2T(t, addr)
	errc := make(chan error, 1)
	go func() {
		resp, err := c.testCall(t, testReq("block", "v"), 0)
		if err == nil && string(resp.RawBody) != "block" {
			err = fmt.Errorf("got %q", resp.RawBody)
		}
		errc <- err
	}()
	for inflight.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		g := c.goaway
		c.mu.Unlock()
		if g {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no GOAWAY seen")
		}
	}
	_, err := c.testCall(t, testReq("new", "v"), 0)
	wantCode(t, err, codes.Unavailable) // refused after GOAWAY
	close(release)
	if err := <-errc; err != nil {
		t.Fatalf("in-flight call during graceful stop: %v", err)
	}
	<-stopped
	checkNoPending(t, c)
}

func TestH2Close(t *testing.T) {
	var inflight atomic.Int32
	addr, _ := startH2GRPC(t, func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		inflight.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	c := dialH2T(t, addr)
	errc := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := c.testCall(t, testReq("block", "v"), 0)
			errc <- err
		}()
	}
	for inflight.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs")
	}
	for range 3 {
		wantCode(t, <-errc, codes.Unavailable)
	}
	_, err := c.testCall(t, testReq("x", "v"), 0)
	wantCode(t, err, codes.Unavailable)
	if err := c.Close(); err != nil { // idempotent
		t.Error(err)
	}
}

// rawH2Server is a hand-written HTTP/2 server for the cases a grpc-go
// server cannot produce: protocol violations, tiny windows, and a near
// free peer for measuring the client alone. Each connection is served by
// one goroutine. The request message picks the response (see respond).
type rawH2Server struct {
	tb          testing.TB
	ln          net.Listener
	streamWin   uint32 // SETTINGS_INITIAL_WINDOW_SIZE we advertise; 0: 1<<30
	maxStreams  uint32 // SETTINGS_MAX_CONCURRENT_STREAMS; 0: not sent
	noReplenish bool   // never send stream WINDOW_UPDATEs
	decode      bool   // decode and check request headers
	canned      []byte // reply to unknown requests with this, else echo

	mu        sync.Mutex
	conns     []net.Conn
	violation string
	timeout   string // last grpc-timeout seen (decode)
	wg        sync.WaitGroup

	streamUpdates atomic.Int64 // stream WINDOW_UPDATEs sent
	pingAcks      atomic.Int64
}

func startRaw(tb testing.TB, s *rawH2Server) *rawH2Server {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s.tb, s.ln = tb, ln
	s.wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, nc)
			s.mu.Unlock()
			s.wg.Go(func() { s.serve(nc) })
		}
	})
	tb.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, nc := range s.conns {
			nc.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
		if v := s.failure(); v != "" {
			tb.Errorf("raw server: %s", v)
		}
	})
	return s
}

func (s *rawH2Server) addr() string { return s.ln.Addr().String() }

func (s *rawH2Server) fail(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.violation == "" {
		s.violation = fmt.Sprintf(format, args...)
	}
}

func (s *rawH2Server) failure() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.violation
}

type rawConn struct {
	s   *rawH2Server
	fr  *http2.Framer
	bw  *bufio.Writer
	enc *hpack.Encoder
	hb  bytes.Buffer
	win uint32
}

func (s *rawH2Server) serve(nc net.Conn) {
	br := bufio.NewReaderSize(nc, 32<<10)
	bw := bufio.NewWriterSize(nc, 32<<10)
	pre := make([]byte, len(h2Preface))
	if _, err := io.ReadFull(br, pre); err != nil || string(pre) != h2Preface {
		s.fail("bad preface %q: %v", pre, err)
		return
	}
	rc := &rawConn{s: s, fr: http2.NewFramer(bw, br), bw: bw, win: s.streamWin}
	rc.enc = hpack.NewEncoder(&rc.hb)
	fr := rc.fr
	fr.SetReuseFrames()
	fr.SetMaxReadFrameSize(16384) // we never raise SETTINGS_MAX_FRAME_SIZE
	if s.decode {
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	}
	if rc.win == 0 {
		rc.win = 1 << 30
	}
	settings := []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: rc.win}}
	if s.maxStreams > 0 {
		settings = append(settings, http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: s.maxStreams})
	}
	fr.WriteSettings(settings...)
	fr.WriteWindowUpdate(0, 1<<30-65535)
	bw.Flush()

	var (
		pending  = map[uint32][]byte{} // partial request messages
		recvd    = map[uint32]uint32{} // unreplenished stream bytes
		open     uint32
		connRecv uint32
		sawAck   bool
	)
	openStream := func(id uint32) {
		if open++; s.maxStreams > 0 && open > s.maxStreams {
			s.fail("%d open streams, limit %d", open, s.maxStreams)
		}
	}
	closeStream := func(id uint32) {
		if _, ok := recvd[id]; ok {
			delete(recvd, id)
			delete(pending, id)
			open--
		}
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if err != io.EOF && !strings.Contains(err.Error(), "use of closed") && !strings.Contains(err.Error(), "reset by peer") {
				s.fail("read: %v", err)
			}
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				sawAck = true
			} else {
				fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if f.IsAck() {
				s.pingAcks.Add(1)
			} else {
				fr.WritePing(true, f.Data)
			}
		case *http2.MetaHeadersFrame:
			s.checkHeaders(f)
			recvd[f.StreamID] = 0
			openStream(f.StreamID)
		case *http2.HeadersFrame:
			recvd[f.StreamID] = 0
			openStream(f.StreamID)
		case *http2.DataFrame:
			id, n := f.StreamID, f.Length
			if !sawAck && s.streamWin > 0 {
				// Only a client that honours our SETTINGS can be held to them.
				s.fail("DATA before SETTINGS ACK")
			}
			if connRecv += n; connRecv >= 1<<29 {
				fr.WriteWindowUpdate(0, connRecv)
				connRecv = 0
			}
			got, ok := recvd[id]
			if !ok {
				break // reset or answered stream
			}
			if got += n; got > rc.win {
				s.fail("stream %d: %d bytes sent into a %d-byte window", id, got, rc.win)
			}
			if got == rc.win && !s.noReplenish {
				fr.WriteWindowUpdate(id, got)
				s.streamUpdates.Add(1)
				got = 0
			}
			recvd[id] = got
			if !f.StreamEnded() {
				pending[id] = append(pending[id], f.Data()...)
				break
			}
			msg := f.Data()
			if p, ok := pending[id]; ok {
				msg = append(p, msg...)
			}
			closeStream(id)
			if len(msg) < 5 {
				s.fail("stream %d: request of %d bytes", id, len(msg))
				break
			}
			rc.respond(id, msg[5:])
		case *http2.RSTStreamFrame:
			closeStream(f.StreamID)
		}
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return
			}
		}
	}
}

func (s *rawH2Server) checkHeaders(f *http2.MetaHeadersFrame) {
	want := map[string]string{":method": "POST", ":scheme": "http", ":path": method,
		":authority": s.addr(), "content-type": "application/grpc", "te": "trailers"}
	for _, hf := range f.Fields {
		if hf.Name == "grpc-timeout" {
			s.mu.Lock()
			s.timeout = hf.Value
			s.mu.Unlock()
			continue
		}
		if w, ok := want[hf.Name]; !ok || w != hf.Value {
			s.fail("unexpected request header %s: %q", hf.Name, hf.Value)
		}
		delete(want, hf.Name)
	}
	if len(want) > 0 {
		s.fail("missing request headers %v", want)
	}
	if f.StreamEnded() || !f.HeadersEnded() {
		s.fail("request HEADERS flags %v", f.Flags)
	}
}

// block HPACK-encodes fields: name, value, name, value...
func (rc *rawConn) block(kv ...string) []byte {
	rc.hb.Reset()
	for i := 0; i < len(kv); i += 2 {
		rc.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return rc.hb.Bytes()
}

func (rc *rawConn) headers(id uint32, end bool, block []byte) {
	rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: end, EndHeaders: true})
}

func (rc *rawConn) okHeaders(id uint32) {
	rc.headers(id, false, rc.block(":status", "200", "content-type", "application/grpc"))
}

func (rc *rawConn) trailers(id uint32, kv ...string) {
	rc.headers(id, true, rc.block(kv...))
}

func grpcFrame(flag byte, msg []byte) []byte {
	n := len(msg)
	return append([]byte{flag, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, msg...)
}

// respond answers stream id according to the request message.
func (rc *rawConn) respond(id uint32, req []byte) {
	fr := rc.fr
	switch string(req) {
	case "trailers-only":
		rc.trailers(id, ":status", "200", "content-type", "application/grpc+proto",
			"grpc-status", "5", "grpc-message", "not%20found %E2%9C%93")
	case "http-503":
		rc.trailers(id, ":status", "503", "content-type", "text/plain")
	case "bad-ctype":
		rc.headers(id, false, rc.block(":status", "200", "content-type", "text/html"))
	case "no-status":
		rc.okHeaders(id)
		fr.WriteData(id, false, grpcFrame(0, req))
		rc.trailers(id, "x-other", "1")
	case "bad-status":
		rc.okHeaders(id)
		fr.WriteData(id, false, grpcFrame(0, req))
		rc.trailers(id, "grpc-status", "x1")
	case "compressed":
		rc.okHeaders(id)
		fr.WriteData(id, false, grpcFrame(1, req))
		rc.trailers(id, "grpc-status", "0")
	case "split":
		rc.okHeaders(id)
		b := grpcFrame(0, req)
		fr.WriteData(id, false, b[:2])
		fr.WriteData(id, false, b[2:6])
		for _, ch := range b[6:] {
			fr.WriteData(id, false, []byte{ch})
		}
		fr.WriteData(id, false, nil)
		rc.trailers(id, "grpc-status", "0")
	case "two-msgs":
		rc.okHeaders(id)
		fr.WriteData(id, false, append(grpcFrame(0, req), grpcFrame(0, req)...))
		rc.trailers(id, "grpc-status", "0")
	case "no-msg":
		rc.okHeaders(id)
		rc.trailers(id, "grpc-status", "0")
	case "short-msg":
		rc.okHeaders(id)
		fr.WriteData(id, false, grpcFrame(0, req)[:8])
		rc.trailers(id, "grpc-status", "0")
	case "rst-refused":
		fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
	case "rst-cancel":
		fr.WriteRSTStream(id, http2.ErrCodeCancel)
	case "rst-internal":
		rc.okHeaders(id)
		fr.WriteRSTStream(id, http2.ErrCodeInternal)
	case "data-end":
		rc.okHeaders(id)
		fr.WriteData(id, true, grpcFrame(0, req))
	case "headers-twice":
		rc.okHeaders(id)
		rc.okHeaders(id)
	case "data-first":
		fr.WriteData(id, false, grpcFrame(0, req))
	case "continuation":
		b := bytes.Clone(rc.block(":status", "200", "content-type", "application/grpc", "x-pad", strings.Repeat("p", 100)))
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: b[:3]})
		fr.WriteContinuation(id, false, b[3:10])
		fr.WriteContinuation(id, true, b[10:])
		fr.WriteData(id, false, grpcFrame(0, req))
		b = bytes.Clone(rc.block("grpc-status", "0", "grpc-message", ""))
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: b[:1], EndStream: true})
		fr.WriteContinuation(id, true, b[1:])
	case "padded":
		rc.okHeaders(id)
		fr.WriteDataPadded(id, false, grpcFrame(0, req), make([]byte, 200))
		rc.trailers(id, "grpc-status", "0")
	case "ping":
		fr.WritePing(false, [8]byte{1, 2, 3})
		rc.okHeaders(id)
		fr.WriteData(id, false, grpcFrame(0, req))
		rc.trailers(id, "grpc-status", "0")
	case "noise": // frames for unknown streams and of unknown type, then a normal reply
		fr.WriteData(id+100, false, []byte("junk"))
		fr.WriteRSTStream(id+200, http2.ErrCodeCancel)
		fr.WriteWindowUpdate(id+300, 10)
		fr.WriteRawFrame(0xfa, 0, id, []byte("?"))
		rc.okHeaders(id)
		fr.WriteData(id, false, grpcFrame(0, req))
		rc.trailers(id, "grpc-status", "0")
	case "grow-window":
		rc.win = 1 << 20 // applies to the streams the client opens after acking
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: rc.win})
		rc.okHeaders(id)
		fr.WriteData(id, false, grpcFrame(0, req))
		rc.trailers(id, "grpc-status", "0")
	case "conn-win-overflow":
		fr.WriteWindowUpdate(0, 1<<31-1)
	case "stream-win-overflow":
		fr.WriteWindowUpdate(id, 1<<31-1)
		rc.okHeaders(id) // ignored: the client has reset the stream
		fr.WriteData(id, false, grpcFrame(0, req))
		rc.trailers(id, "grpc-status", "0")
	case "push":
		fr.WritePushPromise(http2.PushPromiseParam{StreamID: id, PromiseID: 2, EndHeaders: true,
			BlockFragment: rc.block(":method", "GET", ":path", "/", ":scheme", "http", ":authority", "x")})
	case "goaway":
		fr.WriteGoAway(id-2, http2.ErrCodeNo, []byte("bye"))
	default:
		msg := req
		if rc.s.canned != nil {
			msg = rc.s.canned
		}
		rc.okHeaders(id)
		n := len(msg)
		// One DATA frame; grpcFrame would allocate.
		rc.hb.Reset()
		rc.hb.Write([]byte{0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
		rc.hb.Write(msg)
		fr.WriteData(id, false, rc.hb.Bytes())
		rc.trailers(id, "grpc-status", "0")
	}
}

func TestH2ProtocolCases(t *testing.T) {
	s := startRaw(t, &rawH2Server{decode: true})
	c := dialH2T(t, s.addr())
	invoke := func(req string, timeout time.Duration) ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return c.Invoke(ctx, method, []byte(req), timeout, nil)
	}
	for _, tc := range []struct {
		req  string
		code codes.Code
		msg  string // substring of the error message
	}{
		{"echo me", codes.OK, ""},
		{"trailers-only", codes.NotFound, "not found ✓"},
		{"http-503", codes.Internal, "HTTP status"},
		{"bad-ctype", codes.Internal, "content-type"},
		{"no-status", codes.Internal, "grpc-status"},
		{"bad-status", codes.Internal, "malformed grpc-status"},
		{"compressed", codes.Internal, "compressed"},
		{"split", codes.OK, ""},
		{"two-msgs", codes.Internal, "cardinality"},
		{"no-msg", codes.Internal, "cardinality"},
		{"short-msg", codes.Internal, "inside a message"},
		{"rst-refused", codes.Unavailable, "REFUSED_STREAM"},
		{"rst-internal", codes.Internal, "INTERNAL_ERROR"},
		{"rst-cancel", codes.Internal, "CANCEL"}, // no grpc-timeout expired
		{"data-end", codes.Internal, "without sending trailers"},
		{"headers-twice", codes.Internal, "second HEADERS"},
		{"data-first", codes.Internal, "DATA before"},
		{"continuation", codes.OK, ""},
		{"padded", codes.OK, ""},
		{"ping", codes.OK, ""},
		{"noise", codes.OK, ""},
		{"", codes.OK, ""}, // empty request and response messages
		{"echo again", codes.OK, ""},
	} {
		out, err := invoke(tc.req, 0)
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%q: got %v (%v), want %v containing %q", tc.req, status.Code(err), err, tc.code, tc.msg)
			continue
		}
		if err == nil && string(out) != tc.req {
			t.Errorf("%q: response %q", tc.req, out)
		}
	}
	// CANCEL after the grpc-timeout has passed: the server's deadline.
	_, err := invoke("rst-cancel", time.Nanosecond)
	wantCode(t, err, codes.DeadlineExceeded)
	if s.pingAcks.Load() != 1 {
		t.Errorf("ping acks %d, want 1", s.pingAcks.Load())
	}
	if _, err := invoke("x", 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	if s.timeout != "1500000u" {
		t.Errorf("grpc-timeout sent %q", s.timeout)
	}
	s.mu.Unlock()
	checkNoPending(t, c)

	// GOAWAY: the unprocessed call and every later one are Unavailable.
	_, err = invoke("goaway", 0)
	wantCode(t, err, codes.Unavailable)
	_, err = invoke("x", 0)
	wantCode(t, err, codes.Unavailable)
	checkNoPending(t, c)
}

func TestH2StreamIDsExhausted(t *testing.T) {
	s := startRaw(t, &rawH2Server{})
	c := dialH2T(t, s.addr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Invoke(ctx, method, []byte("a"), 0, nil); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.nextID = 1<<31 - 1 // the last odd stream id
	c.mu.Unlock()
	if out, err := c.Invoke(ctx, method, []byte("b"), 0, nil); err != nil || string(out) != "b" {
		t.Fatalf("last stream id: %q %v", out, err)
	}
	_, err := c.Invoke(ctx, method, []byte("c"), 0, nil)
	wantCode(t, err, codes.Unavailable)
	checkNoPending(t, c)
}

// Connection-level violations fail the pending call with Internal; the
// connection is then closed and later calls are Unavailable. A stream-level
// one fails only its call.
func TestH2ConnErrors(t *testing.T) {
	s := startRaw(t, &rawH2Server{})
	for _, req := range []string{"conn-win-overflow", "push"} {
		t.Run(req, func(t *testing.T) {
			c := dialH2T(t, s.addr())
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := c.Invoke(ctx, method, []byte(req), 0, nil)
			wantCode(t, err, codes.Internal)
			_, err = c.Invoke(ctx, method, []byte("x"), 0, nil)
			wantCode(t, err, codes.Unavailable)
			checkNoPending(t, c)
		})
	}
	c := dialH2T(t, s.addr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Invoke(ctx, method, []byte("stream-win-overflow"), 0, nil)
	wantCode(t, err, codes.Internal)
	if out, err := c.Invoke(ctx, method, []byte("x"), 0, nil); err != nil || string(out) != "x" {
		t.Fatalf("after a stream error: %q %v", out, err)
	}
	checkNoPending(t, c)
}

// A peer with a 1000-byte stream window and at most 3 streams: requests of
// 10 KiB from 8 goroutines wait on both; the server checks neither limit
// is exceeded. Then a SETTINGS raising the window applies to new streams.
func TestH2SmallPeerWindow(t *testing.T) {
	s := startRaw(t, &rawH2Server{streamWin: 1000, maxStreams: 3})
	c := dialH2T(t, s.addr())
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 10 {
				req := fmt.Appendf(nil, "%d-%d-%s", g, i, strings.Repeat("r", 10<<10))
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				out, err := c.Invoke(ctx, method, req, 0, nil)
				cancel()
				if err != nil || !bytes.Equal(out, req) {
					t.Errorf("call %d-%d: %v, %d bytes back", g, i, err, len(out))
					return
				}
			}
		})
	}
	wg.Wait()
	if s.streamUpdates.Load() < 80*10 {
		t.Errorf("only %d stream WINDOW_UPDATEs; the window was not exercised", s.streamUpdates.Load())
	}
	checkNoPending(t, c)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Invoke(ctx, method, []byte("grow-window"), 0, nil); err != nil {
		t.Fatal(err)
	}
	// The client has applied the new window when it acked it; by the time
	// it has processed this response the SETTINGS (sent before) is in.
	before := s.streamUpdates.Load()
	req := bytes.Repeat([]byte("g"), 100<<10)
	for range 3 {
		if out, err := c.Invoke(ctx, method, req, 0, nil); err != nil || !bytes.Equal(out, req) {
			t.Fatalf("after growing the window: %v", err)
		}
	}
	if d := s.streamUpdates.Load() - before; d != 0 {
		t.Errorf("%d stream WINDOW_UPDATEs needed after the window grew to 1 MiB", d)
	}
	checkNoPending(t, c)
}

// Calls abandoned while waiting for send window or for a stream slot.
func TestH2CancelWhileBlocked(t *testing.T) {
	s := startRaw(t, &rawH2Server{streamWin: 1000, maxStreams: 1, noReplenish: true})
	c := dialH2T(t, s.addr())
	big := bytes.Repeat([]byte("b"), 5000)

	// Stuck on the stream window: the server never replenishes.
	errc := make(chan error, 1)
	ctx1, cancel1 := context.WithCancel(context.Background())
	go func() {
		_, err := c.Invoke(ctx1, method, big, 0, nil)
		errc <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if n, _ := c.pending(); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("first call never started")
		}
	}
	// Stuck on the single stream slot.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	start := time.Now()
	_, err := c.Invoke(ctx2, method, []byte("small"), 0, nil)
	wantCode(t, err, codes.DeadlineExceeded)
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("slot wait ended after %v", el)
	}
	cancel1()
	select {
	case err := <-errc:
		wantCode(t, err, codes.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("call blocked on the send window ignores its ctx")
	}
	checkNoPending(t, c)
	// The slot is free again and small calls fit the window.
	ctx3, cancel3 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel3()
	if out, err := c.Invoke(ctx3, method, []byte("small"), 0, nil); err != nil || string(out) != "small" {
		t.Fatalf("after cancellations: %q %v", out, err)
	}
	checkNoPending(t, c)
}

func TestH2DialErrors(t *testing.T) {
	// Nothing listening.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := dialH2(ctx, addr)
	wantCode(t, err, codes.Unavailable)

	// A server that accepts but never speaks HTTP/2: the ctx bounds the
	// handshake.
	ln, _ = net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err == nil {
			defer nc.Close()
			io.Copy(io.Discard, nc)
		}
	}()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	start := time.Now()
	_, err = dialH2(ctx2, ln.Addr().String())
	wantCode(t, err, codes.DeadlineExceeded)
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("handshake timeout took %v", el)
	}
}

// Benchmarks: b.RunParallel with 16 goroutines per CPU, so many calls are
// in flight as in a load run. allocs/op counts the whole process, server
// included.

var benchResp = &rlsv3.RateLimitResponse{
	OverallCode: rlsv3.RateLimitResponse_OK,
	Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
		Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 99,
	}},
}

func benchGRPCServer(b *testing.B) string {
	addr, _ := startH2GRPC(b, func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		return benchResp, nil
	})
	return addr
}

func benchH2(b *testing.B, addr string) {
	c := dialH2T(b, addr)
	req := mustMarshal(b, testReq("bench", "key-1"))
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var dst []byte
		ctx := context.Background()
		for pb.Next() {
			out, err := c.Invoke(ctx, method, req, time.Second, dst)
			if err != nil {
				b.Error(err)
				return
			}
			dst = out
		}
	})
}

func benchGRPC(b *testing.B, addr string) {
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(16<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	req := testReq("bench", "key-1")
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		resp := &rlsv3.RateLimitResponse{}
		for pb.Next() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := cc.Invoke(ctx, method, req, resp)
			cancel()
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkH2Invoke and BenchmarkGRPCInvoke call a grpc-go server in the
// same process: the figures include the server's CPU and allocations.
func BenchmarkH2Invoke(b *testing.B)   { benchH2(b, benchGRPCServer(b)) }
func BenchmarkGRPCInvoke(b *testing.B) { benchGRPC(b, benchGRPCServer(b)) }

// BenchmarkClientOnly calls the raw server, which costs next to nothing
// (about one allocation per call), so the figures are mostly the client's.
func BenchmarkClientOnly(b *testing.B) {
	canned := mustMarshal(b, benchResp)
	b.Run("h2", func(b *testing.B) { benchH2(b, startRaw(b, &rawH2Server{canned: canned}).addr()) })
	b.Run("grpc", func(b *testing.B) { benchGRPC(b, startRaw(b, &rawH2Server{canned: canned}).addr()) })
}
