package limiter

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// slotStore decides each "slot" (the key's text before '|') of a batch in
// its own atomic call on a real memory store, as the Redis store does on a
// Cluster; refundsFail makes that many refund calls fail first, as a shard
// that cannot be reached during the undo.
type slotStore struct {
	store.Store
	refundsFail atomic.Int64
}

func (s *slotStore) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	if len(checks) > 0 && checks[0].Refund && s.refundsFail.Add(-1) >= 0 {
		for i := range results {
			results[i] = store.Result{Undecided: true}
		}
		return fmt.Errorf("shard paused: %w", store.ErrUnavailable)
	}
	groups := map[string][]int{}
	var order []string
	for i, c := range checks {
		slot, _, _ := strings.Cut(c.Key, "|")
		if _, ok := groups[slot]; !ok {
			order = append(order, slot)
		}
		groups[slot] = append(groups[slot], i)
	}
	for _, slot := range order {
		idx := groups[slot]
		cs := make([]store.Check, len(idx))
		for j, i := range idx {
			cs[j] = checks[i]
		}
		rs := make([]store.Result, len(idx))
		if err := s.Store.Decide(ctx, cs, rs); err != nil {
			return err
		}
		for j, i := range idx {
			results[i] = rs[j]
		}
	}
	return nil
}

func newSlotted(t *testing.T) (*Limiter, *slotStore, *memory.Store) {
	l, ss, mem, _ := newSlottedClock(t)
	return l, ss, mem
}

// newSlottedClock is newSlotted on a clock the test moves, whose After
// times the refund retries' backoff.
func newSlottedClock(t *testing.T) (*Limiter, *slotStore, *memory.Store, *testkit.Clock) {
	t.Helper()
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	mem := memory.New(memory.Options{Now: clk.Now})
	ss := &slotStore{Store: mem}
	return New(ss, Options{Now: clk.Now, After: clk.After, DisableOverLimitCache: true}), ss, mem, clk
}

// advanceUntil moves clk past each backoff wait the limiter's retries are
// in, until cond holds (within 5 s of real time).
func advanceUntil(t *testing.T, clk *testkit.Clock, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, "condition", 5*time.Second, func() bool {
		if cond() {
			return true
		}
		if clk.Waiters() > 0 {
			clk.Advance(2 * time.Second)
		}
		return cond()
	})
}

func hourly(key string, limit uint64) store.Check {
	return store.Check{Key: key, Limit: limit, Window: time.Hour, Hits: 1}
}

// remaining peeks key's budget on the store itself.
func remaining(t *testing.T, mem *memory.Store, c store.Check) uint64 {
	t.Helper()
	r := make([]store.Result, 1)
	c.Hits = 0
	if err := mem.Peek(context.Background(), []store.Check{c}, r); err != nil {
		t.Fatal(err)
	}
	return r[0].Remaining
}

// TestUndoAcrossSlots: the example. multi_a (2 an hour) and multi_b
// (100 an hour) are in different slots; the third request is denied by
// multi_a, and multi_b keeps 98, not 97.
func TestUndoAcrossSlots(t *testing.T) {
	l, _, mem := newSlotted(t)
	a, b := hourly("a|multi_a=X", 2), hourly("b|multi_b=X", 100)
	for i, want := range []bool{true, true, false} {
		items := []Item{{Check: a}, {Check: b}}
		if err := l.Decide(context.Background(), items); err != nil {
			t.Fatal(err)
		}
		if got := items[0].Result.Allowed && items[1].Result.Allowed; got != want {
			t.Fatalf("request %d: allowed %v, want %v", i+1, got, want)
		}
	}
	if got := remaining(t, mem, b); got != 98 {
		t.Errorf("multi_b remaining %d, want 98: the denied request was counted on the other slot", got)
	}
	if c := l.Counters(); c.Undone != 1 || c.UndoRetried != 0 || c.UndoLost != 0 {
		t.Errorf("counters %+v, want 1 undone", c)
	}
}

// TestUndoQuota: a request denied by its quotas alone (every quota over)
// keeps nothing on its other descriptor; one quota with room lets it pass.
func TestUndoQuota(t *testing.T) {
	l, _, mem := newSlotted(t)
	reg, qa, qb := hourly("r|reg=1", 100), hourly("r|qa=1", 1), hourly("q|qb=1", 2)
	var admitted int
	for range 5 {
		items := []Item{{Check: reg}, {Check: qa, Quota: true}, {Check: qb, Quota: true}}
		if err := l.Decide(context.Background(), items); err != nil {
			t.Fatal(err)
		}
		if items[0].Result.Allowed && (items[1].Result.Allowed || items[2].Result.Allowed) {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("admitted %d, want 2 (qa 1, qb 2: the second request passes on qb)", admitted)
	}
	if got := remaining(t, mem, reg); got != 98 {
		t.Errorf("reg remaining %d, want 98 (2 admitted, 3 denied by their quotas)", got)
	}
}

// TestUndoFallbackDenial: a fail_closed check whose slot is down denies the
// request; what the healthy slot consumed is refunded.
func TestUndoFallbackDenial(t *testing.T) {
	clk := &clock{t: time.Unix(1_751_540_400, 0)}
	mem := memory.New(memory.Options{Now: clk.now})
	cs := &countingStore{Store: mem, undecided: map[string]bool{"down|k=1": true}}
	l := New(cs, Options{Now: clk.now, DisableOverLimitCache: true})
	up := hourly("up|k=1", 100)
	items := []Item{{Check: up}, {Check: hourly("down|k=1", 100), FailClosed: true}}
	if err := l.Decide(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	if items[1].Result.Allowed {
		t.Fatal("fail_closed check on a down slot allowed")
	}
	if got := remaining(t, mem, up); got != 100 {
		t.Errorf("healthy slot remaining %d, want 100: the denied request kept its consumption", got)
	}
}

// TestUndoRetried: a refund the store cannot take at once is retried in
// the background until it lands; one that never lands is counted lost.
func TestUndoRetried(t *testing.T) {
	l, ss, mem, clk := newSlottedClock(t)
	a, b := hourly("a|k=1", 0), hourly("b|k=1", 100)
	ss.refundsFail.Store(2) // the first try and the first retry fail
	if err := l.Decide(context.Background(), []Item{{Check: a}, {Check: b}}); err != nil {
		t.Fatal(err)
	}
	advanceUntil(t, clk, func() bool { return remaining(t, mem, b) == 100 })
	if c := l.Counters(); c.Undone != 1 || c.UndoRetried != 1 || c.UndoLost != 0 {
		t.Errorf("counters %+v, want 1 undone, 1 retried, 0 lost", c)
	}

	ss.refundsFail.Store(100) // never lands
	if err := l.Decide(context.Background(), []Item{{Check: a}, {Check: b}}); err != nil {
		t.Fatal(err)
	}
	advanceUntil(t, clk, func() bool { return l.Counters().UndoLost == 1 })
	if got := remaining(t, mem, b); got != 99 {
		t.Errorf("remaining %d after a lost refund, want 99 (the metric says one was lost)", got)
	}
}
