package limiter

import (
	"math"
	"sync"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// fallback decides the checks of sc the store could not answer, all or
// nothing for the request: fail_closed checks deny, fail_open ones take
// from this replica's share and are queued for write-back (docs/redis.md,
// invariant 13).
func (l *Limiter) fallback(now int64, items []Item, sc *scratch, cause error) {
	if undecided(sc.results) == 0 { // the store failed as a whole
		for j := range sc.results {
			sc.results[j] = store.Result{Undecided: true}
		}
	}
	fleet := max(l.opts.FleetSize(), 1)
	l.fallbackEvaluate(now, items, sc, fleet)
	for j, i := range sc.idx {
		if i >= 0 {
			items[i].Result = sc.results[j]
		}
	}
	vetoed := vetoes(items, func(i int) bool { return !items[i].Result.Allowed })
	n, refunds := l.fallbackTake(now, items, sc, fleet, vetoed, !maybeSent(cause))
	if len(refunds) > 0 {
		l.retryUndo(refunds)
	}
	l.causes[causeOf(cause)].Add(1)
	l.lastFallbk.Store(now)
	l.logFallback(n, cause)
}

// fallbackTake takes each undecided fail-open check's hits locally unless
// the request is vetoed, and returns how many checks fell back and the
// refunds the store never saw (retry: the call cannot have reached it).
func (l *Limiter) fallbackTake(now int64, items []Item, sc *scratch, fleet int, vetoed, retry bool) (n int, refunds []store.Check) {
	for j := range sc.checks {
		r, c := &sc.results[j], &sc.checks[j]
		if !r.Undecided || sc.idx[j] < 0 {
			continue
		}
		n++
		closed := items[sc.idx[j]].FailClosed || !l.answered.Load()
		items[sc.idx[j]].Source = fallbackSource(closed)
		l.sources[fallbackSource(closed)].Add(1)
		if retry && c.Refund && c.Hits > 0 {
			// The store never saw it: it gets the refund later, and the
			// local share does not (that would count it twice).
			refunds = append(refunds, *c)
			continue
		}
		if !closed && c.Hits > 0 && r.Allowed && (!vetoed || c.Refund) {
			l.takeLocally(c, r, fleet, now)
		}
	}
	return n, refunds
}

// takeLocally takes (or refunds) c's hits from its fail-open bucket,
// setting r, and queues what it admitted for write-back.
func (l *Limiter) takeLocally(c *store.Check, r *store.Result, fleet int, now int64) {
	b := l.bucket(c, fleet, now)
	*r = b.take(c, now)
	r.Undecided = true
	if r.Allowed && !c.Refund {
		l.wb.add(c, b, now)
	}
}

// fallbackEvaluate decides each undecided check without consuming.
func (l *Limiter) fallbackEvaluate(now int64, items []Item, sc *scratch, fleet int) {
	for j := range sc.checks {
		r, c := &sc.results[j], &sc.checks[j]
		if !r.Undecided || sc.idx[j] < 0 {
			continue
		}
		closed := items[sc.idx[j]].FailClosed || !l.answered.Load() // see StoreAnswered
		switch {
		case closed && c.Refund:
			*r = store.Result{Allowed: true}
		case closed:
			d := l.opts.FailClosedRetry
			*r = store.Result{RetryAfter: d, Reset: d}
		default:
			*r = l.bucket(c, fleet, now).peek(c, now)
		}
		r.Undecided = true
	}
}

func fallbackSource(failClosed bool) Source {
	if failClosed {
		return FromFailClosed
	}
	return FromFailOpen
}

// logFallback logs store trouble at most once per logthrottle.Every, with
// the number of fallback decisions since the last line.
func (l *Limiter) logFallback(n int, cause error) {
	held, ok := l.fallbackLog.AllowN(uint64(n))
	if !ok {
		return
	}
	l.opts.Log.Warn("store unavailable: deciding locally (fail_open rules at this replica's share, fail_closed rules deny)",
		"err", cause, "cause", causeOf(cause).String(), "fallback_decisions", held+uint64(n), "fleet_size", l.opts.FleetSize())
}

// bucket returns the fail-open bucket of c's key at this replica's share,
// seeded from what the store last said was left when it spoke since the
// bucket's last use, else full (docs/redis.md, invariant 13). A fixed
// window's refills when a window starts, the others' continuously.
func (l *Limiter) bucket(c *store.Check, fleet int, now int64) *bucket {
	capacity := c.Burst
	if capacity == 0 {
		capacity = c.Limit
	}
	size := math.Max(1, math.Floor(float64(capacity)/float64(fleet)))
	rate := float64(c.Limit) / float64(fleet) / float64(c.Window.Nanoseconds()) // tokens per nanosecond
	fixed := c.Algorithm == store.FixedWindow
	k, seen := l.lookup(c)
	return lruWith(l.local, c.Key, func(b *bucket, ok bool) (*bucket, bool, *bucket) {
		if !ok {
			b = &bucket{capacity: size, rate: rate, tokens: size, last: -1, window: int64(c.Window), fixed: fixed}
		}
		b.mu.Lock()
		if b.capacity != size || b.rate != rate || b.fixed != fixed { // fleet size or rule changed
			b.tokens = math.Min(b.tokens, size)
			b.capacity, b.rate, b.window, b.fixed = size, rate, int64(c.Window), fixed
		}
		if seen && k.at > b.last {
			b.seed(float64(k.remaining)/float64(fleet), k.at, now)
		}
		b.mu.Unlock()
		return b, true, b
	})
}

// bucket is a local token bucket holding this replica's share of a limit,
// and the hits it admitted that the store has not been told of yet.
type bucket struct {
	mu       sync.Mutex
	capacity float64
	rate     float64 // tokens per nanosecond (continuous refill)
	tokens   float64
	last     int64 // unix nanoseconds; -1 before first use
	fixed    bool  // refill to capacity when a window starts, not continuously
	window   int64 // the rule's window in nanoseconds

	// Hits admitted and not yet written back, counted per window of the
	// rule as a sliding-window counter does, so that a write-back after a
	// long outage carries only what still counts in the trailing window.
	wbWin         int64 // the window index of wbCur
	wbCur, wbPrev uint64
}

// seed sets the tokens from left, this replica's part of what the store
// said was left at time at, less the hits not yet written back (which the
// store does not count).
func (b *bucket) seed(left float64, at, now int64) {
	left = math.Max(0, left-float64(b.pending(now)))
	switch {
	case !b.fixed:
		b.tokens = math.Min(b.capacity, left+float64(now-at)*b.rate)
	case at/b.window == now/b.window:
		b.tokens = math.Min(b.capacity, left)
	default: // the window the store spoke of has ended
		b.tokens = b.capacity
	}
	b.last = now
}

func (b *bucket) refill(now int64) {
	switch {
	case b.fixed && b.last >= 0 && now/b.window != b.last/b.window:
		b.tokens = b.capacity
	case !b.fixed && b.last >= 0 && now > b.last:
		b.tokens = math.Min(b.capacity, b.tokens+float64(now-b.last)*b.rate)
	}
	if now > b.last {
		b.last = now
	}
}

func (b *bucket) result(h float64, allowed bool) store.Result {
	r := store.Result{Allowed: allowed, Remaining: uint64(math.Max(0, math.Floor(b.tokens)))}
	if b.fixed {
		end := time.Duration(b.window - b.last%b.window) // to the end of the window
		r.Reset = end
		if !allowed {
			r.RetryAfter = end
		}
		return r
	}
	if b.tokens < b.capacity {
		r.Reset = time.Duration((b.capacity-b.tokens)/b.rate) + 1
	}
	if !allowed {
		if h > b.capacity {
			r.RetryAfter = time.Duration(b.capacity/b.rate) + 1
		} else {
			r.RetryAfter = time.Duration((h-b.tokens)/b.rate) + 1
		}
	}
	return r
}

// peek evaluates c without consuming.
func (b *bucket) peek(c *store.Check, now int64) store.Result {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	h := float64(c.Hits)
	switch {
	case c.Refund:
		return b.result(0, true)
	case c.Hits == 0:
		return b.result(1, b.tokens >= 1)
	case b.tokens < h:
		return b.result(h, false)
	}
	// Report as if consumed, as a store reports a check of a denied batch.
	r := b.result(h, true)
	r.Remaining = uint64(math.Max(0, math.Floor(b.tokens-h)))
	return r
}

// take consumes (or refunds) c's hits if the bucket still allows them.
func (b *bucket) take(c *store.Check, now int64) store.Result {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	h := float64(c.Hits)
	b.roll(now)
	if c.Refund {
		b.tokens = math.Min(b.capacity, b.tokens+h)
		b.wbCur -= min(b.wbCur, c.Hits)
		return b.result(0, true)
	}
	if b.tokens < h {
		return b.result(h, false)
	}
	b.tokens -= h
	b.wbCur += c.Hits
	return b.result(h, true)
}

// roll moves the write-back counts to now's window.
func (b *bucket) roll(now int64) {
	w := now / b.window
	if w == b.wbWin {
		return
	}
	if w == b.wbWin+1 {
		b.wbPrev = b.wbCur
	} else {
		b.wbPrev = 0
	}
	b.wbCur, b.wbWin = 0, w
}

// pending returns the admitted hits not yet written back that still count
// in the trailing window (the previous window's weighted by its part still
// inside, as the sliding window counter weighs it, rounded up). b.mu is held.
func (b *bucket) pending(now int64) uint64 {
	b.roll(now)
	elapsed := float64(now-b.wbWin*b.window) / float64(b.window)
	return uint64(math.Ceil(float64(b.wbPrev)*(1-elapsed))) + b.wbCur
}

// drain returns the pending hits and forgets them all.
func (b *bucket) drain(now int64) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.pending(now)
	b.wbCur, b.wbPrev = 0, 0
	return n
}

// wbSnap is what a write-back in flight took from a bucket's counts.
type wbSnap struct {
	win, cur int64
	hits     uint64
}

// snapshot returns the pending hits without forgetting them, for a
// write-back that commits them once the store took them.
func (b *bucket) snapshot(now int64) wbSnap {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.pending(now)
	return wbSnap{win: b.wbWin, cur: int64(b.wbCur), hits: n}
}

// commit forgets the hits of s, which the store has taken: all that was
// pending when s was taken (what was admitted since stays pending).
func (b *bucket) commit(s wbSnap, now int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.roll(now)
	switch b.wbWin {
	case s.win: // the previous window's part was in s, and s.cur of this one's
		b.wbPrev = 0
		b.wbCur -= min(b.wbCur, uint64(s.cur))
	case s.win + 1: // s.cur is the previous window's count now
		b.wbPrev -= min(b.wbPrev, uint64(s.cur))
	}
}

// restore gives back hits that drain took but could not write.
func (b *bucket) restore(n uint64, now int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.roll(now)
	b.wbCur += n
}
