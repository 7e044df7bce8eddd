package store

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"time"
)

// DefaultMaxKeys is the key capacity of a Memory store whose
// MemoryOptions.MaxKeys is 0.
const DefaultMaxKeys = 1_000_000

const (
	maxShards     = 64 // at most 64, so a batch's shards fit in one uint64 mask
	minShardKeys  = 16 // fewer shards than maxShards when MaxKeys is small
	sweepPerShard = 2  // entries examined for expiry per locked shard per call
	inlineChecks  = 8  // batches up to this size need no heap scratch space
	maxFree       = 64 // removed entries kept per shard for reuse
	usPerSecond   = int64(time.Second / time.Microsecond)
	usPerMilli    = int64(time.Millisecond / time.Microsecond)
	algNone       = Algorithm(255) // state of an absent key
)

// MemoryOptions configures NewMemory. The zero value is usable.
type MemoryOptions struct {
	// Now returns the current time; nil means time.Now. The store takes all
	// its time from it, at microsecond precision.
	Now func() time.Time
	// MaxKeys bounds the number of keys holding state; 0 means
	// DefaultMaxKeys. Negative values are treated as 0.
	MaxKeys int
}

// Memory is an in-process Store: the package doc's arithmetic over state
// kept in a sharded map, for a single rls instance, tests and fallback.
// It is safe for concurrent use; a batch is atomic even when its keys span
// shards (the shards are locked in ascending order).
//
// Memory is bounded. State whose TTL has passed is treated as absent and is
// reclaimed lazily when its key is accessed and by an incremental sweep: each
// Decide examines a few entries of the shards it locks and of one other
// shard (no background goroutine).
// At the cap, keys are spread over up to 64 shards, each holding at most
// MaxKeys/shards keys; writing a new key into a full shard first evicts that
// shard's least recently written key, live or not, so Len never exceeds
// MaxKeys and an evicted key starts fresh on its next check (which, for a
// limit, errs towards allowing). Reads (check-only, Peek) do not count as
// writes for this order.
type Memory struct {
	now    func() time.Time
	seed   maphash.Seed
	mask   uint64 // number of shards - 1
	shards []shard
}

var _ Store = (*Memory)(nil)

// shard is one lock and map of keys, with the keys in a doubly linked list
// from the most recently written (head) to the least (tail).
type shard struct {
	mu     sync.Mutex
	keys   map[string]*entry
	head   *entry
	tail   *entry
	cursor *entry // next entry the sweep examines, walking tail to head
	free   *entry // entries to reuse, linked by older
	nfree  int
	cap    int
	_      [64]byte // keep hot shards on separate cache lines
}

// entry is the state of one key.
type entry struct {
	key     string
	st      state
	expires int64 // Unix microseconds; the state is absent from then on
	newer   *entry
	older   *entry
}

// state is the counter state of one key. Sliding window uses win, cur and
// prev; fixed window win and cur (the count); token bucket tokens and last.
type state struct {
	alg    Algorithm
	win    int64
	cur    int64
	prev   int64
	tokens float64
	last   int64
}

// NewMemory returns an empty Memory store configured by opts.
func NewMemory(opts MemoryOptions) *Memory {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	maxKeys := opts.MaxKeys
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	n := maxShards
	for n > 1 && maxKeys/n < minShardKeys {
		n /= 2
	}
	m := &Memory{
		now:    now,
		seed:   maphash.MakeSeed(),
		mask:   uint64(n - 1),
		shards: make([]shard, n),
	}
	for i := range m.shards {
		m.shards[i].keys = make(map[string]*entry)
		m.shards[i].cap = maxKeys / n
	}
	return m
}

// slot is the tentative state of one distinct key of a batch.
type slot struct {
	key      string
	hash     uint64
	shard    *shard
	ent      *entry // the stored entry, nil if absent or expired
	st       state  // tentative state
	base     state  // state after the refunds
	exp      int64  // expiry of st
	baseExp  int64  // expiry of base
	refunded bool
	consumed bool
}

