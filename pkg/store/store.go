// Package store is the contract of the stores that decide rate-limit
// checks: Store, Check, Result, their errors, and the algorithms' exact
// arithmetic, which docs/arithmetic.md states and every store matches bit
// for bit (the memory store, package store/memory; the Redis store,
// package store/redisstore with store/redisstore/lua/decide.lua). A batch of checks is decided
// atomically: all its consuming checks or none; a Force check (a
// write-back) and a refund always stand; a Paced check counts against its
// current window; a check's Want asks for a lease of hits counted ahead.
package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Algorithm selects the counting algorithm of a check. It is the one
// definition shared by the configuration (a rule's rate_limit.algorithm,
// an rls extension), the service, both stores and the Redis script's wire
// format (package lua maps it to the script's codes).
type Algorithm uint8

// The algorithms. The zero value is the default, the sliding-window counter.
const (
	SlidingWindow Algorithm = iota
	TokenBucket
	FixedWindow
)

// String returns the algorithm's configuration name ("sliding_window",
// "token_bucket", "fixed_window"), or "unknown" for any other value.
func (a Algorithm) String() string {
	if a <= FixedWindow {
		return [...]string{"sliding_window", "token_bucket", "fixed_window"}[a]
	}
	return "unknown"
}

// ParseAlgorithm returns the algorithm whose String equals s in lower case
// ("token_bucket", "TOKEN_BUCKET"). ok is false for any other string.
func ParseAlgorithm(s string) (a Algorithm, ok bool) {
	s = strings.ToLower(s)
	for a := SlidingWindow; a <= FixedWindow; a++ {
		if s == a.String() {
			return a, true
		}
	}
	return 0, false
}

// MaxPrecision is the most sub-windows a sliding window may have: the
// bound of a rule's precision, and decide.lua's MAX_PRECISION.
const MaxPrecision = 60

// Check is one counter to decide. Key is the counter's store key (see
// descriptors.AppendKey); checks whose keys share a Redis hash slot are
// decided together, all or nothing (docs/arithmetic.md, "Batches").
type Check struct {
	Key       string
	Algorithm Algorithm
	Limit     uint64        // requests per window
	Window    time.Duration // a whole number of seconds, at least one
	Burst     uint64        // token bucket capacity; 0 means Limit
	Hits      uint64        // 0 means check without consuming
	Refund    bool          // return Hits to the budget (is_negative_hits)
	Shadow    bool          // shadow mode: a denial does not veto the batch (docs/arithmetic.md)
	Force     bool          // add Hits whatever the budget: a write-back (docs/arithmetic.md)
	Precision uint8         // sliding window: sub-windows per window (docs/arithmetic.md); 0 and 1 are the two-counter window
	Strict    bool          // sliding window of Precision >= 2: the oldest sub-window counts whole (docs/arithmetic.md)
	Paced     bool          // sliding window: the budget is the current window's own (docs/arithmetic.md)
	// Want asks for a lease of up to Want more hits, and Horizon lets a
	// sliding window's lease include hits that pass within it
	// (docs/arithmetic.md, Leases).
	Want    uint64
	Horizon time.Duration
	// Exact is a hint that changes no result: the caller last saw the key
	// near its limit, so the Redis store decides it by script at once
	// rather than by plain commands that it may have to take back.
	Exact bool
}

// SlidingBudget returns a two-counter sliding window's budget R = ceil(L -
// rate) when rate < L, else 0, with counts prev and cur, into microseconds
// into a window of wus (see the arithmetic above).
func SlidingBudget(prev, cur int64, limit uint64, into, wus int64) uint64 {
	elapsed := float64(into) / float64(wus)
	rate := float64(float64(prev)*(1-elapsed)) + float64(cur)
	if l := float64(limit); rate < l {
		return uint64(math.Ceil(l - rate))
	}
	return 0
}

