// Package limiter makes the decision around a store: a local over-limit cache
// that denies keys already known to be over their limit without a store
// call, and a fallback for when the store cannot answer (fail_open rules are
// held to this replica's share of the limit by a local token bucket;
// fail_closed rules deny). It is components 1 and 3 of seed-lld.md.
package limiter

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// Source says where a check's result came from.
type Source uint8

// The sources of a result.
const (
	FromStore      Source = iota // the store decided
	FromCache                    // the local over-limit cache denied it
	FromFailOpen                 // store unavailable: the local fail-open bucket decided
	FromFailClosed               // store unavailable: denied by the rule's fail_closed
)

// String names the source as metrics and logs show it.
func (s Source) String() string {
	switch s {
	case FromStore:
		return "store"
	case FromCache:
		return "local_cache"
	case FromFailOpen:
		return "fail_open"
	case FromFailClosed:
		return "fail_closed"
	}
	return "unknown"
}

// Options configure a Limiter. Zero fields take the defaults in brackets.
type Options struct {
	// FleetSize returns how many replicas share the limits [always 1]. The
	// fail-open share of a limit is limit / FleetSize().
	FleetSize func() int
	// CacheSize caps the over-limit cache's entries [100000].
	CacheSize int
	// BucketsSize caps the fail-open buckets' entries [100000].
	BucketsSize int
	// FailClosedRetry is the retry time of a fail_closed denial [1s].
	FailClosedRetry time.Duration
	// DisableCache turns the over-limit cache off (every check goes to the store).
	DisableCache bool
	// Now is the clock [time.Now].
	Now func() time.Time
	// Log receives rate-limited fallback reports [discard].
	Log *slog.Logger
}

// Limiter decides batches of checks. It is safe for concurrent use.
type Limiter struct {
	st    store.Store
	opts  Options
	cache *lru[cached]
	local *lru[*bucket]
	pool  sync.Pool // *scratch

	fallbacks   [4]atomic.Uint64 // results by Source
	lastFallbk  atomic.Int64     // unix nanoseconds of the last fallback decision
	lastLogged  atomic.Int64
	unloggedErr atomic.Uint64
}

// cached is an over-limit cache entry: the key is denied until until, as
// long as the check's limit is the one that was denied.
type cached struct {
	until        int64 // unix nanoseconds
	limit, burst uint64
	window       time.Duration
}

// New returns a Limiter deciding on st.
func New(st store.Store, opts Options) *Limiter {
	if opts.FleetSize == nil {
		opts.FleetSize = func() int { return 1 }
	}
	if opts.CacheSize <= 0 {
		opts.CacheSize = 100_000
	}
	if opts.BucketsSize <= 0 {
		opts.BucketsSize = 100_000
	}
	if opts.FailClosedRetry <= 0 {
		opts.FailClosedRetry = time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	l := &Limiter{st: st, opts: opts, cache: newLRU[cached](opts.CacheSize), local: newLRU[*bucket](opts.BucketsSize)}
	l.pool.New = func() any { return new(scratch) }
	return l
}

type scratch struct {
	idx     []int // positions in the caller's batch of the sub-batch sent to the store
	checks  []store.Check
	results []store.Result
}

// Decide decides checks and writes one result per check into results and
// one source into sources (both of len(checks)). failClosed[i] says check i
// must deny, rather than fall back to the local share, when the store cannot
// answer. It returns an error only when the caller's context ends or the
// store fails in a way no fallback covers (a bug, not an outage).
func (l *Limiter) Decide(ctx context.Context, checks []store.Check, failClosed []bool, results []store.Result, sources []Source) error {
	now := l.opts.Now()
	nowNs := now.UnixNano()
	vetoed := false
	hits := 0
	if !l.opts.DisableCache {
		for i := range checks {
			c := &checks[i]
			sources[i] = FromStore
			if c.Refund {
				l.forget(c.Key)
				continue
			}
			if until, ok := l.deniedUntil(c, nowNs); ok {
				d := time.Duration(until - nowNs)
				results[i] = store.Result{RetryAfter: d, Reset: d}
				sources[i] = FromCache
				hits++
				if c.Hits > 0 && !c.Shadow {
					vetoed = true
				}
			}
		}
	} else {
		for i := range sources {
			sources[i] = FromStore
		}
	}

	// The sub-batch for the store: everything the cache did not answer; when
	// the cache already denied the request, the rest only checks (a denied
	// request consumes nothing) and refunds still apply.
	sub, subRes := checks, results
	var sc *scratch
	if hits > 0 || vetoed {
		sc = l.pool.Get().(*scratch)
		defer l.pool.Put(sc)
		sc.idx, sc.checks = sc.idx[:0], sc.checks[:0]
		for i := range checks {
			if sources[i] == FromCache {
				continue
			}
			c := checks[i]
			if vetoed && !c.Refund {
				c.Hits = 0
			}
			sc.idx = append(sc.idx, i)
			sc.checks = append(sc.checks, c)
		}
		if cap(sc.results) < len(sc.checks) {
			sc.results = make([]store.Result, len(sc.checks))
		}
		sub, subRes = sc.checks, sc.results[:len(sc.checks)]
		for i := range subRes {
			subRes[i] = store.Result{}
		}
	}
	if hits > 0 {
		l.fallbacks[FromCache].Add(uint64(hits))
	}
	if len(sub) == 0 {
		return nil
	}

	err := l.st.Decide(ctx, sub, subRes)
	if err != nil && !errors.Is(err, store.ErrUnavailable) {
		return err
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err() // the caller is gone; no fallback answer is wanted
		}
		l.fallback(now, sub, subRes, failClosed, sc, err)
	}
	// Remember store denials; copy sub-batch results back.
	for j := range sub {
		i := j
		if sc != nil {
			i = sc.idx[j]
			results[i] = subRes[j]
		}
		c := &checks[i]
		r := &results[i]
		if subRes[j].Undecided {
			sources[i] = fallbackSource(failClosed[i])
			r.Undecided = false
			continue
		}
		if !r.Allowed && c.Hits > 0 && !c.Refund && r.RetryAfter > 0 && !l.opts.DisableCache {
			l.remember(c, nowNs+int64(r.RetryAfter))
		}
	}
	return nil
}