// Decide decides checks atomically as the package doc specifies and writes
// one Result per Check into results. It returns an error, and writes no
// state, if the lengths differ, ctx is done, or a check's Window is not a
// whole number of seconds of at least one second.
func (m *Memory) Decide(ctx context.Context, checks []Check, results []Result) error {
	return m.decide(ctx, checks, results, false)
}

// Peek reports what Decide would report if every check were check-only
// (Hits 0, no refund), and writes nothing: no state, no expiry reclaim.
// Its errors are Decide's.
func (m *Memory) Peek(ctx context.Context, checks []Check, results []Result) error {
	return m.decide(ctx, checks, results, true)
}

func (m *Memory) decide(ctx context.Context, checks []Check, results []Result, peek bool) error {
	if len(results) != len(checks) {
		return fmt.Errorf("store: %d results for %d checks", len(results), len(checks))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for i := range checks {
		if w := checks[i].Window; w < time.Second || w%time.Second != 0 {
			return fmt.Errorf("store: check %d (key %q): window %v is not a whole number of seconds of at least 1s", i, checks[i].Key, w)
		}
	}
	now := m.now().UnixMicro()

	// Scratch space on the stack, sized to the batch: zeroing it is a
	// noticeable part of a single check's cost.
	switch {
	case len(checks) == 1:
		var slots [1]slot
		var idx [1]int
		m.run(now, checks, results, slots[:0], idx[:0], peek)
	case len(checks) <= inlineChecks:
		var slots [inlineChecks]slot
		var idx [inlineChecks]int
		m.run(now, checks, results, slots[:0], idx[:0], peek)
	default:
		m.run(now, checks, results, nil, nil, peek)
	}
	return nil
}

// run decides checks at now, with slots and idx as empty scratch slices
// whose backing arrays are zeroed.
func (m *Memory) run(now int64, checks []Check, results []Result, slots []slot, idx []int, peek bool) {
	// Group the checks by key; idx maps each check to its key's slot.
	var locked uint64
	for i := range checks {
		key := checks[i].Key
		h := maphash.String(m.seed, key)
		j := 0
		for j < len(slots) && (slots[j].hash != h || slots[j].key != key) {
			j++
		}
		if j == len(slots) {
			si := h & m.mask
			// The scratch slices arrive zeroed: extend without copying a
			// slot literal.
			if j < cap(slots) {
				slots = slots[:j+1]
			} else {
				slots = append(slots, slot{})
			}
			s := &slots[j]
			s.key, s.hash, s.shard = key, h, &m.shards[si]
			locked |= 1 << si
		}
		idx = append(idx, j)
	}

	for mask := locked; mask != 0; mask &= mask - 1 {
		sh := &m.shards[bits.TrailingZeros64(mask)]
		sh.mu.Lock()
		if !peek {
			sh.sweep(now)
		}
	}

	for j := range slots {
		s := &slots[j]
		s.st.alg = algNone
		if e := s.shard.keys[s.key]; e != nil {
			if e.expires > now {
				s.ent, s.st = e, e.st
			} else if !peek {
				s.shard.remove(e)
			}
		}
	}

	// Refunds first, always written.
	if !peek {
		for i := range checks {
			c := &checks[i]
			if !c.Refund {
				continue
			}
			s := &slots[idx[i]]
			results[i] = s.st.apply(c, now, opRefund)
			s.refunded = true
			s.exp = expiry(c, now)
		}
	}
	for j := range slots {
		slots[j].base, slots[j].baseExp = slots[j].st, slots[j].exp
	}

	// Then the others in order against the tentative state.
	veto := false
	for i := range checks {
		c := &checks[i]
		if c.Refund && !peek {
			continue
		}
		op := opConsume
		if c.Hits == 0 || peek {
			op = opCheck
		}
		s := &slots[idx[i]]
		r := s.st.apply(c, now, op)
		results[i] = r
		if op == opConsume {
			if r.Allowed {
				s.consumed = true
				s.exp = expiry(c, now)
			} else if !c.Shadow {
				veto = true
			}
		}
	}

	if !peek {
		// Existing entries first, so that evictions made room for new keys
		// never touch an entry a later write of this batch refers to.
		for pass := 0; pass < 2; pass++ {
			for j := range slots {
				s := &slots[j]
				if (s.ent != nil) != (pass == 0) {
					continue
				}
				switch {
				case !veto && (s.refunded || s.consumed):
					s.shard.write(s.ent, s.key, s.st, s.exp)
				case s.refunded:
					s.shard.write(s.ent, s.key, s.base, s.baseExp)
				}
			}
		}
	}

	for mask := locked; mask != 0; mask &= mask - 1 {
		m.shards[bits.TrailingZeros64(mask)].mu.Unlock()
	}

	// Also sweep a pseudo-random other shard, so that shards no traffic
	// reaches any more are reclaimed too. TryLock: never wait for it.
	if !peek && len(slots) > 0 {
		si := ((slots[0].hash ^ uint64(now)) * 0x9e3779b97f4a7c15 >> 32) & m.mask
		if locked&(1<<si) == 0 {
			if sh := &m.shards[si]; sh.mu.TryLock() {
				sh.sweep(now)
				sh.mu.Unlock()
			}
		}
	}
}

// Delete removes the state of keys, which then start fresh. It never fails.
func (m *Memory) Delete(_ context.Context, keys ...string) error {
	for _, key := range keys {
		sh := &m.shards[maphash.String(m.seed, key)&m.mask]
		sh.mu.Lock()
		if e := sh.keys[key]; e != nil {
			sh.remove(e)
		}
		sh.mu.Unlock()
	}
	return nil
}

// Len returns the number of keys holding state, including state whose TTL
// has passed but that has not been reclaimed yet. It never exceeds MaxKeys.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.keys)
		sh.mu.Unlock()
	}
	return n
}

