// Package simulate replays a trace of requests through every algorithm
// and precision a rule could use, and measures each against an exact
// sliding log: how far over the limit it lets a trailing window go, and
// how many requests it decides differently from the log. `rls simulate`
// is its command line.
//
// The candidates are decided by package store/memory with a fake clock:
// the stores' own arithmetic (package store's doc, which the Redis
// store's Lua computes bit for bit), not a second implementation.
//
// # The exact sliding log
//
// The reference is the ideal limiter, not a store: for each key it
// remembers every request it admitted. A request of h hits arriving at t
// is admitted iff the hits it admitted in the trailing window (t-W, t] of
// the same key (requests at the same microsecond earlier in the trace
// included), plus h, are at most L. It is run on the same arrivals as
// each candidate, on its own: a candidate's decisions never change what
// the log admits.
//
// # What is reported
//
// For each candidate: the peak, the most hits it admitted for one key in
// any trailing window (t-W, t], over L; wrongly admitted, the requests it
// admitted that the exact log denied, and wrongly denied, the requests it
// denied that the exact log admitted (shares of the log's denials and
// admissions); the Redis calls and commands per decision (see
// RedisCost); and the Redis memory per key of its state layout (see
// RedisBytes). The peak of the exact log is at most L by definition.
package simulate

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
)

// Limit is the rule simulated: Requests per Window.
type Limit struct {
	Requests uint64
	Window   time.Duration // a whole number of seconds, at least one
}

// Validate reports a limit the stores cannot count.
func (l Limit) Validate() error {
	if l.Requests == 0 {
		return fmt.Errorf("limit 0: every request is denied; nothing to compare")
	}
	if l.Requests > maxHits {
		return fmt.Errorf("limit %d: at most 2^53", l.Requests)
	}
	if l.Window < time.Second || l.Window%time.Second != 0 {
		return fmt.Errorf("window %v: want a whole number of seconds, at least 1s", l.Window)
	}
	return nil
}

// Candidate is one way of counting a rule: an algorithm and its
// parameters.
type Candidate struct {
	Algorithm store.Algorithm
	Precision uint64 // sliding window: sub-windows; 0 (or 1) is the two-counter window
	Strict    bool   // sliding window of precision >= 2: the oldest sub-window counts whole
	Burst     uint64 // token bucket: capacity; 0 means the limit
	Own       bool   // the rule's own configuration
}

// Name is the candidate as a rule would say it: "sliding_window",
// "sliding_window precision=10", "sliding_window precision=10 strict",
// "fixed_window", "token_bucket burst=50".
func (c Candidate) Name(l Limit) string {
	switch {
	case c.Algorithm == store.SlidingWindow && c.Precision >= 2 && c.Strict:
		return fmt.Sprintf("sliding_window precision=%d strict", c.Precision)
	case c.Algorithm == store.SlidingWindow && c.Precision >= 2:
		return fmt.Sprintf("sliding_window precision=%d", c.Precision)
	case c.Algorithm == store.TokenBucket:
		b := c.Burst
		if b == 0 {
			b = l.Requests
		}
		return fmt.Sprintf("token_bucket burst=%d", b)
	}
	return c.Algorithm.String()
}

// same reports whether c and o count alike.
func (c Candidate) same(o Candidate, l Limit) bool { return c.Name(l) == o.Name(l) }

// check returns the store check of one request of h hits on key.
func (c Candidate) check(l Limit, key string, h uint64) store.Check {
	return store.Check{Key: key, Algorithm: c.Algorithm, Limit: l.Requests, Window: l.Window,
		Burst: c.Burst, Precision: uint8(c.Precision), Strict: c.Strict && c.Precision >= 2, Hits: h}
}

// DefaultPrecisions are the sub-window counts compared by default.
var DefaultPrecisions = []uint64{2, 5, 10, 20, 60}

