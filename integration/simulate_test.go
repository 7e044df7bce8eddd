package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/simulate"
	"github.com/rls-project/rls/pkg/simulate/simtest"
	"github.com/rls-project/rls/pkg/store"
)

// Sliding window precision, black-box. Two rules of 50 a second,
// one with precision 10 and one without, on two replicas sharing one
// Redis and on one replica of the memory store, driven over gRPC with the
// standard traces of `rls simulate` (a few seconds each). Each request's
// send time is stamped just before it is sent; the peak is the most
// admitted in any trailing second of send times.

const simL = 50

const simConfig = `domain: sim
descriptors:
  - key: precise
    rate_limit: {unit: second, requests_per_unit: 50, precision: 10}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 50}
`

// simRules are the two rules and the candidate of pkg/simulate that
// counts as each does.
var simRules = []struct {
	key  string
	cand simulate.Candidate
}{
	{"precise", simulate.Candidate{Algorithm: store.SlidingWindow, Precision: 10}},
	{"plain", simulate.Candidate{Algorithm: store.SlidingWindow}},
}

// simSample is one answered request: when it was sent, the verdict, and,
// for an allowed one, the store's clock when it decided (from the reset
// the answer carries; 0 when unknown).
type simSample struct {
	sent    int64 // Unix microseconds
	recv    int64
	ok      bool
	storeAt int64
}

// simStream is one rule on one store: the replicas its requests go to and
// what they answered.
type simStream struct {
	store, rule string
	cand        simulate.Candidate
	procs       []*rlsProc
	mu          sync.Mutex
	samples     []simSample
	errs        int
}

