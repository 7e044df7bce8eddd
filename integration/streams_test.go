package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/rlqs/rlqstest"
	"github.com/rls-project/rls/pkg/telemetry"
	"github.com/rls-project/rls/pkg/testkit"
)

// h2Stream opens a connection to addr and one gRPC stream on it to path,
// sending body (a gRPC message, or nothing when nil) and, with halfClose,
// ending its side. With zeroWindow the client's stream window is 0: rls
// can never send the stream a byte (a client that does not read). Frames
// from rls are read until the connection closes: SETTINGS and PING are
// acknowledged, the rest dropped.
func h2Stream(addr, path string, body []byte, halfClose, zeroWindow bool) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	var settings []http2.Setting
	if zeroWindow {
		settings = append(settings, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", addr},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	fr := http2.NewFramer(c, nil)
	err = func() error {
		if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
			return err
		}
		if err := fr.WriteSettings(settings...); err != nil {
			return err
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true,
			EndStream: halfClose && body == nil}); err != nil {
			return err
		}
		if body == nil {
			return nil
		}
		msg := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body))) // gRPC frame: uncompressed, length
		return fr.WriteData(1, halfClose, append(msg, body...))
	}()
	if err != nil {
		c.Close()
		return nil, err
	}
	go func() { // as an HTTP/2 client does: settings and pings acknowledged, the rest dropped
		rd := http2.NewFramer(c, c)
		for {
			f, err := rd.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = rd.WriteSettingsAck()
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					_ = rd.WritePing(true, f.Data)
				}
			}
		}
	}()
	return c, nil
}

// TestStreamsDoNotLockThePort: at the default --max-conns (1000), 1,000
// connections each holding a silent RLQS stream, and then 1,000 each
// holding a health Watch stream, do not keep new clients out: three new
// gRPC clients in turn each get a ShouldRateLimit answer within 1 s (the
// connections holding only streams make room as idle ones do). Then, with
// a stream whose client never reads held open as well, SIGTERM ends rls
// within its shutdown bound (10 s; streams and Watches ended first).
func TestStreamsDoNotLockThePort(t *testing.T) {
	light(t)
	const conns = 1000
	raiseNoFile(t, 3*conns+1000)
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
	open := func(path string, body []byte, halfClose bool) {
		var wg sync.WaitGroup
		work := make(chan struct{})
		for range 16 {
			wg.Go(func() {
				for range work {
					c, err := h2Stream(p.GRPCAddr, path, body, halfClose, false)
					if err != nil {
						continue // refused or reset: rls's metrics tell
					}
					mu.Lock()
					held = append(held, c)
					mu.Unlock()
				}
			})
		}
		for range conns {
			work <- struct{}{}
		}
		close(work)
		wg.Wait()
	}
	clients := func(phase string) {
		for i := range 3 {
			conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			r, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx,
				&rlsv3.RateLimitRequest{Domain: "example", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key", "streams-test")}})
			cancel()
			conn.Close()
			if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("%s: new client %d: %v %v after %v, want an answer within 1 s", phase, i+1, r, err, time.Since(start))
			}
		}
	}

	began := time.Now()
	open(rlqsv3.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName, nil, false) // silent: not even a report
	var m map[string]float64
	testkit.Eventually(5*time.Second, func() bool { // rls takes the last streams' headers
		m = series(scrape(t, p))
		return m["rls_rlqs_streams"] >= conns*9/10
	})
	t.Logf("%d connections with an RLQS stream each opened in %v; rls holds %v RLQS streams on %v connections", conns,
		time.Since(began).Round(time.Millisecond), m["rls_rlqs_streams"], m[`rls_connections_open{port="grpc-addr"}`])
	if m["rls_rlqs_streams"] < conns/2 {
		t.Fatalf("rls holds %v RLQS streams, want most of the %d opened: the port was never full of streams", m["rls_rlqs_streams"], conns)
	}
	clients("1,000 silent RLQS streams")

	began = time.Now()
	open(healthpb.Health_Watch_FullMethodName, []byte{}, true) // HealthCheckRequest{}: the overall health
	m = series(scrape(t, p))
	t.Logf("%d connections with a Watch stream each opened in %v; %v connections open", conns, time.Since(began).Round(time.Millisecond),
		m[`rls_connections_open{port="grpc-addr"}`])
	clients("1,000 silent Watch streams")
	m = series(scrape(t, p))
	if got := m[`rls_connections_refused_total{port="grpc-addr"}`]; got != 0 {
		t.Errorf("%v connections refused, where connections holding only streams could make room", got)
	}
	if got := m[`rls_connections_closed_total{port="grpc-addr",reason="idle_evicted"}`]; got < conns {
		t.Errorf("%v connections evicted, want at least %d (those of the first phase, for the second)", got, conns)
	}

	// A stream whose client never reads (its window 0): its first answer
	// can never be sent. SIGTERM still ends rls within its bound.
	report := rlqstest.MarshalReports(&rlqsv3.RateLimitQuotaUsageReports{Domain: "example",
		BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"api_key": "stuck"}}, TimeElapsed: durationpb.New(0)}}})
	stuck, err := h2Stream(p.GRPCAddr, rlqsv3.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName, report, false, true)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	testkit.WaitFor(t, "the stuck stream's report handled", 5*time.Second, func() bool {
		return series(scrape(t, p))["rls_rlqs_buckets"] >= 1
	})
	stop := time.Now()
	if err := p.cmd.Process.Signal(sigterm); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
		t.Logf("rls exited %v after SIGTERM with %d connections holding streams and a stuck stream", time.Since(stop).Round(time.Millisecond), len(held))
	case <-time.After(10 * time.Second):
		t.Errorf("rls still running 10 s (its shutdown bound) after SIGTERM")
	}
}

