package rlqs

import (
	"context"
	"math"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rls-project/rls/pkg/store"
)

// boundarySlack is how long after a window's end (by the store's Reset) a
// push runs, so that the store has rolled to the next window.
const boundarySlack = 5 * time.Millisecond

// reservation is one grant to reserve: its worst case consumed with the
// checks before it (write-backs, a boundary's charge), all or nothing; when
// it does not fit, shrunk to what is left (see reserveAll). A top-up
// (least > 0) reserves only its extra hits.
type reservation struct {
	b        *bucket
	g        grant
	ttl      int64
	end      time.Time // the window's end; zero for a token-bucket rule
	checks   []store.Check
	boundary bool
	least    uint64
	// The outcome.
	got      grant
	res      []store.Result // the last call's results
	consumed uint64         // hits the store consumed for it
	err      error
}

// ask is a bucket's next grant to reserve: with extra checks (write-backs)
// in the same request, and at a push (boundary) the boundary's charge.
type ask struct {
	b        *bucket
	extra    []store.Check
	boundary bool
	slot     int // its action's place in the stream's pending actions
}

// prepare sizes a's grant: a share of x hits (see share), and, at a push,
// the charge of what the previous grant can admit after the boundary
// beyond the next grant's own worst case (chargeOverlap), out of the
// stream's share (keepShape).
func (st *stream) prepare(a ask, now time.Time) *reservation {
	b := a.b
	ttl, windowEnd := st.srv.period(b, now)
	x := st.srv.share(st.ctx, b, ttl, windowEnd, now)
	g := st.keepShape(b, x, ttl, a.boundary)
	checks := a.extra
	if a.boundary {
		checks = st.chargeOverlap(b, checks, g)
	}
	return &reservation{b: b, g: g, ttl: ttl, end: windowEnd, checks: checks, boundary: a.boundary}
}

// grant reserves the grants asks ask for (and the requests of pre, decided
// first in the same round trip), puts the action of each grant reserved in
// its slot of the pending actions (see slot) and schedules its push. The fleet's demand for their keys is read first,
// a few calls at a time (fetchDemands). A bucket whose grant the store
// could not reserve gets no action (Envoy's grant runs out into its
// expired_assignment_behavior) and a push a second later. It returns the
// store calls made. When the stream ended meanwhile (its client went
// away, or Shutdown), what was reserved is given back and nothing is sent.
func (st *stream) grant(asks []ask, pre []store.Request, now time.Time) (int, error) {
	bs := make([]*bucket, len(asks))
	for i, a := range asks {
		bs[i] = a.b
	}
	calls := st.srv.fetchDemands(st.ctx, bs, now)
	rs := make([]*reservation, len(asks))
	for i, a := range asks {
		rs[i] = st.prepare(a, now)
	}
	calls += st.reserveAll(rs, pre)
	if st.ctx.Err() != nil {
		st.undo(rs)
		return calls, nil
	}
	for i, rv := range rs {
		st.pending[asks[i].slot] = st.granted(rv, now)
	}
	return calls, nil
}

// granted records rv's grant as b's active one, schedules its push and
// returns its action (nil when the store did not answer).
func (st *stream) granted(rv *reservation, now time.Time) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	o := &st.srv.o
	b := rv.b
	if rv.err != nil || b.gone {
		b.next = now.Add(time.Second)
		return nil
	}
	g := rv.got
	want := g.worst()
	g.reservedAt, g.windowEnd, g.reserved = now, rv.end, want
	o.Metrics.addReserved(want)
	b.g, b.hasGrant, b.used = g, true, 0
	b.covered += want
	res := rv.res
	next := time.Duration(rv.ttl) * time.Second
	if !rv.end.IsZero() {
		next = rv.end.Sub(now) + boundarySlack
		if len(res) > 0 && res[len(res)-1].Reset > 0 {
			next = res[len(res)-1].Reset + boundarySlack
		}
	} else {
		next -= o.Overlap // renewed just before it expires
	}
	b.next = now.Add(next)
	if !rv.end.IsZero() && len(res) > 0 && res[len(res)-1].Remaining > 0 {
		st.scheduleTopUp(b, rv.end, now)
	}
	if g.deny {
		o.Metrics.action("deny_all", 1)
	} else {
		o.Metrics.action("token_bucket", 1)
	}
	return assignment(b.id, &g)
}