// TestSimulatePrecisionBlackBox checks sliding window precision on the
// real service. For
// every trace, store and rule:
//
//   - the service's decisions are the arithmetic's, at the store's clock:
//     every request it allowed, the arithmetic (pkg/simulate, on the memory
//     store's code) allows too at the store's time of deciding it
//     (recovered exactly from the answer's reset), given the service's
//     admissions before it; every request it denied, the arithmetic denies
//     at some time the store could have decided it (from its send time to
//     its answer, just after any admission in between; the over-limit cache
//     may deny up to one answer time past the store's retry time, since it
//     times the denial on rls's clock when the answer is back). On a busy
//     machine (the skew below over 5 ms), the plain rule on Redis, which
//     leases near its limit, is held by count instead: the service admits
//     no fewer than the arithmetic on the store's trace, less one a second;
//   - rls simulate's peak on the recorded trace is within ±0.02 L (one
//     request) of the service's: on the trace as the store saw it (each
//     request at its time above), where it follows from the first check,
//     and at the send times (stamped just before sending) when the send to
//     store skew's 99th percentile is at most 5 ms; a busier machine
//     makes the send times say little about when the store decided, and
//     the log says so;
//   - replayed in lockstep at the send times (simtest.Follow), at most 20%
//     of the decisions differ (when the skew is as small): the skew moves
//     requests across (sub-)window boundaries, mostly near the limit; the
//     log reports how many;
//   - precision 10 holds the peak at 1.05 L wherever the arithmetic does
//     on the same trace, and always on the boundary attack. Where the
//     arithmetic itself lets more through (at L = 50 a sub-window holds 5
//     requests, and the even-spread assumption within the oldest one is
//     worth a few of them, more on bursty traffic), the checks above tie
//     the service to it, and the log says so.
//
// Not parallel: the send-time stamps must stay close to the store's clock.
func TestSimulatePrecisionBlackBox(t *testing.T) {
	dir := writeConfig(t, map[string]string{"sim.yaml": simConfig})
	srv := redistest.StartServer(t)
	onRedis := exStartFast(t, 2, dir, "--store", "redis", "--redis-url", srv.URL())
	onMemory := exStartFast(t, 1, dir, "--store", "memory")
	stores := []struct {
		name  string
		procs []*rlsProc
	}{{"redis", onRedis}, {"memory", onMemory}}
	l := simulate.Limit{Requests: simL, Window: time.Second}
	const seed, duration = 17, 4 * time.Second

	type outcome struct {
		trace, store, rule                   string
		peak, simPeak, storePeak, simStorePk uint64
	}
	var outcomes []outcome
	var skews []int64
	start := time.Now()
	for ti, spec := range simulate.StandardGenerators {
		sep := ","
		if !strings.Contains(spec, ":") {
			sep = ":"
		}
		tr, err := simulate.Generate(spec+sep+"duration="+duration.String(), simL, time.Second, seed, "")
		if err != nil {
			t.Fatal(err)
		}
		var streams []*simStream
		for _, s := range stores {
			for _, r := range simRules {
				streams = append(streams, &simStream{store: s.name, rule: r.key, cand: r.cand, procs: s.procs})
			}
		}
		suffix := fmt.Sprintf("t%d-%d", ti, time.Now().UnixNano())
		simDrive(t, tr, streams, suffix)
		simCheckKeys(t, srv, suffix)
		for _, st := range streams {
			name := fmt.Sprintf("%s, %s on %s", spec, st.rule, st.store)
			if st.errs > 0 {
				t.Errorf("%s: %d calls failed", name, st.errs)
			}
			at, notAllowed, late, unexplained, slack := simAtStore(t, st.samples, l, st.cand)
			sent, atStore, storeVerdicts := simTraces(st.samples, at)
			verdicts := make([]bool, len(st.samples))
			var streamSkews []int64
			for i, s := range st.samples {
				verdicts[i] = s.ok
				if s.ok {
					streamSkews = append(streamSkews, s.storeAt-s.sent)
				}
			}
			skews = append(skews, streamSkews...)
			slices.Sort(streamSkews)
			p99 := int64(0)
			if n := len(streamSkews); n > 0 {
				p99 = streamSkews[n*99/100]
			}
			quiet := p99 <= simQuietSkew
			lockstep, err := simtest.Follow(sent, l, st.cand, verdicts)
			if err != nil {
				t.Fatal(err)
			}
			peaks := map[string][2]simulate.Result{}
			for _, v := range []struct {
				clock    string
				tr       simulate.Trace
				verdicts []bool
			}{{"send", sent, verdicts}, {"store", atStore, storeVerdicts}} {
				decided, err := simulate.Decide(context.Background(), v.tr, l, st.cand)
				if err != nil {
					t.Fatal(err)
				}
				peaks[v.clock] = [2]simulate.Result{simulate.Measure(v.tr, l, v.verdicts), simulate.Measure(v.tr, l, decided)}
			}
			sp, ss := peaks["send"], peaks["store"]
			outcomes = append(outcomes, outcome{spec, st.store, st.rule, sp[0].Peak, sp[1].Peak, ss[0].Peak, ss[1].Peak})
			t.Logf("%s: %d requests, skew p99 %d µs; peak at send times %d (%.2f L), rls simulate %d; at the store's %d, rls simulate %d; admitted %d, simulated %d; lockstep at send times: %d differ; at the store's: %d allowed not, %d denials only up to %v before the send time, %d not",
				name, len(st.samples), p99, sp[0].Peak, sp[0].PeakRatio, sp[1].Peak, ss[0].Peak, ss[1].Peak, sp[0].Admitted, sp[1].Admitted,
				len(lockstep), notAllowed, late, time.Duration(slack)*time.Microsecond, unexplained)
			// The plain rule on Redis leases near its limit (docs/redis.md,
			// invariant 16): the hits that free up in the next 20 ms are
			// counted for the replica that asked, which admits them when its
			// requests come; meanwhile the other replica's are denied, as
			// Redis holds them. On a busy machine those requests come later
			// than a denial's answer, so the arithmetic, given the admissions
			// before, would allow what Redis held: there the denials are held
			// by count (the service admits no fewer than the arithmetic on
			// the store's trace, less one a second of trace), not one by one.
			leased := st.store == "redis" && st.rule == "plain" && !quiet
			if notAllowed > 0 || unexplained > 0 && !leased {
				t.Errorf("%s: the service decided otherwise than the arithmetic at the store's clock: %d allowed requests it denies, %d denials it never makes",
					name, notAllowed, unexplained)
			}
			if leased && unexplained > 0 {
				got, want := peaks["store"][0].Admitted, peaks["store"][1].Admitted
				t.Logf("%s: %d denials the arithmetic does not make before their answers, on a busy machine (skew p99 %v); admitted %d, the arithmetic on the store's trace %d",
					name, unexplained, time.Duration(p99)*time.Microsecond, got, want)
				if got+int(duration/time.Second) < want {
					t.Errorf("%s: admitted %d, the arithmetic %d on the store's trace: more than one a second fewer", name, got, want)
				}
			}
			for _, clock := range []string{"store", "send"} {
				service, sim := peaks[clock][0], peaks[clock][1]
				if clock == "send" && !quiet {
					t.Logf("%s: skew p99 %v over %v: the send times are too far from the store's to hold the service to them", name, time.Duration(p99)*time.Microsecond, time.Duration(simQuietSkew)*time.Microsecond)
					break
				}
				if d := int(service.Peak) - int(sim.Peak); d > 1 || d < -1 {
					t.Errorf("%s: at the %s times the service's peak %d and rls simulate's %d differ by more than 0.02 L", name, clock, service.Peak, sim.Peak)
				}
				if st.rule == "precise" && float64(service.Peak) > 1.05*simL {
					if float64(sim.Peak) > 1.05*simL && spec != "boundary" {
						t.Logf("%s: over 1.05 L at the %s times, as the arithmetic is on this trace (rls simulate: %.2f L)", name, clock, sim.PeakRatio)
					} else {
						t.Errorf("%s: precision 10 let %d through in one trailing second at the %s times (%.2f L), over 1.05 L; the arithmetic: %.2f L",
							name, service.Peak, clock, service.PeakRatio, sim.PeakRatio)
					}
				}
			}
			if quiet && len(lockstep)*5 > len(st.samples) {
				t.Errorf("%s: %d of %d decisions differ from the arithmetic at the send times (over 20%%)", name, len(lockstep), len(st.samples))
			}
		}
	}
	slices.Sort(skews)
	if n := len(skews); n > 0 {
		t.Logf("send to store skew of allowed answers: median %d µs, p99 %d µs, max %d µs (%d answers); the traces took %v",
			skews[n/2], skews[n*99/100], skews[n-1], n, time.Since(start).Round(time.Millisecond))
	}
	for _, s := range stores {
		for _, r := range simRules {
			line := fmt.Sprintf("%s on %s, peak/L at send times (rls simulate), at the store's (rls simulate):", r.key, s.name)
			for _, o := range outcomes {
				if o.store == s.name && o.rule == r.key {
					line += fmt.Sprintf("  %s %.2f (%.2f), %.2f (%.2f)", o.trace, float64(o.peak)/simL, float64(o.simPeak)/simL,
						float64(o.storePeak)/simL, float64(o.simStorePk)/simL)
				}
			}
			t.Log(line)
		}
	}
	rdNoFallback(t, append(onRedis, onMemory...)...)
	if fb := exFallbacks(t, append(onRedis, onMemory...)); fb != 0 {
		t.Errorf("%v fallback decisions: the comparison needs the stores' own", fb)
	}
}