// TestRLQSReloadLowersLimit: beside a stream that reported 10^12 denials
// once and then fell silent, two fake Envoys (each asking for the whole
// limit of 400 a second) still admit at least half the limit per window;
// and the limit lowered to 40 a second in the config files under the open
// streams holds from the RLQS fleet's next window on.
func TestRLQSReloadLowersLimit(t *testing.T) {
	light(t)
	dir := writeConfig(t, rlqsConfig("fixed_window"))
	p := startRLSFast(t, dir)
	var es []*fakeEnvoy
	for range 2 {
		e := newFakeEnvoy("d", time.Second, p.GRPCAddr)
		e.expiredDeny = true
		es = append(es, e)
		t.Cleanup(e.close)
	}
	id := map[string]string{"api_key": "reload"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	liar, err := p.conn.NewStream(ctx, &rlqsv3.RateLimitQuotaService_ServiceDesc.Streams[0],
		rlqsv3.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName, grpcRawCodec())
	if err != nil {
		t.Fatal(err)
	}
	for _, denied := range []uint64{0, 1_000_000_000_000} {
		if err := liar.SendMsg(rawBytes(rlqstest.MarshalReports(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d",
			BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: &rlqsv3.BucketId{Bucket: id},
				TimeElapsed: durationpb.New(time.Second), NumRequestsDenied: denied}}}))); err != nil {
			t.Fatal(err)
		}
	}
	recvRLQS(t, liar)
	first := waitSecond()
	load := startLoad(es, id, rlqsLimit, rlqsLimit)
	defer load.end()
	const reloadAt, windows = 3, 5
	lowered := strings.Replace(rlqsConfig("fixed_window")["d.yaml"], fmt.Sprintf("requests_per_unit: %d", rlqsLimit), "requests_per_unit: 40", 1)
	time.Sleep(time.Until(time.Unix(first+reloadAt, 0).Add(50 * time.Millisecond))) // the reload in window 3: real time on purpose
	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte(lowered), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(time.Unix(first+windows, 0))) // the last window: real time on purpose
	load.end()
	for w := first + 1; w < first+windows; w++ {
		got, i := load.window(w), w-first
		t.Logf("window %d: admitted %d (offered %d; by Envoy %v)", i, got, load.offeredIn(w), load.envoys(w))
		// The generator (this test's process, on a machine as busy as CI's)
		// may fall behind: grants follow the demand reported in the window
		// before, so a window, or the one before it, offered under 3/4 of
		// the two Envoys' 2x load says nothing about the liar's effect.
		fed := min(load.offeredIn(w-1), load.offeredIn(w)) >= 2*rlqsLimit*3/4
		switch {
		case got > rlqsLimit:
			t.Errorf("window %d: admitted %d, over the limit %d", i, got, rlqsLimit)
		case i < reloadAt && !fed:
			t.Logf("window %d: the generator offered %d, then %d, of %d a window; its lower bound is not checked", i, load.offeredIn(w-1), load.offeredIn(w), 2*rlqsLimit)
		case i < reloadAt && got < rlqsLimit/2:
			t.Errorf("window %d: the honest Envoys admitted %d beside a stream that claimed 10^12 denials, under half the limit %d", i, got, rlqsLimit)
		case i > reloadAt && got > 40:
			t.Errorf("window %d, after the limit fell to 40 in window %d: admitted %d", i, reloadAt, got)
		}
	}
}

