package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
)

// reserveSetup is setup with reservations on, and n limiters (replicas) on
// one store.
func reserveSetup(t *testing.T, n int) ([]*Limiter, *countingStore, *clock) {
	t.Helper()
	clk := &clock{t: time.Unix(1_751_540_400, 0)}
	cs := &countingStore{Store: memory.New(memory.Options{Now: clk.now})}
	ls := make([]*Limiter, n)
	for i := range ls {
		ls[i] = New(cs, Options{Now: clk.now, FleetSize: func() int { return n }, Reserve: true})
	}
	return ls, cs, clk
}

// used returns what the store has counted for c: the limit less its budget.
func used(t *testing.T, st store.Store, c store.Check) uint64 {
	t.Helper()
	r := make([]store.Result, 1)
	if err := st.Peek(context.Background(), []store.Check{hits(c, 0)}, r); err != nil {
		t.Fatal(err)
	}
	return c.Limit - r[0].Remaining
}

// A hot key far from its limit is decided from slices: few store calls,
// every admitted hit counted in the store before it was admitted, and after
// release the store counts exactly what was admitted.
func TestReserveHotKeyDecidesLocally(t *testing.T) {
	ls, cs, clk := reserveSetup(t, 1)
	c := chk("rl:{d|k=hot}:m1", 1_000_000, time.Minute)
	admitted := uint64(0)
	local := 0
	for range 2000 {
		r, src := decide(t, ls[0], false, c)
		if !r[0].Allowed {
			t.Fatalf("denied far from the limit: %+v", r[0])
		}
		admitted++
		if src[0] == FromReserve {
			local++
		}
		if u := used(t, cs.Store, c); u < admitted {
			t.Fatalf("the store counts %d hits, %d were admitted", u, admitted)
		}
		clk.add(100 * time.Microsecond) // 10,000 a second
	}
	if calls := cs.calls.Load(); calls > 200 || local < 1800 {
		t.Fatalf("%d store calls, %d of 2000 decided from slices: want few calls", calls, local)
	}
	if err := ls[0].ReleaseReservations(context.Background()); err != nil {
		t.Fatal(err)
	}
	if u := used(t, cs.Store, c); u != admitted {
		t.Fatalf("after release the store counts %d hits, %d were admitted", u, admitted)
	}
	n := ls[0].Counters()
	if n.ReservedGranted != n.ReservedUsed+n.ReservedReturned+n.ReservedExpired || n.ReservedUsed != uint64(local) {
		t.Fatalf("reserved hits: granted %d, used %d, returned %d, expired %d; %d decided locally",
			n.ReservedGranted, n.ReservedUsed, n.ReservedReturned, n.ReservedExpired, local)
	}
	if n.Sources[FromReserve] != uint64(local) {
		t.Fatalf("checks from slices %d, want %d", n.Sources[FromReserve], local)
	}
}

// A cold key never reserves, nor does a rule with reserve: false.
func TestReserveColdKeyAndReserveFalse(t *testing.T) {
	ls, cs, clk := reserveSetup(t, 1)
	cold := chk("rl:{d|k=cold}:m1", 1_000_000, time.Minute)
	for range 50 {
		decide(t, ls[0], false, cold)
		clk.add(10 * time.Millisecond) // 100 a second: under minSlice per rate interval
	}
	hot := chk("rl:{d|k=off}:m1", 1_000_000, time.Minute)
	calls := cs.calls.Load()
	for range 500 {
		_, src := decideItems(t, ls[0], []Item{{Check: hot, NoReserve: true}})
		if src[0] != FromStore {
			t.Fatalf("a reserve: false check came from %v", src[0])
		}
		clk.add(100 * time.Microsecond)
	}
	if got := cs.calls.Load() - calls; got != 500 {
		t.Fatalf("%d store calls for 500 reserve: false requests", got)
	}
	if g := ls[0].Counters().ReservedGranted; g != 0 {
		t.Fatalf("granted %d reserved hits to a cold key and a reserve: false rule", g)
	}
}

// Near the limit no slice is taken: the last hits go request by request,
// and a slice is at most what is left / (sliceShare × fleet size).
func TestReserveNeverNearTheLimit(t *testing.T) {
	ls, cs, clk := reserveSetup(t, 1)
	c := chk("rl:{d|k=near}:m1", 1000, time.Minute)
	for range 1200 {
		left := c.Limit - used(t, cs.Store, c)
		before := ls[0].Counters().ReservedGranted
		decide(t, ls[0], false, c)
		clk.add(100 * time.Microsecond)
		if g := ls[0].Counters().ReservedGranted - before; g > 0 && (left < sliceShare*minSlice || g > left/sliceShare) {
			t.Fatalf("a slice of %d hits with %d left in the store", g, left)
		}
	}
	if u := used(t, cs.Store, c); u != c.Limit {
		t.Fatalf("the store counts %d of a limit of %d after 1200 requests", u, c.Limit)
	}
	if ls[0].Counters().ReservedGranted == 0 {
		t.Fatal("no slice was reserved while far from the limit")
	}
}