// undo gives back what the store consumed for rs, whose grants will never
// be sent (the stream ended while they were reserved).
func (st *stream) undo(rs []*reservation) {
	var back []store.Check
	for _, rv := range rs {
		if rv.consumed > 0 {
			back = append(back, st.giveBack(rv.b, rv.consumed))
		}
	}
	if len(back) > 0 {
		_ = st.srv.decideAfter(back) // a failure is logged
	}
}

// At a boundary the previous grant keeps admitting until the next one
// arrives (within Overlap of the boundary, the guarantee's assumption).
// What it admits after the boundary beyond the next grant's worst case,
// which the next window is charged, is:
//
//   - its bucket's tokens (min(max_tokens, worst case)), always. An
//     identical next bucket is carried over by Envoy, tokens and all, only
//     while the active grant lives; but the active grant's TTL, counted
//     from its own receipt, ends about when the next push lands (both a
//     window after the previous push), and where it ends first Envoy falls
//     back, then starts the next bucket full. A fake Envoy's fleet test
//     lost that race at 2 of 12 boundaries. So carrying a bucket over
//     cannot be counted on, and its tokens are charged as a replaced
//     bucket's are.
//   - its refill until the next grant arrives, only where that refills
//     slower: the next grant's worst case counts ttl seconds of its own
//     refill from its arrival, where ttl (whole seconds up from the time
//     left in the window) is at least the window, so it covers the whole
//     window's refill at its own rate, the span before its arrival too.
//     What the previous grant refills faster there, over at most Overlap,
//     is owed. Should ttl fall short of the window (a push more than a
//     second late), or the rule be a token bucket (no window), the whole
//     Overlap of the previous refill is.

// chargeOverlap appends to checks the forced write-back of what b's
// previous grant can admit after the boundary beyond g's worst case (see
// overlapOf).
func (st *stream) chargeOverlap(b *bucket, checks []store.Check, g grant) []store.Check {
	over := st.overlapOf(b, g)
	if over == 0 {
		return checks
	}
	st.srv.o.Metrics.addReserved(over)
	return append(checks, st.force(b, over))
}

// overlapOf returns what b's active grant can admit after a boundary until
// g, the next grant, arrives, beyond g's worst case: its bucket's tokens,
// and Overlap of its refill beyond g's (zero for no grant, or a blanket
// one; see the comment above chargeOverlap).
func (st *stream) overlapOf(b *bucket, g grant) uint64 {
	if !b.hasGrant || b.g.deny || b.g.allow {
		return 0
	}
	bucket := min(b.g.max, b.g.worst())
	faster := b.g.rate()
	if w := b.check.Window; b.check.Algorithm != store.TokenBucket && (g.allow || (w > 0 && time.Duration(g.ttl)*time.Second >= w)) {
		faster -= g.rate()
	}
	if faster <= 0 {
		return bucket
	}
	return bucket + uint64(math.Ceil(faster*st.srv.o.Overlap.Seconds()))
}

// keepShape returns the grant for a share of x hits over ttl seconds. At a
// push (boundary) the share pays for the boundary's charge (chargeOverlap),
// so that the fleet's grants and charges together stay within the shares
// (else the last stream to reserve in a window gets only what the others'
// charges left). There an active token bucket that still fits what the
// charge leaves, and falls short of a fresh grant's worst case by at most
// a thirty-second of the share, is sent again as it is: Envoy then carries
// its limiter over and restarts only the TTL, where the active grant still
// lives, so an Envoy whose demand holds steady keeps its tokens across
// windows. Otherwise the grant is shaped afresh, made distinct from the
// active bucket where Envoy would take one for the other (see distinct).
func (st *stream) keepShape(b *bucket, x uint64, ttl int64, boundary bool) grant {
	if !boundary {
		return st.distinct(b, shape(x, ttl))
	}
	old := b.g
	k := grant{max: old.max, per: old.per, fill: old.fill, ttl: ttl}
	if over := st.overlapOf(b, k); over > 0 {
		if w := k.worst() + over; w <= x && w >= x-x/32 {
			return k
		}
	}
	left := func(charge uint64) uint64 { return max(x-min(x, charge), min(x, st.srv.o.MinShare)) }
	g := st.distinct(b, shape(left(st.overlapOf(b, shape(x, ttl))), ttl))
	if over := st.overlapOf(b, g); over > 0 {
		// A slower refill is owed more: shape once more on what that
		// charge leaves (a token's difference at most, paid by the share).
		g = st.distinct(b, shape(left(over), ttl))
	}
	return g
}

