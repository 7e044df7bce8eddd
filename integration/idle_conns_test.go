package integration

import (
	"context"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// h2Preface is an HTTP/2 client's connection preface: the magic, then an
// empty SETTINGS frame. A gRPC server takes the connection as established.
var h2Preface = append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)

// raiseNoFile raises the soft file-descriptor limit of the test process
// (and so of the rls it starts) to at least n, up to the hard limit.
func raiseNoFile(t *testing.T, n uint64) {
	t.Helper()
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
	if r.Cur >= n {
		return
	}
	r.Cur = min(n, r.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur < n {
		t.Skipf("cannot raise RLIMIT_NOFILE to %d (hard limit %d): %v", n, r.Max, err)
	}
}

// TestIdleConnectionsMakeRoom: 2,000 connections on each port that send
// the HTTP/2 preface and nothing else, at the default flags (--max-conns
// 1000 per port), do not shut new clients out: three new gRPC clients in a
// row each connect and get an answer within 1 s, and the idle connections
// closed to make room are counted.
func TestIdleConnectionsMakeRoom(t *testing.T) {
	light(t)
	const perPort = 2000
	raiseNoFile(t, 3*perPort+1000)
	p := startRLSFast(t, "../config")

	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	open := func(addr string) {
		var wg sync.WaitGroup
		work := make(chan struct{})
		for range 32 {
			wg.Go(func() {
				for range work {
					c, err := net.DialTimeout("tcp", addr, 5*time.Second)
					if err != nil {
						continue // refused or reset: counted below by what rls reports
					}
					_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
					_, _ = c.Write(h2Preface)
					mu.Lock()
					held = append(held, c)
					mu.Unlock()
				}
			})
		}
		for range perPort {
			work <- struct{}{}
		}
		close(work)
		wg.Wait()
	}
	began := time.Now()
	open(p.GRPCAddr)
	open(p.HTTPAddr)
	t.Logf("%d idle connections opened on each port in %v", perPort, time.Since(began).Round(time.Millisecond))
	m := series(scrape(t, p))
	if got := m[`rls_connections_open{port="grpc-addr"}`]; got < 900 {
		t.Logf("only %v connections open on the gRPC port before the clients (cap 1000)", got)
	}

	for i := range 3 {
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx,
			&rlsv3.RateLimitRequest{Domain: "example", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key", "idle-test")}})
		cancel()
		conn.Close()
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("new client %d among %d idle connections: %v %v after %v", i+1, perPort, r, err, time.Since(start))
		}
	}
	m = series(scrape(t, p))
	evicted := m[`rls_connections_closed_total{port="grpc-addr",reason="idle_evicted"}`]
	noCall := m[`rls_connections_closed_total{port="grpc-addr",reason="no_call"}`]
	if evicted < 3 || evicted+noCall < perPort-1000 {
		t.Errorf("gRPC port: %v idle connections evicted and %v closed without a call; want at least 3 evicted and %d in all",
			evicted, noCall, perPort-1000)
	}
	if got := m[`rls_connections_open{port="grpc-addr"}`]; got > 1000 {
		t.Errorf("%v connections open on the gRPC port, over its cap of 1000", got)
	}
	if got := m[`rls_connections_refused_total{port="grpc-addr"}`]; got != 0 {
		t.Errorf("%v connections refused on the gRPC port, where every idle one could make room", got)
	}
	t.Logf("gRPC port: %v evicted, %v closed without a call; HTTP port: %v evicted, %v closed without a call", evicted, noCall,
		m[`rls_connections_closed_total{port="http-addr",reason="idle_evicted"}`], m[`rls_connections_closed_total{port="http-addr",reason="no_call"}`])
}
