package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/integration/redistest"
)

// Exact under load. Every test here runs rls with default flags
// (only the store and its address are set), as a new user would.

const exConfig = `domain: exact
descriptors:
  - key: sliding_window
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: token_bucket
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: token_bucket}
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}
  - key: per_second
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: per_second_fixed
    rate_limit: {unit: second, requests_per_unit: 50, algorithm: fixed_window}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 100000000, on_error: fail_closed}
  - key: steps
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 100}
`

var exAlgorithms = []string{"sliding_window", "token_bucket", "fixed_window"}

// exBurst sends total requests for d from clients goroutines spread
// round-robin over the replicas, released together, each call with no
// deadline (as grpcurl and many clients send), and returns how many were OK.
// Any RPC error fails the test.
func exBurst(t *testing.T, ps []*rlsProc, clients, total int, d *rlcommon.RateLimitDescriptor) int {
	t.Helper()
	var sent, ok, errs atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	req := &rlsv3.RateLimitRequest{Domain: "exact", Descriptors: []*rlcommon.RateLimitDescriptor{d}}
	for g := range clients {
		c := ps[g%len(ps)].client()
		wg.Go(func() {
			<-start
			for sent.Add(1) <= int64(total) {
				r, err := c.ShouldRateLimit(context.Background(), req)
				switch {
				case err != nil:
					if errs.Add(1) <= 3 {
						t.Errorf("ShouldRateLimit: %v", err)
					}
				case r.OverallCode == rlsv3.RateLimitResponse_OK:
					ok.Add(1)
				case r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT:
					t.Errorf("overall code %v", r.OverallCode)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	return int(ok.Load())
}

// exBurnCPU keeps every core busy with shell loops until the test ends.
func exBurnCPU(t *testing.T, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = redistest.ChildAttr() // killed with the test process, even when it is killed
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}

// exMetric sums the samples of a Prometheus counter whose label set
// contains every label=value given.
func exMetric(t *testing.T, p *rlsProc, name string, labels ...string) float64 {
	t.Helper()
	sum := 0.0
	for k, v := range series(scrape(t, p)) {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(k, l)
		}
		if match {
			sum += v
		}
	}
	return sum
}

func exFallbacks(t *testing.T, ps []*rlsProc) float64 {
	n := 0.0
	for _, p := range ps {
		n += exMetric(t, p, "rls_fallback_decisions_total")
	}
	return n
}

// TestExactUnderBurst: two replicas with default flags on one healthy Redis
// (and on a 3-master Cluster), a limit of 100 per hour, bursts of 400
// requests from 200 clients and 2,000 from 1,000 clients with no deadline,
// also with a CPU burner on every core: exactly 100 pass, every decision
// from Redis.
//
// Not parallel: its CPU burners would slow every other test down.
func TestExactUnderBurst(t *testing.T) {
	dir := writeConfig(t, map[string]string{"exact.yaml": exConfig})
	topologies := map[string]func(t *testing.T) []string{
		"single": func(t *testing.T) []string {
			srv := redistest.StartServer(t)
			return []string{"--store", "redis", "--redis-url", srv.URL()}
		},
		"cluster": func(t *testing.T) []string {
			c := redistest.StartCluster(t, 3, 0)
			return []string{"--store", "redis-cluster", "--redis-url", c.Seeds()}
		},
	}
	for _, topo := range []string{"single", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			ps := rdStartReplicas(t, 2, dir, topologies[topo](t)...)
			for _, burner := range []bool{false, true} {
				if burner {
					exBurnCPU(t, 2)
				}
				for _, alg := range exAlgorithms {
					for _, size := range [][2]int{{200, 400}, {1000, 2000}} {
						name := fmt.Sprintf("%s/%d_clients/burner=%v", alg, size[0], burner)
						before := exFallbacks(t, ps)
						start := time.Now()
						ok := exBurst(t, ps, size[0], size[1], desc(alg, fmt.Sprintf("%s-%d", topo, time.Now().UnixNano())))
						fb := exFallbacks(t, ps) - before
						t.Logf("%s: %d of %d OK in %v, %v fallback decisions", name, ok, size[1], time.Since(start).Round(time.Millisecond), fb)
						if ok != 100 {
							t.Errorf("%s: %d of %d requests OK on a limit of 100, want exactly 100", name, ok, size[1])
						}
						if fb != 0 {
							t.Errorf("%s: %v decisions without Redis while Redis was healthy", name, fb)
						}
					}
				}
			}
		})
	}
}

// exEvent is one answered request of a trace: when it was sent and whether
// it was allowed.
type exEvent struct {
	at time.Time
	ok bool
}

// exPoisson sends Poisson traffic at rate per second for d over the
// replicas (each request to a random one), with Envoy's default 20ms
// deadline, and returns every answer stamped with its send time. Errors
// (none expected: the fallback answers) are counted in errs.
func exPoisson(ps []*rlsProc, rate float64, dur time.Duration, d *rlcommon.RateLimitDescriptor, errs *atomic.Int64) []exEvent {
	req := &rlsv3.RateLimitRequest{Domain: "exact", Descriptors: []*rlcommon.RateLimitDescriptor{d}}
	var mu sync.Mutex
	var events []exEvent
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13))
	clients := make([]rlsv3.RateLimitServiceClient, len(ps))
	for i, p := range ps {
		clients[i] = p.client()
	}
	start := time.Now()
	next := start
	for next.Sub(start) < dur {
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		time.Sleep(time.Until(next)) // paced arrivals: real time on purpose
		c := clients[rng.IntN(len(clients))]
		sent := time.Now()
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			r, err := c.ShouldRateLimit(ctx, req)
			if err != nil {
				errs.Add(1)
				return
			}
			mu.Lock()
			events = append(events, exEvent{at: sent, ok: r.OverallCode == rlsv3.RateLimitResponse_OK})
			mu.Unlock()
		})
	}
	wg.Wait()
	sort.Slice(events, func(i, j int) bool { return events[i].at.Before(events[j].at) })
	return events
}