// distinct returns g, changed where Envoy would take it for b's active
// token bucket and keep that one: Envoy compares max_tokens,
// tokens_per_fill and only the nanos of fill_interval, so two buckets of
// the same max and tokens but other whole-second fill intervals are "the
// same" to it, and the old fill rate would stay. Doubling tokens_per_fill
// and fill_interval keeps g's rate and worst case and makes it another
// bucket to Envoy.
func (st *stream) distinct(b *bucket, g grant) grant {
	old := b.g
	if !b.hasGrant || old.deny || old.allow || g.deny || g.allow {
		return g
	}
	for g.max == old.max && g.per == old.per && g.fill != old.fill {
		g.per, g.fill = 2*g.per, 2*g.fill
	}
	return g
}

// reserveAll consumes each reservation's worst case, with its checks
// decided in the same request, all or nothing; one that does not fit is
// shrunk to what is left and consumed in a second round trip, or made
// DENY_ALL. The requests of pre go first in the first round trip. Each
// round trip is one store.DecideBatch: one call per Redis node for every
// bucket of a report or a tick. It returns the calls made.
//
// At a boundary the checks hold the boundary's charge for g (see
// chargeOverlap), which is forced, so it stands when g does not fit; a
// shrunk grant that refills slower than g is owed more, which goes with
// the second call (or alone when the shrunk grant is DENY_ALL).
func (st *stream) reserveAll(rs []*reservation, pre []store.Request) int {
	if len(rs) == 0 && len(pre) == 0 {
		return 0
	}
	reqs := append([]store.Request(nil), pre...)
	for _, rv := range rs {
		checks := append(rv.checks, st.consume(rv.b, rv.g.worst(), rv.ttl))
		reqs = append(reqs, store.Request{Checks: checks, Results: make([]store.Result, len(checks))})
	}
	st.srv.decideBatch(st.ctx, reqs)
	copy(pre, reqs)
	var again []store.Request
	var retried []*reservation
	for i, rv := range rs {
		r := &reqs[len(pre)+i]
		last := r.Results[len(r.Results)-1]
		rv.res, rv.err = r.Results, r.Err
		switch {
		case r.Err != nil:
			continue
		case last.Allowed:
			rv.got = rv.g
			if last.Consumed {
				rv.consumed = rv.g.worst()
			}
			continue
		case last.Remaining < rv.least:
			rv.got = shape(0, rv.ttl) // not worth a replacement (see topUpLocked)
			continue
		}
		shrunk := st.distinct(rv.b, shape(min(last.Remaining, rv.g.worst()), rv.ttl))
		var owed []store.Check
		if rv.boundary {
			if was, now := st.overlapOf(rv.b, rv.g), st.overlapOf(rv.b, shrunk); now > was {
				more := now - was
				st.srv.o.Metrics.addReserved(more)
				owed = append(owed, st.force(rv.b, more))
			}
		}
		rv.got = shrunk
		if shrunk.worst() > 0 {
			owed = append(owed, st.consume(rv.b, shrunk.worst(), rv.ttl))
		} else if len(owed) == 0 {
			continue
		}
		again = append(again, store.Request{Checks: owed, Results: make([]store.Result, len(owed))})
		retried = append(retried, rv)
	}
	if len(again) == 0 {
		return 1
	}
	st.srv.decideBatch(st.ctx, again)
	for i, rv := range retried {
		r := &again[i]
		last := r.Results[len(r.Results)-1]
		if rv.got.worst() == 0 {
			continue // the owed charge alone: a failure is logged; the grant is DENY_ALL
		}
		if r.Err != nil || !last.Allowed {
			rv.got = shape(0, rv.ttl)
			continue
		}
		rv.res = r.Results[len(r.Results)-1:]
		if last.Consumed {
			rv.consumed = rv.got.worst()
		}
	}
	return 2
}

