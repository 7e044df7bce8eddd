package rlqs

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// TestPeriod: a windowed grant lasts to the end of the window now is in
// (windows start at multiples of their length since the epoch), in whole
// seconds up; a token-bucket grant lasts Period, at most the bucket's
// capacity over its rate, and at least a second.
func TestPeriod(t *testing.T) {
	s := New(Options{Period: 2 * time.Second})
	t0 := time.Unix(1_200_000, 0) // a multiple of 10 s and of 60 s
	cases := []struct {
		name    string
		check   store.Check
		now     time.Time
		ttl     int64
		wantEnd time.Time
	}{
		{"fixed 10 s, 3.2 s in", store.Check{Algorithm: store.FixedWindow, Limit: 10, Window: 10 * time.Second}, t0.Add(3200 * time.Millisecond), 7, t0.Add(10 * time.Second)},
		{"sliding 1 s, at its start", store.Check{Algorithm: store.SlidingWindow, Limit: 10, Window: time.Second}, t0, 1, t0.Add(time.Second)},
		{"fixed 60 s, 59.999 s in", store.Check{Algorithm: store.FixedWindow, Limit: 10, Window: time.Minute}, t0.Add(59999 * time.Millisecond), 1, t0.Add(time.Minute)},
		{"token bucket, Period", store.Check{Algorithm: store.TokenBucket, Limit: 10, Window: 10 * time.Second}, t0, 2, time.Time{}},
		{"token bucket, capacity over rate", store.Check{Algorithm: store.TokenBucket, Limit: 100, Burst: 50, Window: time.Second}, t0, 1, time.Time{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ttl, end := s.period(&bucket{check: c.check}, c.now)
			if ttl != c.ttl || !end.Equal(c.wantEnd) {
				t.Errorf("period = %d s, end %v; want %d s, end %v", ttl, end, c.ttl, c.wantEnd)
			}
		})
	}
}

// TestShareFollowsLocalDemand holds invariant 7 of docs/rlqs.md on one
// replica: a window's limit is divided among the streams of a key by their
// demand, never below MinShare, never above demandHeadroom times a
// stream's own demand (plus MinShare); without demand sharing a replica
// takes the limit over the fleet's size.
func TestShareFollowsLocalDemand(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	end := t0.Add(time.Second)
	fleet := 1
	st := ledgerStream(t0)
	st.srv.o.Fleet = func() int { return fleet }
	a := windowed(st, "a", 400, time.Second, shape(1, 1), t0, end)
	b := windowed(st, "b", 400, time.Second, shape(1, 1), t0, end)
	b.check.Key = a.check.Key // one counter
	st.srv.leaveKey(b, "c:b")
	st.srv.join(b)
	until := t0.Add(time.Minute)
	setDemandTo(a, 300, until)
	setDemandTo(b, 100, until)
	ctx := context.Background()
	if got := st.srv.share(ctx, a, 1, end, t0); got != 300 {
		t.Errorf("demand 300 of 400: share %d, want 300", got)
	}
	if got := st.srv.share(ctx, b, 1, end, t0); got != 100 {
		t.Errorf("demand 100 of 400: share %d, want 100", got)
	}
	// Demand below the limit: the rest stays in the store for top-ups.
	setDemandTo(a, 50, until)
	setDemandTo(b, 10, until)
	if got, most := st.srv.share(ctx, a, 1, end, t0), uint64(52)+1; got != most {
		t.Errorf("demand 50 of 400: share %d, want %d (1.05 x 50, plus MinShare)", got, most)
	}
	// Two replicas without Demand: each takes half.
	fleet = 2
	setDemandTo(a, 300, until)
	setDemandTo(b, 100, until)
	if got := st.srv.share(ctx, a, 1, end, t0); got != 150 {
		t.Errorf("two replicas, demand 300 of 400: share %d, want 150", got)
	}
	// No demand known on the key (every report overdue): the whole part.
	late := until.Add(time.Second)
	if got := st.srv.share(ctx, a, 1, end, late); got != 200 {
		t.Errorf("no demand known: share %d, want the replica's part 200", got)
	}
	// Its own demand overdue beside another's: MinShare.
	setDemandTo(b, 100, late.Add(time.Minute))
	if got := st.srv.share(ctx, a, 1, end, late); got != st.srv.o.MinShare {
		t.Errorf("overdue demand beside another's: share %d, want MinShare %d", got, st.srv.o.MinShare)
	}
	// The shares of a window never pass the limit.
	fleet = 1
	for _, d := range [][2]float64{{1, 1}, {399, 1}, {1e9, 1e9}, {0.5, 1e6}} {
		setDemandTo(a, d[0], until)
		setDemandTo(b, d[1], until)
		if sa, sb := st.srv.share(ctx, a, 1, end, t0), st.srv.share(ctx, b, 1, end, t0); sa+sb > 400+2*st.srv.o.MinShare {
			t.Errorf("demands %v: shares %d + %d pass the limit 400", d, sa, sb)
		}
	}
}