func fallbackSource(failClosed bool) Source {
	if failClosed {
		return FromFailClosed
	}
	return FromFailOpen
}

// deniedUntil reports whether the cache holds a denial of c's key and limit
// that lasts past now.
func (l *Limiter) deniedUntil(c *store.Check, now int64) (int64, bool) {
	s := l.cache.shard(c.Key)
	s.mu.Lock()
	n := s.m[c.Key]
	if n == nil {
		s.mu.Unlock()
		return 0, false
	}
	e := n.val
	if e.until <= now || e.limit != c.Limit || e.burst != c.Burst || e.window != c.Window {
		s.unlink(n)
		delete(s.m, c.Key)
		s.mu.Unlock()
		return 0, false
	}
	s.mu.Unlock()
	return e.until, true
}

func (l *Limiter) remember(c *store.Check, until int64) {
	lruWith(l.cache, c.Key, func(cached, bool) (cached, bool, struct{}) {
		return cached{until: until, limit: c.Limit, burst: c.Burst, window: c.Window}, true, struct{}{}
	})
}

func (l *Limiter) forget(key string) {
	lruWith(l.cache, key, func(v cached, ok bool) (cached, bool, struct{}) { return v, false, struct{}{} })
}

// fallback decides the undecided checks of a batch the store could not
// answer, with the batch's all-or-nothing rule: fail_closed checks deny;
// fail_open checks take from this replica's share; if any consuming
// non-shadow check is denied, none consumes.
func (l *Limiter) fallback(now time.Time, checks []store.Check, results []store.Result, failClosed []bool, sc *scratch, cause error) {
	fc := func(j int) bool {
		if sc != nil {
			return failClosed[sc.idx[j]]
		}
		return failClosed[j]
	}
	anyMarked := false
	for j := range results {
		if results[j].Undecided {
			anyMarked = true
			break
		}
	}
	if !anyMarked { // the store failed as a whole
		for j := range results {
			results[j] = store.Result{Undecided: true}
		}
	}
	fleet := max(l.opts.FleetSize(), 1)
	nowNs := now.UnixNano()
	vetoed := false
	n := 0
	for j := range checks {
		if !results[j].Undecided {
			continue
		}
		n++
		c := &checks[j]
		if fc(j) {
			if c.Refund {
				results[j] = store.Result{Allowed: true, Undecided: true}
				continue
			}
			d := l.opts.FailClosedRetry
			results[j] = store.Result{RetryAfter: d, Reset: d, Undecided: true}
			if c.Hits > 0 && !c.Shadow {
				vetoed = true
			}
			continue
		}
		r := l.bucket(c, fleet).peek(c, nowNs)
		r.Undecided = true
		results[j] = r
		if !r.Allowed && c.Hits > 0 && !c.Refund && !c.Shadow {
			vetoed = true
		}
	}
	// Consume (or refund) in the local buckets.
	for j := range checks {
		c := &checks[j]
		if !results[j].Undecided || fc(j) || c.Hits == 0 || !results[j].Allowed {
			continue
		}
		if vetoed && !c.Refund {
			continue
		}
		r := l.bucket(c, fleet).take(c, nowNs)
		r.Undecided = true
		results[j] = r
	}
	for j := range checks {
		if results[j].Undecided {
			l.fallbacks[fallbackSource(fc(j))].Add(1)
		}
	}
	l.lastFallbk.Store(nowNs)
	l.logFallback(nowNs, n, cause)
}