// SlidingRetry returns a two-counter sliding window's RetryAfter for h >= 1
// hits, with counts prev and cur, into microseconds into a window of wus
// (see the arithmetic above).
func SlidingRetry(prev, cur int64, limit, h uint64, into, wus int64) time.Duration {
	l, hf, fw := float64(limit), float64(h), float64(wus)
	rst := wus - into
	var x float64
	if a := l - float64(cur) - hf + 1; a > 0 && prev > 0 {
		x = float64((1-a/float64(prev))*fw) - float64(into)
	} else {
		a2 := l - hf + 1
		switch {
		case a2 <= 0:
			return time.Duration(rst) * time.Microsecond
		case float64(cur) < a2:
			x = float64(rst - 1)
		default:
			x = float64(rst) + float64((1-a2/float64(cur))*fw)
		}
	}
	ra := Settle(int64(math.Floor(x))+1, func(ra int64) bool { return slidingPassesAt(prev, cur, l, hf, into+ra, wus) })
	return time.Duration(ra) * time.Microsecond
}

// slidingPassesAt reports whether hf hits would pass at into microseconds
// past the current window's start (into may reach later windows), with no
// other traffic.
func slidingPassesAt(prev, cur int64, l, hf float64, into, wus int64) bool {
	switch {
	case into >= 2*wus:
		prev, cur = 0, 0
	case into >= wus:
		prev, cur, into = cur, 0, into-wus
	}
	elapsed := float64(into) / float64(wus)
	rate := float64(float64(prev)*(1-elapsed)) + float64(cur)
	if rate >= l {
		return false
	}
	return hf <= math.Ceil(l-rate)
}

// SlidingLease returns a two-counter sliding window's lease of at most want
// hits after a check left count cur (its own hits included) and budget r,
// into microseconds into a window of wus, with previous count prev
// (docs/arithmetic.md, Leases).
func SlidingLease(prev, cur int64, limit, r, want uint64, horizon time.Duration, into, wus int64) Lease {
	n := min(want, r)
	l := Lease{Hits: n, Now: n}
	own := uint64(max(0, int64(limit)-cur)) // cur never exceeds what a budget let in, but a force may
	if n == want || horizon <= 0 || prev <= 0 || r >= own {
		return l
	}
	from := int64(SlidingRetry(prev, cur+int64(r), limit, 1, into, wus) / time.Microsecond)
	every := (wus + prev - 1) / prev
	last := min(int64(horizon/time.Microsecond), wus-into-1) // the latest a hit may pass: within Horizon and this window
	if from > last {
		return l
	}
	m := min(own-r, want-n, uint64((last-from)/every)+1)
	l.Hits += m
	l.From, l.Every = time.Duration(from)*time.Microsecond, time.Duration(every)*time.Microsecond
	return l
}

// Unconsume sets the results of a vetoed batch's allowed consuming checks
// to what they found, since nothing was consumed: their budget before their
// hits and lease, and no lease (see docs/arithmetic.md's Batches).
func Unconsume(checks []Check, results []Result) {
	for i := range checks {
		if r := &results[i]; checks[i].Consuming() && r.Allowed {
			r.Remaining += checks[i].Hits + r.Lease.Now
			r.Lease = Lease{}
		}
	}
}

// Settle corrects a RetryAfter computed in floating point: it is at least
// one microsecond, and it moves later (a few microseconds at most) while the
// check would still not pass then, so a client retrying at RetryAfter passes.
// The sliding window settles in int64 microseconds; the token bucket in
// float64, as the script computes it, because a slow bucket's times can
// exceed what an int64 of microseconds holds.
func Settle[T int64 | float64](ra T, passes func(T) bool) T {
	ra = max(ra, 1)
	for range 4 {
		if passes(ra) {
			break
		}
		ra++
	}
	return ra
}

// Consuming reports whether c consumes when allowed: it has hits and is
// neither a refund nor a forced write-back.
func (c *Check) Consuming() bool { return c.Hits > 0 && !c.Refund && !c.Force }

// Result is the outcome of one Check.
type Result struct {
	Allowed    bool
	Remaining  uint64        // budget left after this check (docs/arithmetic.md)
	RetryAfter time.Duration // when denied: until the same check would pass; 0 when allowed
	Reset      time.Duration // until the current window ends (token bucket: until full)
	// Lease is what the store granted of the check's Want.
	Lease Lease
	// Undecided marks a check the store could not decide because the part of
	// the backend that owns its key is unavailable (see Store.Decide).
	Undecided bool
	// Consumed marks a consuming check whose hits the store wrote: allowed
	// in a batch (on a Redis Cluster: a hash slot's part of it) that no
	// denial vetoed. Refunds, forced write-backs, check-only checks and
	// denied checks are never Consumed. A caller that denies the request
	// after all (another slot, its fallback, its quota rule) refunds these
	// hits and those of their Lease.
	Consumed bool
}