// TestDemandOfBounded holds invariant 8: a reported demand counts for at
// most the larger of the fair part (the limit's pace over the key's
// buckets here) and its bound, and for nothing once overdue; a report
// raises the bound to demandGrowth times what it counted for, or the rate
// it reports allowed.
func TestDemandOfBounded(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	st := ledgerStream(t0)
	b := windowed(st, "a", 400, time.Second, shape(1, 1), t0, t0.Add(time.Second))
	o := windowed(st, "b", 400, time.Second, shape(1, 1), t0, t0.Add(time.Second))
	o.check.Key = b.check.Key
	st.srv.leaveKey(o, "c:b")
	st.srv.join(o)
	// The first report claims 10^12 denials.
	st.setDemand(b, &usage{denied: 1e12}, 0, t0)
	got := st.srv.demandOf(b, t0, st.srv.groupSize(b.check.Key))
	if fair := 400.0 / 2; got != fair {
		t.Errorf("a claim of 10^12 beside one other bucket counts for %v, want the fair part %v", got, fair)
	}
	if d := math.Float64frombits(b.demand.Load()); d != 400 {
		t.Errorf("demand recorded %v, want the limit's pace 400", d)
	}
	// Alone on the key, the same claim counts for the whole pace.
	st.srv.leave(o)
	if got := st.srv.demandOf(b, t0, st.srv.groupSize(b.check.Key)); got != 400 {
		t.Errorf("alone: %v, want 400", got)
	}
	st.srv.join(o)
	// A stream that truly grows: its bound is 4 x what it counted for.
	c := windowed(st, "c", 4000, time.Second, shape(1, 1), t0, t0.Add(time.Second))
	st.setDemand(c, &usage{allowed: 10}, time.Second, t0)
	if got := st.srv.demandOf(c, t0, 1); got != 10 {
		t.Fatalf("10 a second counts for %v", got)
	}
	st.setDemand(c, &usage{allowed: 10, denied: 3990}, time.Second, t0.Add(time.Second))
	if got := st.srv.demandOf(c, t0.Add(time.Second), 100); got != 4*10 {
		t.Errorf("demand 4,000 after 10, fair part 40 of 100 buckets: counts for %v, want 4 x 10 = 40", got)
	}
	// Overdue: nothing.
	if got := st.srv.demandOf(c, t0.Add(time.Hour), 1); got != 0 {
		t.Errorf("an overdue demand counts for %v, want 0", got)
	}
}

// TestPartFollowsFleetDemand: with Demand a replica's part is its share of
// the fleet's demand; a failed call falls back to the limit over the fleet
// and is not retried within demandBackoff; a reading is reused within
// demandReuse.
func TestPartFollowsFleetDemand(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var calls atomic.Int32
	fail := false
	st := ledgerStream(t0)
	st.srv.o.Fleet = func() int { return 4 }
	st.srv.o.Demand = func(_ context.Context, key string, d float64, ttl time.Duration) (float64, error) {
		calls.Add(1)
		if fail {
			return 0, errors.New("down")
		}
		return d + 30, nil
	}
	b := windowed(st, "a", 400, time.Second, shape(1, 1), t0, t0.Add(time.Second))
	ctx := context.Background()
	if got := st.srv.part(ctx, b, 10, t0); got != 0.25 {
		t.Errorf("here 10, others 30: part %v, want 0.25", got)
	}
	if got := st.srv.part(ctx, b, 0, t0); got != 0.25 || calls.Load() != 1 {
		t.Errorf("no demand here: part %v (want 1 over the fleet) after %d calls (want 1)", got, calls.Load())
	}
	if got := st.srv.part(ctx, b, 10, t0.Add(demandReuse/2)); got != 0.25 || calls.Load() != 1 {
		t.Errorf("within demandReuse: part %v after %d calls, want the reading reused", got, calls.Load())
	}
	fail = true
	later := t0.Add(time.Second)
	if got := st.srv.part(ctx, b, 90, later); got != 0.25 || calls.Load() != 2 {
		t.Errorf("a failed call: part %v after %d calls, want 1 over the fleet after 2", got, calls.Load())
	}
	fail = false
	if got := st.srv.part(ctx, b, 90, later.Add(demandBackoff/2)); got != 0.25 || calls.Load() != 2 {
		t.Errorf("within the backoff: part %v after %d calls, want no call", got, calls.Load())
	}
	if got := st.srv.part(ctx, b, 90, later.Add(demandBackoff)); got != 0.75 || calls.Load() != 3 {
		t.Errorf("after the backoff: part %v after %d calls, want 0.75 after 3", got, calls.Load())
	}
}

// TestTopUpWant: a top-up asks what the demand over the window exceeds the
// grant's reservation by, and nothing for a blanket grant.
func TestTopUpWant(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	st := ledgerStream(t0)
	b := windowed(st, "a", 1000, 10*time.Second, shape(100, 10), t0, t0.Add(10*time.Second))
	setDemandTo(b, 30, t0.Add(time.Minute))
	if got, want := st.topUpWant(b, t0), 300-b.g.reserved; got != want {
		t.Errorf("demand 30/s over 10 s, %d reserved: want %d, got %d", b.g.reserved, want, got)
	}
	setDemandTo(b, 5, t0.Add(time.Minute))
	if got := st.topUpWant(b, t0); got != 0 {
		t.Errorf("demand within the grant: top-up %d", got)
	}
	b.g = grant{deny: true}
	setDemandTo(b, 30, t0.Add(time.Minute))
	if got := st.topUpWant(b, t0); got != 0 {
		t.Errorf("DENY_ALL: top-up %d", got)
	}
}
