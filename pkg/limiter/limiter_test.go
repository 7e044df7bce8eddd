package limiter

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// countingStore wraps a real memory store, counting calls and failing on
// demand (a hand-written fake of the outage, around real arithmetic).
type countingStore struct {
	store.Store
	calls atomic.Int64
	down  atomic.Bool
	// undecided, when set, marks only these keys undecided (a Cluster shard down).
	undecided map[string]bool
}

func (s *countingStore) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	s.calls.Add(1)
	if s.down.Load() {
		return fmt.Errorf("dial tcp: connection refused: %w", store.ErrUnavailable)
	}
	if s.undecided != nil {
		// Decide the healthy keys on the real store, mark the others.
		var ok []store.Check
		var idx []int
		for i, c := range checks {
			if s.undecided[c.Key] {
				results[i] = store.Result{Undecided: true}
				continue
			}
			ok = append(ok, c)
			idx = append(idx, i)
		}
		res := make([]store.Result, len(ok))
		if err := s.Store.Decide(ctx, ok, res); err != nil {
			return err
		}
		for j, i := range idx {
			results[i] = res[j]
		}
		return fmt.Errorf("shard down: %w", store.ErrUnavailable)
	}
	return s.Store.Decide(ctx, checks, results)
}

func setup(t *testing.T, fleet int) (*Limiter, *countingStore, *clock) {
	t.Helper()
	clk := &clock{t: time.Unix(1_751_540_400, 0)}
	cs := &countingStore{Store: memory.New(memory.Options{Now: clk.now})}
	l := New(cs, Options{Now: clk.now, FleetSize: func() int { return fleet }})
	return l, cs, clk
}

func decide(t *testing.T, l *Limiter, failClosed bool, checks ...store.Check) ([]store.Result, []Source) {
	t.Helper()
	items := make([]Item, len(checks))
	for i := range checks {
		items[i] = Item{Check: checks[i], FailClosed: failClosed}
	}
	return decideItems(t, l, items)
}

