package rlqs

import (
	"math"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
)

func abandon(id map[string]string) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
}

// bucket is one subscribed BucketId of a stream, and its ledger. Only
// demand and demandUntil are read by other streams (a key's demand).
type bucket struct {
	id       map[string]string
	key      string // canonical form of id
	kept     int64  // bytes of the budget it holds
	check    store.Check
	static   *grant // blanket answer of an unmatched, unlimited or shadow bucket; nil when counted
	shadow   bool
	matched  bool  // a rule (limited, unlimited or shadow) decides it
	g        grant // the active grant
	hasGrant bool
	// demand is (allowed+denied) per second at the last report and claim
	// the bound it counts with (float64 bits: see demandOf); they count
	// until demandUntil (unix ns).
	demand      atomic.Uint64
	claim       atomic.Uint64
	pace        atomic.Uint64 // limitPace of check (float64 bits), for other streams' demandOf
	demandUntil atomic.Int64
	last        time.Time     // last report, rls's clock
	interval    time.Duration // the longest between two of its reports; 0 before its second
	idle        int
	covered     uint64    // worst case of the grants active since the last report
	used        uint64    // allowed reported under the active grant
	next        time.Time // the next push (zero: none)
	topUpAt     time.Time // the window's top-up (reserve.go; zero: none)
	gone        bool
	// pendingTopUp asks handle to top b up after its report's write-backs.
	pendingTopUp bool
	shrunk       uint64    // hits the last shrink gave back (shrink)
	shrunkAt     time.Time // when
}

// reportInterval is the longest time between two of b's reports, or
// defaultInterval before its second.
func (b *bucket) reportInterval() time.Duration {
	if b.interval <= 0 {
		return defaultInterval
	}
	return b.interval
}

// drop forgets b.
func (st *stream) drop(b *bucket) {
	if b.gone {
		return
	}
	b.gone = true
	delete(st.buckets, b.key)
	if b.static == nil {
		st.srv.leave(b)
	}
	st.srv.budget.give(&st.held, b.kept)
	st.srv.o.Metrics.addBuckets(-1)
}

// subscribe takes a bucket's first report: it answers an unmatched,
// unlimited or shadow bucket at once (with the shadow's write-back), or
// returns the reservation of its first grant (with the write-back of what
// Envoy allowed before it). A bucket that the budget cannot keep ends the
// stream.
func (st *stream) subscribe(key string, u *usage, now time.Time) (*ask, []store.Check, error) {
	o := &st.srv.o
	if len(st.buckets) >= o.MaxBuckets {
		o.Metrics.action("abandon", 1)
		st.act(abandon(u.bucket))
		return nil, nil, nil
	}
	b := &bucket{id: u.bucket, key: key, last: now}
	if !st.resolve(b, u.bucket) {
		o.Metrics.action("abandon", 1)
		st.act(abandon(u.bucket))
		return nil, nil, nil
	}
	b.kept = keptCost(u.bucket)
	if err := st.srv.budget.take(&st.held, b.kept); err != nil {
		o.Metrics.refuse("budget")
		return nil, nil, err
	}
	st.buckets[key] = b
	o.Metrics.addBuckets(1)
	if b.static != nil {
		st.act(st.staticAction(b, now))
		if b.shadow && u.allowed > 0 {
			return nil, []store.Check{st.force(b, u.allowed)}, nil
		}
		return nil, nil, nil
	}
	st.srv.join(b)
	st.setDemand(b, u, time.Second, now)
	// What Envoy allowed before this first answer came from its
	// no_assignment_behavior: it is written back with the reservation.
	var extra []store.Check
	if u.allowed > 0 {
		extra = append(extra, st.force(b, u.allowed))
		o.Metrics.addWrittenBack(u.allowed)
	}
	return &ask{b: b, extra: extra, slot: st.slot()}, nil, nil
}