// TestRedisEvictionsLoud: on a Redis with a maxmemory and allkeys-lru, rls
// warns at start that Redis may evict its counters, and keys evicted while
// it serves (Redis filled past its maxmemory under rls's traffic) show in
// /metrics.
func TestRedisEvictionsLoud(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t, "--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru")
	p := startRLSFast(t, "../config", "--store", "redis", "--redis-url", srv.URL())
	testkit.WaitFor(t, "the WARN of the eviction policy", 5*time.Second, func() bool {
		return strings.Contains(p.Log.String(), `level=WARN msg="Redis may evict rls's counters`) &&
			strings.Contains(p.Log.String(), "maxmemory_policy=allkeys-lru")
	})
	rdb := srv.Client()
	defer rdb.Close()
	value := strings.Repeat("x", 64<<10)
	for i := range 200 { // 12.5 MB into 4 MB, beside rls's counters
		if err := rdb.Set(context.Background(), fmt.Sprint("filler", i), value, 0).Err(); err != nil {
			t.Fatal(err)
		}
		should(t, p.client(), "example", desc("api_key", fmt.Sprint("evict", i)))
	}
	testkit.WaitFor(t, "evictions in /metrics", 3*telemetry.EvictionEvery, func() bool {
		m := series(scrape(t, p))
		return m["rls_store_evicted_keys_total"] > 0 && m["rls_store_eviction_policy_evicts"] == 1
	})
}

// TestRLQSStreamMemoryBounded: 4 RLQS streams on one connection each
// subscribing 1,000 buckets of 100 KB BucketIds (two per report), and 4
// more whose client never reads, keep rls's peak RSS under 300 MB: what
// does not fit the streams' memory budget is refused ResourceExhausted
// naming it, a stream whose client reads is never cut as a slow reader,
// and the gauges return to 0 once the streams are gone.
func TestRLQSStreamMemoryBounded(t *testing.T) {
	light(t)
	p := startRLSFast(t, "../config")
	const idBytes = 100 << 10
	report := func(i, j int) []byte {
		var us []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
		for k := range 2 {
			id := map[string]string{"api_key": fmt.Sprintf("s%d-b%d-%d-", i, j, k) + strings.Repeat("x", idBytes)}
			us = append(us, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: id},
				TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1})
		}
		return rlqstest.MarshalReports(&rlqsv3.RateLimitQuotaUsageReports{Domain: "example", BucketQuotaUsages: us})
	}
	open := func(conn *grpc.ClientConn) grpc.ClientStream {
		cs, err := conn.NewStream(context.Background(), &rlqsv3.RateLimitQuotaService_ServiceDesc.Streams[0],
			rlqsv3.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName, grpcRawCodec())
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	dial := func(opts ...grpc.DialOption) *grpc.ClientConn {
		conn, err := grpc.NewClient(p.GRPCAddr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	readers := dial()
	ends := make([]error, 4)
	var wg sync.WaitGroup
	for i := range 4 { // read everything
		cs := open(readers)
		wg.Go(func() {
			go func() {
				for j := 0; j < 500; j++ {
					if cs.SendMsg(rawBytes(report(i, j))) != nil {
						return
					}
				}
			}()
			for {
				if err := cs.RecvMsg(rawBytes(nil)); err != nil {
					ends[i] = err
					return
				}
			}
		})
	}
	// Never read (a 64 KiB window, never opened further): such a client
	// cannot see its stream's status without reading, and its sends block
	// once rls stops reading it; it gives up when rls has ended every
	// stream.
	quiet, giveUp := context.WithCancel(context.Background())
	defer giveUp()
	for i := 4; i < 8; i++ {
		cs, err := dial(grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10)).NewStream(quiet,
			&rlqsv3.RateLimitQuotaService_ServiceDesc.Streams[0], rlqsv3.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName, grpcRawCodec())
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for j := 0; j < 500; j++ {
				if err := cs.SendMsg(rawBytes(report(i, j))); err != nil {
					break
				}
			}
		})
	}
	testkit.WaitFor(t, "every stream ended by rls", 30*time.Second, func() bool {
		m := series(scrape(t, p))
		return m["rls_rlqs_streams"] == 0 && m[`rls_rlqs_refused_total{reason="budget"}`]+m[`rls_rlqs_refused_total{reason="slow_reader"}`] >= 8
	})
	giveUp()
	wg.Wait()
	rss := peakRSS(t, p.cmd.Process.Pid)
	m := series(scrape(t, p))
	t.Logf("peak RSS %.1f MB; streams refused: budget %v, slow_reader %v; ends %v", float64(rss)/1e6,
		m[`rls_rlqs_refused_total{reason="budget"}`], m[`rls_rlqs_refused_total{reason="slow_reader"}`], ends)
	if rss > 300<<20 {
		t.Errorf("peak RSS %d MB, over 300 MB", rss>>20)
	}
	for i, err := range ends[:4] {
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(fmt.Sprint(err), "memory budget") {
			t.Errorf("reading stream %d ended %v, want ResourceExhausted naming the memory budget (never cut as a slow reader)", i, err)
		}
	}
	if m["rls_rlqs_buckets"] != 0 {
		t.Errorf("rls_rlqs_buckets %v with no stream open, want 0", m["rls_rlqs_buckets"])
	}
}
