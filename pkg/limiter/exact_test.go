package limiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/testkit"
)

// waitFor polls cond until it holds or two seconds pass.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, "condition", 2*time.Second, cond)
}

func hits(c store.Check, h uint64) store.Check {
	c.Hits = h
	return c
}

// The cache denies only what the store would deny: a denial of 3 hits does
// not deny 2 (a limit of 5: 3 hits, 3 more denied, then 2 admitted), and a
// huge request does not block small ones.
func TestCacheDeniesOnlyWhatTheStoreWould(t *testing.T) {
	l, cs, _ := setup(t, 1)
	c := chk("rl:{d|k=v}:m1", 5, time.Minute)
	r, _ := decide(t, l, false, hits(c, 3))
	if !r[0].Allowed || r[0].Remaining != 2 {
		t.Fatalf("3 hits: %+v, want OK remaining 2", r[0])
	}
	r, src := decide(t, l, false, hits(c, 3))
	if r[0].Allowed || r[0].Remaining != 2 || src[0] != FromStore {
		t.Fatalf("3 more: %+v from %v, want OVER_LIMIT remaining 2 from the store", r[0], src[0])
	}
	// Asking for as much again is answered from the cache, with what was left.
	calls := cs.calls.Load()
	r, src = decide(t, l, false, hits(c, 4))
	if r[0].Allowed || r[0].Remaining != 2 || src[0] != FromCache || cs.calls.Load() != calls {
		t.Fatalf("4 hits: %+v from %v, want a cached denial with remaining 2", r[0], src[0])
	}
	r, src = decide(t, l, false, hits(c, 2))
	if !r[0].Allowed || r[0].Remaining != 0 || src[0] != FromStore {
		t.Fatalf("2 hits: %+v from %v, want OK remaining 0", r[0], src[0])
	}

	big := chk("rl:{d|k=big}:m1", 100, time.Minute)
	decide(t, l, false, big)
	if r, _ := decide(t, l, false, hits(big, 1_000_000_000)); r[0].Allowed {
		t.Fatal("10^9 hits allowed on a limit of 100")
	}
	for i := range 99 {
		if r, src := decide(t, l, false, big); !r[0].Allowed {
			t.Fatalf("hit %d after the 10^9 request: %+v from %v", i+2, r[0], src[0])
		}
	}
	if r, _ := decide(t, l, false, big); r[0].Allowed {
		t.Fatal("101st hit allowed")
	}
}

// A refund clears a cached denial: the budget it gives back is usable at once.
func TestRefundClearsCachedDenial(t *testing.T) {
	l, _, _ := setup(t, 1)
	c := chk("rl:{d|k=v}:m1", 1, time.Minute)
	decide(t, l, false, c)
	decide(t, l, false, c) // denied, cached
	refund := c
	refund.Refund = true
	decide(t, l, false, refund)
	if r, src := decide(t, l, false, c); !r[0].Allowed || src[0] != FromStore {
		t.Fatalf("after a refund: %+v from %v", r[0], src[0])
	}
}

// The fail-open bucket starts from what the store last said was left, this
// replica's part of it, not from a full share.
func TestFallbackSeededFromTheStore(t *testing.T) {
	l, cs, clk := setup(t, 2)
	c := chk("rl:{d|k=v}:s60", 100, time.Minute)
	decide(t, l, false, hits(c, 90)) // the store says 10 are left
	cs.down.Store(true)
	allowed := 0
	for range 50 {
		if r, _ := decide(t, l, false, c); r[0].Allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("store said 10 left, fleet of 2: %d allowed locally, want 5", allowed)
	}
	// Refill at this replica's share: 50 per minute, so 5 in 6 s.
	clk.add(6 * time.Second)
	allowed = 0
	for range 50 {
		if r, _ := decide(t, l, false, c); r[0].Allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("6 s later: %d allowed, want 5", allowed)
	}
	if got := l.Counters().Causes[CauseUnavailable]; got != 100 {
		t.Fatalf("fallbacks caused by an unavailable store: %d, want 100", got)
	}
}

// A denial the store gave seeds an empty bucket: a saturated key stays
// saturated through an outage.
func TestFallbackAfterDenialStartsEmpty(t *testing.T) {
	l, cs, _ := setup(t, 2)
	c := chk("rl:{d|k=v}:s60", 10, time.Minute)
	decide(t, l, false, hits(c, 10))
	decide(t, l, false, c) // denied
	cs.down.Store(true)
	if r, src := decide(t, l, false, c); r[0].Allowed && src[0] == FromFailOpen {
		t.Fatalf("allowed locally right after the store denied: %+v", r[0])
	}
}

// Hits admitted locally are written back once the store answers again, and
// only those that still count in the trailing window.
func TestWriteBackAfterOutage(t *testing.T) {
	l, cs, clk := setup(t, 1)
	c := chk("rl:{d|k=v}:s1", 100, time.Second)
	cs.down.Store(true)
	for range 40 {
		decide(t, l, false, c)
	}
	cs.down.Store(false)
	if err := l.WriteBack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := l.Counters().WrittenBack; got != 40 {
		t.Fatalf("written back %d hits, want 40", got)
	}
	r, _ := decide(t, l, false, hits(c, 0))
	if r[0].Remaining != 60 {
		t.Fatalf("store remaining %d after the write-back, want 60", r[0].Remaining)
	}

	// An outage longer than the window writes back only the last window's hits.
	cs.down.Store(true)
	key := chk("rl:{d|k=long}:s1", 100, time.Second)
	for range 5 { // 5 seconds of outage at 10 hits a second
		for range 10 {
			decide(t, l, false, key)
		}
		clk.add(time.Second)
	}
	cs.down.Store(false)
	before := l.Counters().WrittenBack
	if err := l.WriteBack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := l.Counters().WrittenBack - before; got != 10 {
		t.Fatalf("after 5 s of outage, wrote back %d hits, want the last window's 10", got)
	}
}