// Close releases nothing (Memory holds no goroutines or connections) and
// returns nil. The store remains usable.
func (m *Memory) Close() error { return nil }

// write stores st under key (in e if it is non-nil, else in a new entry,
// evicting the least recently written keys to stay within the cap) and makes
// the key the most recently written. The shard must be locked.
func (sh *shard) write(e *entry, key string, st state, exp int64) {
	if e == nil {
		for len(sh.keys) >= sh.cap && sh.tail != nil {
			sh.remove(sh.tail)
		}
		e = sh.free
		if e != nil {
			sh.free, sh.nfree = e.older, sh.nfree-1
			e.older = nil
		} else {
			e = new(entry)
		}
		e.key = key
		sh.keys[key] = e
	} else if e == sh.head {
		e.st, e.expires = st, exp
		return
	} else {
		sh.unlink(e)
	}
	e.st, e.expires = st, exp
	e.older = sh.head
	if sh.head != nil {
		sh.head.newer = e
	}
	sh.head = e
	if sh.tail == nil {
		sh.tail = e
	}
}

// unlink takes e out of the list, moving the sweep cursor past it.
func (sh *shard) unlink(e *entry) {
	if sh.cursor == e {
		sh.cursor = e.newer
	}
	if e.newer != nil {
		e.newer.older = e.older
	} else {
		sh.head = e.older
	}
	if e.older != nil {
		e.older.newer = e.newer
	} else {
		sh.tail = e.newer
	}
	e.newer, e.older = nil, nil
}

// remove deletes e's key and keeps e for reuse unless enough are kept.
func (sh *shard) remove(e *entry) {
	sh.unlink(e)
	delete(sh.keys, e.key)
	if sh.nfree < maxFree {
		*e = entry{older: sh.free}
		sh.free, sh.nfree = e, sh.nfree+1
	}
}

// sweep examines the next few entries from the cursor (which walks from the
// least recently written entry towards the most, and wraps around) and
// removes those whose TTL has passed.
func (sh *shard) sweep(now int64) {
	for i := 0; i < sweepPerShard; i++ {
		e := sh.cursor
		if e == nil {
			if e = sh.tail; e == nil {
				return
			}
		}
		sh.cursor = e.newer
		if e.expires <= now {
			sh.remove(e)
		}
	}
}