// resolve finds b's rule and check, or its blanket answer, in the config
// in force; false when the bucket matches no rule and Unmatched is Abandon.
func (st *stream) resolve(b *bucket, id map[string]string) bool {
	o := &st.srv.o
	entries := st.cfg.BucketEntries(st.domain, id)
	var rule *descriptors.Rule
	unlimited := false
	b.static, b.shadow, b.check, b.matched = nil, false, store.Check{}, false
	if len(entries) > 0 {
		var err error
		if b.check, rule, unlimited, err = o.Resolver.BucketCheck(st.domain, entries); err != nil {
			rule, unlimited = nil, false
		}
	}
	b.matched = rule != nil || unlimited
	b.pace.Store(math.Float64bits(limitPace(b)))
	switch {
	case unlimited:
		b.static = &grant{allow: true}
	case rule == nil && o.Unmatched == Abandon:
		return false
	case rule == nil && o.Unmatched == Deny:
		b.static = &grant{deny: true}
	case rule == nil:
		b.static = &grant{allow: true}
	case b.check.Shadow:
		b.static, b.shadow = &grant{allow: true}, true
	}
	return true
}

// checkConfig re-resolves every bucket when the config in force is not the
// one they were resolved in (see reconfigure).
func (st *stream) checkConfig(now time.Time) {
	if st.srv.o.Resolver.Config() != st.cfg {
		st.reconfigure(now)
	}
}

// reconfigure re-resolves every bucket in the config in force: a changed
// rule gets its next grant at once, a rule gone abandons its bucket; old
// reservations stay counted (invariant 11).
func (st *stream) reconfigure(now time.Time) {
	cfg := st.srv.o.Resolver.Config()
	if cfg == st.cfg {
		return
	}
	st.cfg = cfg
	for _, b := range st.sortedBuckets() {
		was := resolution{static: b.static, shadow: b.shadow, matched: b.matched, check: b.check}
		if !st.resolve(b, b.id) || (was.matched && !b.matched) {
			// The rule is gone: abandoned (it is subscribed again as new).
			b.static, b.shadow, b.check = was.static, was.shadow, was.check
			st.drop(b)
			st.srv.o.Metrics.action("abandon", 1)
			st.act(abandon(b.id))
			continue
		}
		if was.same(b) {
			continue
		}
		if was.static == nil {
			st.srv.leaveKey(b, was.check.Key)
		}
		if b.static == nil {
			st.srv.join(b)
		}
		b.hasGrant, b.g, b.used, b.shrunk = false, grant{}, 0, 0 // covered stays: the old grant's usage is still to come
		b.topUpAt, b.pendingTopUp = time.Time{}, false
		b.next = now
	}
}

// resolution is what resolve found for a bucket.
type resolution struct {
	static  *grant
	shadow  bool
	matched bool
	check   store.Check
}

// same reports whether b decides as r: the same blanket answer, or the
// same counter and rule.
func (r resolution) same(b *bucket) bool {
	if (r.static == nil) != (b.static == nil) || r.shadow != b.shadow {
		return false
	}
	if r.static != nil && (r.static.allow != b.static.allow || r.static.deny != b.static.deny) {
		return false
	}
	return r.check == b.check
}

// staticAction returns b's blanket answer for Period, renewed before it
// expires.
func (st *stream) staticAction(b *bucket, now time.Time) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	g := *b.static
	g.ttl = int64(st.srv.o.Period / time.Second)
	b.g, b.hasGrant = g, true
	if g.deny {
		st.srv.o.Metrics.action("deny_all", 1)
	} else {
		st.srv.o.Metrics.action("allow_all", 1)
	}
	b.next = now.Add(st.srv.o.Period - st.srv.o.Period/4)
	return assignment(b.id, &g)
}

// force returns a write-back of n hits to b's counter.
func (st *stream) force(b *bucket, n uint64) store.Check {
	c := b.check
	c.Hits, c.Force, c.Shadow = n, true, false
	return c
}

// giveBack returns a refund of n hits to b's counter.
func (st *stream) giveBack(b *bucket, n uint64) store.Check {
	c := b.check
	c.Hits, c.Refund, c.Shadow = n, true, false
	return c
}

