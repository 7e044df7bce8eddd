package rlqs

import (
	"context"
	"math"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rls-project/rls/pkg/store"
)

// boundarySlack is how long after a window's end (by the store's Reset) a
// push runs, so that the store has rolled to the next window.
const boundarySlack = 5 * time.Millisecond

// regrant reserves and returns b's next grant, with extra checks (write-
// backs) decided in the same store call, and schedules the push after it.
// At a push (boundary true) the next window is also charged what the
// previous grant can admit after the boundary beyond the next grant's own
// worst case (chargeOverlap), out of the stream's share (keepShape). It
// returns the action (nil when the store could not answer: Envoy's grant
// then runs out into its expired_assignment_behavior) and the store calls
// made.
func (st *stream) regrant(b *bucket, now time.Time, extra []store.Check, boundary bool) (*rlqsv3.RateLimitQuotaResponse_BucketAction, int) {
	o := &st.srv.o
	ttl, windowEnd := st.srv.period(b, now)
	x := st.srv.share(b, ttl, windowEnd, now)
	g := st.keepShape(b, x, ttl, boundary)
	checks := extra
	if boundary {
		checks = st.chargeOverlap(b, checks, g)
	}
	g, res, calls, err := st.reserve(b, g, ttl, checks, boundary, 0)
	if err != nil {
		st.schedule(b, time.Second)
		return nil, calls
	}
	want := g.worst()
	g.reservedAt, g.windowEnd, g.reserved = now, windowEnd, want
	o.Metrics.addReserved(want)
	b.g, b.hasGrant, b.used = g, true, 0
	b.covered += want
	next := time.Duration(ttl) * time.Second
	if !windowEnd.IsZero() {
		next = windowEnd.Sub(now) + boundarySlack
		if len(res) > 0 && res[len(res)-1].Reset > 0 {
			next = res[len(res)-1].Reset + boundarySlack
		}
	} else {
		next -= o.Overlap // renewed just before it expires
	}
	st.schedule(b, next)
	if !windowEnd.IsZero() && len(res) > 0 && res[len(res)-1].Remaining > 0 {
		st.scheduleTopUp(b, windowEnd, now)
	}
	if g.deny {
		o.Metrics.action("deny_all", 1)
	} else {
		o.Metrics.action("token_bucket", 1)
	}
	return assignment(b.id, &g), calls
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

// reserve consumes g's worst case, with checks decided in the same call,
// all or nothing; when it does not fit, it shrinks g to what is left and
// consumes that in a second call, or makes it DENY_ALL. It returns the
// grant reserved, the results of the last call and the calls made.
//
// At a boundary the checks hold the boundary's charge for g (see
// chargeOverlap), which is forced, so it stands when g does not fit; a
// shrunk grant that refills slower than g is owed more, which goes with
// the second call (or alone when the shrunk grant is DENY_ALL).
func (st *stream) reserve(b *bucket, g grant, ttl int64, checks []store.Check, boundary bool, least uint64) (grant, []store.Result, int, error) {
	want := g.worst()
	consume := b.check
	consume.Hits, consume.Shadow = want, false
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
	consume.Paced = time.Duration(ttl)*time.Second >= b.check.Window
	checks = append(checks, consume)
	res, err := st.srv.decideResults(checks)
	if err != nil || res[len(res)-1].Allowed {
		return g, res, 1, err
	}
	if res[len(res)-1].Remaining < least {
		return shape(0, ttl), res, 1, nil // not worth a replacement (see topUpLocked)
	}
	shrunk := st.distinct(b, shape(min(res[len(res)-1].Remaining, want), ttl))
	var owed []store.Check
	if boundary {
		if was, now := st.overlapOf(b, g), st.overlapOf(b, shrunk); now > was {
			more := now - was
			st.srv.o.Metrics.addReserved(more)
			owed = append(owed, st.force(b, more))
		}
	}
	g = shrunk
	if consume.Hits = g.worst(); consume.Hits == 0 {
		if len(owed) > 0 {
			_ = st.srv.decide(owed) // a failure is logged; the grant is DENY_ALL
			return g, res, 2, nil
		}
		return g, res, 1, nil
	}
	r2, err := st.srv.decideResults(append(owed, consume))
	if err != nil || !r2[len(r2)-1].Allowed {
		return shape(0, ttl), res, 2, nil
	}
	return g, r2[len(r2)-1:], 2, nil
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
func (s *Server) share(b *bucket, ttl int64, windowEnd, now time.Time) uint64 {
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
	mine, total := b.demandRate(), s.localDemand(b.check.Key)
	frac := 1.0
	if total > 0 {
		frac = mine / total
	}
	x := uint64(rate * span * frac * s.part(b, total, now))
	if mine > 0 {
		x = min(x, uint64(demandHeadroom*mine*max(1, min(float64(ttl), span*w)))+s.o.MinShare)
	}
	return max(x, s.o.MinShare)
}

// part returns this replica's part of b's limit, here being its demand for
// b's key over all its streams: its share of the fleet's demand, shared
// through Options.Demand; or, without Demand, when it fails or while no
// demand is known here, one over the fleet's size.
func (s *Server) part(b *bucket, here float64, now time.Time) float64 {
	even := 1 / float64(max(1, s.o.Fleet()))
	if s.o.Demand == nil || here <= 0 {
		return even
	}
	fleet, ok := s.fleetDemand(b, here, now)
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

// fleetDemand shares here (this replica's demand for b's key) and returns
// the fleet's; false when the store could not answer.
func (s *Server) fleetDemand(b *bucket, here float64, now time.Time) (float64, bool) {
	key := b.check.Key
	s.mu.Lock()
	seen, ok := s.demands[key]
	s.mu.Unlock()
	if age := now.Sub(seen.at); ok && age >= 0 && age < demandReuse {
		return seen.others + here, true
	}
	if now.UnixNano() < s.demandDown.Load() {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.o.StoreTimeout)
	defer cancel()
	fleet, err := s.o.Demand(ctx, key, here, s.demandTTL(b))
	if err != nil {
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
func (s *Server) shareShifted(keys map[string]*bucket, now time.Time) int {
	if s.o.Demand == nil || now.UnixNano() < s.demandDown.Load() {
		return 0
	}
	calls := 0
	for key, b := range keys {
		here := s.localDemand(key)
		s.mu.Lock()
		seen, ok := s.demands[key]
		shifted := ok && here > 0 && (here > seen.here*(1+demandShift) || here < seen.here*(1-demandShift))
		if shifted {
			delete(s.demands, key) // not a reading to reuse: ask again
		}
		s.mu.Unlock()
		if !shifted {
			continue // never shared (its first grant shares it), or about as shared
		}
		calls++
		if _, ok := s.fleetDemand(b, here, now); !ok {
			return calls
		}
	}
	return calls
}

// localDemand is this replica's demand for key: the sum of its streams'.
func (s *Server) localDemand(key string) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := 0.0
	for o := range s.groups[key] {
		d += o.demandRate()
	}
	return d
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

func (s *Server) leave(b *bucket) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.groups[b.check.Key]; g != nil {
		delete(g, b)
		if len(g) == 0 {
			delete(s.groups, b.check.Key)
			delete(s.demands, b.check.Key) // its record in the store expires
		}
	}
}

func (s *Server) decide(checks []store.Check) error {
	_, err := s.decideResults(checks)
	return err
}

func (s *Server) decideResults(checks []store.Check) ([]store.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.o.StoreTimeout)
	defer cancel()
	res := make([]store.Result, len(checks))
	err := s.o.Store.Decide(ctx, checks, res)
	if err != nil {
		if held, ok := s.storeLog.Allow(); ok {
			s.o.Log.Warn("rlqs: store call failed; no grant was sent", "err", err, "held", held)
		}
	}
	return res, err
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
	if st.topUpWant(b) == 0 || windowEnd.Sub(now) < topUpDelay+4*st.srv.o.Overlap {
		return
	}
	if b.topUp != nil {
		b.topUp.Stop()
	}
	b.topUp = time.AfterFunc(topUpDelay, func() { st.topUpNow(b) })
}

// topUpWant returns the hits b's demand asks beyond its grant this window.
func (st *stream) topUpWant(b *bucket) uint64 {
	want := uint64(b.demandRate() * b.check.Window.Seconds())
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

// topUpNow reserves what b's demand asks beyond its grant, from what the
// window has left (all or nothing, then shrunk to what is left), and sends
// a grant that replaces the active one: the old grant's rate for the rest
// of the window (already reserved, less Overlap for the replacement to
// arrive) plus the hits reserved now.
func (st *stream) topUpNow(b *bucket) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if a := st.topUpLocked(b, st.srv.o.Now()); a != nil {
		st.send(&rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{a}})
	}
}

// topUpLocked is topUpNow with st.mu held: it returns the action to send,
// nil when there is nothing to top up.
func (st *stream) topUpLocked(b *bucket, now time.Time) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	g := b.g
	left := g.windowEnd.Sub(now) - st.srv.o.Overlap
	extra := st.topUpWant(b)
	if b.gone || st.ended || g.windowEnd.IsZero() || left <= 0 || extra == 0 {
		return nil
	}
	carry := uint64(float64(g.per) / float64(g.fill) * left.Seconds())
	ttl := wholeSeconds(g.windowEnd.Sub(now))
	least := topUpLeast(g, carry, ttl)
	if extra < least {
		return nil
	}
	got, _, _, err := st.reserve(b, shape(extra, 1), 1, nil, false, least)
	if err != nil || got.worst() == 0 {
		return nil
	}
	extra = got.worst()
	ng := st.distinct(b, shape(carry+extra, ttl))
	ng.reservedAt, ng.windowEnd, ng.reserved = now, g.windowEnd, g.reserved+extra
	b.g = ng
	b.covered += extra
	st.srv.o.Metrics.addReserved(extra)
	st.srv.o.Metrics.action("token_bucket", 1)
	return assignment(b.id, &ng)
}