// Candidates returns what a rule of limit l could use: the two-counter
// sliding window, the sliding window at each precision (2 to
// store.MaxPrecision), then strict at each, the fixed window, and token buckets of burst L
// and L/10 (when that is at least 1). own, when not nil, is the rule's
// own configuration: marked Own, and added if it is none of those.
func Candidates(l Limit, precisions []uint64, own *Candidate) []Candidate {
	cs := []Candidate{{Algorithm: store.SlidingWindow}}
	for _, strict := range []bool{false, true} {
		for _, p := range precisions {
			if p >= 2 {
				cs = append(cs, Candidate{Algorithm: store.SlidingWindow, Precision: p, Strict: strict})
			}
		}
	}
	cs = append(cs, Candidate{Algorithm: store.FixedWindow}, Candidate{Algorithm: store.TokenBucket, Burst: l.Requests})
	if b := l.Requests / 10; b >= 1 {
		cs = append(cs, Candidate{Algorithm: store.TokenBucket, Burst: b})
	}
	if own != nil {
		o := *own
		o.Own = true
		if o.Algorithm == store.TokenBucket && o.Burst == 0 {
			o.Burst = l.Requests
		}
		if o.Algorithm != store.SlidingWindow || o.Precision < 2 {
			o.Precision, o.Strict = 0, false
		}
		if i := slices.IndexFunc(cs, func(c Candidate) bool { return c.same(o, l) }); i >= 0 {
			cs[i].Own = true
		} else {
			cs = append(cs, o)
		}
	}
	// The same candidate twice (a precision listed twice) once.
	out := cs[:0]
	for _, c := range cs {
		if !slices.ContainsFunc(out, func(o Candidate) bool { return o.same(c, l) }) {
			out = append(out, c)
		}
	}
	return out
}

// Report is the outcome of one trace.
type Report struct {
	Trace    string  `json:"trace"`
	Seed     uint64  `json:"seed,omitempty"`
	Limit    uint64  `json:"limit"`
	Window   string  `json:"window"`
	Requests int     `json:"requests"`
	Hits     uint64  `json:"hits"`
	Keys     int     `json:"keys"`
	Skipped  int     `json:"skipped_rows,omitempty"`
	Origin   float64 `json:"origin_seconds"`   // the window boundary at or before the first request; series times count from it
	Duration float64 `json:"duration_seconds"` // from the origin to the last request
	// ChartKey is the key the series follow: the one with the most
	// requests (the first such in the trace).
	ChartKey string   `json:"chart_key"`
	Exact    Result   `json:"exact"`
	Results  []Result `json:"candidates"`
}

// Result is one candidate's (or the exact log's) figures on a trace.
type Result struct {
	Name      string `json:"name"`
	Algorithm string `json:"algorithm"` // a store algorithm, or "exact_sliding_log"
	Precision uint64 `json:"precision,omitempty"`
	Strict    bool   `json:"strict,omitempty"`
	Burst     uint64 `json:"burst,omitempty"`
	Own       bool   `json:"rule_own,omitempty"`

	Admitted     int    `json:"admitted"`
	AdmittedHits uint64 `json:"admitted_hits"`
	// Peak is the most hits admitted for one key in any trailing window
	// (t-W, t]; PeakAt is that window's end, in seconds from the origin.
	Peak      uint64  `json:"peak"`
	PeakRatio float64 `json:"peak_ratio"`
	PeakAt    float64 `json:"peak_at_seconds"`

	WronglyAdmitted      int     `json:"wrongly_admitted"`
	WronglyDenied        int     `json:"wrongly_denied"`
	WronglyAdmittedShare float64 `json:"wrongly_admitted_share"` // of the requests the exact log denied
	WronglyDeniedShare   float64 `json:"wrongly_denied_share"`   // of the requests the exact log admitted

	RedisCalls      float64 `json:"redis_calls_per_decision,omitempty"`
	RedisCommands   float64 `json:"redis_commands_per_decision,omitempty"`
	RedisBytes      int     `json:"redis_bytes_per_key,omitempty"`
	RedisValueBytes int     `json:"redis_value_bytes,omitempty"`

	// Series is admitted hits per trailing window on ChartKey over time:
	// [seconds from the origin, the most in any trailing window ending
	// in the step that starts there].
	Series [][2]float64 `json:"series"`

	// Allowed holds the decision on each event of the trace.
	Allowed []bool `json:"-"`
}

// chartPoints is how many steps a series has (fewer for short traces).
const chartPoints = 600