// Lease is the part of a check's Want that the store counted: Hits in
// all, of which the first Now may be admitted at once and hit Now+j (j >=
// 1) from From + (j-1)*Every after the store decided (see the package
// doc's Leases). A lease never outlives the window it was counted in.
type Lease struct {
	Hits, Now   uint64
	From, Every time.Duration
}

// At returns when lease hit k (1-based) may be admitted, after the
// decision: 0 for the first Now.
func (l *Lease) At(k uint64) time.Duration {
	if k <= l.Now {
		return 0
	}
	return l.From + time.Duration(k-l.Now-1)*l.Every
}

// Store decides batches of checks. Implementations are safe for concurrent use.
type Store interface {
	// Decide decides checks atomically (docs/arithmetic.md) and writes one
	// Result per Check into results, which has the same length as checks.
	// It is bounded by ctx's deadline when ctx has one, else by the store's
	// own timeout: the caller decides how long an answer is worth waiting
	// for.
	// Errors caused by an unreachable or slow backend wrap ErrUnavailable;
	// then the results not marked Undecided are valid decisions (a Redis
	// Cluster whose other shards answered) and the Undecided ones are for the
	// caller's fallback. A store that marks none has decided none. Any other
	// error means nothing is known about the outcome.
	Decide(ctx context.Context, checks []Check, results []Result) error
	// Peek reports what Decide would answer for check-only versions of
	// checks (Hits 0, no refund, no force) and writes nothing (the admin
	// API's Explain). Errors as for Decide.
	Peek(ctx context.Context, checks []Check, results []Result) error
	// Delete removes the counters of checks (their keys, and a windowed
	// key's recent windows); a missing one is not an error (the admin
	// API's ResetCounters).
	Delete(ctx context.Context, checks ...Check) error
	// Close releases the store's resources.
	Close() error
}

// ErrUnavailable marks errors caused by a store backend that cannot answer
// (connection refused, timeout, cluster down). Callers fall back on it.
var ErrUnavailable = errors.New("store unavailable")

// ErrCircuitOpen marks a call refused at once because the backend's circuit
// breaker is open (it has been failing for a while). It wraps ErrUnavailable.
var ErrCircuitOpen = fmt.Errorf("%w: circuit open", ErrUnavailable)

// ErrProtocol marks an answer the backend gave that rls cannot use: a script
// error, a reply of the wrong shape or type. It is a bug, not an outage: it
// does not wrap ErrUnavailable, callers do not fall back on it, and circuit
// breakers do not count it as a failure.
var ErrProtocol = errors.New("store protocol error")

// ErrAuth marks the backend's refusal of rls's credentials or permissions
// (Redis's NOAUTH, WRONGPASS, NOPERM): a misconfiguration, which no retry
// mends. It does not wrap ErrUnavailable, so callers do not fall back on
// it: a fleet deciding from local shares for as long as a password is
// wrong would admit up to its size times each limit, silently.
var ErrAuth = errors.New("store refused rls's credentials")

// Request is one request of a batch of independent requests: its checks
// are decided atomically among themselves (as one Decide call), apart from
// the other requests of the batch. Err receives the request's error, as
// Decide would return it.
type Request struct {
	Checks  []Check
	Results []Result // len(Checks) results
	Err     error
}

// Batcher is a Store that decides many independent requests together, in
// as few round trips as its backend allows (the Redis store: one pipeline
// per node), for callers that decide many keys at once (RLQS reports).
type Batcher interface {
	DecideBatch(ctx context.Context, reqs []Request)
}

// DecideBatch decides each request of reqs as its own Decide call, setting
// its Results and Err: in one call of st's DecideBatch when st is a
// Batcher, else one Decide per request, in order.
func DecideBatch(ctx context.Context, st Store, reqs []Request) {
	if b, ok := st.(Batcher); ok {
		b.DecideBatch(ctx, reqs)
		return
	}
	for i := range reqs {
		reqs[i].Err = st.Decide(ctx, reqs[i].Checks, reqs[i].Results)
	}
}
