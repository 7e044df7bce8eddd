package rlqs

import (
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
// charge from the share. Either way the grant and the charge fit the share.
func TestBoundaryKeepsSteadyBucket(t *testing.T) {
	st := testStream(40 * time.Millisecond)
	b := &bucket{hasGrant: true, check: store.Check{Key: "k", Algorithm: store.FixedWindow, Limit: 400, Window: time.Second}}
	b.g = shape(96, 1)
	bucketTokens, refill := st.overlapOf(b)
	if bucketTokens != b.g.max || refill == 0 {
		t.Fatalf("overlapOf(%+v) = %d, %d", b.g, bucketTokens, refill)
	}
	for _, x := range []uint64{100, 102, 104} {
		g, carried := st.keepShape(b, x, 1, true)
		if !carried || !envoySame(g, b.g) || g.fill != b.g.fill {
			t.Errorf("share %d: keepShape = %+v, %v; want the active %+v kept", x, g, carried, b.g)
		}
		checks, onShrink := st.chargeOverlap(b, nil, carried)
		if len(checks) != 1 || checks[0].Hits != refill || !checks[0].Force {
			t.Errorf("share %d: charge %+v, want the refill %d alone, forced", x, checks, refill)
		}
		if len(onShrink) != 1 || onShrink[0].Hits != bucketTokens {
			t.Errorf("share %d: on shrink %+v, want the bucket's %d", x, onShrink, bucketTokens)
		}
		if g.worst()+refill > x {
			t.Errorf("share %d: grant %d and charge %d pass it", x, g.worst(), refill)
		}
	}
	for _, x := range []uint64{90, 150, 400} {
		g, carried := st.keepShape(b, x, 1, true)
		if carried || envoySame(g, b.g) {
			t.Errorf("share %d: keepShape = %+v, %v; want a fresh grant", x, g, carried)
		}
		checks, onShrink := st.chargeOverlap(b, nil, carried)
		if len(checks) != 1 || checks[0].Hits != bucketTokens+refill || onShrink != nil {
			t.Errorf("share %d: charge %+v, %v; want bucket and refill, %d", x, checks, onShrink, bucketTokens+refill)
		}
		if g.worst()+bucketTokens+refill > x {
			t.Errorf("share %d: grant %d and charge %d pass it", x, g.worst(), bucketTokens+refill)
		}
	}
	// Not at a boundary (a first grant, a top-up): nothing is charged,
	// and the share is the grant's.
	if g, carried := st.keepShape(b, 100, 1, false); carried || g != st.distinct(b, shape(100, 1)) {
		t.Errorf("first grant: %+v, %v", g, carried)
	}
}
