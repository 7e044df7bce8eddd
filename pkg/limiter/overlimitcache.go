package limiter

import (
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// overLimitEntry is what the store last said about one key, for the rule it was
// checked with: the budget it reported and when, and the last denial with
// the hits it denied and until when (the over-limit cache).
type overLimitEntry struct {
	limit, burst uint64
	window       time.Duration
	remaining    uint64 // the budget the store reported
	at           int64  // when, in unix nanoseconds
	deniedHits   uint64 // the store denied this many hits (0: no denial known) ...
	until        int64  // ... which would not pass before then (unix nanoseconds)
	end          int64  // the window ends no earlier (unix nanoseconds; the token bucket: when full)
}

// sameRule reports whether k was learned under c's limit.
func (k *overLimitEntry) sameRule(c *store.Check) bool {
	return k.limit == c.Limit && k.burst == c.Burst && k.window == c.Window
}

// denies reports whether k's denial covers c at now: the store denied at
// least c's hits (one for a check-only check) under c's rule until k.until
// (docs/redis.md, invariant 12). Refunds clear the denial.
func (k *overLimitEntry) denies(c *store.Check, now int64) bool {
	return k.deniedHits > 0 && now < k.until && max(c.Hits, 1) >= k.deniedHits && k.sameRule(c)
}

// lookup returns what the store last said about c's key under c's rule.
func (l *Limiter) lookup(c *store.Check) (overLimitEntry, bool) {
	s := l.overLimitCache.shard(c.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.list.Get(c.Key)
	if n == nil || !n.Value.sameRule(c) {
		return overLimitEntry{}, false
	}
	return n.Value, true
}

// fromCache answers the items that local knowledge denies: a remembered
// denial of at least their hits (the over-limit cache), or a paced lease
// whose next hit is not due (the store would deny them too). It marks the
// others FromStore and reports whether a denial vetoes the request.
func (l *Limiter) fromCache(items []Item, now int64) (vetoed bool) {
	hits := 0
	credits := givesBack(items)
	for i := range items {
		it := &items[i]
		it.Source, it.Result = FromStore, store.Result{}
		c := &it.Check
		if l.opts.DisableOverLimitCache || c.Refund || c.Force || (credits && givesBackTo(items, c.Key)) {
			continue
		}
		if l.res != nil && leasable(it) {
			if d, ok := l.res.waiting(c, now); ok {
				it.Result, it.Source = store.Result{RetryAfter: d, Reset: d}, FromReserve
				l.sources[FromReserve].Add(1)
				hits++
				continue
			}
		}
		k, ok := l.lookup(c)
		if !ok || !k.denies(c, now) {
			continue
		}
		d := time.Duration(k.until - now)
		it.Result = store.Result{Remaining: k.remaining, RetryAfter: d, Reset: d}
		it.Source = FromCache
		l.sources[FromCache].Add(1)
		hits++
	}
	return hits > 0 && vetoes(items, func(i int) bool { return items[i].Source != FromStore && !items[i].Result.Allowed })
}

// givesBack reports whether items hold a refund: the store applies refunds
// before the other checks, so a denial it answered before need not hold
// for their keys.
func givesBack(items []Item) bool {
	for i := range items {
		if c := &items[i].Check; c.Hits > 0 && c.Refund {
			return true
		}
	}
	return false
}

// givesBackTo reports whether items refund key.
func givesBackTo(items []Item, key string) bool {
	for i := range items {
		if c := &items[i].Check; c.Hits > 0 && c.Refund && c.Key == key {
			return true
		}
	}
	return false
}

// learn records a result the store decided for c, a check of the
// sub-batch sc sent at sent. A denial is remembered for the hits the
// sub-batch asked of c's key in all (see keyHits): that much was denied,
// and a request asking for less may pass.
func (l *Limiter) learn(c *store.Check, r *store.Result, sc *scratch, sent int64) {
	denied := !c.Refund && !c.Force && !r.Allowed && r.RetryAfter > 0 && !l.opts.DisableOverLimitCache
	var total uint64
	if denied {
		total = sc.keyHits(c.Key)
	}
	lruWith(l.overLimitCache, c.Key, func(k overLimitEntry, ok bool) (overLimitEntry, bool, struct{}) {
		if !ok || !k.sameRule(c) {
			k = overLimitEntry{limit: c.Limit, burst: c.Burst, window: c.Window}
		}
		k.remaining, k.at, k.end = r.Remaining, sent, sent+int64(r.Reset)
		switch {
		case c.Refund:
			k.deniedHits = 0 // a refund gives budget back
		case c.Force: // a write-back is not a denial
		case denied:
			k.deniedHits, k.until = total, sent+int64(r.RetryAfter)
		case r.Allowed && max(c.Hits, 1) >= k.deniedHits:
			k.deniedHits = 0 // the store let as many pass: the denial is over
		}
		return k, true, struct{}{}
	})
}
