package limiter

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// Leases: a key this replica asks about several times a window is decided
// from hits counted in the store ahead of its requests (store.Check.Want,
// store.Lease), asked for by a request that goes to the store anyway
// (docs/redis.md, invariants 14 to 17).

const (
	leaseLife    = time.Second            // the longest a lease decides
	bucketLife   = 200 * time.Millisecond // a token bucket's lease
	paceSpan     = 20 * time.Millisecond  // near the limit: what a paced lease covers
	minLease     = 2                      // the smallest lease worth asking for
	minFar       = 16                     // far from the limit: left / (leaseShare × fleet) is at least this
	minSeen      = 3                      // hits seen in a window before a key leases
	leaseShare   = 8                      // far from the limit: at most left / (leaseShare × fleet)
	nearBelow    = 8                      // a key is near its limit below nearBelow × the hits asked
	returnMargin = 100 * time.Millisecond
	// DefaultReserveBytes bounds the bytes of the lease table (each key
	// counts len(key) + leaseOverhead), so a flood of keys cannot grow it.
	DefaultReserveBytes = 4 << 20
	leaseOverhead       = 256 // the lease and its map slot (measured under 200 on linux/amd64)
	leaseShards         = 16
)

// lease is one key's lease state: its rule, its demand and its lease.
type lease struct {
	rule store.Check // the rule it was counted under (Hits and flags unset)
	// demand: hits seen in the current interval (one window, at most a
	// second) and the last one
	dStart     int64
	dHits      uint64
	dLast      uint64
	l          store.Lease // granted
	base       int64       // unix ns: l's schedule counts from here (the answer's arrival)
	used       uint64      // hits of l admitted
	expires    int64       // unix ns: the lease decides until then
	windowEnd  int64       // unix ns: its window ends no earlier (0: a token bucket)
	storeLeft  uint64      // what the store had left after granting it
	pending    bool        // a call asking for a lease of this key is in flight
	lastUse    int64
	paced      bool
	returnable bool
}

type leaseShard struct {
	mu              sync.Mutex
	m               map[string]*lease
	bytes, maxBytes int64
}

// leases is the table of keys' leases and its running totals in hits.
type leases struct {
	shards                           [leaseShards]leaseShard
	used, returned, expired, granted atomic.Uint64
}

func newLeases(maxBytes int64) *leases {
	r := &leases{}
	for i := range r.shards {
		r.shards[i].m = make(map[string]*lease)
		r.shards[i].maxBytes = maxBytes / leaseShards
	}
	return r
}

var leaseSeed = maphash.MakeSeed()

func leaseShardOf(key string) uint64 { return maphash.String(leaseSeed, key) % leaseShards }

func (r *leases) shard(key string) *leaseShard { return &r.shards[leaseShardOf(key)] }

// get returns key's lease under c's rule; a lease of another rule ends
// (its unused hits are returned with ret). sh.mu is held.
func (sh *leaseShard) get(r *leases, c *store.Check, now int64, create bool) (s *lease, ret uint64, retRule store.Check) {
	s = sh.m[c.Key]
	if s != nil && !sameRule(&s.rule, c) {
		ret, retRule = r.end(s, now), s.rule
		sh.del(c.Key)
		s = nil
	}
	if s == nil && create && sh.room(c.Key, now) {
		s = &lease{rule: ruleOf(c), dStart: now}
		sh.m[c.Key] = s
		sh.bytes += int64(len(c.Key)) + leaseOverhead
	}
	return s, ret, retRule
}

func (sh *leaseShard) del(key string) {
	if _, ok := sh.m[key]; ok {
		delete(sh.m, key)
		sh.bytes -= int64(len(key)) + leaseOverhead
	}
}

// room reports whether an entry of key fits, dropping idle entries that
// hold nothing to make room. sh.mu is held.
func (sh *leaseShard) room(key string, now int64) bool {
	for sh.bytes+int64(len(key))+leaseOverhead > sh.maxBytes {
		dropped := false
		for k, s := range sh.m {
			if s.used >= s.l.Hits && !s.pending && now-s.lastUse > int64(time.Second) {
				sh.del(k)
				dropped = true
				break
			}
		}
		if !dropped {
			return false
		}
	}
	return true
}

func sameRule(a, c *store.Check) bool {
	return a.Key == c.Key && a.Algorithm == c.Algorithm && a.Limit == c.Limit && a.Window == c.Window &&
		a.Burst == c.Burst && a.Precision == c.Precision && a.Strict == c.Strict
}

// ruleOf is c's rule: c without its hits, flags and lease.
func ruleOf(c *store.Check) store.Check {
	return store.Check{Key: c.Key, Algorithm: c.Algorithm, Limit: c.Limit, Window: c.Window, Burst: c.Burst,
		Precision: c.Precision, Strict: c.Strict}
}

// live reports whether s decides at now.
func (s *lease) live(now int64) bool { return now < s.expires && s.used < s.l.Hits }