// A write-back the store cannot take stays queued for the next time.
func TestWriteBackRetriedWhileDown(t *testing.T) {
	l, cs, _ := setup(t, 1)
	c := chk("rl:{d|k=v}:m1", 100, time.Minute)
	cs.down.Store(true)
	for range 7 {
		decide(t, l, false, c)
	}
	if err := l.WriteBack(context.Background()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("write-back while down: %v", err)
	}
	cs.down.Store(false)
	decide(t, l, false, hits(c, 0)) // an answered call starts the write-back
	waitFor(t, func() bool { return l.Counters().WrittenBack == 7 })
	if r, _ := decide(t, l, false, hits(c, 0)); r[0].Remaining != 93 {
		t.Fatalf("remaining %d, want 93", r[0].Remaining)
	}
}

// blockingStore answers only when its context ends, recording whether the
// context had a deadline and how long it gave.
type blockingStore struct {
	store.Store
	budget chan time.Duration
}

func (s *blockingStore) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	d, ok := ctx.Deadline()
	if !ok {
		s.budget <- -1
		return nil
	}
	s.budget <- time.Until(d)
	<-ctx.Done()
	return errors.Join(store.ErrUnavailable, ctx.Err())
}

// The store gets the caller's deadline less a margin; a caller without a
// deadline leaves the store its own timeout; a deadline that leaves no time
// decides locally without a call.
func TestBudgetFollowsTheCaller(t *testing.T) {
	bs := &blockingStore{budget: make(chan time.Duration, 1)}
	l := New(bs, Options{})
	items := []Item{{Check: chk("rl:{d|k=v}:s1", 10, time.Second)}}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := l.Decide(ctx, items)
	if b := <-bs.budget; b <= 0 || b > 16*time.Millisecond {
		t.Fatalf("store budget %v for a 20ms caller, want at most 16ms", b)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		// The answer's margin is 4 ms past the store's budget: a machine
		// too busy to run the limiter within it says nothing of the budget.
		t.Logf("the caller's deadline passed before the fail-open answer (a busy machine): %v", err)
	case err != nil:
		t.Fatal(err)
	case items[0].Source != FromFailOpen || ctx.Err() != nil:
		t.Fatalf("source %v, caller ctx %v: want a fail-open answer before the caller's deadline", items[0].Source, ctx.Err())
	case l.Counters().Causes[CauseDeadline] != 1:
		t.Fatalf("deadline fallbacks %d, want 1", l.Counters().Causes[CauseDeadline])
	}

	if err := l.Decide(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	if b := <-bs.budget; b != -1 {
		t.Fatalf("a caller without a deadline gave the store a deadline (%v)", b)
	}

	short, cancel2 := context.WithTimeout(context.Background(), 900*time.Microsecond)
	defer cancel2()
	if err := l.Decide(short, items); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	select {
	case b := <-bs.budget:
		t.Fatalf("the store was called with %v left", b)
	default:
	}
}

// A fixed-window rule's fallback refills as the store's counter does: what
// the store said was left until the window ends, then a full share.
func TestFixedWindowFallbackRefillsPerWindow(t *testing.T) {
	l, cs, clk := setup(t, 2)
	c := chk("rl:{d|k=v}:f60", 100, time.Minute)
	c.Algorithm = store.FixedWindow
	decide(t, l, false, hits(c, 90)) // 10 left in this minute
	cs.down.Store(true)
	count := func() int {
		n := 0
		for range 100 {
			if r, _ := decide(t, l, false, c); r[0].Allowed {
				n++
			}
		}
		return n
	}
	if n := count(); n != 5 {
		t.Fatalf("10 left, fleet of 2: %d allowed locally, want 5", n)
	}
	clk.add(30 * time.Second) // same window: nothing refills
	if n := count(); n != 0 {
		t.Fatalf("later in the same window: %d allowed, want 0", n)
	}
	clk.add(30 * time.Second) // the next window: a full share
	if n := count(); n != 50 {
		t.Fatalf("next window: %d allowed, want 50", n)
	}
}

// A store that restarted empty says the whole limit is left; the hits this
// bucket admitted and has not written back yet are still taken off when it
// starts again from what the store said.
func TestReseedKeepsUnwrittenHits(t *testing.T) {
	now := time.Unix(1_751_540_400, 0).UnixNano()
	b := &bucket{capacity: 100, rate: 100 / float64(time.Minute), tokens: 100, last: -1, window: int64(time.Minute)}
	c := chk("k", 100, time.Minute)
	for range 30 {
		b.take(&c, now)
	}
	b.mu.Lock()
	b.seed(100, now+1, now+1)
	got := b.tokens
	b.mu.Unlock()
	if got != 70 {
		t.Fatalf("tokens %v after the store said 100 were left, want 70 (the 30 not yet written back are not in it)", got)
	}
	if n := b.drain(now + 1); n != 30 {
		t.Fatalf("pending %d, want 30 still to write back", n)
	}
}
