package limiter

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// Reservations for hot keys.
//
// A replica that sees a key often, while the store says far more is left
// than the fleet can use soon, reserves a slice of hits: the store counts
// the slice at once, as consumed, and the replica then decides the key's
// next requests from the slice without a store call. What the slice did not
// use goes back as a refund within its window.
//
//   - Never over the limit: every hit admitted from a slice was counted in
//     the store, in the window it is admitted in, before it was admitted. A
//     slice ends no later than its window ends on the store's clock (it ends
//     at send time + the store's Reset, and the store decided after the
//     send), and after sliceLifetime in any case. For a token bucket, hits
//     counted up to sliceLifetime before they are admitted let the fleet
//     admit up to rate × sliceLifetime more over any span than the bucket
//     alone would.
//   - Exact near the limit: a slice is at most what is left / (sliceShare ×
//     fleet size), and none is taken when that is under minSlice, so the last
//     hits of a window go request by request to whoever asks first.
//   - Sized by demand: a slice covers sliceSpan of this replica's observed
//     rate of the key; a key seen fewer than minSlice hits within a rate
//     interval never reserves.
//
// The reservation rides along with the request that goes to the store: a
// shadow check of the slice's hits on the same key, after the request's own
// checks, so a slice the store cannot grant takes nothing and denies nothing.
// A slice's unused hits ride along the same way, as a refund, with the key's
// next store call, or are returned at Close.

const (
	// sliceSpan is how much of this replica's observed rate one slice covers.
	sliceSpan = 20 * time.Millisecond
	// rateInterval is the interval over which a key's rate is counted.
	rateInterval = 50 * time.Millisecond
	// sliceLifetime bounds how long a slice decides: an unused rest then goes
	// back to the store, so a replica whose demand stops holds nothing for long.
	sliceLifetime = 200 * time.Millisecond
	// minSlice is the smallest slice worth a reservation, and the least demand
	// (hits within rateInterval) that makes a key hot.
	minSlice = 16
	// sliceShare: a slice is at most what is left / (sliceShare × fleet size),
	// so all replicas' slices together hold at most about 1/sliceShare of it.
	sliceShare = 8
	// returnMargin: unused hits go back only while the window has at least
	// this long to run, so a refund lands in the window it belongs to.
	returnMargin = 100 * time.Millisecond
	// DefaultReserveBytes bounds the bytes of the keys whose demand is
	// tracked (each counts len(key) + reserveOverhead): a flood of distinct
	// keys, even of 4 KB values, cannot grow the table beyond it.
	DefaultReserveBytes = 4 << 20
	reserveOverhead     = 256 // the slice, its map slot (measured under 200 on linux/amd64)
	reserveShards       = 16
)

// slice is one key's reservation state: its demand, and the slice it holds.
type slice struct {
	rule store.Check // the rule it was reserved under (Hits, Refund, Shadow, Force unset)

	// demand: hits counted in the current rate interval, and in the last full one
	intervalStart int64
	intervalHits  uint64
	lastHits      uint64

	left      uint64 // hits of the slice not yet used
	expires   int64  // unix nanoseconds: the slice decides until then
	windowEnd int64  // unix nanoseconds: the store's window ends no earlier (0: token bucket)
	storeLeft uint64 // what the store had left after granting the slice
	reset     int64  // the store's Reset at grant time, as unix nanoseconds
	lastUse   int64
	granted   int64 // when the last slice was granted (unix nanoseconds)
	pending   bool  // a reservation of this key is in flight
}

type reserveShard struct {
	mu              sync.Mutex
	m               map[string]*slice
	bytes, maxBytes int64 // len(key)+reserveOverhead per entry of m, and the cap
}

// put adds s at key. sh.mu is held.
func (sh *reserveShard) put(key string, s *slice) {
	sh.m[key] = s
	sh.bytes += int64(len(key)) + reserveOverhead
}

