package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// boundsHeapLimit is the most Go heap in use (go_memstats_heap_inuse_bytes)
// the binary may reach while serving RLS_BOUNDS_KEYS distinct keys with
// --memory-max-bytes 20 MiB (about 100,000 counters) and --local-max-bytes
// 4 MiB (about 10,000 cached answers).
const boundsHeapLimit = 150 << 20

// TestMemoryBoundedUnderHostileCardinality drives RLS_BOUNDS_KEYS (default
// 120000, past the memory store's 100,000 counters; 1000000 for `make soak`
// or by hand) distinct api_key values through
// the real binary on the memory store with small caps, and checks that every
// call succeeds, that the Go heap stays under boundsHeapLimit and that
// rls_decisions_total does not grow a series per key (nor does
// rls_detailed_decisions_total: 100 values per rule cap it).
func TestMemoryBoundedUnderHostileCardinality(t *testing.T) {
	light(t) // processes of its own; asserts counts and memory, not time
	total := 120_000
	if v := os.Getenv("RLS_BOUNDS_KEYS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1000 {
			t.Fatalf("RLS_BOUNDS_KEYS=%q: want a number of at least 1000", v)
		}
		total = n
	}
	dir := writeConfig(t, map[string]string{"bounds.yaml": `
domain: bounds
descriptors:
  - key: api_key
    detailed_metric: true
    rate_limit: {name: per-key, unit: hour, requests_per_unit: 10}
    descriptors:
      - key: route
        rate_limit: {name: per-route, unit: minute, requests_per_unit: 5, algorithm: token_bucket}
`})
	debugAddr := freeAddr(t)
	// The production build: this test is about memory and volume, not races.
	p := startRLSFast(t, dir, "--memory-max-bytes", "20971520", "--local-max-bytes", "4194304",
		"--debug-addr", debugAddr)

	// Several connections, as a fleet of Envoys would open.
	clients := []rlsv3.RateLimitServiceClient{p.client()}
	for range 3 {
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}

	var (
		next, done, failed atomic.Int64
		firstErr           atomic.Value
		peakHeap           atomic.Int64
		warmSeries         atomic.Int64
	)
	warmSeries.Store(-1)
	sample := func() {
		m := metricValues(t, p.HTTPAddr)
		if h := int64(m["go_memstats_heap_inuse_bytes"]); h > peakHeap.Load() {
			peakHeap.Store(h)
		}
	}
	stopSampling := make(chan struct{})
	var samplerDone sync.WaitGroup
	samplerDone.Add(1)
	go func() {
		defer samplerDone.Done()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
				sample()
				if warmSeries.Load() < 0 && done.Load() >= int64(total/10) {
					warmSeries.Store(int64(decisionSeries(t, p.HTTPAddr)))
				}
			}
		}
	}()

	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%len(clients)]
			for {
				i := next.Add(1) - 1
				if i >= int64(total) {
					return
				}
				// Every call is a new key; every 4th adds a route level.
				d := desc("api_key", fmt.Sprintf("hostile-%08d", i))
				if i%4 == 0 {
					d = desc("api_key", fmt.Sprintf("hostile-%08d", i), "route", "/r")
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "bounds", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
				cancel()
				if err == nil && r.OverallCode != rlsv3.RateLimitResponse_OK {
					err = fmt.Errorf("key %d: %v, want OK (a new key)", i, r)
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stopSampling)
	samplerDone.Wait()
	sample()

	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d calls failed; first: %v", n, total, firstErr.Load())
	}
	if got := done.Load(); got != int64(total) {
		t.Fatalf("%d calls succeeded, want %d", got, total)
	}
	endSeries := decisionSeries(t, p.HTTPAddr)
	warm := warmSeries.Load()
	if warm < 0 {
		warm = int64(endSeries) // the run was shorter than one sample
	}
	if int64(endSeries) != warm || endSeries > 200 {
		t.Errorf("rls_decisions_total and rls_detailed_decisions_total have %d series after %d keys, %d after %d: it grows with cardinality", endSeries, total, warm, total/10)
	}
	// The heap retained after a forced GC (pprof's ?gc=1) shows what the
	// capped tables hold.
	resp, err := http.Get("http://" + debugAddr + "/debug/pprof/heap?gc=1")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	retained := metricValues(t, p.HTTPAddr)["go_memstats_heap_inuse_bytes"]
	peak := peakHeap.Load()
	t.Logf("%d distinct keys in %v (%.0f calls/s, 32 goroutines, %d connections): peak heap in use %.1f MiB, %.1f MiB after GC; %d decision series",
		total, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), len(clients),
		float64(peak)/(1<<20), retained/(1<<20), endSeries)
	if peak > boundsHeapLimit {
		t.Errorf("peak heap in use %.1f MiB, over the bound of %d MiB", float64(peak)/(1<<20), boundsHeapLimit>>20)
	}
}

// metricValues returns every unlabelled sample of /metrics, name → value.
func metricValues(t testing.TB, httpAddr string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(scrapeAddr(t, httpAddr)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			out[name] = v
		}
	}
	return out
}

// decisionSeries counts the series of rls_decisions_total and
// rls_detailed_decisions_total in /metrics.
func decisionSeries(t testing.TB, httpAddr string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(scrapeAddr(t, httpAddr), "\n") {
		if strings.HasPrefix(line, "rls_decisions_total") || strings.HasPrefix(line, "rls_detailed_decisions_total") {
			n++
		}
	}
	return n
}

func scrapeAddr(t testing.TB, httpAddr string) string {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Error(err)
		return ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}
