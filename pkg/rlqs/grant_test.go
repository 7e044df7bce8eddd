package rlqs

import (
	"math"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// envoySame is Envoy's protoTokenBucketsEq: max_tokens, tokens_per_fill
// and only the nanos of fill_interval (ours are whole seconds: always 0).
func envoySame(a, b grant) bool { return a.max == b.max && a.per == b.per }

// TestShapeBurst: a grant's burst is at least four tokens where it has
// them (a bucket of one loses a third of its refill to requests arriving
// at random), never leaves under one token per second of refill, and its
// worst case never passes the share.
func TestShapeBurst(t *testing.T) {
	for _, ttl := range []int64{1, 2, 7, 60} {
		for x := uint64(0); x <= 2000; x++ {
			g := shape(x, ttl)
			if w := g.worst(); w > x {
				t.Fatalf("shape(%d, %d) = %+v: worst %d over the share", x, ttl, g, w)
			}
			if x == 0 {
				if !g.deny {
					t.Fatalf("shape(0, %d) = %+v, want DENY_ALL", ttl, g)
				}
				continue
			}
			if g.per < 1 || g.fill < 1 || g.max < 1 {
				t.Fatalf("shape(%d, %d) = %+v: tokens, refill and fill must be at least 1", x, ttl, g)
			}
			if x > uint64(ttl)+4 && x >= 16 && g.max < 4 {
				t.Errorf("shape(%d, %d) = %+v: a burst of %d, want at least 4", x, ttl, g, g.max)
			}
			if x > uint64(ttl) && g.worst() < x-uint64(ttl) {
				t.Errorf("shape(%d, %d) = %+v: worst %d, want nearly the share", x, ttl, g, g.worst())
			}
		}
	}
}

// TestTopUpLeast: the fewest extra hits for which a top-up's replacement
// (the old grant's carry plus the extra, over ttl) refills faster than the
// grant it replaces; one hit fewer would not. The fleet test's case: a
// grant of 92 a second, 0.98 s left, carry 86, needs more than 5.
func TestTopUpLeast(t *testing.T) {
	rateOf := func(g grant) float64 { return g.rate() }
	for _, ttl := range []int64{1, 2, 60} {
		for _, x := range []uint64{1, 3, 17, 96, 100, 1000, 100000} {
			g := shape(x, ttl)
			for _, carry := range []uint64{0, g.per / 2, g.per * uint64(ttl) / uint64(g.fill)} {
				least := topUpLeast(g, carry, ttl)
				if least == 0 || rateOf(shape(carry+least, ttl)) <= g.rate() {
					t.Fatalf("grant %+v, carry %d: least %d does not refill faster", g, carry, least)
				}
				if least > 1 && rateOf(shape(carry+least-1, ttl)) > g.rate() {
					t.Fatalf("grant %+v, carry %d: least %d, but %d refills faster already", g, carry, least, least-1)
				}
			}
		}
	}
	g := grant{max: 4, per: 92, fill: 1, ttl: 1}
	if least := topUpLeast(g, 86, 1); least <= 5 {
		t.Errorf("a grant of 92/s with a carry of 86: least %d, want more than 5", least)
	}
}

func testStream(overlap time.Duration) *stream {
	s := &Server{o: Options{Overlap: overlap, MinShare: 1}}
	return &stream{srv: s}
}

// TestDistinctFromActive: a grant Envoy would take for the active bucket
// (the same max and tokens, another whole-second fill, so that Envoy
// would keep the active bucket's faster refill) is sent as another bucket
// with the same rate and worst case.
func TestDistinctFromActive(t *testing.T) {
	st := testStream(40 * time.Millisecond)
	// A top-up late in a minute's window (2 s left), then the next
	// window's grant: 2 tokens each, refilled 1 per 3 s and 1 per 61 s.
	b := &bucket{hasGrant: true, g: shape(2, 2)}
	next := shape(2, 60)
	if b.g.max != 2 || b.g.per != 1 || b.g.fill != 3 || next.max != 2 || next.per != 1 || next.fill != 61 {
		t.Fatalf("setup: %+v, %+v", b.g, next)
	}
	got := st.distinct(b, next)
	if envoySame(got, b.g) {
		t.Fatalf("distinct(%+v) = %+v: Envoy keeps the active %+v and its fill of %d s", next, got, b.g, b.g.fill)
	}
	if got.worst() != next.worst() || float64(got.per)/float64(got.fill) != float64(next.per)/float64(next.fill) {
		t.Errorf("distinct(%+v) = %+v: rate or worst case changed", next, got)
	}
	// The same bucket, fill and all, is left alone (Envoy carries it
	// over, as meant), and so is another bucket.
	if same := st.distinct(b, b.g); same != b.g {
		t.Errorf("distinct of the active grant itself = %+v", same)
	}
	other := shape(500, 1)
	if got := st.distinct(b, other); got != other {
		t.Errorf("distinct(%+v) = %+v, want it unchanged", other, got)
	}
}

// TestBoundaryKeepsSteadyBucket: at a boundary, a share that the active
// bucket still fits keeps that bucket (Envoy carries it over), and the
// boundary is charged only its refill, with the bucket's tokens held back
// for a shrink; a share that moved gets a fresh grant that pays the whole
// TestBoundaryCharge: at a boundary the next window is charged what the
// previous grant can admit after it beyond the next grant's worst case,
// whether Envoy carries an identical bucket over or, its grant having
// expired first, starts the next bucket full: the old bucket's tokens, and
// the old refill only where it is faster. A bucket whose share holds
// steady is sent again unchanged, and grant plus charge fit the share.
func TestBoundaryCharge(t *testing.T) {
	const overlap = 40 * time.Millisecond
	st := testStream(overlap)
	fixed := store.Check{Key: "k", Algorithm: store.FixedWindow, Limit: 400, Window: time.Second}
	b := &bucket{hasGrant: true, check: fixed}
	b.g = shape(96, 1)
	for _, x := range []uint64{100, 102, 103} {
		g := st.keepShape(b, x, 1, true)
		if !envoySame(g, b.g) || g.fill != b.g.fill {
			t.Errorf("share %d: keepShape = %+v; want the active %+v sent again", x, g, b.g)
		}
		if c := st.overlapOf(b, g); c != b.g.max || g.worst()+c > x {
			t.Errorf("share %d: charge %d, want the bucket's %d alone (its refill is the next grant's); grant %d", x, c, b.g.max, g.worst())
		}
	}
	if g := st.keepShape(b, 150, 1, true); envoySame(g, b.g) || st.overlapOf(b, g) != b.g.max || g.worst()+b.g.max > 150 {
		t.Errorf("share 150: %+v, charge %d; want a fresh, faster grant charged the bucket", g, st.overlapOf(b, g))
	}
	g := st.keepShape(b, 90, 1, true)
	if c := st.overlapOf(b, g); c <= b.g.max || g.worst()+c > 90 {
		t.Errorf("share 90: %+v, charge %d; want a slower grant charged the bucket and its faster refill", g, c)
	}
	// A token-bucket rule has no window the next grant covers: the whole
	// Overlap of the refill is owed; so it is after a push so late that
	// its ttl falls short of the window.
	tb := &bucket{hasGrant: true, check: store.Check{Key: "k", Algorithm: store.TokenBucket, Limit: 100, Window: time.Second}, g: b.g}
	refill := uint64(math.Ceil(b.g.rate() * overlap.Seconds()))
	if c := st.overlapOf(tb, b.g); c != b.g.max+refill {
		t.Errorf("token bucket: charge %d, want bucket and refill %d", c, b.g.max+refill)
	}
	late := &bucket{hasGrant: true, check: store.Check{Key: "k", Algorithm: store.FixedWindow, Limit: 6000, Window: time.Minute}, g: shape(600, 60)}
	if c, r := st.overlapOf(late, shape(590, 59)), uint64(math.Ceil(late.g.rate()*overlap.Seconds())); c != late.g.max+r {
		t.Errorf("late push: charge %d, want bucket and refill %d", c, late.g.max+r)
	}
	// The bound, over many shapes: after the boundary the old grant runs
	// until the next one arrives, within overlap, from a full bucket (its
	// tokens carried over or spent before it expired), and the next one
	// then admits its bucket and its refill to the window's end.
	for old := uint64(1); old <= 400; old += 7 {
		b.g = shape(old, 1)
		for x := uint64(1); x <= 400; x++ {
			g := st.keepShape(b, x, 1, true)
			c := st.overlapOf(b, g)
			if x >= c+8 && g.worst()+c > x+1 {
				t.Fatalf("old %+v, share %d: next %+v and charge %d pass the share", b.g, x, g, c)
			}
			for _, d := range []float64{0, overlap.Seconds()} {
				admits := float64(b.g.max) + b.g.rate()*d + float64(g.max) + g.rate()*(1-d)
				if uint64(admits+1e-9) > c+g.worst() {
					t.Fatalf("old %+v, share %d: next %+v and charge %d; an arrival %.0f ms after the boundary admits %.2f",
						b.g, x, g, c, d*1000, admits)
				}
			}
		}
	}
	// Not at a boundary (a first grant, a top-up): nothing is charged,
	// and the share is the grant's.
	if g := st.keepShape(b, 100, 1, false); g != st.distinct(b, shape(100, 1)) {
		t.Errorf("first grant: %+v", g)
	}
}