// del removes key's entry. sh.mu is held.
func (sh *reserveShard) del(key string) {
	if _, ok := sh.m[key]; ok {
		delete(sh.m, key)
		sh.bytes -= int64(len(key)) + reserveOverhead
	}
}

// room reports whether an entry of key fits, evicting idle entries to make
// it. sh.mu is held.
func (sh *reserveShard) room(key string, now int64) bool {
	for sh.bytes+int64(len(key))+reserveOverhead > sh.maxBytes {
		if !sh.evict(now) {
			return false
		}
	}
	return true
}

// reservations is the table of keys' slices, and its running totals in hits.
type reservations struct {
	shards                           [reserveShards]reserveShard
	used, returned, expired, granted atomic.Uint64
}

func newReservations(maxBytes int64) *reservations {
	r := &reservations{}
	for i := range r.shards {
		r.shards[i].m = make(map[string]*slice)
		r.shards[i].maxBytes = maxBytes / reserveShards
	}
	return r
}

func (r *reservations) shard(key string) *reserveShard {
	return &r.shards[fnv32(key)%reserveShards]
}

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// sameRule reports whether c is checked under the rule s was made for.
func (s *slice) sameRule(c *store.Check) bool {
	return s.rule.Key == c.Key && s.rule.Algorithm == c.Algorithm && s.rule.Limit == c.Limit &&
		s.rule.Window == c.Window && s.rule.Burst == c.Burst && s.rule.Precision == c.Precision
}

// live reports whether s can decide at now.
func (s *slice) live(now int64) bool { return s.left > 0 && now < s.expires }

// returnable reports whether s's unused hits may still go back at now: the
// window they were counted in has at least returnMargin to run.
func (s *slice) returnable(now int64) bool {
	return s.left > 0 && (s.windowEnd == 0 || now+int64(returnMargin) < s.windowEnd)
}

// reservable reports whether a check may be decided from, or reserve, a
// slice. A fail_closed rule never does: its owner asked that nothing pass
// while the store cannot answer, and a slice keeps deciding through an
// outage until it ends.
func reservable(it *Item) bool {
	c := &it.Check
	return !it.NoReserve && !it.Quota && !it.FailClosed && c.Consuming() && !c.Shadow && c.Limit > 0
}

// allReservable reports whether a slice could decide every item.
func allReservable(items []Item) bool {
	for i := range items {
		if !reservable(&items[i]) || items[i].Source != FromStore {
			return false
		}
	}
	return true
}

// takeAll decides items from their keys' live slices when every item has
// one that covers it, and reports whether it did. Nothing is taken otherwise.
func (r *reservations) takeAll(items []Item, now int64) bool {
	if !allReservable(items) {
		return false
	}
	defer r.unlock(r.lock(items))
	if !r.covers(items, now) {
		return false
	}
	var total uint64
	for i := range items {
		it := &items[i]
		c := &it.Check
		s := r.shard(c.Key).m[c.Key]
		s.left -= c.Hits
		s.lastUse = now
		s.count(c.Hits, now)
		total += c.Hits
		reset := s.reset - now
		if s.windowEnd != 0 {
			reset = s.windowEnd - now
		}
		it.Result = store.Result{Allowed: true, Remaining: s.storeLeft + s.left, Reset: time.Duration(max(reset, 0))}
		it.Source = FromReserve
	}
	r.used.Add(total)
	return true
}

// lock locks the shards of items' keys, in index order (a request may name
// keys of several), and returns which it locked, for unlock. (Not a
// closure: one would escape to the heap on every request.)
func (r *reservations) lock(items []Item) (locked [reserveShards]bool) {
	for i := range items {
		locked[fnv32(items[i].Check.Key)%reserveShards] = true
	}
	for i := range locked {
		if locked[i] {
			r.shards[i].mu.Lock()
		}
	}
	return locked
}