// Run replays tr through each candidate and the exact log; it stops with
// ctx's error when ctx is done, looking at it every few thousand events of
// each replay.
func Run(ctx context.Context, tr Trace, l Limit, cands []Candidate) (*Report, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if len(tr.Events) == 0 {
		return nil, fmt.Errorf("trace %s: no requests", tr.Name)
	}
	wus := l.Window.Microseconds()
	rep := &Report{Trace: tr.Name, Seed: tr.Seed, Limit: l.Requests, Window: l.Window.String(), Requests: len(tr.Events), Skipped: tr.Skipped}
	for _, e := range tr.Events {
		rep.Hits += e.Hits
	}
	rep.ChartKey, rep.Keys = chartKey(tr)
	origin := store.FloorDiv(tr.Events[0].At, wus) * wus
	rep.Origin = float64(origin) / 1e6
	rep.Duration = float64(tr.Events[len(tr.Events)-1].At-origin) / 1e6

	exact := Exact(tr, l)
	rep.Exact = Measure(tr, l, exact)
	rep.Exact.Name, rep.Exact.Algorithm = "exact sliding log", "exact_sliding_log"
	for _, c := range cands {
		allowed, err := Decide(ctx, tr, l, c)
		if err != nil {
			return nil, err
		}
		r := Measure(tr, l, allowed)
		r.Name, r.Algorithm, r.Own = c.Name(l), c.Algorithm.String(), c.Own
		switch c.Algorithm {
		case store.SlidingWindow:
			r.Precision, r.Strict = c.Precision, c.Strict
		case store.TokenBucket:
			r.Burst = c.Burst
			if r.Burst == 0 {
				r.Burst = l.Requests
			}
		}
		exactAdmitted, exactDenied := 0, 0
		for i := range allowed {
			switch {
			case exact[i]:
				exactAdmitted++
				if !allowed[i] {
					r.WronglyDenied++
				}
			default:
				exactDenied++
				if allowed[i] {
					r.WronglyAdmitted++
				}
			}
		}
		r.WronglyAdmittedShare = share(r.WronglyAdmitted, exactDenied)
		r.WronglyDeniedShare = share(r.WronglyDenied, exactAdmitted)
		r.RedisCalls, r.RedisCommands = RedisCost(tr, l, c, allowed)
		r.RedisBytes, r.RedisValueBytes = RedisBytes(c)
		rep.Results = append(rep.Results, r)
	}
	return rep, nil
}

func share(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}

// Decide replays tr through candidate c on a memory store whose clock
// reads each event's time, and returns its decision on each event.
func Decide(ctx context.Context, tr Trace, l Limit, c Candidate) ([]bool, error) {
	allowed := make([]bool, len(tr.Events))
	err := Replay(ctx, tr, l, c, func(i int, ok bool) (force, refund bool) {
		allowed[i] = ok
		return false, false
	})
	return allowed, err
}

// Replay decides tr's events in order through c on a fresh memory store
// and calls each with the decision; each may ask for the event's hits to
// be forced in or refunded right after, at the same time. It stops with
// ctx's error when ctx is done.
func Replay(ctx context.Context, tr Trace, l Limit, c Candidate, each func(i int, allowed bool) (force, refund bool)) error {
	var now int64
	m := memory.New(memory.Options{
		Now:      func() time.Time { return time.UnixMicro(now) },
		MaxKeys:  1 << 30,
		MaxBytes: 1 << 50,
	})
	checks, res := make([]store.Check, 1), make([]store.Result, 1)
	for i, e := range tr.Events {
		if i%checkEvery == 0 && ctx.Err() != nil {
			return fmt.Errorf("%s: %w", c.Name(l), ctx.Err())
		}
		now = e.At
		checks[0] = c.check(l, e.Key, e.Hits)
		if err := m.Decide(ctx, checks, res); err != nil {
			return fmt.Errorf("%s: %v", c.Name(l), err)
		}
		force, refund := each(i, res[0].Allowed)
		if force || refund {
			checks[0].Force, checks[0].Refund = force, refund
			if err := m.Decide(ctx, checks, res); err != nil {
				return fmt.Errorf("%s: %v", c.Name(l), err)
			}
		}
	}
	return nil
}

// Exact runs the exact sliding log (the package doc) over tr and returns
// its decision on each event.
func Exact(tr Trace, l Limit) []bool {
	type log struct {
		at   []int64
		hits []uint64
		head int
		sum  uint64
	}
	wus := l.Window.Microseconds()
	logs := map[string]*log{}
	allowed := make([]bool, len(tr.Events))
	for i, e := range tr.Events {
		g := logs[e.Key]
		if g == nil {
			g = &log{}
			logs[e.Key] = g
		}
		for g.head < len(g.at) && g.at[g.head] <= e.At-wus {
			g.sum -= g.hits[g.head]
			g.head++
		}
		if g.head > 1024 && g.head*2 > len(g.at) {
			g.at, g.hits, g.head = append(g.at[:0], g.at[g.head:]...), append(g.hits[:0], g.hits[g.head:]...), 0
		}
		if e.Hits <= l.Requests && g.sum+e.Hits <= l.Requests {
			allowed[i] = true
			g.at, g.hits = append(g.at, e.At), append(g.hits, e.Hits)
			g.sum += e.Hits
		}
	}
	return allowed
}

