package limiter

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
)

// gatedStore holds each Decide until the test lets it go, after
// signalling that it arrived.
type gatedStore struct {
	store.Store
	arrived chan struct{}
	release chan struct{}
}

func (s *gatedStore) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	s.arrived <- struct{}{}
	<-s.release
	return s.Store.Decide(ctx, checks, results)
}

// flightSetup returns a limiter over a gated memory store whose waits
// for another's call last up to a minute (the test decides when they end),
// and a function deciding one hit of c.
func flightSetup(t *testing.T, c store.Check) (*Limiter, *gatedStore, func() Item) {
	clk := &clock{t: time.Unix(1_751_540_400, 0)}
	gs := &gatedStore{Store: memory.New(memory.Options{Now: clk.now}), arrived: make(chan struct{}, 8), release: make(chan struct{}, 8)}
	l := New(gs, Options{Now: clk.now})
	l.flights.maxWait = time.Minute
	return l, gs, func() Item {
		items := []Item{{Check: c}}
		if err := l.Decide(context.Background(), items); err != nil {
			t.Error(err)
		}
		return items[0]
	}
}

// until spins (no sleep) until cond holds, for at most 30 s.
func until(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); runtime.Gosched() {
		if time.Now().After(end) {
			t.Fatal("no request waited for the call in flight")
		}
	}
}

// A request for a key at its limit waits for the store call in flight for
// that key, and makes its own call only once that call has been answered.
func TestFlightWaitsForTheCallInFlight(t *testing.T) {
	c := chk("rl:{d|k=v}:s60", 3, time.Minute)
	l, gs, one := flightSetup(t, c)
	for range 2 { // 1 left: near the limit
		gs.release <- struct{}{}
		one()
		<-gs.arrived
	}
	var wg sync.WaitGroup
	var leader, waiter Item
	wg.Go(func() { leader = one() }) // takes the last hit, held in flight
	<-gs.arrived
	wg.Go(func() { waiter = one() })
	until(t, func() bool { return l.flights.waiting.Load() == 1 })
	if len(gs.arrived) != 0 {
		t.Fatal("the waiter called the store while the leader's call was in flight")
	}
	gs.release <- struct{}{} // the leader's answer; then the waiter's own call
	<-gs.arrived
	gs.release <- struct{}{}
	wg.Wait()
	if !leader.Result.Allowed || leader.Result.Remaining != 0 {
		t.Fatalf("leader: %+v, want the last hit", leader.Result)
	}
	if waiter.Result.Allowed || waiter.Source != FromStore {
		t.Fatalf("waiter: %+v from %v, want denied by the store", waiter.Result, waiter.Source)
	}
	if n := l.flights.n.Load(); n != 0 {
		t.Fatalf("%d calls still in flight", n)
	}
}

// A key away from its limit never waits: two requests' calls are in
// flight together.
func TestFlightNotAwayFromTheLimit(t *testing.T) {
	c := chk("rl:{d|k=v}:s60", 100, time.Minute)
	l, gs, one := flightSetup(t, c)
	gs.release <- struct{}{}
	one()
	<-gs.arrived
	var wg sync.WaitGroup
	wg.Go(func() { one() })
	wg.Go(func() { one() })
	<-gs.arrived
	<-gs.arrived // both calls reached the store while neither was answered
	if n := l.flights.n.Load(); n != 0 {
		t.Errorf("%d flights for a key with 99 left", n)
	}
	gs.release <- struct{}{}
	gs.release <- struct{}{}
	wg.Wait()
}

// A waiter whose wait runs out makes its own call, as without flights
// (a store that hangs delays it by the wait, no more).
func TestFlightWaitIsBounded(t *testing.T) {
	c := chk("rl:{d|k=v}:s60", 3, time.Minute)
	l, gs, one := flightSetup(t, c)
	l.flights.maxWait = time.Nanosecond
	for range 2 {
		gs.release <- struct{}{}
		one()
		<-gs.arrived
	}
	var wg sync.WaitGroup
	wg.Go(func() { one() })
	<-gs.arrived // the leader, held
	wg.Go(func() { one() })
	<-gs.arrived // the waiter gave up and called too
	gs.release <- struct{}{}
	gs.release <- struct{}{}
	wg.Wait()
}

// slowStore advances the clock by rtt inside each Decide, after deciding:
// the answer arrives rtt after the store's moment.
type slowStore struct {
	store.Store
	clk    *clock
	rtt    time.Duration
	calls  chan struct{}
	scarce atomic.Bool   // the last call's first check was marked Scarce
	hold   chan struct{} // when set, each call waits for a receive
}

func (s *slowStore) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	s.calls <- struct{}{}
	s.scarce.Store(checks[0].Scarce)
	if s.hold != nil {
		<-s.hold
	}
	err := s.Store.Decide(ctx, checks, results)
	s.clk.add(s.rtt)
	return err
}

// A request that arrives after the cache's denial of a key's next hit has
// run out (its RetryAfter counted from before the call), but before the hit
// surely fits (counted from the answer's arrival), waits for that moment as
// the call others wait for, then sends the hit as one expected to fit (not
// Scarce), and the store admits it; the request behind it calls only after
// that answer.
func TestFlightWaitsUntilTheHitFits(t *testing.T) {
	clk := &clock{t: time.Unix(1_751_540_400, 0)}
	ss := &slowStore{Store: memory.New(memory.Options{Now: clk.now}), clk: clk, rtt: 500 * time.Microsecond, calls: make(chan struct{}, 16)}
	l := New(ss, Options{Now: clk.now})
	l.flights.maxWait = time.Minute
	l.flights.sleepFn = clk.add               // the wait until the fit moves the test's clock
	c := chk("rl:{d|k=v}:s1", 2, time.Second) // a sliding window of 2/s
	one := func() Item {
		items := []Item{{Check: c}}
		if err := l.Decide(context.Background(), items); err != nil {
			t.Error(err)
		}
		return items[0]
	}
	// Fill the window: the next hit is denied until the window ends.
	one()
	one()
	denied := one()
	for range 3 {
		<-ss.calls
	}
	if denied.Result.Allowed || denied.Result.RetryAfter == 0 {
		t.Fatalf("third hit: %+v, want denied with a RetryAfter", denied.Result)
	}
	// Between the denial's end and the sure fit.
	clk.add(denied.Result.RetryAfter - ss.rtt + 100*time.Microsecond)
	ss.hold = make(chan struct{})
	var wg sync.WaitGroup
	var first, second Item
	wg.Go(func() { first = one() })
	until(t, func() bool { return len(ss.calls) == 1 }) // waited for the fit, then called: held
	<-ss.calls
	sentScarce := ss.scarce.Load()
	wg.Go(func() { second = one() })
	until(t, func() bool { return l.flights.waiting.Load() == 1 })
	if len(ss.calls) != 0 {
		t.Fatal("the second request called while the first's call was in flight")
	}
	close(ss.hold)
	wg.Wait()
	if !first.Result.Allowed || first.Source != FromStore || sentScarce {
		t.Fatalf("the request that waited for the fit: %+v from %v (Scarce %v), want admitted by the store, sent as a hit expected to fit (not Scarce)",
			first.Result, first.Source, sentScarce)
	}
	if second.Result.Allowed {
		t.Fatalf("the request behind it: %+v, want denied", second.Result)
	}
}