// exPeak returns the most requests allowed in any trailing window of w that
// ends in [from, to], and where that window ends.
func exPeak(events []exEvent, w time.Duration, from, to time.Time) (int, time.Time) {
	var ok []time.Time
	for _, e := range events {
		if e.ok {
			ok = append(ok, e.at)
		}
	}
	best, at, lo := 0, time.Time{}, 0
	for hi := range ok {
		for ok[hi].Sub(ok[lo]) >= w {
			lo++
		}
		if n := hi - lo + 1; n > best && !ok[hi].Before(from) && !ok[hi].After(to) {
			best, at = n, ok[hi]
		}
	}
	return best, at
}

// exStartFast starts n replicas of the production build (the tests that
// hold latency bounds) and waits until all serve.
func exStartFast(t *testing.T, n int, dir string, args ...string) []*rlsProc {
	t.Helper()
	ps := make([]*rlsProc, n)
	for i := range ps {
		ps[i] = startRLSBin(t, rlsFastBin, dir, args...)
	}
	for _, p := range ps {
		p.waitServing(t, 30*time.Second)
	}
	return ps
}

// TestStallKeepsTheLimit: Poisson traffic at twice a 50/s limit over two
// replicas; Redis paused for 1.2 s (and, separately, killed for 1.2 s and
// restarted empty) in the middle. Two traces run at once, one on the
// default sliding window and one on a fixed window. The trailing seconds
// that overlap the fault or the second after it (when the write-back
// lands) admit at most 1.25× the limit on the sliding window.
//
// Outside the fault each algorithm has its own bound, checked loosely: the
// sliding window counter assumes the previous window's hits were spread
// evenly, which overload makes untrue (1.04 to 1.24× on this trace); a
// fixed window lets up to twice its limit through across a window boundary
// by design (1.2 to 1.4× here, when one window's first arrivals come slowly
// and the next one's quickly, checked at 1.6×), and the fault may not push
// it past that same 1.6×: a trailing second around the fault holds a
// window boundary too (a bound of 1.5× there failed a quiet CI run at
// 1.54×, where the boundary alone is allowed 1.6×).
// The first two seconds are not measured: a fresh key's first window
// admits its limit whatever came before it.
//
// Not parallel: the clients send Envoy's 20ms deadline, and other tests'
// load (CPU burners) would turn it into fallback decisions.
func TestStallKeepsTheLimit(t *testing.T) {
	const limit, rate = 50, 100.0
	type bound struct{ fault, own float64 }
	bounds := map[string]bound{"per_second": {1.25, 1.4}, "per_second_fixed": {1.6, 1.6}}
	dir := writeConfig(t, map[string]string{"exact.yaml": exConfig})
	for _, fault := range []string{"none", "pause", "kill"} {
		t.Run(fault, func(t *testing.T) {
			srv := redistest.StartServer(t)
			ps := exStartFast(t, 2, dir, "--store", "redis", "--redis-url", srv.URL())
			var errs atomic.Int64
			traces := map[string][]exEvent{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			start := time.Now()
			for rule := range bounds {
				wg.Go(func() {
					ev := exPoisson(ps, rate, 6*time.Second, desc(rule, fmt.Sprintf("%s-%d", fault, time.Now().UnixNano())), &errs)
					mu.Lock()
					traces[rule] = ev
					mu.Unlock()
				})
			}
			warm := start.Add(2 * time.Second)
			time.Sleep(time.Until(start.Add(2500 * time.Millisecond))) // the fault 2.5 s into the run: real time on purpose
			faultAt := time.Now()
			switch fault {
			case "pause":
				srv.Pause()
				time.Sleep(1200 * time.Millisecond) // the pause lasts 1.2 s: real time on purpose
				srv.Resume()
			case "kill":
				srv.Stop()
				time.Sleep(1200 * time.Millisecond) // down for 1.2 s: real time on purpose
				srv.Restart(t)
			}
			faultEnd := time.Now()
			wg.Wait()
			end := time.Now()
			total := 0
			for rule, events := range traces {
				total += len(events)
				b := bounds[rule]
				inFault, at := exPeak(events, time.Second, faultAt, faultEnd.Add(time.Second))
				own := max(exPeakOf(events, warm, faultAt), exPeakOf(events, faultEnd.Add(time.Second), end))
				t.Logf("%s, %s: %d answers; the busiest trailing second overlapping the fault or the second after it admitted %d (%.2f× the limit, ending %v after the fault began); elsewhere %d (%.2f×)",
					fault, rule, len(events), inFault, float64(inFault)/limit, at.Sub(faultAt).Round(time.Millisecond), own, float64(own)/limit)
				if float64(inFault) > b.fault*limit {
					t.Errorf("%s, %s: %d allowed in one trailing second around the fault, over %.2f× the limit of %d", fault, rule, inFault, b.fault, limit)
				}
				if float64(own) > b.own*limit {
					t.Errorf("%s, %s: %d allowed in one trailing second away from the fault, over the algorithm's own %.2f×", fault, rule, own, b.own)
				}
			}
			fb := exFallbacks(t, ps)
			t.Logf("%s: %d calls failed, %v fallback decisions", fault, errs.Load(), fb)
			if n := errs.Load(); n > int64(total/50) {
				t.Errorf("%s: %d of %d calls failed (want the fallback to answer)", fault, n, total)
			}
			if fault == "none" && fb > float64(total/100) {
				t.Errorf("%v fallback decisions of %d without a fault", fb, total)
			}
		})
	}
}

func exPeakOf(events []exEvent, from, to time.Time) int {
	n, _ := exPeak(events, time.Second, from, to)
	return n
}

// TestCacheDeniesOnlyWhatRedisWould: on a real Redis, a limit of 5 takes
// 3 hits, denies 3 more and then admits 2 (a cached denial of 3 hits must
// not deny 2), and a 10^9-hits request must not block smaller ones.
func TestCacheDeniesOnlyWhatRedisWould(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	dir := writeConfig(t, map[string]string{"exact.yaml": exConfig})
	ps := rdStartReplicas(t, 2, dir, "--store", "redis", "--redis-url", srv.URL())
	c := ps[0].client()
	call := func(d *rlcommon.RateLimitDescriptor, hits uint64) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		d.HitsAddend = wrapperspb.UInt64(hits)
		return should(t, c, "exact", d).Statuses[0]
	}
	key := fmt.Sprintf("s-%d", time.Now().UnixNano())
	steps := []struct {
		hits      uint64
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}{{3, rdOkCode, 2}, {3, rdOverCode, 2}, {2, rdOkCode, 0}}
	for i, s := range steps {
		st := call(desc("steps", key), s.hits)
		if st.Code != s.code || st.LimitRemaining != s.remaining {
			t.Errorf("step %d (%d hits): %v remaining %d, want %v remaining %d", i+1, s.hits, st.Code, st.LimitRemaining, s.code, s.remaining)
		}
	}
	big := fmt.Sprintf("b-%d", time.Now().UnixNano())
	call(desc("big", big), 1)
	if st := call(desc("big", big), 1_000_000_000); st.Code != rdOverCode {
		t.Fatalf("10^9 hits: %v", st.Code)
	}
	for i := range 99 {
		if st := call(desc("big", big), 1); st.Code != rdOkCode {
			t.Fatalf("hit %d after the 10^9-hits request: %v remaining %d", i+2, st.Code, st.LimitRemaining)
		}
	}
	if st := call(desc("big", big), 1); st.Code != rdOverCode {
		t.Fatalf("101st hit: %v", st.Code)
	}
}

