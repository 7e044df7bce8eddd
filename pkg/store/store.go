// Package store decides rate-limit checks against counter state. It defines
// the Store contract and the algorithms' exact arithmetic; the memory store
// (package store/memory) and the Redis store (package store/redis via lua/)
// implement it and must give identical results for identical inputs and
// clocks.
//
// # Arithmetic (shared by every implementation, bit for bit)
//
// Time is an integer count of microseconds since the Unix epoch (now). A
// window is W whole seconds, Wus = W*1e6 microseconds. All fractional
// arithmetic is IEEE-754 float64 in the order written here, so Lua (doubles)
// and Go produce the same numbers.
//
// Every algorithm has a "budget" R (how many single hits would pass right
// now, never negative). A consuming check of h >= 1 hits is allowed iff
// h <= R; it then consumes h and reports Remaining = R - h. A check-only
// check (h == 0) is allowed iff R >= 1 and reports Remaining = R. A refund
// (Refund true) returns h hits to the budget, is always allowed, and reports
// the budget after the refund.
//
// Sliding-window counter (the previous window's count weighted by the share
// of it still inside the trailing window). State: win, cur, prev (integers).
//
//	curWin  = floor(now / Wus)
//	if no state: win, cur, prev = curWin, 0, 0
//	if win != curWin: prev = (win == curWin-1) ? cur : 0; cur = 0
//	elapsed = (now - curWin*Wus) / Wus             -- float in [0,1)
//	rate    = prev*(1-elapsed) + cur
//	R       = rate < L ? ceil(L - rate) : 0
//	consume: cur += h
//	refund:  cur -= h; if cur < 0 { prev = max(0, prev+cur); cur = 0 }
//	Reset   = Wus - (now - curWin*Wus)             -- to the end of the window
//	TTL     = 2*W seconds, set on every write
//
// RetryAfter when denied (h > R): the earliest time at which h hits would pass
// with no other traffic. Let A = L - cur - h + 1.
//
//	if A > 0 (prev > 0 necessarily): x = (1 - A/prev)*Wus - (now - curWin*Wus)
//	else: A2 = L - h + 1
//	      if A2 <= 0 (h > L, can never pass): RetryAfter = Reset
//	      elif cur < A2: x = Reset (the next window start) minus 1 microsecond
//	      else: x = Reset + (1 - A2/cur)*Wus
//	RetryAfter = settle(floor(x) + 1) microseconds
//
// settle(ra) makes ra at least 1 and then, at most four times, adds one
// microsecond while h hits would still not pass at now+ra (the budget rolled
// forward with no other traffic), so float rounding never makes a client
// that retries at RetryAfter fail again. A check-only check (h = 0) that is
// denied reports the RetryAfter of one hit. Remaining of a denied check is
// its budget R.
//
// Sliding window of precision N (Precision >= 2, at most MaxPrecision): the
// window is counted in N sub-windows; sub-window j of a window spans
// [ceil(j*Wus/N), ceil((j+1)*Wus/N)) microseconds into it. State: sub (the
// absolute index curWin*N + j of the newest sub-window written), cur (its
// count) and old[1..N] (old[i] the count of sub-window sub-i).
//
//	j   = floor(into*N / Wus); s = curWin*N + j      -- into = now - curWin*Wus
//	if s != sub: the counts move s - sub places older (cur becomes old[s-sub]);
//	             those beyond old[N] drop; cur = 0 (s < sub: all 0)
//	b0, b1 = ceil(j*Wus/N), ceil((j+1)*Wus/N)
//	frac = (b1 - into) / (b1 - b0)                  -- the share of sub-window s-N still inside
//	rate = old[N]*frac + (cur + old[1] + ... + old[N-1])
//	R, consume and Force as above; refund: cur -= h, a deficit taken from
//	old[1], old[2], ... in turn and never owed.
//	Reset, TTL as above (Reset to the end of the window, TTL 2*W).
//
// RetryAfter (h > R): A = L - h + 1; if A <= 0, Reset. Else step through
// the sub-windows from s on (no other traffic): in step m (sub-window s+m)
// the counts of sub-windows s+m-N+1..s+m sum to F and sub-window s+m-N
// counts c. The first step with F < A passes at its start when c == 0 or
// q = (A - F)/c > 1, else at x = (T + b1') - q*(b1' - b0') microseconds
// from now, T + b1' being when sub-window s+m ends relative to now and b0',
// b1' its bounds; step 0 starts now. RetryAfter = settle(floor(x) + 1).
// Precision 1 is the two-counter window above, bit for bit.
//
// Strict (a sliding window of precision N >= 2 only): frac is 1, so the
// oldest sub-window counts whole until it has left the window, and no
// trailing window ever holds more than L. RetryAfter (h > R): the first
// step m whose F + c < A passes at its start (step 0: at once).
//
// Fixed window. State: win, count. If win != curWin: count = 0.
// R = max(0, L - count); refund: count = max(0, count - h).
// Reset = RetryAfter = Wus - (now - curWin*Wus); TTL = Reset (rounded up to a
// whole millisecond), set on every write.
//
// Token bucket. Capacity B = Burst (Burst 0 means L); refill rate
// r = L / Wus tokens per microsecond. State: tokens (float), last (integer
// microseconds). No state: tokens = B, last = now.
//
//	tokens = min(B, tokens + (now - last)*r); last = now
//	R = floor(tokens)
//	consume: tokens -= h      refund: tokens = min(B, tokens + h)
//	Reset      = floor((B - tokens)/r) + 1 microseconds when tokens < B, else 0 (time to full)
//	RetryAfter = settle(floor((h - tokens)/r) + 1) microseconds when h <= B, else floor(B/r) + 1
//	A bucket with L = 0 never refills: it denies everything with RetryAfter of
//	one window and Reset 0, and neither reads nor writes state.
//	TTL        = ceil(B/r) microseconds + 1 second, in whole milliseconds rounded up
//
// Redis stores tokens as string.format('%.17g', tokens) so the double round-
// trips exactly.
//
// # Batches
//
// Decide evaluates a batch atomically. Refund checks are applied first and are
// always written. Then the other checks are evaluated in order, each against
// the state the earlier checks of the batch left (so two checks of one key
// count twice). If every consuming check is allowed, all consumption is
// written; if any consuming check is denied, no consumption is written (a
// denied request takes no quota). Each Result reports its own check's
// verdict computed in that pass; an allowed consuming check of a vetoed
// batch reports the budget it found, R, since nothing was consumed (as
// envoyproxy/ratelimit does). Check-only checks never write.
//
// A Force check adds its Hits whatever the budget: it is a write-back of hits
// that a caller admitted while the store could not answer, so the window
// after an outage counts them. Force checks are applied with the refunds,
// before the other checks, and always written; each is Allowed and reports
// the budget after it. Sliding window: cur += h. Fixed window: count += h.
// Token bucket: tokens = max(0, tokens - h) (a write-back can empty a bucket
// but never leaves it owing tokens). A check that sets both Force and Refund
// is a refund.
//
// Leases: a consuming check that is neither a shadow nor paced and
// whose batch is not vetoed may ask for Want more hits, which the store
// counts with the check's own and the caller admits later (Result.Lease).
// Let R' be the budget after the check's own hits. n = min(Want, R') hits
// are granted at once. A two-counter sliding window with Horizon > 0 and
// prev > 0 is also granted, beyond R', the hits that would pass later as
// the previous window fades, with no other traffic: the j-th of them
// passes From + (j-1)*Every after the decision, where From is the
// RetryAfter of one hit with count cur'+R' (cur' = cur + h) and Every is
// wus/prev rounded up to a microsecond (a schedule no earlier than the
// exact one); they are granted while From + (j-1)*Every <= Horizon and <
// Reset, R'+j <= L - cur' (the window's own budget) and n+j <= Want. The
// lease's hits are consumed (cur, count or tokens), Remaining is the budget
// after them, and a vetoed batch grants nothing, with one exception: when
// the batch's only consuming check is such a sliding window, with Horizon
// > 0, and its own h hits do not fit (h > R), it is denied as usual (its
// Remaining, RetryAfter and Reset as any denial's) and is granted the lease
// that follows R: SlidingLease with cur and r = R (a queue position in
// what frees up, which is fair to the replicas that wait for it).
//
// A Paced check (sliding windows; ignored by the other algorithms)
// reserves hits that its holder spends no faster than the limit's pace, a
// small burst then a steady rate (an RLQS grant's token bucket): its budget
// is the current window's own, R = max(0, L - cur), as a fixed window's
// count (precision N: cur plus the counts of the window's sub-windows
// before it, those of absolute index curWin*N and up), and its RetryAfter
// is Reset. The whole reservation is counted in cur at once, so
// every other check sees it as spent; a window's paced reservations stay
// within L, and the rolling count passes L by no more than what their
// holders spend at once (their bursts).
//
// A Shadow check is evaluated like any other, but its denial does not veto
// the batch: the other checks consume as if it were absent, and the denied
// shadow check itself writes nothing. An allowed shadow check consumes.
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
	switch a {
	case SlidingWindow:
		return "sliding_window"
	case TokenBucket:
		return "token_bucket"
	case FixedWindow:
		return "fixed_window"
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
// decided in one atomic call.
type Check struct {
	Key       string
	Algorithm Algorithm
	Limit     uint64        // requests per window
	Window    time.Duration // a whole number of seconds, at least one
	Burst     uint64        // token bucket capacity; 0 means Limit
	Hits      uint64        // 0 means check without consuming
	Refund    bool          // return Hits to the budget (is_negative_hits)
	Shadow    bool          // shadow mode: a denial does not veto the batch (see the package doc)
	Force     bool          // add Hits whatever the budget: a write-back (see the package doc)
	Precision uint8         // sliding window: sub-windows per window (see the package doc); 0 and 1 are the two-counter window
	Strict    bool          // sliding window of Precision >= 2: the oldest sub-window counts whole (see the package doc)
	Paced     bool          // sliding window: the budget is the current window's own (see the package doc)
	// Want asks for a lease of up to Want more hits, and Horizon lets a
	// sliding window's lease include hits that pass within it (see the
	// package doc's Leases).
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
// into microseconds into a window of wus, with previous count prev (see the
// package doc's Leases).
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
// hits and lease, and no lease (see the package doc's Batches).
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
	Remaining  uint64        // budget left after this check (see the package doc)
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
	// Decide decides checks atomically (see the package doc) and writes one
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