// unlock unlocks the shards lock locked.
func (r *reservations) unlock(locked [reserveShards]bool) {
	for i := range locked {
		if locked[i] {
			r.shards[i].mu.Unlock()
		}
	}
}

// covers reports whether every item's key has a live slice, under the
// item's rule, with hits enough for it (two items of one key take from one
// slice). The items' shards are locked.
func (r *reservations) covers(items []Item, now int64) bool {
	for i := range items {
		c := &items[i].Check
		s := r.shard(c.Key).m[c.Key]
		if s == nil || !s.sameRule(c) || !s.live(now) {
			return false
		}
		need := c.Hits
		for j := range i {
			if items[j].Check.Key == c.Key {
				need += items[j].Check.Hits
			}
		}
		if need > s.left {
			return false
		}
	}
	return true
}

// count records hits of demand for s's key at now.
func (s *slice) count(hits uint64, now int64) {
	if now-s.intervalStart >= int64(rateInterval) {
		if now-s.intervalStart < 2*int64(rateInterval) {
			s.lastHits = s.intervalHits
		} else {
			s.lastHits = 0 // an idle interval between: the demand is gone
		}
		s.intervalStart, s.intervalHits = now, 0
	}
	s.intervalHits += hits
}

// plan is what one store call does for a key's slice: give back the unused
// hits of an ended slice (ret > 0), and reserve a new slice (want > 0).
type plan struct {
	ret, want uint64
	retRule   store.Check
	held      uint64 // hits of a live slice of the key: this replica's, beyond what the store has left
}