// consume returns the consuming check of n hits for a grant of ttl
// seconds on b's counter.
//
// Paced (store.Check.Paced): a grant whose TTL is at least the window
// spends its reservation over a whole window at least (a token bucket:
// its burst, then its rate), so a sliding window's grants, together
// within the limit, refill no faster than the limit's pace, and are
// counted against the current window alone, as a fixed window's.
// Reserved against the weighted count instead, a window after a full
// one has almost nothing to grant at its start: the fleet would admit
// half the limit, a full window and an empty one in turn. A shorter
// grant (a top-up late in a long window) could spend faster, and is
// reserved against the weighted count.
func (st *stream) consume(b *bucket, n uint64, ttl int64) store.Check {
	c := b.check
	c.Hits, c.Shadow = n, false
	c.Paced = time.Duration(ttl)*time.Second >= b.check.Window
	return c
}

// period returns the TTL of b's next grant in whole seconds and, for a
// windowed rule, the end of the window now is in (windows start at
// multiples of their length since the Unix epoch, as the store counts
// them); zero for a token-bucket rule, whose grants last Options.Period.
func (s *Server) period(b *bucket, now time.Time) (int64, time.Time) {
	if c := &b.check; c.Algorithm == store.TokenBucket {
		// A grant's worst case is reserved at once: it must fit the
		// bucket's capacity, so its TTL is at most capacity / rate.
		burst := c.Burst
		if burst == 0 {
			burst = c.Limit
		}
		ttl := int64(s.o.Period / time.Second)
		if c.Limit > 0 {
			ttl = min(ttl, int64(float64(burst)/float64(c.Limit)*c.Window.Seconds()))
		}
		return max(1, ttl), time.Time{}
	}
	w := b.check.Window
	if w <= 0 {
		w = time.Second
	}
	us := now.UnixMicro()
	wus := w.Microseconds()
	end := time.UnixMicro((us/wus + 1) * wus)
	return wholeSeconds(end.Sub(now)), end
}

// share returns the hits b may be granted until windowEnd (a windowed rule:
// a part of the window's limit) or for ttl seconds (a token bucket: a part
// of its rate times ttl): this replica's part (see part), divided among
// this replica's streams of the same key by their reported demand, never
// below MinShare, and never above demandHeadroom times its own demand
// over the grant's TTL plus MinShare (the rest stays in the store for
// others' top-ups).
func (s *Server) share(ctx context.Context, b *bucket, ttl int64, windowEnd, now time.Time) uint64 {
	w := b.check.Window.Seconds()
	if w <= 0 {
		w = 1
	}
	// A window's budget does not refill within it: a share is a part of
	// the whole window's limit. A token bucket refills at limit/window.
	rate, span := float64(b.check.Limit)/w, float64(ttl)
	if !windowEnd.IsZero() {
		rate, span = float64(b.check.Limit), 1
	}
	mine, total := s.demandOf(b, now, s.groupSize(b.check.Key)), s.localDemand(b.check.Key, now)
	frac := 1.0
	if total > 0 {
		frac = mine / total
	}
	x := uint64(rate * span * frac * s.part(ctx, b, total, now))
	if mine > 0 {
		x = min(x, uint64(demandHeadroom*mine*max(1, min(float64(ttl), span*w)))+s.o.MinShare)
	}
	return max(x, s.o.MinShare)
}

// part returns this replica's part of b's limit, here being its demand for
// b's key over all its streams: its share of the fleet's demand, shared
// through Options.Demand; or, without Demand, when it fails or while no
// demand is known here, one over the fleet's size.
func (s *Server) part(ctx context.Context, b *bucket, here float64, now time.Time) float64 {
	even := 1 / float64(max(1, s.o.Fleet()))
	if s.o.Demand == nil || here <= 0 {
		return even
	}
	fleet, ok := s.fleetDemand(ctx, b, here, now)
	if !ok || fleet <= 0 {
		return even
	}
	return here / max(fleet, here)
}

// demandSeen is the fleet's demand for a key, less this replica's, as last
// read through Options.Demand.
type demandSeen struct {
	others float64
	at     time.Time
	here   float64 // this replica's demand as then shared
}

