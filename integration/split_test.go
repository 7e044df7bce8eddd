package integration

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/integration/redistest"
)

// Split: a hot key that no longer pins one Redis shard.

// spLimit is the hot key's limit per second. Its fixed window makes the
// admitted count of every Redis window exact to check.
const spLimit = 3000

const spConfig = `domain: hot
descriptors:
  - key: tenant
    value: big
    rate_limit: {unit: second, requests_per_unit: 3000, algorithm: fixed_window, split: 3}
  - key: tenant
    value: plain
    rate_limit: {unit: second, requests_per_unit: 3000, algorithm: fixed_window}
`

// spCallsByMaster returns each master's decision calls: scripts, and the
// INCRBY of a counter decided with plain commands.
func spCallsByMaster(t *testing.T, masters []*redistest.Server) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := make([]int64, len(masters))
	for i, m := range masters {
		st := m.CommandStats(ctx)
		if st == nil {
			t.Fatalf("INFO commandstats on %s failed", m.Addr)
		}
		out[i] = st["evalsha"] + st["eval"] + st["fcall"] + st["incrby"]
	}
	return out
}

// spResult is what a run of spDrive saw.
type spResult struct {
	sent, ok, errs int
	perWindow      map[int64]int // admitted per Redis window (unix second it ends at)
	offered        map[int64]int // requests sent per Redis window (by send time)
	elapsed        time.Duration
}

// spDrive sends requests for d at rate per second for dur, paced, from a
// pool of workers over the replicas in turn (each call with a 1s
// deadline), and attributes each admitted request to the Redis window it
// was counted in: the send and answer times bracket when Redis decided,
// and an allowed fixed-window decision's duration_until_reset runs to that
// window's end.
func spDrive(t *testing.T, ps []*rlsProc, d *rlcommon.RateLimitDescriptor, rate float64, dur time.Duration) spResult {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: "hot", Descriptors: []*rlcommon.RateLimitDescriptor{d}}
	clients := make([]rlsv3.RateLimitServiceClient, len(ps))
	for i, p := range ps {
		clients[i] = p.client()
	}
	tokens := make(chan time.Time, 1024)
	var mu sync.Mutex
	res := spResult{perWindow: map[int64]int{}, offered: map[int64]int{}}
	var errs atomic.Int64
	var wg sync.WaitGroup
	var next atomic.Uint64
	for range 48 {
		wg.Go(func() {
			for range tokens {
				c := clients[next.Add(1)%uint64(len(clients))]
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				sent := time.Now()
				r, err := c.ShouldRateLimit(ctx, req)
				got := time.Now()
				cancel()
				if err != nil {
					if errs.Add(1) <= 3 {
						t.Errorf("ShouldRateLimit: %v", err)
					}
					continue
				}
				mu.Lock()
				res.sent++
				res.offered[sent.Unix()+1]++
				if r.OverallCode == rlsv3.RateLimitResponse_OK {
					res.ok++
					mid := sent.Add(got.Sub(sent) / 2)
					end := mid.Add(r.Statuses[0].DurationUntilReset.AsDuration())
					res.perWindow[int64(math.Round(float64(end.UnixNano())/1e9))]++
				}
				mu.Unlock()
			}
		})
	}
	start := time.Now()
	interval := time.Duration(float64(time.Second) / rate)
	for at := start; time.Since(start) < dur; at = at.Add(interval) {
		if w := time.Until(at); w > 0 {
			time.Sleep(w) // paced: real time on purpose
		}
		tokens <- at
	}
	close(tokens)
	wg.Wait()
	res.elapsed = time.Since(start)
	res.errs = int(errs.Load())
	return res
}

// TestSplitSpreadsHotKeyOverCluster: on a 3-master Cluster, one hot key of
// 3,000/s with split: 3, driven at 1.3 times its limit for 3 s through two
// rls replicas, sends its decision calls (scripts and INCRBY) to the three masters within ±15% of
// a third each (the same key without split sends all of them to one
// master); every Redis window admits
// at most the limit, and exactly the limit once it has been offered the
// limit plus (replicas+1)×(split−1) requests (README, "Hot keys: split").
func TestSplitSpreadsHotKeyOverCluster(t *testing.T) {
	timed(t)
	start := time.Now()
	c := redistest.StartCluster(t, 3, 0)
	masters := c.Nodes[:3]
	dir := writeConfig(t, map[string]string{"hot.yaml": spConfig})
	ps := make([]*rlsProc, 2)
	for i := range ps {
		ps[i] = startRLSBin(t, rlsFastBin, dir, rdClusterArgs(c)...)
	}
	for _, p := range ps {
		p.waitServing(t, 20*time.Second)
	}
	const replicas, split = 2, 3
	rate, dur := 1.3*spLimit, 3*time.Second

	for _, key := range []string{"plain", "big"} {
		before := spCallsByMaster(t, masters)
		res := spDrive(t, ps, desc("tenant", key), rate, dur)
		after := spCallsByMaster(t, masters)
		var calls []int64
		total := int64(0)
		for i := range masters {
			calls = append(calls, after[i]-before[i])
			total += after[i] - before[i]
		}
		shares := make([]string, len(calls))
		for i, n := range calls {
			shares[i] = fmt.Sprintf("%.1f%%", 100*float64(n)/float64(total))
		}
		t.Logf("%s: %d requests in %v (%.0f/s), %d OK; decision calls per master %v = %s",
			key, res.sent, res.elapsed.Round(time.Millisecond), float64(res.sent)/res.elapsed.Seconds(), res.ok, calls, strings.Join(shares, " "))
		if res.errs > 0 || total == 0 {
			t.Fatalf("%s: %d errors, %d decision calls", key, res.errs, total)
		}
		// Admitted per Redis window: never over the limit; exactly the
		// limit in a window offered enough that every sub-key was spent.
		full := spLimit + (replicas+1)*(split-1)
		var windows []int64
		for w := range res.perWindow {
			windows = append(windows, w)
		}
		sort.Slice(windows, func(i, j int) bool { return windows[i] < windows[j] })
		for _, w := range windows {
			ok, offered := res.perWindow[w], res.offered[w]
			t.Logf("%s: window ending %s: %d admitted of %d offered", key, time.Unix(w, 0).Format("15:04:05"), ok, offered)
			if ok > spLimit {
				t.Errorf("%s: window ending %d admitted %d, over the limit of %d", key, w, ok, spLimit)
			}
			if offered >= full+spLimit/10 && ok < spLimit { // a tenth of margin: send times only approximate the window
				t.Errorf("%s: window ending %d admitted %d of %d offered, want the whole limit %d", key, w, ok, offered, spLimit)
			}
		}
		if key == "plain" {
			if most := max(calls[0], calls[1], calls[2]); most != total {
				t.Errorf("the unsplit key's %d decision calls went to more than one master: %v", total, calls)
			}
			continue
		}
		for i, n := range calls {
			if share := float64(n) / float64(total); share < 0.85/3 || share > 1.15/3 {
				t.Errorf("master %s got %.1f%% of the split key's %d decision calls, want within ±15%% of a third", masters[i].Addr, 100*share, total)
			}
		}
	}
	rdNoFallback(t, ps...)
	t.Logf("test took %v", time.Since(start).Round(time.Millisecond))
}