// usage takes a later report of b: it queues an abandon or a shrink, and
// returns the refunds and write-backs to apply.
func (st *stream) usage(b *bucket, u *usage, now time.Time) []store.Check {
	o := &st.srv.o
	since := now.Sub(b.last)
	if m := o.Metrics; m != nil {
		m.reportInterval.Observe(since.Seconds())
	}
	grantBefore := b.hasGrant && !b.g.reservedAt.After(b.last) // the grant covers the whole interval
	b.last = now
	b.interval = max(b.interval, since)
	if u.allowed == 0 && u.denied == 0 {
		b.idle++
		if b.idle >= o.IdleReports {
			st.drop(b)
			o.Metrics.action("abandon", 1)
			st.act(abandon(b.id))
			return nil
		}
	} else {
		b.idle = 0
	}
	if b.static != nil {
		if b.shadow && u.allowed > 0 {
			return []store.Check{st.force(b, u.allowed)}
		}
		return nil
	}
	st.setDemand(b, u, since, now)
	var checks []store.Check
	// Allowed beyond every grant that was active since the last report
	// came from Envoy's own fallbacks: counted now.
	if u.allowed > b.covered {
		checks = append(checks, st.force(b, u.allowed-b.covered))
	}
	b.covered = b.g.worst()
	if u.denied > 0 {
		// Demand beyond the grant: what the window has left, at once.
		b.pendingTopUp = true
	}
	if !grantBefore {
		b.used = 0 // the report mixes grants: its usage proves nothing unused
	} else {
		b.used += u.allowed
	}
	if a, c, ok := st.shrink(b, now, grantBefore); ok {
		st.act(a)
		return append(checks, c)
	}
	if !grantBefore {
		return checks
	}
	if c, ok := st.refund(b, now); ok {
		checks = append(checks, c)
	}
	return checks
}

// shrinkMin is the least a shrink gives back, as a part of the grant's
// worst case (and at least 4 hits): below it a replacement is not worth
// its churn (invariant 5).
const shrinkMin = 32

// shrink replaces b's active windowed grant, when the report shows a
// demand that leaves much of it unused, by one sized to that demand, and
// returns it with the refund of all the old grant can no longer admit
// (invariant 5; reported: the report covers the grant's whole life). A
// stream that ends before the replacement lands charges the refund back
// (see end).
func (st *stream) shrink(b *bucket, now time.Time, reported bool) (*rlqsv3.RateLimitQuotaResponse_BucketAction, store.Check, bool) {
	o := &st.srv.o
	g := b.g
	if b.pendingTopUp || !b.hasGrant || g.windowEnd.IsZero() || g.deny || g.allow || g.reserved > g.worst() || b.check.Window <= 0 {
		return nil, store.Check{}, false
	}
	left := g.windowEnd.Sub(now)
	start := g.windowEnd.Add(-b.check.Window)
	if left < 4*o.Overlap || now.Before(start) {
		return nil, store.Check{}, false
	}
	ng := st.distinct(b, shape(uint64(math.Ceil(st.srv.demandOf(b, now, st.srv.groupSize(b.check.Key))*left.Seconds()))+o.MinShare, wholeSeconds(left)))
	admits := g.max + uint64(math.Ceil(g.rate()*(now.Sub(start)+o.Overlap).Seconds()))
	if reported {
		admits = min(admits, b.used+g.max+uint64(math.Ceil(g.rate()*(2*o.Overlap).Seconds())))
	}
	need := admits + ng.worst()
	if need >= g.reserved || g.reserved-need < max(4, g.worst()/shrinkMin) {
		return nil, store.Check{}, false
	}
	back := g.reserved - need
	ng.reservedAt, ng.windowEnd, ng.reserved = now, g.windowEnd, need
	b.g = ng
	if !reported {
		// Later refunds count what this report's usage did not prove:
		// all the old grant could admit.
		b.used = admits
	} // else b.used goes on: the reservation holds it and the old grant's tail
	b.covered += ng.worst()
	b.shrunk, b.shrunkAt = back, now
	o.Metrics.action("token_bucket", 1)
	return assignment(b.id, &ng), st.giveBack(b, back), true
}

// refund returns the refund of what b's reservation holds beyond what the
// reports prove used and what the grant can still admit, while its window
// lasts (invariant 4).
func (st *stream) refund(b *bucket, now time.Time) (store.Check, bool) {
	o := &st.srv.o
	g := &b.g
	end := g.reservedAt.Add(time.Duration(g.ttl)*time.Second + o.Overlap)
	if !g.windowEnd.IsZero() {
		if !now.Add(o.Overlap).Before(g.windowEnd) {
			return store.Check{}, false
		}
		end = g.windowEnd.Add(o.Overlap)
	}
	left := end.Sub(now).Seconds()
	if g.deny || g.allow || left <= 0 {
		return store.Check{}, false
	}
	need := b.used + g.max + uint64(math.Ceil(float64(g.per)*left/float64(g.fill)))
	if need >= g.reserved {
		return store.Check{}, false
	}
	c := st.giveBack(b, g.reserved-need)
	g.reserved = need
	return c, true
}