// demandShift is how far a report must move this replica's demand for a
// key from what it last shared before it shares it at once, rather than at
// its next push (see shareShifted).
const demandShift = 0.25

// demandReuse is how long a reading of the fleet's demand serves the other
// streams of the same key here (their pushes at one boundary) without
// another store call.
const demandReuse = 250 * time.Millisecond

// demandBackoff is how long after a failed Demand call grants are sized
// without asking again (a Redis that is down, or a user whose ACL lacks the
// hash commands, costs one call per backoff, not one per grant).
const demandBackoff = 5 * time.Second

// demandParallel bounds the Demand calls in flight for one report or tick
// (Options.Demand decides one key per call).
const demandParallel = 8

// fleetDemand shares here (this replica's demand for b's key) and returns
// the fleet's; false when the store could not answer. A reading younger
// than demandReuse is reused.
func (s *Server) fleetDemand(ctx context.Context, b *bucket, here float64, now time.Time) (float64, bool) {
	key := b.check.Key
	s.mu.Lock()
	seen, ok := s.demands[key]
	s.mu.Unlock()
	if age := now.Sub(seen.at); ok && age >= 0 && age < demandReuse {
		return seen.others + here, true
	}
	if now.UnixNano() < s.demandDown.Load() || ctx.Err() != nil {
		return 0, false
	}
	c, cancel := context.WithTimeout(ctx, s.o.StoreTimeout)
	defer cancel()
	fleet, err := s.o.Demand(c, key, here, s.demandTTL(b))
	if err != nil {
		if ctx.Err() != nil {
			return 0, false // the stream ended: no news of the store
		}
		s.demandDown.Store(now.Add(demandBackoff).UnixNano())
		if held, ok := s.storeLog.Allow(); ok {
			s.o.Log.Warn("rlqs: sharing demand failed; this replica takes the limit over the fleet's size", "err", err, "held", held,
				"retry_in", demandBackoff)
		}
		return 0, false
	}
	s.mu.Lock()
	s.demands[key] = demandSeen{others: max(0, fleet-here), at: now, here: here}
	s.mu.Unlock()
	return fleet, true
}

// fetchDemands shares this replica's demand for the keys of bs that have
// no reading younger than demandReuse, demandParallel calls at a time, so
// that the grants of a report or a tick size their parts without a store
// round trip each. It returns the calls made.
func (s *Server) fetchDemands(ctx context.Context, bs []*bucket, now time.Time) int {
	if s.o.Demand == nil || now.UnixNano() < s.demandDown.Load() {
		return 0
	}
	todo := map[string]*bucket{}
	s.mu.Lock()
	for _, b := range bs {
		if b.static != nil {
			continue
		}
		if seen, ok := s.demands[b.check.Key]; ok && now.Sub(seen.at) >= 0 && now.Sub(seen.at) < demandReuse {
			continue
		}
		todo[b.check.Key] = b
	}
	s.mu.Unlock()
	return s.shareAll(ctx, todo, now)
}

// shareAll calls fleetDemand for each key of keys with this replica's
// demand, demandParallel at a time; it returns the calls made.
func (s *Server) shareAll(ctx context.Context, keys map[string]*bucket, now time.Time) int {
	var wg sync.WaitGroup
	sem := make(chan struct{}, demandParallel)
	calls := 0
	for key, b := range keys {
		here := s.localDemand(key, now)
		if here <= 0 {
			continue
		}
		calls++
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s.fleetDemand(ctx, b, here, now)
		})
	}
	wg.Wait()
	return calls
}