// released returns how many of s's hits may be admitted at now.
func (s *lease) released(now int64) uint64 {
	el := time.Duration(now - s.base)
	n := s.l.Now
	if s.l.Hits > n && el >= s.l.From {
		n += 1 + uint64((el-s.l.From)/max(s.l.Every, 1))
	}
	return min(n, s.l.Hits)
}

// count records hits of demand at now.
func (s *lease) count(hits uint64, now int64) {
	iv := int64(min(s.rule.Window, time.Second))
	if now-s.dStart >= iv {
		s.dLast = 0
		if now-s.dStart < 2*iv {
			s.dLast = s.dHits
		}
		s.dStart, s.dHits = now, 0
	}
	s.dHits += hits
	s.lastUse = now
}

// end takes s's unused hits: for a refund when their window can still
// take them back, else counted expired.
func (r *leases) end(s *lease, now int64) uint64 {
	left := s.l.Hits - min(s.used, s.l.Hits)
	s.used = s.l.Hits
	if left == 0 {
		return 0
	}
	if s.returnable && (s.windowEnd == 0 || now+int64(returnMargin) < s.windowEnd) {
		return left
	}
	r.expired.Add(left)
	return 0
}

// leasable reports whether an item may be decided from, or ask for, a
// lease. A fail_closed rule never leases: a lease goes on deciding through
// an outage until it ends.
func leasable(it *Item) bool {
	c := &it.Check
	return !it.NoReserve && !it.Quota && !it.FailClosed && c.Consuming() && !c.Shadow && c.Limit > 0
}

// allLeasable reports whether every item may be decided from a lease.
func allLeasable(items []Item) bool {
	for i := range items {
		if !leasable(&items[i]) || items[i].Source != FromStore {
			return false
		}
	}
	return true
}

// fromLeases decides items from their keys' live leases when every item
// has one with hits enough, and reports whether it did.
func (l *Limiter) fromLeases(items []Item, now int64) bool {
	r := l.res
	if !allLeasable(items) {
		return false
	}
	defer r.unlock(r.lock(items))
	for i := range items {
		c := &items[i].Check
		s := r.shard(c.Key).m[c.Key]
		need := c.Hits
		for j := range i {
			if items[j].Check.Key == c.Key {
				need += items[j].Check.Hits
			}
		}
		if s == nil || !sameRule(&s.rule, c) || !s.live(now) || s.released(now) < s.used+need {
			return false
		}
	}
	var total uint64
	for i := range items {
		it := &items[i]
		c := &it.Check
		s := r.shard(c.Key).m[c.Key]
		s.used += c.Hits
		s.count(c.Hits, now)
		total += c.Hits
		reset := s.expires - now
		if s.windowEnd != 0 {
			reset = s.windowEnd - now
		}
		it.Result = store.Result{Allowed: true, Remaining: s.storeLeft + s.released(now) - s.used, Reset: time.Duration(max(reset, 0))}
		it.Source = FromReserve
	}
	r.used.Add(total)
	l.sources[FromReserve].Add(uint64(len(items)))
	return true
}