// Measure returns the figures of decisions on tr (a candidate's, or a
// running service's, one per event): admitted, the peak and the series of
// the key with the most requests, as Run reports them.
func Measure(tr Trace, l Limit, allowed []bool) Result {
	if len(tr.Events) == 0 || len(allowed) != len(tr.Events) {
		return Result{}
	}
	key, _ := chartKey(tr)
	wus := l.Window.Microseconds()
	return result(tr, l, allowed, store.FloorDiv(tr.Events[0].At, wus)*wus, key)
}

// chartKey returns the key with the most requests in tr (the first such),
// which a report's series follow, and the number of keys.
func chartKey(tr Trace) (key string, keys int) {
	counts := map[string]int{}
	best := 0
	for _, e := range tr.Events {
		counts[e.Key]++
		if n := counts[e.Key]; n > best {
			best, key = n, e.Key
		}
	}
	return key, len(counts)
}

// result measures one set of decisions on tr: counts, the peak over all
// keys, and the series of chartKey.
func result(tr Trace, l Limit, allowed []bool, origin int64, chartKey string) Result {
	wus := l.Window.Microseconds()
	r := Result{Allowed: allowed}
	byKey := map[string][]Event{}
	for i, e := range tr.Events {
		if allowed[i] {
			r.Admitted++
			r.AdmittedHits += e.Hits
			byKey[e.Key] = append(byKey[e.Key], e)
		}
	}
	peakAt := int64(-1)
	for _, evs := range byKey {
		lo, sum := 0, uint64(0)
		for _, e := range evs {
			sum += e.Hits
			for evs[lo].At <= e.At-wus {
				sum -= evs[lo].Hits
				lo++
			}
			if sum > r.Peak || sum == r.Peak && e.At < peakAt {
				r.Peak, peakAt = sum, e.At
			}
		}
	}
	r.PeakRatio = float64(r.Peak) / float64(l.Requests)
	if peakAt >= 0 {
		r.PeakAt = float64(peakAt-origin) / 1e6
	}
	r.Series = series(byKey[chartKey], wus, origin, tr.Events[len(tr.Events)-1].At)
	return r
}

// series returns the most hits of adm (one key's admitted events, in time
// order) in any trailing window ending in each of up to chartPoints
// equal steps from origin to end.
func series(adm []Event, wus, origin, end int64) [][2]float64 {
	span := max(end-origin+1, 1)
	steps := int64(chartPoints)
	step := max((span+steps-1)/steps, 1)
	n := (span + step - 1) / step
	out := make([][2]float64, 0, n)
	// trailing(p) for non-decreasing p, by two pointers.
	hi, lo, sum := 0, 0, uint64(0)
	trailing := func(p int64) uint64 {
		for hi < len(adm) && adm[hi].At <= p {
			sum += adm[hi].Hits
			hi++
		}
		for lo < hi && adm[lo].At <= p-wus {
			sum -= adm[lo].Hits
			lo++
		}
		return sum
	}
	for i := int64(0); i < n; i++ {
		from := origin + i*step
		to := from + step
		m := trailing(from)
		// Within the step the count only rises at an admission.
		for hi < len(adm) && adm[hi].At < to {
			m = max(m, trailing(adm[hi].At))
		}
		out = append(out, [2]float64{float64(from-origin) / 1e6, float64(m)})
	}
	return out
}

// ParsePrecisions reads a comma-separated list of sub-window counts, each
// from 2 to store.MaxPrecision ("" is none).
func ParsePrecisions(s string) ([]uint64, error) {
	var out []uint64
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, f := range strings.Split(s, ",") {
		var p uint64
		if _, err := fmt.Sscan(strings.TrimSpace(f), &p); err != nil || p < 2 || p > store.MaxPrecision || fmt.Sprint(p) != strings.TrimSpace(f) {
			return nil, fmt.Errorf("precision %q: want a whole number from 2 to %d", strings.TrimSpace(f), store.MaxPrecision)
		}
		out = append(out, p)
	}
	return out, nil
}
