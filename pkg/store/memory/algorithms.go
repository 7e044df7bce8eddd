package memory

import (
	"math"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// The per-algorithm arithmetic of package store's doc. Every float64
// product is converted explicitly so that it is rounded on its own and never
// fused into a multiply-add: the Lua script (doubles) must get the same
// numbers.

const (
	usPerSecond = int64(time.Second / time.Microsecond)
	usPerMilli  = int64(time.Millisecond / time.Microsecond)
	algNone     = store.Algorithm(255) // state of an absent key
)

// state is the counter state of one key. Sliding window uses win, cur and
// prev; fixed window win and cur (the count); token bucket tokens and last.
type state struct {
	alg    store.Algorithm
	win    int64 // precision >= 2: the sub-window index (store's "sub")
	cur    int64
	prev   int64
	tokens float64
	last   int64
	old    *[]int64 // precision >= 2: old[i-1] is store's old[i]; nil otherwise
}

// op is how a check acts on the state.
type op uint8

const (
	opCheck   op = iota // check-only: never changes the state
	opConsume           // consume Hits if they fit the budget
	opRefund            // return Hits to the budget
	opForce             // add Hits whatever the budget (a write-back)
	opQueue             // opConsume, the batch's only consuming check: a denial may lease (see store's Leases)
)

// apply evaluates c against st at now (Unix microseconds), updating st, and
// returns c's Result.
func (st *state) apply(c *store.Check, now int64, o op) store.Result {
	wus := int64(c.Window / time.Microsecond)
	h := c.Hits
	if o == opCheck {
		h = 0
	}
	switch c.Algorithm {
	case store.TokenBucket:
		return st.tokenBucket(c, now, wus, h, o)
	case store.FixedWindow:
		return st.fixedWindow(c, now, wus, h, o)
	default: // SlidingWindow, and unknown values as the default algorithm
		if c.Precision >= 2 {
			return st.preciseWindow(c, now, wus, h, o)
		}
		if st.old != nil {
			*st = state{} // another precision's state: start fresh
		}
		return st.slidingWindow(c, now, wus, h, o)
	}
}

// want returns the lease c may ask for when its hits were allowed: Want,
// on a consuming check that is neither a shadow nor paced (see the package
// doc's Leases).
func want(c *store.Check, o op) uint64 {
	if (o != opConsume && o != opQueue) || c.Shadow || c.Paced || c.Hits == 0 {
		return 0
	}
	return c.Want
}

// allowed reports whether h hits (0: check-only) pass a budget of r.
func allowed(h, r uint64) bool {
	if h == 0 {
		return r >= 1
	}
	return h <= r
}

// addHits returns count + h, saturating instead of wrapping: forced hits
// are not bounded by a limit.
func addHits(count int64, h uint64) int64 {
	if h > uint64(math.MaxInt64-count) {
		return math.MaxInt64
	}
	return count + int64(h)
}

// fixedWindow applies a fixed-window check of h hits.
func (st *state) fixedWindow(c *store.Check, now, wus int64, h uint64, o op) store.Result {
	limit := c.Limit
	curWin := store.FloorDiv(now, wus)
	if st.alg != store.FixedWindow || st.win != curWin {
		*st = state{alg: store.FixedWindow, win: curWin}
	}
	rst := time.Duration(wus-(now-curWin*wus)) * time.Microsecond
	switch o {
	case opRefund:
		st.cur = max(0, st.cur-int64(h))
		return store.Result{Allowed: true, Remaining: fixedBudget(st.cur, limit), Reset: rst}
	case opForce:
		st.cur = addHits(st.cur, h)
		return store.Result{Allowed: true, Remaining: fixedBudget(st.cur, limit), Reset: rst}
	}
	return st.windowCount(st.cur, limit, h, want(c, o), rst)
}

// windowCount decides h hits (0: check-only) against count, the current
// window's alone: a fixed window's, or a paced sliding window's; allowed,
// they go to st.cur with a lease of at most w hits. A denial waits for the
// window's end.
func (st *state) windowCount(count int64, limit, h, w uint64, rst time.Duration) store.Result {
	r := fixedBudget(count, limit)
	if allowed(h, r) {
		n := min(w, r-h)
		st.cur += int64(h + n)
		return store.Result{Allowed: true, Remaining: r - h - n, Reset: rst, Lease: store.Lease{Hits: n, Now: n}}
	}
	return store.Result{Remaining: r, RetryAfter: rst, Reset: rst}
}

// fixedBudget returns R = max(0, L - count).
func fixedBudget(count int64, limit uint64) uint64 {
	if count >= 0 && uint64(count) < limit {
		return limit - uint64(count)
	}
	return 0
}

// slidingWindow applies a sliding-window check of h hits; a paced one (see
// store.Check.Paced) against the current window's count alone.
func (st *state) slidingWindow(c *store.Check, now, wus int64, h uint64, o op) store.Result {
	limit := c.Limit
	curWin := store.FloorDiv(now, wus)
	into := now - curWin*wus // microseconds into the window
	switch {
	case st.alg != store.SlidingWindow:
		*st = state{alg: store.SlidingWindow, win: curWin}
	case st.win != curWin:
		if st.win == curWin-1 {
			st.prev = st.cur
		} else {
			st.prev = 0
		}
		st.cur, st.win = 0, curWin
	}
	rstUS := wus - into
	rst := time.Duration(rstUS) * time.Microsecond
	switch o {
	case opRefund:
		st.cur -= int64(h)
		if st.cur < 0 {
			st.prev = max(0, st.prev+st.cur)
			st.cur = 0
		}
		return store.Result{Allowed: true, Remaining: st.slidingBudget(limit, into, wus), Reset: rst}
	case opForce:
		st.cur = addHits(st.cur, h)
		return store.Result{Allowed: true, Remaining: st.slidingBudget(limit, into, wus), Reset: rst}
	}
	if c.Paced {
		return st.windowCount(st.cur, limit, h, 0, rst)
	}
	r := st.slidingBudget(limit, into, wus)
	if o == opQueue && h > r && c.Want > 0 && c.Horizon > 0 && !c.Shadow {
		res := store.Result{Remaining: r, RetryAfter: st.slidingRetry(limit, h, into, wus), Reset: rst}
		res.Lease = store.SlidingLease(st.prev, st.cur, limit, r, c.Want, c.Horizon, into, wus)
		st.cur += int64(res.Lease.Hits)
		return res
	}
	if allowed(h, r) {
		st.cur += int64(h)
		l := store.SlidingLease(st.prev, st.cur, limit, r-h, want(c, o), c.Horizon, into, wus)
		st.cur += int64(l.Hits)
		return store.Result{Allowed: true, Remaining: st.slidingBudget(limit, into, wus), Reset: rst, Lease: l}
	}
	return store.Result{Remaining: r, RetryAfter: st.slidingRetry(limit, max(h, 1), into, wus), Reset: rst}
}

// slidingBudget returns R = ceil(L - rate) when rate < L, else 0.
func (st *state) slidingBudget(limit uint64, into, wus int64) uint64 {
	return store.SlidingBudget(st.prev, st.cur, limit, into, wus)
}

// slidingRetry returns the sliding window's RetryAfter for h >= 1 hits.
func (st *state) slidingRetry(limit, h uint64, into, wus int64) time.Duration {
	return store.SlidingRetry(st.prev, st.cur, limit, h, into, wus)
}

// tokenBucket applies a token bucket check of h hits. A Limit of 0 never
// refills; docs/arithmetic.md's divisions by the refill rate then have no
// finite value, so such a bucket denies everything, writes nothing and
// reports RetryAfter of one window and Reset 0 (a refund or a force is
// allowed, with Remaining 0).
func (st *state) tokenBucket(c *store.Check, now, wus int64, h uint64, o op) store.Result {
	if c.Limit == 0 {
		if o == opRefund || o == opForce {
			return store.Result{Allowed: true}
		}
		return store.Result{RetryAfter: time.Duration(wus) * time.Microsecond}
	}
	b := bucketCapacity(c)
	r := float64(c.Limit) / float64(wus)
	if st.alg != store.TokenBucket {
		*st = state{alg: store.TokenBucket, tokens: b, last: now}
	}
	t := st.tokens + float64(float64(now-st.last)*r)
	if t > b {
		t = b
	}
	st.tokens, st.last = t, now

	switch o {
	case opRefund:
		st.tokens = min(b, st.tokens+float64(h))
		return store.Result{Allowed: true, Remaining: tokenBudget(st.tokens), Reset: tokenReset(st.tokens, b, r)}
	case opForce:
		st.tokens = max(0, st.tokens-float64(h))
		return store.Result{Allowed: true, Remaining: tokenBudget(st.tokens), Reset: tokenReset(st.tokens, b, r)}
	}
	budget := tokenBudget(st.tokens)
	if allowed(h, budget) {
		n := min(want(c, o), budget-h)
		st.tokens -= float64(h + n)
		return store.Result{Allowed: true, Remaining: budget - h - n, Reset: tokenReset(st.tokens, b, r), Lease: store.Lease{Hits: n, Now: n}}
	}
	return store.Result{Remaining: budget, RetryAfter: tokenRetry(st.tokens, float64(max(h, 1)), b, r), Reset: tokenReset(st.tokens, b, r)}
}

// bucketCapacity returns B: the check's Burst, or its Limit when Burst is 0.
func bucketCapacity(c *store.Check) float64 {
	if c.Burst == 0 {
		return float64(c.Limit)
	}
	return float64(c.Burst)
}

// tokenRetry returns the token bucket's RetryAfter for hf >= 1 hits with
// tokens in a bucket of capacity b refilling at r tokens per microsecond.
func tokenRetry(tokens, hf, b, r float64) time.Duration {
	if hf > b {
		return usDuration(b / r)
	}
	ra := store.Settle(math.Floor((hf-tokens)/r)+1, func(ra float64) bool {
		return min(b, tokens+float64(ra*r)) >= hf
	})
	return floatMicros(ra)
}

// tokenBudget returns R = floor(tokens), 0 below one token.
func tokenBudget(tokens float64) uint64 {
	if tokens < 1 {
		return 0
	}
	return uint64(math.Floor(tokens))
}

// tokenReset returns the time until the bucket is full.
func tokenReset(tokens, b, r float64) time.Duration {
	if tokens < b {
		return usDuration((b - tokens) / r)
	}
	return 0
}

// usDuration returns floor(x)+1 microseconds (see floatMicros).
func usDuration(x float64) time.Duration {
	return floatMicros(math.Floor(x) + 1)
}

// floatMicros converts us, a whole number of microseconds, to a Duration as
// the Redis store decodes the script's reply: at least 0 and at most the
// largest Duration (a bucket that refills over millennia).
func floatMicros(us float64) time.Duration {
	switch {
	case !(us > 0):
		return 0
	case us >= math.MaxUint64:
		return math.MaxInt64
	}
	if u := uint64(us); u <= math.MaxInt64/uint64(time.Microsecond) {
		return time.Duration(u) * time.Microsecond
	}
	return math.MaxInt64
}

// expiry returns when state written by c at now expires: docs/arithmetic.md's
// TTL added to now.
func expiry(c *store.Check, now int64) int64 {
	wus := int64(c.Window / time.Microsecond)
	switch c.Algorithm {
	case store.TokenBucket:
		if c.Limit == 0 {
			return now
		}
		r := float64(c.Limit) / float64(wus)
		full := math.Ceil(bucketCapacity(c) / r)
		if full >= float64(math.MaxInt64-now-2*usPerSecond) {
			// A bucket that refills slower than int64 microseconds
			// can count (a large burst of a long window) never
			// expires; int64(full) would overflow to an expired state.
			return math.MaxInt64
		}
		ttl := int64(full) + usPerSecond
		return now + ceilDiv(ttl, usPerMilli)*usPerMilli
	case store.FixedWindow:
		rst := wus - (now - store.FloorDiv(now, wus)*wus)
		return now + ceilDiv(rst, usPerMilli)*usPerMilli
	default:
		return now + 2*wus
	}
}

// ceilDiv returns a/b rounded towards positive infinity.
func ceilDiv(a, b int64) int64 { return -store.FloorDiv(-a, b) }