// waiting returns, for a check whose key holds a live paced lease none of
// whose next hits is due, how long until one is: the store would deny the
// check until then (invariant 12).
func (r *leases) waiting(c *store.Check, now int64) (time.Duration, bool) {
	sh := r.shard(c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.m[c.Key]
	if s == nil || !sameRule(&s.rule, c) || !s.live(now) || s.released(now) >= s.used+max(c.Hits, 1) {
		return 0, false
	}
	k := s.used + max(c.Hits, 1)
	if k > s.l.Hits {
		return 0, false // more than the lease holds: the store decides
	}
	return max(time.Duration(s.base-now)+s.l.At(k), 1), true
}

// lock locks the shards of items' keys in index order and returns which.
func (r *leases) lock(items []Item) (locked [leaseShards]bool) {
	for i := range items {
		locked[leaseShardOf(items[i].Check.Key)] = true
	}
	for i := range locked {
		if locked[i] {
			r.shards[i].mu.Lock()
		}
	}
	return locked
}

func (r *leases) unlock(locked [leaseShards]bool) {
	for i := range locked {
		if locked[i] {
			r.shards[i].mu.Unlock()
		}
	}
}

// ask records c's demand and sets what its store call carries for the
// key's lease: Want (and Horizon, Exact) when the key is hot and its last
// answer k (known) leaves room, and the refund of an ended lease's unused
// hits.
func (r *leases) ask(c *store.Check, k overLimitEntry, known bool, fleet int, now int64) (ret store.Check) {
	sh := r.shard(c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s, n, rule := sh.get(r, c, now, true)
	if n > 0 {
		ret = rule
		ret.Hits, ret.Refund = n, true
	}
	if s == nil {
		return ret
	}
	s.count(c.Hits, now)
	if s.used < s.l.Hits && !s.live(now) && ret.Hits == 0 {
		if n := r.end(s, now); n > 0 {
			ret = s.rule
			ret.Hits, ret.Refund = n, true
		}
	}
	if s.pending || s.live(now) || !known || k.deniedHits > 0 && k.until > now {
		return ret
	}
	if want := s.want(c, k, fleet, now); want >= minLease {
		c.Want = want
		s.pending = true
	}
	return ret
}

// want sizes the lease c asks for, from the key's demand and its last
// answer k; near the limit it asks for a paced lease (c.Horizon set).
func (s *lease) want(c *store.Check, k overLimitEntry, fleet int, now int64) uint64 {
	seen := max(s.dHits, s.dLast)
	iv := min(c.Window, time.Second)
	if seen < minSeen {
		return 0
	}
	left := k.remaining
	if s.storeLeft < left && k.at <= s.base {
		left = s.storeLeft
	}
	span := leaseLife
	if c.Algorithm == store.TokenBucket {
		span = bucketLife
	} else if k.end > now {
		span = min(span, time.Duration(k.end-now))
	}
	want := uint64(float64(seen) * float64(span) / float64(iv))
	want -= min(want, c.Hits) // the request's own hits are not the lease's
	fleetN := uint64(max(fleet, 1))
	if far := left / (leaseShare * fleetN); far >= minFar {
		return min(want, far)
	} else if c.Algorithm == store.SlidingWindow && c.Precision < 2 {
		// Near the limit: a paced lease of what frees up within paceSpan.
		share := uint64(float64(c.Limit) * float64(paceSpan) / float64(c.Window) / float64(fleetN))
		c.Horizon = paceSpan
		return min(uint64(float64(seen)*float64(paceSpan)/float64(iv)), share)
	}
	return 0
}

// grant records the answer to c's lease request, sent at sent and answered
// at arrived; ok is false when the store could not answer.
func (r *leases) grant(c *store.Check, res *store.Result, ok bool, sent, arrived int64) {
	sh := r.shard(c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.m[c.Key]
	if s == nil || !sameRule(&s.rule, c) {
		if ok {
			r.expired.Add(res.Lease.Hits) // the rule changed meanwhile
		}
		return
	}
	s.pending = false
	if !ok || res.Lease.Hits == 0 {
		return
	}
	s.l, s.used, s.base, s.storeLeft = res.Lease, 0, arrived, res.Remaining
	s.paced = res.Lease.Hits > res.Lease.Now
	s.expires, s.windowEnd = sent+int64(leaseLife), 0
	if c.Algorithm == store.TokenBucket {
		s.expires = sent + int64(bucketLife)
	} else {
		s.windowEnd = sent + int64(res.Reset)
		s.expires = min(s.expires, s.windowEnd)
	}
	s.returnable = true
	r.granted.Add(res.Lease.Hits)
}

// observe records what the store said is left of c's key beyond its
// lease, for the remaining the lease's requests report.
func (r *leases) observe(c *store.Check, remaining uint64) {
	sh := r.shard(c.Key)
	sh.mu.Lock()
	if s := sh.m[c.Key]; s != nil && sameRule(&s.rule, c) {
		s.storeLeft = remaining
	}
	sh.mu.Unlock()
}

// settleReturn counts the outcome of a refund of n unused hits.
func (r *leases) settleReturn(n uint64, ok bool) {
	if ok {
		r.returned.Add(n)
	} else {
		r.expired.Add(n)
	}
}

// drain takes every lease's unused hits that may still go back, for the
// refunds of a clean stop.
func (r *leases) drain(now int64) []store.Check {
	var out []store.Check
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for _, s := range sh.m {
			if n := r.end(s, now); n > 0 {
				c := s.rule
				c.Hits, c.Refund = n, true
				out = append(out, c)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// ReleaseReservations returns the unused hits of every lease to the store,
// within ctx (a clean stop: another replica can use them in the same
// window). Hits that cannot go back are counted as expired.
func (l *Limiter) ReleaseReservations(ctx context.Context) error {
	if l.res == nil {
		return nil
	}
	checks := l.res.drain(l.opts.Now().UnixNano())
	if len(checks) == 0 {
		return nil
	}
	results := make([]store.Result, len(checks))
	err := l.st.Decide(ctx, checks, results)
	var returned, held uint64
	for i := range checks {
		ok := (err == nil || errors.Is(err, store.ErrUnavailable)) && !results[i].Undecided
		l.res.settleReturn(checks[i].Hits, ok)
		held += checks[i].Hits
		if ok {
			returned += checks[i].Hits
		}
	}
	l.opts.Log.Info("reserved hits returned", "hits", returned, "held", held)
	return err
}

// HandOver gives the store what this replica holds at a clean stop, after
// Close: the unused hits of leases, then the hits admitted locally while
// the store could not answer (WriteBack).
func (l *Limiter) HandOver(ctx context.Context) error {
	return errors.Join(l.ReleaseReservations(ctx), l.WriteBack(ctx))
}
