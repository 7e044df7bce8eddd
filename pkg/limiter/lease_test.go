package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
)

// leaseSetup is a limiter with leases on a memory store (which grants
// leases as the Redis store does), both on clk, and a count of store calls.
func leaseSetup(t *testing.T, fleet int) (*Limiter, *countingStore, *clock) {
	t.Helper()
	clk := &clock{t: time.Unix(1_751_540_400, 0)}
	cs := &countingStore{Store: memory.New(memory.Options{Now: clk.now})}
	l := New(cs, Options{Now: clk.now, FleetSize: func() int { return fleet }, Reserve: true})
	return l, cs, clk
}

// drive sends n requests of one hit of c through ls in turn (replica i
// gets request k when k % len(ls) == i), every gap on clk, and returns how
// many each window of c's (counted from the clock's start) admitted.
func drive(t *testing.T, ls []*Limiter, clk *clock, c store.Check, n int, gap time.Duration) map[int64]int {
	t.Helper()
	start := clk.now()
	per := map[int64]int{}
	for k := range n {
		items := []Item{{Check: c}}
		if err := ls[k%len(ls)].Decide(context.Background(), items); err != nil {
			t.Fatal(err)
		}
		if items[0].Result.Allowed {
			per[int64(clk.now().Sub(start)/c.Window)]++
		}
		clk.add(gap)
	}
	return per
}

// TestLeaseSizing: a key seen 5 times a window costs about one store call
// per window, not five (invariant 2), and never more than its limit.
func TestLeaseSizing(t *testing.T) {
	l, cs, clk := leaseSetup(t, 1)
	c := store.Check{Key: "k", Limit: 1000, Window: time.Second, Hits: 1}
	per := drive(t, []*Limiter{l}, clk, c, 50, 200*time.Millisecond) // 10 windows
	for w, n := range per {
		if n != 5 {
			t.Errorf("window %d admitted %d of 5", w, n)
		}
	}
	if calls := cs.calls.Load(); calls > 14 {
		t.Errorf("%d store calls for 50 requests over 10 windows, want about one a window", calls)
	}
	if cnt := l.Counters(); cnt.ReservedUsed < 30 {
		t.Errorf("only %d of 50 hits admitted from leases", cnt.ReservedUsed)
	}
	// A lease is at most what is left / (8 × fleet): near its limit a
	// fixed window's key goes request by request.
	f := store.Check{Key: "f", Algorithm: store.FixedWindow, Limit: 40, Window: time.Hour, Hits: 1}
	per = drive(t, []*Limiter{l}, clk, f, 60, time.Millisecond)
	if per[0] != 40 {
		t.Errorf("fixed window: %d admitted, want its limit 40", per[0])
	}
}

// TestPacedLease: a sliding window at twice its limit from two replicas
// is decided from paced leases (invariant 3): each window admits at most
// its limit and at least 90 % of it, for far fewer store calls than
// admissions, and neither replica starves.
func TestPacedLease(t *testing.T) {
	clk := &clock{t: time.Unix(1_751_540_400, 0)}
	cs := &countingStore{Store: memory.New(memory.Options{Now: clk.now})}
	var ls []*Limiter
	for range 2 {
		ls = append(ls, New(cs, Options{Now: clk.now, FleetSize: func() int { return 2 }, Reserve: true}))
	}
	c := store.Check{Key: "hot", Limit: 2500, Window: time.Second, Hits: 1}
	start := clk.now()
	admitted := map[int64][2]int{}
	for k := range 5000 * 6 { // 5,000/s for 6 s
		i := k % 2
		items := []Item{{Check: c}}
		if err := ls[i].Decide(context.Background(), items); err != nil {
			t.Fatal(err)
		}
		if items[0].Result.Allowed {
			w := int64(clk.now().Sub(start) / time.Second)
			a := admitted[w]
			a[i]++
			admitted[w] = a
		}
		clk.add(200 * time.Microsecond)
	}
	for w := int64(1); w < 6; w++ {
		a := admitted[w]
		if n := a[0] + a[1]; n > 2500 || n < 2250 {
			t.Errorf("window %d admitted %d (%d + %d), want 2,250 to 2,500", w, n, a[0], a[1])
		}
		if a[0] < 1000 || a[1] < 1000 {
			t.Errorf("window %d: the replicas admitted %d and %d: one starves", w, a[0], a[1])
		}
	}
	if calls := cs.calls.Load(); calls > 6*2500/10 {
		t.Errorf("%d store calls for %d admitted in 6 s", calls, 6*2500)
	}
	t.Logf("store calls %d; admitted by window %v", cs.calls.Load(), admitted)
}

// TestLeaseNeverOutlivesItsWindow: hits leased in one window are not
// admitted in the next (invariant 1).
func TestLeaseNeverOutlivesItsWindow(t *testing.T) {
	l, _, clk := leaseSetup(t, 1)
	c := store.Check{Key: "w", Algorithm: store.FixedWindow, Limit: 1000, Window: time.Second, Hits: 1}
	drive(t, []*Limiter{l}, clk, c, 10, 10*time.Millisecond) // the lease asks for the rest of the window
	clk.add(time.Second - 100*time.Millisecond)              // the next window
	items := []Item{{Check: c}}
	if err := l.Decide(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	if items[0].Source == FromReserve {
		t.Errorf("a hit leased in the last window was admitted in this one")
	}
}

// TestLeaseReturned: a lease's unused hits go back while its window runs
// (invariant 4): at a clean stop, and with the key's next call after the
// lease ended.
func TestLeaseReturned(t *testing.T) {
	l, cs, clk := leaseSetup(t, 1)
	c := store.Check{Key: "r", Algorithm: store.FixedWindow, Limit: 100000, Window: time.Hour, Hits: 1}
	drive(t, []*Limiter{l}, clk, c, 20, 10*time.Millisecond)
	used := func() uint64 {
		r := []store.Result{{}}
		cc := c
		cc.Hits = 0
		if err := cs.Peek(context.Background(), []store.Check{cc}, r); err != nil {
			t.Fatal(err)
		}
		return c.Limit - r[0].Remaining
	}
	if used() <= 20 {
		t.Fatalf("the store counts %d hits for 20 admitted: no lease held", used())
	}
	clk.add(leaseLife) // the lease ends; the next call carries its rest back
	drive(t, []*Limiter{l}, clk, c, 1, 0)
	if cnt := l.Counters(); cnt.ReservedReturned == 0 {
		t.Errorf("no unused hit returned with the next call: %+v", cnt)
	}
	drive(t, []*Limiter{l}, clk, c, 10, 10*time.Millisecond)
	if err := l.ReleaseReservations(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := used(); n != 31 {
		t.Errorf("after a clean stop the store counts %d hits, want the 31 admitted", n)
	}
}