// simAtStore compares the service's decisions with the arithmetic's at the
// store's clock, and returns each sample's time at the store: an allowed
// one's, exact, and a denied one's, the first at which the arithmetic
// denies it (its send time when none). The requests it allowed, at their recovered store times,
// must all pass the arithmetic in turn (a denial changes no state):
// notAllowed counts those that do not. A denial is explained when the
// arithmetic, given the admissions before, denies at its send time or just
// after an admission up to its answer; late counts those explained only
// from slack before the send time, unexplained those never. slack is the
// longest answer time of the stream: the over-limit cache keeps a denial
// until rls's clock, read when the store's answer came back, reaches the
// retry time, so it may deny that much past the store's own retry time.
func simAtStore(t *testing.T, samples []simSample, l simulate.Limit, c simulate.Candidate) (at []int64, notAllowed, late, unexplained int, slack int64) {
	t.Helper()
	slack = 1000
	for _, s := range samples {
		slack = max(slack, s.recv-s.sent)
	}
	var admitted []int64
	for _, s := range samples {
		if s.ok {
			if s.storeAt == 0 {
				t.Fatalf("an allowed answer without a reset: %+v", s)
			}
			admitted = append(admitted, s.storeAt)
		}
	}
	slices.Sort(admitted)
	tr := simulate.Trace{Name: "admitted"}
	for _, a := range admitted {
		tr.Events = append(tr.Events, simulate.Event{At: a, Key: "k", Hits: 1})
	}
	d, err := simulate.Decide(context.Background(), tr, l, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range d {
		if !ok {
			notAllowed++
		}
	}
	// denies reports whether the arithmetic denies a request at p, after
	// the admissions up to p.
	denies := func(p int64) bool {
		n, _ := slices.BinarySearch(admitted, p+1)
		probe := simulate.Trace{Name: "probe", Events: append(slices.Clone(tr.Events[:n]), simulate.Event{At: p, Key: "k", Hits: 1})}
		d, err := simulate.Decide(context.Background(), probe, l, c)
		if err != nil {
			t.Fatal(err)
		}
		return !d[len(d)-1]
	}
	// explained returns the first time from from on at which the
	// arithmetic denies s.
	explained := func(s simSample, from int64) (int64, bool) {
		if denies(from) {
			return from, true
		}
		for _, a := range admitted {
			if a > from && a <= s.recv && denies(a) {
				return a, true
			}
		}
		return 0, false
	}
	at = make([]int64, len(samples))
	for i, s := range samples {
		if s.ok {
			at[i] = s.storeAt
			continue
		}
		var ok bool
		if at[i], ok = explained(s, s.sent); ok {
			continue
		}
		if at[i], ok = explained(s, s.sent-slack); ok {
			late++
			continue
		}
		at[i] = s.sent
		unexplained++
	}
	return at, notAllowed, late, unexplained, slack
}

// simQuietSkew is the largest 99th percentile of the send to store skew
// (microseconds) at which the send times are held to the arithmetic: on a
// machine busy enough to delay requests by more, send times say little
// about when the store decided. (A CI run beside two CPU burners saw p99s
// of 7.4 and 9.6 ms move two requests of the on/off trace across a
// trailing second's edge: 0.04 L at the send times, none at the store's.)
const simQuietSkew = 5_000

// simTraces returns the samples as traces of pkg/simulate: at their send
// times, and at their times at the store (simAtStore's), with the verdicts
// in that trace's order (a denial after an admission at the same time).
func simTraces(samples []simSample, at []int64) (sent, atStore simulate.Trace, storeVerdicts []bool) {
	sent.Name, atStore.Name = "recorded at send times", "recorded at store times"
	idx := make([]int, len(samples))
	for i, s := range samples {
		sent.Events = append(sent.Events, simulate.Event{At: s.sent, Key: "k", Hits: 1})
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		i, j := idx[a], idx[b]
		return at[i] < at[j] || at[i] == at[j] && samples[i].ok && !samples[j].ok
	})
	for _, i := range idx {
		atStore.Events = append(atStore.Events, simulate.Event{At: at[i], Key: "k", Hits: 1})
		storeVerdicts = append(storeVerdicts, samples[i].ok)
	}
	return sent, atStore, storeVerdicts
}