func decideItems(t *testing.T, l *Limiter, items []Item) ([]store.Result, []Source) {
	t.Helper()
	if err := l.Decide(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	res := make([]store.Result, len(items))
	src := make([]Source, len(items))
	for i := range items {
		res[i], src[i] = items[i].Result, items[i].Source
	}
	return res, src
}

func chk(key string, limit uint64, w time.Duration) store.Check {
	return store.Check{Key: key, Limit: limit, Window: w, Hits: 1}
}

func TestOverLimitCacheSparesTheStore(t *testing.T) {
	l, cs, clk := setup(t, 1)
	c := chk("rl:{d|k=v}:s60", 2, time.Minute)
	for range 2 {
		decide(t, l, false, c)
	}
	r, src := decide(t, l, false, c) // the store denies
	if r[0].Allowed || src[0] != FromStore {
		t.Fatalf("3rd: %+v from %v", r[0], src[0])
	}
	retry := r[0].RetryAfter
	calls := cs.calls.Load()
	for range 1000 {
		r, src = decide(t, l, false, c)
		if r[0].Allowed || src[0] != FromCache || r[0].Remaining != 0 {
			t.Fatalf("flood: %+v from %v", r[0], src[0])
		}
	}
	if got := cs.calls.Load() - calls; got != 0 {
		t.Fatalf("flood of 1000 denied requests cost %d store calls", got)
	}
	// The cached answer's duration shrinks with time.
	clk.add(10 * time.Second)
	r, _ = decide(t, l, false, c)
	if r[0].RetryAfter != retry-10*time.Second {
		t.Fatalf("retry %v 10s later, want %v", r[0].RetryAfter, retry-10*time.Second)
	}
	// A different limit on the same key (config change) is not answered by
	// the cached denial.
	c2 := c
	c2.Limit = 100
	c2.Hits = 0 // check only: leave the count as it is
	if _, src := decide(t, l, false, c2); src[0] != FromStore {
		t.Fatalf("changed limit answered from %v", src[0])
	}
	// After the retry time the store decides again.
	clk.add(retry - 10*time.Second)
	if r, src := decide(t, l, false, c); src[0] != FromStore || !r[0].Allowed {
		t.Fatalf("after retry: %+v from %v", r[0], src[0])
	}
}

func TestCachedDenialVetoesTheRequest(t *testing.T) {
	l, cs, _ := setup(t, 1)
	over := chk("rl:{d|a=1}:s60", 1, time.Minute)
	other := chk("rl:{d|b=1}:s60", 10, time.Minute)
	decide(t, l, false, over)
	decide(t, l, false, over) // denied by the store, now cached
	r, src := decide(t, l, false, over, other)
	if r[0].Allowed || src[0] != FromCache || !r[1].Allowed || r[1].Remaining != 10 {
		t.Fatalf("got %+v %v", r, src)
	}
	// The other check was only checked: a denied request consumes nothing.
	r, _ = decide(t, l, false, other)
	if r[0].Remaining != 9 {
		t.Fatalf("other remaining %d after a denied request, want 9", r[0].Remaining)
	}
	// A single cached key costs no store call at all.
	calls := cs.calls.Load()
	decide(t, l, false, over)
	if cs.calls.Load() != calls {
		t.Fatal("cached denial called the store")
	}
}

func TestFailOpenShare(t *testing.T) {
	l, cs, clk := setup(t, 4)
	cs.down.Store(true)
	c := chk("rl:{d|k=v}:s1", 100, time.Second)
	allowed := 0
	for range 200 {
		r, src := decide(t, l, false, c)
		if src[0] != FromFailOpen {
			t.Fatalf("source %v, want fail_open", src[0])
		}
		if r[0].Allowed {
			allowed++
		}
	}
	if allowed != 25 {
		t.Fatalf("fleet of 4, limit 100/s: %d allowed at once, want 25", allowed)
	}
	clk.add(200 * time.Millisecond) // refills 5
	allowed = 0
	for range 50 {
		if r, _ := decide(t, l, false, c); r[0].Allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("after 200ms: %d allowed, want 5", allowed)
	}
	if !l.Degraded(time.Second) {
		t.Fatal("not degraded while in fallback")
	}
	if got := l.Count(FromFailOpen); got != 250 {
		t.Fatalf("fail_open count %d, want 250", got)
	}
	// The store is back: it decides again, and the first call for the key
	// carries the 30 hits admitted locally (all in this window) with it.
	cs.down.Store(false)
	if r, src := decide(t, l, false, c); src[0] != FromStore || r[0].Remaining != 100-30-1 {
		t.Fatalf("after recovery: %+v from %v, want remaining %d", r[0], src[0], 100-30-1)
	}
	if got := l.Counters().WrittenBack; got != 30 {
		t.Fatalf("written back %d, want 30", got)
	}
	if r, _ := decide(t, l, false, c); r[0].Remaining != 100-30-2 {
		t.Fatalf("next call: remaining %d, want %d", r[0].Remaining, 100-30-2)
	}
}

func TestFailClosedDenies(t *testing.T) {
	l, cs, _ := setup(t, 1)
	cs.down.Store(true)
	r, src := decide(t, l, true, chk("rl:{d|k=v}:s60", 100, time.Minute))
	if r[0].Allowed || src[0] != FromFailClosed || r[0].RetryAfter != time.Second {
		t.Fatalf("got %+v from %v", r[0], src[0])
	}
}

func TestFallbackAllOrNothing(t *testing.T) {
	l, cs, _ := setup(t, 1)
	cs.down.Store(true)
	open := chk("rl:{d|a=1}:s60", 10, time.Minute)
	closed := chk("rl:{d|b=1}:s60", 10, time.Minute)
	res, src := decideItems(t, l, []Item{{Check: open}, {Check: closed, FailClosed: true}})
	if !res[0].Allowed || res[1].Allowed || src[0] != FromFailOpen || src[1] != FromFailClosed {
		t.Fatalf("got %+v %v", res, src)
	}
	// The fail_open check was not consumed: the request was denied.
	r, _ := decide(t, l, false, open)
	if r[0].Remaining != 9 {
		t.Fatalf("remaining %d, want 9 (the denied request took nothing)", r[0].Remaining)
	}
}

func TestPartialOutage(t *testing.T) {
	l, cs, _ := setup(t, 2)
	healthy := chk("rl:{d|a=1}:s60", 10, time.Minute)
	sick := chk("rl:{d|b=1}:s60", 10, time.Minute)
	cs.undecided = map[string]bool{sick.Key: true}
	r, src := decide(t, l, false, healthy, sick)
	if src[0] != FromStore || src[1] != FromFailOpen || r[0].Remaining != 9 || r[1].Remaining != 4 {
		t.Fatalf("got %+v %v", r, src)
	}
}

func TestCacheIsBounded(t *testing.T) {
	clk := &clock{t: time.Unix(1_751_540_400, 0)}
	l := New(memory.New(memory.Options{Now: clk.now}), Options{Now: clk.now, OverLimitCacheSize: 1000})
	for i := range 20_000 {
		c := chk(fmt.Sprintf("rl:{d|k=%d}:s60", i), 0, time.Minute) // limit 0: always denied
		decide(t, l, false, c)
	}
	if n := lruLen(l.overLimitCache); n > 1000+lruShards {
		t.Fatalf("cache holds %d entries, cap 1000", n)
	}
}

func BenchmarkCachedDenial(b *testing.B) {
	clk := &clock{t: time.Unix(1_751_540_400, 0)}
	l := New(memory.New(memory.Options{Now: clk.now}), Options{Now: clk.now})
	items := []Item{{Check: chk("rl:{d|k=v}:s60", 0, time.Minute)}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Decide(ctx, items); err != nil {
			b.Fatal(err)
		}
	}
}