// shareShifted shares this replica's demand for each of keys whose reports
// moved it by more than demandShift from what it last shared, and returns
// the store calls made. The other replicas size their parts at their
// boundary pushes from what each replica last shared, which otherwise is
// what it had at its own last push, before the reports since: when the
// demand moves (Envoys starting, one Envoy taking most of the traffic),
// the replica that pushes first takes a part sized on the others' old
// demand, and the others' streams find the window spent (measured in the
// fleet test at start-up: one replica's two Envoys admitted 2 and 0 of
// 200 while the other's admitted 190 and 183).
func (s *Server) shareShifted(ctx context.Context, keys map[string]*bucket, now time.Time) int {
	if s.o.Demand == nil || now.UnixNano() < s.demandDown.Load() {
		return 0
	}
	todo := map[string]*bucket{}
	for key, b := range keys {
		here := s.localDemand(key, now)
		s.mu.Lock()
		seen, ok := s.demands[key]
		shifted := ok && here > 0 && (here > seen.here*(1+demandShift) || here < seen.here*(1-demandShift))
		if shifted {
			delete(s.demands, key) // not a reading to reuse: ask again
		}
		s.mu.Unlock()
		if shifted { // else never shared (its first grant shares it), or about as shared
			todo[key] = b
		}
	}
	return s.shareAll(ctx, todo, now)
}

// localDemand is this replica's demand for key: the sum of its streams'.
func (s *Server) localDemand(key string, now time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, g := 0.0, s.groups[key]
	for o := range g {
		d += s.demandOf(o, now, len(g))
	}
	return d
}

// groupSize is the number of this replica's buckets counting on key.
func (s *Server) groupSize(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.groups[key])
}

// demandTTL is how long a replica's demand for b's key holds: two of its
// pushes (a window, or a token-bucket grant's Period), and at least the
// fleet's heartbeat TTL, 6 s. A replica that stopped cleanly withdrew it.
func (s *Server) demandTTL(b *bucket) time.Duration {
	d := 2 * b.check.Window
	if b.check.Algorithm == store.TokenBucket {
		d = 2 * s.o.Period
	}
	return max(d, 6*time.Second)
}

// withdrawDemand withdraws this replica's demand for keys (those it shared
// one for), so that the replicas left take the whole limit at their next
// push; it stops when ctx is done.
func (s *Server) withdrawDemand(ctx context.Context, keys []string) {
	if s.o.Demand == nil {
		return
	}
	for _, k := range keys {
		if ctx.Err() != nil {
			return
		}
		c, cancel := context.WithTimeout(ctx, s.o.StoreTimeout)
		_, _ = s.o.Demand(c, k, 0, time.Second)
		cancel()
	}
}

func (s *Server) join(b *bucket) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[b.check.Key]
	if g == nil {
		g = map[*bucket]struct{}{}
		s.groups[b.check.Key] = g
	}
	g[b] = struct{}{}
}

func (s *Server) leave(b *bucket) { s.leaveKey(b, b.check.Key) }

// leaveKey takes b out of the share group of key.
func (s *Server) leaveKey(b *bucket, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.groups[key]; g != nil {
		delete(g, b)
		if len(g) == 0 {
			delete(s.groups, key)
			delete(s.demands, key) // its record in the store expires
		}
	}
}

// decideBatch decides reqs in one store.DecideBatch within StoreTimeout of
// ctx; a failure is logged (throttled).
func (s *Server) decideBatch(ctx context.Context, reqs []store.Request) {
	if len(reqs) == 0 {
		return
	}
	c, cancel := context.WithTimeout(ctx, s.o.StoreTimeout)
	defer cancel()
	store.DecideBatch(c, s.o.Store, reqs)
	for _, r := range reqs {
		if r.Err != nil && ctx.Err() == nil {
			if held, ok := s.storeLog.Allow(); ok {
				s.o.Log.Warn("rlqs: store call failed; no grant was sent", "err", r.Err, "held", held)
			}
			return
		}
	}
}

// decideAfter decides checks that stand whether the stream lives or not
// (a stream's last charges and refunds), within StoreTimeout.
func (s *Server) decideAfter(checks []store.Check) error {
	reqs := []store.Request{{Checks: checks, Results: make([]store.Result, len(checks))}}
	s.decideBatch(context.Background(), reqs)
	return reqs[0].Err
}

// assignment returns g as a QuotaAssignmentAction for id, echoed as it came.
func assignment(id map[string]string, g *grant) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(time.Duration(g.ttl) * time.Second),
			RateLimitStrategy:    g.strategy(),
		}}}
}

// demandHeadroom is how much more than its reported demand a stream's share
// may be: what it leaves is topped up by streams whose share fell short,
// here or on another replica.
const demandHeadroom = 1.05

