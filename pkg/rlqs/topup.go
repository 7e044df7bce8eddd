package rlqs

import "time"

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
// g (g's rate for the window's rest less Overlap, plus the extra, over ttl
// whole seconds) refills faster than g (invariant 9).
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

// topUps reserves for each of bs what its demand asks beyond its grant,
// from what the window has left (invariant 9: all or nothing, then shrunk,
// as reserveAll), and queues each replacement grant. It returns the store
// calls made.
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