// TestShortStallFailClosed: a 30 ms Redis stall costs fail_closed traffic
// at most the requests sent inside the stall and the 100 ms after it. Not
// parallel: it holds a latency bound.
func TestShortStallFailClosed(t *testing.T) {
	srv := redistest.StartServer(t)
	dir := writeConfig(t, map[string]string{"exact.yaml": exConfig})
	// The production build: this test is about latency.
	p := startRLSFast(t, dir, "--store", "redis", "--redis-url", srv.URL())
	c := p.client()
	req := &rlsv3.RateLimitRequest{Domain: "exact", Descriptors: []*rlcommon.RateLimitDescriptor{desc("closed", "tenant")}}
	type answer struct {
		at     time.Time
		denied bool
	}
	var mu sync.Mutex
	var answers []answer
	var wg sync.WaitGroup
	var stallFrom, stallTo time.Time
	stalled := make(chan struct{})
	go func() { // the stall, while the traffic goes on
		defer close(stalled)
		time.Sleep(time.Second) // traffic before the stall: real time on purpose
		stallFrom = time.Now()
		srv.Pause()
		time.Sleep(30 * time.Millisecond) // the stall lasts 30 ms: real time on purpose
		srv.Resume()
		stallTo = time.Now()
	}()
	stop := time.Now().Add(2 * time.Second)
	for tick := time.Now(); tick.Before(stop); tick = tick.Add(2500 * time.Microsecond) { // 400 requests a second
		time.Sleep(time.Until(tick)) // paced: real time on purpose
		sent := time.Now()
		wg.Go(func() {
			// Envoy's default deadline.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			r, err := c.ShouldRateLimit(ctx, req)
			mu.Lock()
			answers = append(answers, answer{at: sent, denied: err != nil || r.OverallCode != rdOkCode})
			mu.Unlock()
		})
	}
	wg.Wait()
	<-stalled
	// The allowance: requests sent during the stall and the 100 ms after
	// it, and those already in flight when it began (sent within one
	// deadline before).
	allowance, denied, deniedInside := 0, 0, 0
	for _, a := range answers {
		inside := !a.at.Before(stallFrom.Add(-20*time.Millisecond)) && a.at.Before(stallTo.Add(100*time.Millisecond))
		if inside {
			allowance++
		}
		if a.denied {
			denied++
			if inside {
				deniedInside++
			}
		}
	}
	t.Logf("%d requests, %d denied or failed (%d of them inside the allowance); %d sent from one deadline before the %v stall to 100ms after it",
		len(answers), denied, deniedInside, allowance, stallTo.Sub(stallFrom).Round(time.Millisecond))
	if denied > allowance {
		t.Errorf("a %v stall denied %d fail_closed requests, more than the %d sent during it and the 100ms after",
			stallTo.Sub(stallFrom).Round(time.Millisecond), denied, allowance)
	}
}