// prepare records c's demand and says what its store call should carry for
// the key's slice: the refund of an ended slice's unused hits, and a new
// reservation when the key is hot and known (from the store's last answer,
// remaining) to have far more left than the fleet's slices. fleet is the
// fleet size; at is when the store said remaining.
func (r *reservations) prepare(c *store.Check, remaining uint64, at int64, known bool, fleet int, now int64) plan {
	sh := r.shard(c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s, p := r.entry(sh, c, now)
	if s == nil {
		return p
	}
	s.count(c.Hits, now)
	s.lastUse = now
	if s.left > 0 && !s.live(now) && p.ret == 0 {
		p.ret, p.retRule = r.end(s, now), s.rule
	}
	if s.live(now) {
		p.held = s.left
	}
	if s.pending || s.live(now) || !known {
		return p
	}
	if s.granted != 0 && s.granted >= at {
		remaining = min(remaining, s.storeLeft) // what the store had after this replica's last slice
	}
	want := s.size(c.Hits, remaining, fleet)
	if want == 0 {
		return p
	}
	s.pending = true
	p.want = want
	return p
}

// size is the slice to reserve for s's key with a request of hits and
// remaining left in the store: sliceSpan of the observed demand, at most
// what is left / (sliceShare × fleet), and 0 for a cold key or near the
// limit (decided request by request).
func (s *slice) size(hits, remaining uint64, fleet int) uint64 {
	demand := max(s.lastHits, s.intervalHits)
	if demand < minSlice || remaining < hits {
		return 0
	}
	want := max(uint64(float64(demand)*float64(sliceSpan)/float64(rateInterval)), minSlice)
	want = min(want, (remaining-hits)/(sliceShare*uint64(max(fleet, 1))))
	if want < minSlice {
		return 0
	}
	return want
}

// entry returns c's key's slice, made for c's rule (nil when the table is
// full), and the refund of a slice counted under the key's former rule.
// sh.mu is held.
func (r *reservations) entry(sh *reserveShard, c *store.Check, now int64) (*slice, plan) {
	s := sh.m[c.Key]
	var p plan
	if s != nil && !s.sameRule(c) {
		// The key's rule changed: its slice was counted under the old one.
		p.ret, p.retRule = r.end(s, now), s.rule
		s = nil
		sh.del(c.Key)
	}
	if s == nil {
		if !sh.room(c.Key, now) {
			return nil, p
		}
		s = &slice{rule: ruleOf(c), intervalStart: now}
		sh.put(c.Key, s)
	}
	return s, p
}

// end takes s's unused hits for a refund when they may still go back (the
// caller counts them returned or expired by the refund's outcome), and
// counts them as expired when their window is ending.
func (r *reservations) end(s *slice, now int64) uint64 {
	left, ok := s.left, s.returnable(now)
	s.left = 0
	if left == 0 {
		return 0
	}
	if ok {
		return left
	}
	r.expired.Add(left)
	return 0
}

// settleReturn counts the outcome of a refund of n unused hits.
func (r *reservations) settleReturn(n uint64, ok bool) {
	if ok {
		r.returned.Add(n)
	} else {
		r.expired.Add(n)
	}
}

// evict drops an entry of the shard that holds no slice and has not been
// used for a rate interval, to make room. sh.mu is held.
func (sh *reserveShard) evict(now int64) bool {
	for k, s := range sh.m {
		if s.left == 0 && !s.pending && now-s.lastUse > int64(rateInterval) {
			sh.del(k)
			return true
		}
	}
	return false
}

// granted records the answer to a reservation of c's key sent at sent:
// the store's result for the shadow check of want hits.
func (r *reservations) grant(c *store.Check, want uint64, res *store.Result, ok bool, sent int64) {
	sh := r.shard(c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.m[c.Key]
	if s == nil || !s.sameRule(c) {
		if ok && res.Consumed {
			r.expired.Add(want) // the key's rule changed meanwhile: nothing can use it
		}
		return
	}
	s.pending = false
	if !ok || !res.Consumed {
		return
	}
	s.left, s.storeLeft, s.granted = want, res.Remaining, sent
	s.expires = sent + int64(sliceLifetime)
	s.reset = sent + int64(res.Reset)
	if c.Algorithm != store.TokenBucket {
		s.windowEnd = sent + int64(res.Reset)
		s.expires = min(s.expires, s.windowEnd)
	}
	r.granted.Add(want)
}

// drain takes every slice's unused hits that may still go back, for the
// refunds of a clean stop, and counts the others as expired.
func (r *reservations) drain(now int64) []store.Check {
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

// ruleOf is c's rule: c without its hits and flags.
func ruleOf(c *store.Check) store.Check {
	r := *c
	r.Hits, r.Refund, r.Shadow, r.Force, r.Scarce = 0, false, false, false, false
	return r
}

// fromReservations decides items from their keys' slices when reservations
// are on, no cached denial vetoed the request, and every item has a live
// slice that covers it.
func (l *Limiter) fromReservations(items []Item, vetoed bool, now int64) bool {
	if l.res == nil || vetoed || !l.res.takeAll(items, now) {
		return false
	}
	l.sources[FromReserve].Add(uint64(len(items)))
	return true
}

// attachReservations adds to the store call the reservation checks of the
// request's hot keys: a refund of an ended slice's unused hits, and a shadow
// check of a new slice's hits after the request's own checks. A request a
// cached denial vetoed only checks, and carries none; nor does one that a
// slice could never decide (a quota, shadow, refund or reserve: false
// descriptor in it), since a slice is for requests like the one that takes it.
func (l *Limiter) attachReservations(items []Item, sc *scratch, vetoed bool, now int64) {
	if l.res == nil || vetoed {
		return
	}
	// Only a request of one descriptor takes a slice: a request of several
	// may be denied by another of its descriptors and then refunded, which
	// a slice taken beside it would not follow (it would hold hits the
	// request gave back). Such requests still use the slices others took.
	all := len(items) == 1 && allReservable(items)
	fleet := l.opts.FleetSize()
	n := len(sc.checks)
	sc.held = sc.held[:0]
	for j := 0; j < n; j++ {
		i := sc.idx[j]
		if i < 0 || !reservable(&items[i]) || items[i].Source != FromStore {
			continue
		}
		c := &items[i].Check
		if !all {
			if held := l.res.held(c, now); held > 0 {
				sc.held = append(sc.held, riding{j: j, hits: held})
			}
			continue
		}
		k, known := l.lookup(c)
		p := l.res.prepare(c, k.remaining, k.at, known && k.deniedHits == 0, fleet, now)
		if p.ret > 0 {
			rc := p.retRule
			rc.Hits, rc.Refund = p.ret, true
			sc.resv = append(sc.resv, riding{j: len(sc.checks), hits: p.ret})
			sc.idx = append(sc.idx, rideReturn)
			sc.checks = append(sc.checks, rc)
		}
		if p.held > 0 {
			sc.held = append(sc.held, riding{j: j, hits: p.held})
		}
		if p.want > 0 {
			rc := ruleOf(c)
			rc.Hits, rc.Shadow = p.want, true
			sc.resv = append(sc.resv, riding{j: len(sc.checks), hits: p.want})
			sc.idx = append(sc.idx, rideReserve)
			sc.checks = append(sc.checks, rc)
		}
	}
}

// settleReservations accounts for the reservation checks of a store call
// that returned err: a granted slice starts deciding; a refund that did not
// land counts its hits as expired.
func (l *Limiter) settleReservations(sc *scratch, err error, now int64) {
	answered := err == nil || errors.Is(err, store.ErrUnavailable)
	for _, rd := range sc.resv {
		c, r := &sc.checks[rd.j], &sc.results[rd.j]
		ok := answered && !r.Undecided
		if sc.idx[rd.j] == rideReturn {
			l.res.settleReturn(rd.hits, ok)
			continue
		}
		l.res.grant(c, rd.hits, r, ok, now)
	}
}

// ReleaseReservations returns the unused hits of every slice to the store,
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
	var returned uint64
	for i := range checks {
		ok := (err == nil || errors.Is(err, store.ErrUnavailable)) && !results[i].Undecided
		l.res.settleReturn(checks[i].Hits, ok)
		if ok {
			returned += checks[i].Hits
		}
	}
	l.opts.Log.Info("reserved hits returned", "hits", returned, "held", sumHits(checks))
	return err
}

// HandOver gives the store what this replica holds at a clean stop, after
// Close: the unused hits of reserved slices (ReleaseReservations), then the
// hits admitted locally while the store could not answer (WriteBack).
func (l *Limiter) HandOver(ctx context.Context) error {
	return errors.Join(l.ReleaseReservations(ctx), l.WriteBack(ctx))
}

func sumHits(checks []store.Check) uint64 {
	var n uint64
	for i := range checks {
		n += checks[i].Hits
	}
	return n
}

// reportHeld adds to the results the store decided the hits of this
// replica's live slices of their keys, which the store counts as consumed
// but this replica can still admit: a request that goes to the store while
// its key has a slice (another of its descriptors has none) reports what is
// left to it. It also tells each slice what the store now has left.
func (l *Limiter) reportHeld(items []Item, sc *scratch) {
	if l.res == nil {
		return
	}
	for _, h := range sc.held {
		it := &items[sc.idx[h.j]]
		if it.Source != FromStore || sc.results[h.j].Undecided {
			continue
		}
		l.res.observe(&sc.checks[h.j], sc.results[h.j].Remaining)
		it.Result.Remaining += h.hits
	}
}

// held returns the unused hits of c's key's live slice under c's rule.
func (r *reservations) held(c *store.Check, now int64) uint64 {
	sh := r.shard(c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s := sh.m[c.Key]; s != nil && s.sameRule(c) && s.live(now) {
		return s.left
	}
	return 0
}

// observe records what the store said is left for c's key, beyond the
// key's slice.
func (r *reservations) observe(c *store.Check, remaining uint64) {
	sh := r.shard(c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s := sh.m[c.Key]; s != nil && s.sameRule(c) {
		s.storeLeft = remaining
	}
}
