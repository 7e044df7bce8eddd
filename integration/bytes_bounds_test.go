package integration

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/integration/redistest"
)

// rssSlack is what the process may hold beyond its table budgets (the
// runtime, gRPC buffers, garbage the GC has not collected yet, memory the
// scavenger has not returned yet).
const rssSlack = 64 << 20

// TestTablesBoundedByBytes sends distinct descriptors with 4 KB values
// through the real binary (built without the race detector, whose shadow
// memory would swamp the figures) and checks that its resident set stays
// under the byte budgets of its tables plus rssSlack:
//   - memory: distinct keys on the memory store, which keeps a counter per
//     key (--memory-max-bytes 16 MiB) and the limiter what the store said
//     (--local-max-bytes 16 MiB);
//   - redis: over-limit requests on Redis, each a new key the over-limit
//     cache learns (--local-max-bytes 16 MiB).
//
// rls runs with GOGC=100 (Go's default target): without GOGC the tuner's
// 400 lets garbage take up to 64 MiB more (see gctune.Headroom), which is
// not the tables' doing. By default (`make test`) 20,000 calls each; with
// RLS_BYTES_FULL=1 (`make soak`) 250,000 new keys on the memory store and
// 100,000 over-limit requests on Redis, under the same budgets.
func TestTablesBoundedByBytes(t *testing.T) {
	light(t) // processes of its own; asserts counts and memory, not time
	memKeys, redisKeys := 20_000, 20_000
	if os.Getenv("RLS_BYTES_FULL") != "" {
		memKeys, redisKeys = 250_000, 100_000
	}
	type run struct {
		name    string
		keys    int
		args    []string
		budget  int64
		redis   bool
		overLim bool
	}
	runs := []run{
		{"memory", memKeys, []string{"--memory-max-bytes", "16777216", "--local-max-bytes", "16777216"}, 32 << 20, false, false},
		{"redis", redisKeys, []string{"--local-max-bytes", "16777216"}, 16 << 20, true, true},
	}
	dir := writeConfig(t, map[string]string{"bytes.yaml": `
domain: bytes
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 10}
`})
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			args := append([]string{"--log-level", "warn"}, r.args...)
			if r.redis {
				srv := redistest.StartServer(t)
				args = append(rdRedisArgs(srv), args...)
			}
			p := startRLSBinEnv(t, rlsFastBin, []string{"GOGC=100"}, dir, args...)
			p.waitServing(t, 20*time.Second)
			pid := p.cmd.Process.Pid
			startRSS := vmRSS(t, pid)
			peak, calls, elapsed := driveBigKeys(t, p, r.keys, r.overLim, pid)
			endRSS := vmRSS(t, pid)
			t.Logf("%d calls with 4 KB values (%s) in %v: VmRSS %.1f MiB at start, peak %.1f MiB, %.1f MiB at the end; budgets %d MiB + slack %d MiB",
				calls, map[bool]string{true: "over limit", false: "new keys"}[r.overLim], elapsed.Round(time.Millisecond),
				float64(startRSS)/(1<<20), float64(peak)/(1<<20), float64(endRSS)/(1<<20), r.budget>>20, rssSlack>>20)
			if limit := r.budget + rssSlack; peak > limit {
				t.Errorf("peak VmRSS %.1f MiB, over the tables' budgets (%d MiB) plus %d MiB", float64(peak)/(1<<20), r.budget>>20, rssSlack>>20)
			}
		})
	}
}

// driveBigKeys sends total calls, each for a new api_key with a 4 KB value
// (asking for more hits than the limit when over), over 4 connections, and
// samples pid's VmRSS meanwhile. It returns the peak VmRSS.
func driveBigKeys(t *testing.T, p *rlsProc, total int, over bool, pid int) (peak int64, calls int64, elapsed time.Duration) {
	clients := []rlsv3.RateLimitServiceClient{p.client()}
	for range 3 {
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	var peakRSS atomic.Int64
	sample := func() {
		if v, err := readVmRSS(pid); err == nil && v > peakRSS.Load() {
			peakRSS.Store(v)
		}
	}
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	pad := strings.Repeat("x", 4096-9)
	want := rlsv3.RateLimitResponse_OK
	if over {
		want = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	var next, done, failed atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%len(clients)]
			for {
				i := next.Add(1) - 1
				if i >= int64(total) {
					return
				}
				d := desc("api_key", fmt.Sprintf("%08d", i)+pad) // 4,096 bytes
				if over {
					d.HitsAddend = wrapperspb.UInt64(11)
				}
				r, err := rdCall(c, "bytes", d)
				if err == nil && r.OverallCode != want {
					err = fmt.Errorf("call %d: %v, want %v", i, r.OverallCode, want)
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
	elapsed = time.Since(start)
	close(stop)
	sampler.Wait()
	sample()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d calls failed; first: %v", n, total, firstErr.Load())
	}
	return peakRSS.Load(), done.Load(), elapsed
}

// vmRSS returns the resident set of process pid, from /proc/pid/status.
func vmRSS(t testing.TB, pid int) int64 {
	t.Helper()
	v, err := readVmRSS(pid)
	if err != nil {
		t.Skipf("no resident set size: %v", err)
	}
	return v
}

// readVmRSS reads a process's resident set size (VmRSS) in bytes.
func readVmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