// topUpDelay is how long after a grant a stream whose demand its share did
// not cover asks for what the window has left: after every replica's
// boundary pushes took their shares.
const topUpDelay = 100 * time.Millisecond

// scheduleTopUp arranges b's top-up when its demand over the window exceeds
// its grant and the window has time left for one.
func (st *stream) scheduleTopUp(b *bucket, windowEnd, now time.Time) {
	if st.topUpWant(b, now) == 0 || windowEnd.Sub(now) < topUpDelay+4*st.srv.o.Overlap {
		return
	}
	b.topUpAt = now.Add(topUpDelay)
}

// topUpWant returns the hits b's demand asks beyond its grant this window.
func (st *stream) topUpWant(b *bucket, now time.Time) uint64 {
	want := uint64(st.srv.demandOf(b, now, st.srv.groupSize(b.check.Key)) * b.check.Window.Seconds())
	if b.g.deny || b.g.allow || want <= b.g.reserved {
		return 0
	}
	return want - b.g.reserved
}

// topUpLeast is the fewest extra hits for which a top-up's replacement of
// g refills faster than g: the replacement carries g's rate for the rest
// of the window less Overlap (the old grant admits until it lands), spread
// with the extra over ttl whole seconds, and starts a new bucket that an
// Envoy whose requests are being denied (the newest Envoy seeds it with
// the old bucket's ratio of tokens) finds nearly empty. A smaller top-up
// would leave such an Envoy admitting less than before it: measured in the
// fleet test, a top-up of 5 hits took the hungry Envoy's window from 92 to
// 87 admitted.
func topUpLeast(g grant, carry uint64, ttl int64) uint64 {
	r := g.rate()
	if r <= 0 {
		return 1
	}
	for least := uint64(1); ; least *= 2 {
		if n := shape(carry+least, ttl); n.rate() > r {
			// The fewest in (least/2, least]: rates grow with the hits.
			lo, hi := least/2, least
			for lo+1 < hi {
				mid := (lo + hi) / 2
				if n := shape(carry+mid, ttl); n.rate() > r {
					hi = mid
				} else {
					lo = mid
				}
			}
			return hi
		}
	}
}

// topUps reserves, for each of bs, what its demand asks beyond its grant,
// from what the window has left (all or nothing, then shrunk to what is
// left; one round trip for them all, and one for those shrunk), and queues
// a grant that replaces the active one: the old grant's rate for the rest
// of the window (already reserved, less Overlap for the replacement to
// arrive) plus the hits reserved now. It returns the store calls made.
func (st *stream) topUps(bs []*bucket, now time.Time) (int, error) {
	var rs []*reservation
	for _, b := range bs {
		g := b.g
		left := g.windowEnd.Sub(now) - st.srv.o.Overlap
		extra := st.topUpWant(b, now)
		if b.gone || g.windowEnd.IsZero() || left <= 0 || extra == 0 {
			continue
		}
		carry := uint64(float64(g.per) / float64(g.fill) * left.Seconds())
		ttl := wholeSeconds(g.windowEnd.Sub(now))
		least := topUpLeast(g, carry, ttl)
		if extra < least {
			continue
		}
		rs = append(rs, &reservation{b: b, g: shape(extra, 1), ttl: 1, least: least, end: g.windowEnd})
	}
	calls := st.reserveAll(rs, nil)
	if st.ctx.Err() != nil {
		st.undo(rs)
		return calls, nil
	}
	for _, rv := range rs {
		b := rv.b
		if rv.err != nil || rv.got.worst() == 0 || b.gone {
			continue
		}
		g := b.g
		extra := rv.got.worst()
		left := g.windowEnd.Sub(now) - st.srv.o.Overlap
		carry := uint64(float64(g.per) / float64(g.fill) * left.Seconds())
		ng := st.distinct(b, shape(carry+extra, wholeSeconds(g.windowEnd.Sub(now))))
		ng.reservedAt, ng.windowEnd, ng.reserved = now, g.windowEnd, g.reserved+extra
		b.g = ng
		b.covered += extra
		st.srv.o.Metrics.addReserved(extra)
		st.srv.o.Metrics.action("token_bucket", 1)
		st.act(assignment(b.id, &ng))
	}
	return calls, nil
}
