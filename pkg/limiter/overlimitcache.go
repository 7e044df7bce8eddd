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
	// fits, after a denial of one hit or a hit that left no budget (the
	// store's NextHit), is when one hit is expected to pass for sure: the
	// RetryAfter or NextHit counted from when the answer arrived, where
	// until counts a denial's from before the call was sent (unix
	// nanoseconds; 0: not known).
	fits int64
}

// sameRule reports whether k was learned under c's limit.
func (k *overLimitEntry) sameRule(c *store.Check) bool {
	return k.limit == c.Limit && k.burst == c.Burst && k.window == c.Window
}

// denies reports whether k's denial covers c at now: the store denied at
// least as many hits as c asks for (a check-only check asks for one), and
// said they would not pass before k.until. Time only helps a request and
// other traffic only hurts it, so the store would deny c too. Refunds clear
// the denial, since they give budget back.
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

// fromCache answers the items the over-limit cache denies, marks the others
// FromStore, and reports whether a cached denial vetoes the request (a
// consuming, non-shadow check was denied).
//
// fits, for a request of one hit of one key whose last answer said when
// one hit surely fits (overLimitEntry.fits), is how long until then when
// the cache's denial has run out but that time has not come (0 else).
func (l *Limiter) fromCache(items []Item, now int64) (vetoed bool, fits time.Duration) {
	hits := 0
	credits := givesBack(items)
	for i := range items {
		it := &items[i]
		it.Source, it.Result = FromStore, store.Result{}
		c := &it.Check
		if l.opts.DisableOverLimitCache || c.Refund || c.Force || (credits && givesBackTo(items, c.Key)) {
			continue
		}
		k, ok := l.lookup(c)
		if ok && len(items) == 1 && c.Hits == 1 && k.deniedHits == 1 && k.fits > now && k.sameRule(c) && !k.denies(c, now) {
			fits = time.Duration(k.fits - now)
		}
		if !ok || !k.denies(c, now) {
			continue
		}
		if k.fits != 0 && l.res != nil && l.res.held(c, now) > 0 {
			continue // a denial of one hit while this replica holds a live slice: the slice decides
		}
		d := time.Duration(k.until - now)
		it.Result = store.Result{Remaining: k.remaining, RetryAfter: d, Reset: d}
		it.Source = FromCache
		hits++
	}
	if hits > 0 {
		vetoed = vetoes(items, func(i int) bool { return items[i].Source == FromCache })
	}
	if hits > 0 {
		l.sources[FromCache].Add(uint64(hits))
	}
	return vetoed, fits
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
// sub-batch sc, at now. A denial is remembered for the hits the sub-batch
// asked of c's key in all (see keyHits): that much was denied, and a
// request asking for less may pass.
func (l *Limiter) learn(c *store.Check, r *store.Result, sc *scratch, now int64) {
	denied := !c.Refund && !c.Force && !r.Allowed && r.RetryAfter > 0 && !l.opts.DisableOverLimitCache
	var total uint64
	if denied {
		total = sc.keyHits(c.Key)
	}
	var arrived int64
	if (r.Consumed && r.Remaining == 0 && r.NextHit > 0) || (denied && total == 1) {
		arrived = l.opts.Now().UnixNano()
	}
	lruWith(l.overLimitCache, c.Key, func(k overLimitEntry, ok bool) (overLimitEntry, bool, struct{}) {
		if !ok || !k.sameRule(c) {
			k = overLimitEntry{limit: c.Limit, burst: c.Burst, window: c.Window}
		}
		k.remaining, k.at = r.Remaining, now
		switch {
		case c.Refund:
			k.deniedHits = 0 // a refund gives budget back
		case c.Force: // a write-back is not a denial
		case denied:
			k.deniedHits, k.until, k.fits = total, now+int64(r.RetryAfter), 0
			if total == 1 { // one hit: it passes once RetryAfter has surely come
				k.fits = arrived + int64(r.RetryAfter)
			}
		case r.Allowed && max(c.Hits, 1) >= k.deniedHits:
			k.deniedHits, k.fits = 0, 0 // the store let as many pass: the denial is over
		}
		if r.Consumed && r.Remaining == 0 && r.NextHit > 0 && !l.opts.DisableOverLimitCache {
			// The hit admitted took the last of the budget. NextHit only
			// says when to send the next hit as one that fits: it is not
			// held as a denial, since the count it was reckoned from may
			// hold another replica's INCRBY that its script then takes
			// back (the integration test of rls simulate saw such a
			// denial the store never made).
			k.fits = arrived + int64(r.NextHit)
		}
		return k, true, struct{}{}
	})
}
