package rlqs

import (
	"context"
	"math"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

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

// chargeOverlap appends to checks the forced charge of what b's previous
// grant can admit after the boundary beyond g's worst case (overlapOf;
// invariant 3 of docs/rlqs.md).
func (st *stream) chargeOverlap(b *bucket, checks []store.Check, g grant) []store.Check {
	over := st.overlapOf(b, g)
	if over == 0 {
		return checks
	}
	st.srv.o.Metrics.addReserved(over)
	return append(checks, st.force(b, over))
}

// overlapOf returns what b's active grant can admit after a boundary until
// g lands, beyond g's worst case: its bucket, and Overlap of its refill
// where it is faster than g's (invariant 3); zero for none or a blanket.
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

// keepShape returns the grant for a share of x hits over ttl seconds; at a
// boundary the share also pays the boundary's charge, and a bucket whose
// share holds steady is kept as it is (invariant 3). The grant is made
// distinct from the active bucket (invariant 10).
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

// distinct returns g, or g with tokens_per_fill and fill_interval doubled
// (the same rate and worst case) where Envoy would take it for b's active
// bucket and keep the old refill (invariant 10).
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

// share returns the hits b may be granted until windowEnd (a part of the
// window's limit) or for ttl seconds (a token bucket: of its rate times
// ttl): this replica's part divided by demand among its streams of the
// key, at least MinShare, at most demandHeadroom times b's own demand
// plus MinShare (invariant 7).
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

// demandHeadroom is how much more than its reported demand a stream's share
// may be: what it leaves is topped up by streams whose share fell short,
// here or on another replica.
const demandHeadroom = 1.05

// demandGrowth bounds how much one report may raise a stream's demand
// beyond its fair part: to this many times what it counted for before
// (see demandOf).
const demandGrowth = 4

// setDemand records b's demand from a report covering since, and the
// bound it counts with, until the report after next is overdue
// (invariant 8).
func (st *stream) setDemand(b *bucket, u *usage, since time.Duration, now time.Time) {
	since = max(since, time.Second) // whole seconds: a first report says 0 s
	rate := (float64(u.allowed) + float64(u.denied)) / since.Seconds()
	prev := st.srv.demandOf(b, now, st.srv.groupSize(b.check.Key))
	b.claim.Store(math.Float64bits(max(demandGrowth*prev, float64(u.allowed)/since.Seconds())))
	b.demand.Store(math.Float64bits(min(rate, limitPace(b))))
	b.demandUntil.Store(now.Add(2*max(b.reportInterval(), time.Second) + time.Second).UnixNano())
}

// limitPace is b's limit over its window, in hits per second.
func limitPace(b *bucket) float64 {
	w := b.check.Window.Seconds()
	if w <= 0 {
		w = 1
	}
	return float64(b.check.Limit) / w
}

// demandOf is what b's demand counts for now among the n buckets of its
// key here: what it reported, held to its fair part and bound, 0 once
// overdue (invariant 8). Safe for concurrent use (it reads b's atomics).
func (s *Server) demandOf(b *bucket, now time.Time, n int) float64 {
	if now.UnixNano() >= b.demandUntil.Load() {
		return 0
	}
	fair := math.Float64frombits(b.pace.Load()) / float64(max(1, n))
	return min(math.Float64frombits(b.demand.Load()), max(fair, math.Float64frombits(b.claim.Load())))
}