// logFallback logs store trouble at most once every 10 seconds, with the
// number of fallback decisions since the last line.
func (l *Limiter) logFallback(now int64, n int, cause error) {
	l.unloggedErr.Add(uint64(n))
	last := l.lastLogged.Load()
	if now-last < int64(10*time.Second) || !l.lastLogged.CompareAndSwap(last, now) {
		return
	}
	l.opts.Log.Warn("store unavailable: deciding locally (fail_open rules at this replica's share, fail_closed rules deny)",
		"err", cause, "fallback_decisions", l.unloggedErr.Swap(0), "fleet_size", l.opts.FleetSize())
}

// Degraded reports whether a fallback decision was made within the last
// window (the store could not answer recently).
func (l *Limiter) Degraded(window time.Duration) bool {
	last := l.lastFallbk.Load()
	return last != 0 && l.opts.Now().UnixNano()-last < int64(window)
}

// Count returns how many results came from s since start (the store's own
// decisions are not counted: Count(FromStore) is 0).
func (l *Limiter) Count(s Source) uint64 {
	if s == FromStore || int(s) >= len(l.fallbacks) {
		return 0
	}
	return l.fallbacks[s].Load()
}

// bucket returns the fail-open bucket of c's key at this replica's share.
func (l *Limiter) bucket(c *store.Check, fleet int) *bucket {
	capacity := c.Burst
	if capacity == 0 {
		capacity = c.Limit
	}
	share := float64(c.Limit) / float64(fleet)
	size := math.Max(1, math.Floor(float64(capacity)/float64(fleet)))
	rate := share / float64(c.Window.Nanoseconds()) // tokens per nanosecond
	return lruWith(l.local, c.Key, func(b *bucket, ok bool) (*bucket, bool, *bucket) {
		if !ok {
			b = &bucket{capacity: size, rate: rate, tokens: size, last: -1}
		}
		b.mu.Lock()
		if b.capacity != size || b.rate != rate { // fleet size or limit changed
			if b.tokens > size {
				b.tokens = size
			}
			b.capacity, b.rate = size, rate
		}
		b.mu.Unlock()
		return b, true, b
	})
}

// bucket is a local token bucket holding this replica's share of a limit.
type bucket struct {
	mu       sync.Mutex
	capacity float64
	rate     float64 // tokens per nanosecond
	tokens   float64
	last     int64 // unix nanoseconds; -1 before first use
}

func (b *bucket) refill(now int64) {
	if b.last >= 0 && now > b.last {
		b.tokens = math.Min(b.capacity, b.tokens+float64(now-b.last)*b.rate)
	}
	if now > b.last {
		b.last = now
	}
}

func (b *bucket) result(h float64, allowed bool) store.Result {
	r := store.Result{Allowed: allowed, Remaining: uint64(math.Max(0, math.Floor(b.tokens)))}
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
	if c.Refund {
		b.tokens = math.Min(b.capacity, b.tokens+h)
		return b.result(0, true)
	}
	if b.tokens < h {
		return b.result(h, false)
	}
	b.tokens -= h
	return b.result(h, true)
}

// Forget drops keys from the over-limit cache and the fail-open buckets, so
// a counter reset by an operator is not denied from stale local state.
func (l *Limiter) Forget(keys ...string) {
	for _, k := range keys {
		l.forget(k)
		lruWith(l.local, k, func(b *bucket, _ bool) (*bucket, bool, struct{}) { return b, false, struct{}{} })
	}
}

// CachedDenial reports whether the over-limit cache denies c now, and for
// how long (for the admin API's Explain).
func (l *Limiter) CachedDenial(c *store.Check) (time.Duration, bool) {
	now := l.opts.Now().UnixNano()
	until, ok := l.deniedUntil(c, now)
	if !ok {
		return 0, false
	}
	return time.Duration(until - now), true
}