// simDrive sends tr's arrivals to every stream at once, from the next
// whole second on (so that the generators' window boundaries are the
// stores'), each request stamped just before it is sent, and waits for
// every answer. suffix makes the descriptor values fresh.
func simDrive(t *testing.T, tr simulate.Trace, streams []*simStream, suffix string) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 17))
	origin := time.Now().Truncate(time.Second).Add(time.Second)
	var wg sync.WaitGroup
	for _, e := range tr.Events {
		time.Sleep(time.Until(origin.Add(time.Duration(e.At) * time.Microsecond))) // the trace's times: real time on purpose
		for _, st := range streams {
			c := st.procs[rng.IntN(len(st.procs))].client()
			req := &rlsv3.RateLimitRequest{Domain: "sim", Descriptors: []*rlcommon.RateLimitDescriptor{desc(st.rule, suffix)}}
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				sent := time.Now()
				r, err := c.ShouldRateLimit(ctx, req)
				st.mu.Lock()
				defer st.mu.Unlock()
				if err != nil {
					st.errs++
					return
				}
				s := simSample{sent: sent.UnixMicro(), recv: time.Now().UnixMicro(), ok: r.OverallCode == rlsv3.RateLimitResponse_OK}
				if s.ok && len(r.Statuses) == 1 && r.Statuses[0].DurationUntilReset != nil {
					s.storeAt = simStoreTime(s.sent, r.Statuses[0].DurationUntilReset.AsDuration().Microseconds())
				}
				st.samples = append(st.samples, s)
			})
		}
	}
	wg.Wait()
	for _, st := range streams {
		sort.SliceStable(st.samples, func(i, j int) bool { return st.samples[i].sent < st.samples[j].sent })
	}
}

// simStoreTime recovers the store's clock at an allowed decision of a
// one-second sliding window from its reset (the time to the end of the
// window the store was in): the window end nearest after the send time
// that puts the decision at or after it (allowing 1 ms of clock reading
// order).
func simStoreTime(sent, resetUS int64) int64 {
	into := 1_000_000 - resetUS
	at := sent/1_000_000*1_000_000 + into
	if at < sent-1000 {
		at += 1_000_000
	}
	return at
}

// simCheckKeys, right after a trace: on Redis the rule with precision 10
// keeps its sub-windows under a key ending in s1p10, and the rule without
// precision its counts in one key per window, s1:<the window's start>, a
// decimal integer.
func simCheckKeys(t *testing.T, srv *redistest.Server, suffix string) {
	t.Helper()
	rc := srv.Client()
	defer rc.Close()
	ctx := context.Background()
	keys, err := rc.Keys(ctx, "rl:{sim|*"+suffix+"}*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var precise, plain int
	for _, k := range keys {
		v, err := rc.Get(ctx, k).Result()
		if err != nil {
			continue // expired meanwhile
		}
		switch {
		case strings.HasPrefix(k, "rl:{sim|precise=") && strings.HasSuffix(k, "}:s1p10"):
			precise++
			if len(v) != 1+8*(10+3) || v[0] != 'p' {
				t.Errorf("%s holds %d bytes starting %q, want 105 starting 'p'", k, len(v), v[:1])
			}
		case strings.HasPrefix(k, "rl:{sim|plain=") && strings.Contains(k, "}:s1:"):
			plain++
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				t.Errorf("%s holds %q, want a window's count", k, v)
			}
		default:
			t.Errorf("unexpected key %q", k)
		}
	}
	if precise == 0 || plain == 0 {
		t.Errorf("keys %v: want both rules'", keys)
	}
}
