package rlqs

import (
	"context"
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

// grant reserves what asks ask for (after pre, in the same round trip;
// invariant 1), puts each grant's action in its slot (see slot) and
// schedules its push. The fleet's demand for their keys is read first
// (fetchDemands). A bucket whose grant was not reserved gets no action and
// a push a second later. When the stream ended meanwhile, what was
// reserved is given back and nothing is sent (invariant 12). It returns
// the store calls made.
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

// reserveAll consumes each reservation's worst case with its checks, all or
// nothing (invariant 1); one that does not fit is shrunk to what is left
// and consumed in a second round trip, or made DENY_ALL. pre goes first in
// the first round trip. A boundary's charge is forced, so it stands when
// its grant does not fit; a shrunk grant owes what its slower refill adds
// (invariant 3). Each round trip is one store.DecideBatch; it returns the
// calls made.
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
		if owed, ok := st.settle(rv, &reqs[len(pre)+i]); ok {
			again = append(again, store.Request{Checks: owed, Results: make([]store.Result, len(owed))})
			retried = append(retried, rv)
		}
	}
	if len(again) == 0 {
		return 1
	}
	st.srv.decideBatch(st.ctx, again)
	for i, rv := range retried {
		st.settleShrunk(rv, &again[i])
	}
	return 2
}

// settle records the first round trip's outcome r of rv. A grant that did
// not fit is shrunk to what is left: settle returns the checks of its
// second round trip (its consume, and at a boundary what a slower refill
// is owed) and true, or false when rv is settled.
func (st *stream) settle(rv *reservation, r *store.Request) ([]store.Check, bool) {
	last := r.Results[len(r.Results)-1]
	rv.res, rv.err = r.Results, r.Err
	switch {
	case r.Err != nil:
		return nil, false
	case last.Allowed:
		rv.got = rv.g
		if last.Consumed {
			rv.consumed = rv.g.worst()
		}
		return nil, false
	case last.Remaining < rv.least:
		rv.got = shape(0, rv.ttl) // not worth a replacement (see topUpLeast)
		return nil, false
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
	}
	return owed, len(owed) > 0
}

// settleShrunk records the second round trip's outcome r of rv's shrunk
// grant: DENY_ALL when it failed or did not fit.
func (st *stream) settleShrunk(rv *reservation, r *store.Request) {
	last := r.Results[len(r.Results)-1]
	if rv.got.worst() == 0 {
		return // the owed charge alone: a failure is logged; the grant is DENY_ALL
	}
	if r.Err != nil || !last.Allowed {
		rv.got = shape(0, rv.ttl)
		return
	}
	rv.res = r.Results[len(r.Results)-1:]
	if last.Consumed {
		rv.consumed = rv.got.worst()
	}
}

// consume returns the consuming check of n hits for a grant of ttl seconds
// on b's counter, paced where the grant lasts a window at least
// (invariant 2).
func (st *stream) consume(b *bucket, n uint64, ttl int64) store.Check {
	c := b.check
	c.Hits, c.Shadow = n, false
	c.Paced = time.Duration(ttl)*time.Second >= b.check.Window
	return c
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
