package service

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// The accuracy cost of split, measured on simulated traffic: Poisson
// arrivals at a multiple of the limit, each sent to a random replica (each
// replica its own Service, config and limiter, as separate processes are),
// decided by one shared store on a virtual clock, once without split and
// once with it on the same trace. go test ./pkg/service -run
// TestSplitAccuracy -split.table -v prints the table README's "Hot keys:
// split" quotes; without -split.table the test runs one row per load and
// checks the bounds README states.

var splitTable = flag.Bool("split.table", false, "print the accuracy table of split (README, \"Hot keys: split\")")

// simRun is the outcome of one simulated trace.
type simRun struct {
	offered, admitted int
	peak              int // the most admitted in any trailing window, after the first two windows
	aligned           int // the most admitted in one window aligned to the clock (fixed_window's)
	secs              float64
}

// simulate sends Poisson traffic at rate per second for dur (virtual time)
// for one key of rule yaml, over replicas replicas, and counts what passes.
func simulate(t testing.TB, rule string, replicas int, rate float64, dur time.Duration, seed uint64) simRun {
	t.Helper()
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	st := memory.New(memory.Options{Now: clk.Now})
	conf := "domain: sim\ndescriptors:\n  - key: k\n    rate_limit: " + rule + "\n"
	svcs := make([]*Service, replicas)
	for i := range svcs {
		cfg, err := descriptors.Parse(map[string][]byte{"sim.yaml": []byte(conf)})
		if err != nil {
			t.Fatal(err)
		}
		svcs[i] = New(cfg, limiter.New(st, limiter.Options{Now: clk.Now, FleetSize: func() int { return replicas }}), Options{})
	}
	window := cfgWindow(t, conf)
	req := &rlsv3.RateLimitRequest{Domain: "sim", Descriptors: []*rlcommon.RateLimitDescriptor{d("k", "hot")}}
	rng := rand.New(rand.NewPCG(seed, 18))
	start := clk.Now()
	var run simRun
	var ok []time.Time
	for at := time.Duration(0); ; {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if at >= dur {
			break
		}
		clk.Set(start.Add(at))
		r, err := svcs[rng.IntN(replicas)].ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		run.offered++
		if r.OverallCode == rlsv3.RateLimitResponse_OK {
			run.admitted++
			ok = append(ok, clk.Now())
		}
	}
	run.secs = dur.Seconds()
	perWindow := map[int64]int{}
	for _, at := range ok {
		perWindow[at.UnixNano()/int64(window)]++
	}
	for _, n := range perWindow {
		run.aligned = max(run.aligned, n)
	}
	lo := 0
	for hi := range ok {
		for ok[hi].Sub(ok[lo]) >= window {
			lo++
		}
		if ok[hi].Sub(start) >= 2*window {
			run.peak = max(run.peak, hi-lo+1)
		}
	}
	return run
}

func cfgWindow(t testing.TB, conf string) time.Duration {
	cfg, err := descriptors.Parse(map[string][]byte{"sim.yaml": []byte(conf)})
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Rules()[0].Window()
}

// simRow compares split n with no split on the same traces.
type simRow struct {
	limit, n, replicas int
	load               float64
	plain, split       simRun
}

// ratio is what split admits as a share of what the unsplit key admits.
func (r simRow) ratio() float64 { return float64(r.split.admitted) / float64(r.plain.admitted) }

func simCompare(t testing.TB, alg string, limit, n, replicas int, load float64, dur time.Duration, seed uint64) simRow {
	rule := fmt.Sprintf("{unit: second, requests_per_unit: %d, algorithm: %s", limit, alg)
	row := simRow{limit: limit, n: n, replicas: replicas, load: load}
	row.plain = simulate(t, rule+"}", replicas, load*float64(limit), dur, seed)
	row.split = simulate(t, fmt.Sprintf("%s, split: %d}", rule, n), replicas, load*float64(limit), dur, seed)
	return row
}

// TestSplitAccuracy: with split, a fixed window never admits more than
// its limit in one window; a sliding window admits at most one request per
// sub-key more in a trailing second than the unsplit key (each sub-key
// rounds its budget up); and split admits at least the share README states
// of what the unsplit key admits: at 0.9, 1.1 and 2 times a limit of 300/s
// split 3 over 2 replicas, at least 99%.
func TestSplitAccuracy(t *testing.T) {
	if *splitTable {
		printSplitTable(t)
		return
	}
	for _, load := range []float64{0.9, 1.1, 2} {
		row := simCompare(t, "sliding_window", 300, 3, 2, load, 20*time.Second, 1)
		t.Logf("300/s split 3, 2 replicas, %.1fx: admitted %d of %d (unsplit %d), %.2f%%; peak second %d (unsplit %d)",
			load, row.split.admitted, row.split.offered, row.plain.admitted, 100*row.ratio(), row.split.peak, row.plain.peak)
		if row.ratio() < 0.99 {
			t.Errorf("%.1fx: split admits %.2f%% of what the unsplit key admits, want at least 99%%", load, 100*row.ratio())
		}
		if row.split.peak > row.plain.peak+row.n {
			t.Errorf("%.1fx: split admitted %d in one trailing second, more than the unsplit key's %d plus one per sub-key", load, row.split.peak, row.plain.peak)
		}
		fixed := simCompare(t, "fixed_window", 300, 3, 2, load, 20*time.Second, 2)
		if fixed.split.aligned > 300 || fixed.ratio() < 0.99 {
			t.Errorf("%.1fx: fixed_window split 3 admitted up to %d in one window (limit 300), %.2f%% of the unsplit key", load, fixed.split.aligned, 100*fixed.ratio())
		}
	}
}

// printSplitTable prints README's table: for each limit, split and load,
// what split admits as a share of what the unsplit key admits on the same
// trace, per algorithm, and the most either admitted in a trailing second.
func printSplitTable(t *testing.T) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n| limit/s | split | replicas | load | sliding_window | fixed_window | token_bucket | peak second (split / unsplit, sliding) |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|\n")
	for _, limit := range []int{30, 300, 3000} {
		for _, n := range []int{2, 3, 8} {
			for _, replicas := range []int{1, 4, 16} {
				for _, load := range []float64{0.9, 1.1, 2} {
					dur := time.Duration(max(20, 60000/(float64(limit)*load)) * float64(time.Second)) // at least 60,000 requests
					var cells []string
					var peak string
					for _, alg := range []string{"sliding_window", "fixed_window", "token_bucket"} {
						row := simCompare(t, alg, limit, n, replicas, load, dur, uint64(limit*n+replicas))
						cells = append(cells, fmt.Sprintf("%.1f%%", 100*row.ratio()))
						if alg == "sliding_window" {
							peak = fmt.Sprintf("%.2f / %.2f", float64(row.split.peak)/float64(limit), float64(row.plain.peak)/float64(limit))
						}
					}
					fmt.Fprintf(&b, "| %d | %d | %d | %.1f× | %s | %s |\n", limit, n, replicas, load, strings.Join(cells, " | "), peak)
				}
			}
		}
	}
	t.Log(b.String())
}