// op is how a check acts on the state.
type op uint8

const (
	opCheck   op = iota // check-only: never changes the state
	opConsume           // consume Hits if they fit the budget
	opRefund            // return Hits to the budget
)

// apply evaluates c against st at now (Unix microseconds), updating st, and
// returns c's Result. It implements the package doc's arithmetic; every
// float64 product is converted explicitly so that it is rounded on its own
// and never fused into a multiply-add.
func (st *state) apply(c *Check, now int64, o op) Result {
	wus := int64(c.Window / time.Microsecond)
	curWin := floorDiv(now, wus)
	into := now - curWin*wus // microseconds into the window
	h := c.Hits
	if o == opCheck {
		h = 0
	}
	switch c.Algorithm {
	case TokenBucket:
		return st.tokenBucket(c, now, wus, h, o)
	case FixedWindow:
		if st.alg != FixedWindow || st.win != curWin {
			*st = state{alg: FixedWindow, win: curWin}
		}
		rst := time.Duration(wus-into) * time.Microsecond
		if o == opRefund {
			st.cur = max(0, st.cur-int64(h))
			return Result{Allowed: true, Remaining: fixedBudget(st.cur, c.Limit), Reset: rst}
		}
		r := fixedBudget(st.cur, c.Limit)
		if allowed(h, r) {
			st.cur += int64(h)
			return Result{Allowed: true, Remaining: r - h, Reset: rst}
		}
		return Result{Remaining: r, RetryAfter: rst, Reset: rst}
	default: // SlidingWindow, and unknown values as the default algorithm
		switch {
		case st.alg != SlidingWindow:
			*st = state{alg: SlidingWindow, win: curWin}
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
		if o == opRefund {
			st.cur -= int64(h)
			if st.cur < 0 {
				st.prev = max(0, st.prev+st.cur)
				st.cur = 0
			}
			return Result{Allowed: true, Remaining: st.slidingBudget(c.Limit, into, wus), Reset: rst}
		}
		r := st.slidingBudget(c.Limit, into, wus)
		if allowed(h, r) {
			st.cur += int64(h)
			return Result{Allowed: true, Remaining: r - h, Reset: rst}
		}
		return Result{Remaining: r, RetryAfter: st.slidingRetry(c.Limit, max(h, 1), into, wus, rstUS), Reset: rst}
	}
}

// allowed reports whether h hits (0: check-only) pass a budget of r.
func allowed(h, r uint64) bool {
	if h == 0 {
		return r >= 1
	}
	return h <= r
}

func fixedBudget(count int64, limit uint64) uint64 {
	if count >= 0 && uint64(count) < limit {
		return limit - uint64(count)
	}
	return 0
}

// slidingBudget returns R = ceil(L - rate) when rate < L, else 0.
func (st *state) slidingBudget(limit uint64, into, wus int64) uint64 {
	elapsed := float64(into) / float64(wus)
	rate := float64(float64(st.prev)*(1-elapsed)) + float64(st.cur)
	if l := float64(limit); rate < l {
		return uint64(math.Ceil(l - rate))
	}
	return 0
}

// slidingRetry returns the sliding window's RetryAfter for h >= 1 hits.
func (st *state) slidingRetry(limit, h uint64, into, wus, rst int64) time.Duration {
	l, hf, fw := float64(limit), float64(h), float64(wus)
	var x float64
	if a := l - float64(st.cur) - hf + 1; a > 0 && st.prev > 0 {
		x = float64((1-a/float64(st.prev))*fw) - float64(into)
	} else {
		a2 := l - hf + 1
		switch {
		case a2 <= 0:
			return time.Duration(rst) * time.Microsecond
		case float64(st.cur) < a2:
			x = float64(rst - 1)
		default:
			x = float64(rst) + float64((1-a2/float64(st.cur))*fw)
		}
	}
	ra := settle(int64(math.Floor(x))+1, func(ra int64) bool { return st.slidingPassesAt(l, hf, into+ra, wus) })
	return time.Duration(ra) * time.Microsecond
}

// slidingPassesAt reports whether hf hits would pass at into microseconds
// past the current window's start (into may reach later windows), with no
// other traffic.
func (st *state) slidingPassesAt(l, hf float64, into, wus int64) bool {
	prev, cur := st.prev, st.cur
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

// settle corrects a RetryAfter computed in floating point: it is at least
// one microsecond, and it moves later (a few microseconds at most) while the
// check would still not pass then, so a client retrying at RetryAfter passes.
func settle(ra int64, passes func(int64) bool) int64 {
	ra = max(ra, 1)
	for range 4 {
		if passes(ra) {
			break
		}
		ra++
	}
	return ra
}

// tokenBucket applies a token bucket check. A Limit of 0 never refills; the
// package doc's divisions by the refill rate then have no finite value, so
// such a bucket denies everything, writes nothing and reports RetryAfter of
// one window and Reset 0.
func (st *state) tokenBucket(c *Check, now, wus int64, h uint64, o op) Result {
	if c.Limit == 0 {
		if o == opRefund {
			return Result{Allowed: true}
		}
		return Result{RetryAfter: time.Duration(wus) * time.Microsecond}
	}
	b := float64(c.Burst)
	if c.Burst == 0 {
		b = float64(c.Limit)
	}
	r := float64(c.Limit) / float64(wus)
	if st.alg != TokenBucket {
		*st = state{alg: TokenBucket, tokens: b, last: now}
	}
	t := st.tokens + float64(float64(now-st.last)*r)
	if t > b {
		t = b
	}
	st.tokens, st.last = t, now

	if o == opRefund {
		st.tokens = min(b, st.tokens+float64(h))
		return Result{Allowed: true, Remaining: tokenBudget(st.tokens), Reset: tokenReset(st.tokens, b, r)}
	}
	budget := tokenBudget(st.tokens)
	if allowed(h, budget) {
		st.tokens -= float64(h)
		return Result{Allowed: true, Remaining: budget - h, Reset: tokenReset(st.tokens, b, r)}
	}
	hf := float64(max(h, 1))
	var retry time.Duration
	if hf <= b {
		tokens := st.tokens
		ra := settleFloat(math.Floor((hf-tokens)/r)+1, func(ra float64) bool {
			return min(b, tokens+float64(ra*r)) >= hf
		})
		retry = floatMicros(ra)
	} else {
		retry = usDuration(b / r)
	}
	return Result{Remaining: budget, RetryAfter: retry, Reset: tokenReset(st.tokens, b, r)}
}

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

// settleFloat is settle in float64, as the script computes it: a slow
// bucket's times can exceed what an int64 of microseconds holds.
func settleFloat(ra float64, passes func(float64) bool) float64 {
	ra = max(ra, 1)
	for range 4 {
		if passes(ra) {
			break
		}
		ra++
	}
	return ra
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

// expiry returns when state written by c at now expires: the package doc's
// TTL added to now.
func expiry(c *Check, now int64) int64 {
	wus := int64(c.Window / time.Microsecond)
	switch c.Algorithm {
	case TokenBucket:
		if c.Limit == 0 {
			return now
		}
		b := float64(c.Burst)
		if c.Burst == 0 {
			b = float64(c.Limit)
		}
		r := float64(c.Limit) / float64(wus)
		full := math.Ceil(b / r)
		if full >= float64(math.MaxInt64-now-2*usPerSecond) {
			// A bucket that refills slower than int64 microseconds
			// can count (a large burst of a long window) never
			// expires; int64(full) would overflow to an expired state.
			return math.MaxInt64
		}
		ttl := int64(full) + usPerSecond
		return now + ceilDiv(ttl, usPerMilli)*usPerMilli
	case FixedWindow:
		rst := wus - (now - floorDiv(now, wus)*wus)
		return now + ceilDiv(rst, usPerMilli)*usPerMilli
	default:
		return now + 2*wus
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 { return -floorDiv(-a, b) }