// A slice never outlives its window: in a fixed window it ends at the
// window's end, and its unused hits are not refunded into the next window.
func TestReserveNeverCrossesAWindow(t *testing.T) {
	ls, cs, clk := reserveSetup(t, 1)
	c := chk("rl:{d|k=win}:f1", 100_000, time.Second)
	c.Algorithm = store.FixedWindow
	// Start 60 ms before a window ends, at 10,000 a second.
	now := clk.now()
	clk.add(time.Second - time.Duration(now.UnixNano()%int64(time.Second)) - 60*time.Millisecond)
	var lastLocal time.Time
	for range 1200 { // 120 ms: into the next window
		_, src := decide(t, ls[0], false, c)
		if src[0] == FromReserve {
			lastLocal = clk.now()
		}
		clk.add(100 * time.Microsecond)
	}
	if lastLocal.IsZero() {
		t.Fatal("no request was decided from a slice")
	}
	// Nothing from a slice reserved in the first window was used in the
	// second: after the boundary, local decisions need a new reservation,
	// which is counted in the second window.
	if err := ls[0].ReleaseReservations(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := ls[0].Counters()
	if n.ReservedGranted != n.ReservedUsed+n.ReservedReturned+n.ReservedExpired {
		t.Fatalf("reserved hits unaccounted: %+v", n)
	}
	// The second window counts exactly its own admissions: 600 requests
	// (60 ms at 10,000 a second), whatever the first window's slice left.
	if u := used(t, cs.Store, c); u != 600 {
		t.Fatalf("the new window counts %d hits, want the 600 admitted in it", u)
	}
}

// A slice ends after sliceLifetime; its unused hits ride back as a refund
// with the key's next store call, in the same window.
func TestReserveUnusedHitsGoBack(t *testing.T) {
	ls, cs, clk := reserveSetup(t, 1)
	c := chk("rl:{d|k=back}:m1", 1_000_000, time.Minute)
	n := 0
	for ls[0].Counters().ReservedGranted == 0 {
		decide(t, ls[0], false, c)
		n++
		clk.add(100 * time.Microsecond)
		if n > 1000 {
			t.Fatal("no slice after 1,000 requests at 10,000 a second")
		}
	}
	clk.add(sliceLifetime) // the slice ends unused
	decide(t, ls[0], false, c)
	n++
	st := ls[0].Counters()
	if st.ReservedReturned == 0 {
		t.Fatalf("nothing returned after the slice ended: %+v", st)
	}
	if u, want := used(t, cs.Store, c), uint64(n)+ls[0].res.shard(c.Key).m[c.Key].left; u != want {
		t.Fatalf("the store counts %d, want %d admitted plus the live slice", u, want)
	}
}

// Two replicas driving one hot key to its limit from both at once admit
// exactly the limit, never more, and the store never counts less than was
// admitted.
func TestReserveTwoReplicasExact(t *testing.T) {
	for _, alg := range []store.Algorithm{store.SlidingWindow, store.FixedWindow, store.TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			ls, cs, clk := reserveSetup(t, 2)
			c := chk("rl:{d|k=both}:m1", 5000, time.Minute)
			c.Algorithm = alg
			admitted := uint64(0)
			for i := range 12000 {
				r, _ := decide(t, ls[i%2], false, c)
				if r[0].Allowed {
					admitted++
				}
				if u := used(t, cs.Store, c); u < admitted && alg != store.TokenBucket {
					t.Fatalf("request %d: the store counts %d hits, %d were admitted", i, u, admitted)
				}
				clk.add(20 * time.Microsecond) // 50,000 a second, 10 times the limit over the run
			}
			if alg != store.TokenBucket && admitted != c.Limit {
				t.Fatalf("admitted %d of a limit of %d", admitted, c.Limit)
			}
			// A token bucket refills 5000/min: over 240 ms that is 20 hits,
			// plus the slices' lead (rate × sliceLifetime, under one hit).
			if alg == store.TokenBucket && (admitted < c.Limit || admitted > c.Limit+21) {
				t.Fatalf("token bucket admitted %d; want %d to %d", admitted, c.Limit, c.Limit+21)
			}
			if g := ls[0].Counters().ReservedGranted + ls[1].Counters().ReservedGranted; g == 0 {
				t.Fatal("no slice was reserved: the test did not exercise reservations")
			}
		})
	}
}

// When the store fails, a live slice keeps deciding until it ends; then
// the fallback decides as without reservations.
func TestReserveSliceOutlivesAnOutage(t *testing.T) {
	ls, cs, clk := reserveSetup(t, 1)
	c := chk("rl:{d|k=out}:m1", 1_000_000, time.Minute)
	for ls[0].Counters().ReservedGranted == 0 {
		decide(t, ls[0], false, c)
		clk.add(100 * time.Microsecond)
	}
	cs.down.Store(true)
	_, src := decide(t, ls[0], false, c)
	if src[0] != FromReserve {
		t.Fatalf("with a live slice and the store down: from %v", src[0])
	}
	clk.add(sliceLifetime)
	if _, src = decide(t, ls[0], false, c); src[0] != FromFailOpen {
		t.Fatalf("after the slice ended, store down: from %v, want fail_open", src[0])
	}
}
