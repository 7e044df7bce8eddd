package memory_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/store/storetest"
	"github.com/rls-project/rls/pkg/testkit"
)

// clockOpts are the options of a store on clk's time, at most maxKeys keys.
func clockOpts(clk *testkit.Clock, maxKeys int) memory.Options {
	return memory.Options{Now: clk.Now, MaxKeys: maxKeys}
}

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) store.Store {
		return memory.New(memory.Options{Now: now})
	})
}

func TestMemoryConcurrent(t *testing.T) {
	clk := testkit.NewClock(storetest.T0)
	storetest.RunConcurrent(t, memory.New(clockOpts(clk, 0)))
}

func sliding(key string, limit, hits uint64) store.Check {
	return store.Check{Key: key, Limit: limit, Window: time.Second, Hits: hits}
}

func decide(t *testing.T, m *memory.Store, checks ...store.Check) []store.Result {
	t.Helper()
	res := make([]store.Result, len(checks))
	if err := m.Decide(context.Background(), checks, res); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return res
}

func peek(t *testing.T, m *memory.Store, checks ...store.Check) []store.Result {
	t.Helper()
	res := make([]store.Result, len(checks))
	if err := m.Peek(context.Background(), checks, res); err != nil {
		t.Fatalf("Peek: %v", err)
	}
	return res
}

func TestMemoryMaxKeys(t *testing.T) {
	tests := []struct {
		name    string
		maxKeys int
		keys    int
	}{
		{"1000 of 100k", 1000, 100_000},
		{"10 of 100k (one shard)", 10, 100_000},
		{"default of 100k", 0, 100_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := testkit.NewClock(storetest.T0)
			m := memory.New(clockOpts(clk, tt.maxKeys))
			limit := tt.maxKeys
			if limit == 0 {
				limit = memory.DefaultMaxKeys
			}
			for i := 0; i < tt.keys; i++ {
				decide(t, m, sliding("k"+strconv.Itoa(i), 10, 1))
				if i%1000 == 0 && m.Len() > limit {
					t.Fatalf("after %d keys Len() = %d > %d", i+1, m.Len(), limit)
				}
			}
			if n := m.Len(); n > limit || n == 0 {
				t.Fatalf("Len() = %d, want 1..%d", n, limit)
			}
			// The last key written survives.
			last := "k" + strconv.Itoa(tt.keys-1)
			if got := peek(t, m, sliding(last, 10, 0))[0].Remaining; got != 9 {
				t.Errorf("last key: Remaining %d, want 9", got)
			}
		})
	}
}

func TestMemoryEvictsLeastRecentlyWritten(t *testing.T) {
	clk := testkit.NewClock(storetest.T0)
	m := memory.New(clockOpts(clk, 3)) // one shard of 3 keys
	for _, k := range []string{"a", "b", "c"} {
		decide(t, m, sliding(k, 10, 1))
	}
	peek(t, m, sliding("a", 10, 0)) // a read is not a write
	decide(t, m, sliding("b", 10, 0))
	decide(t, m, sliding("a", 10, 1)) // a is now the most recently written
	decide(t, m, sliding("d", 10, 1)) // evicts b
	want := map[string]uint64{"a": 8, "b": 10, "c": 9, "d": 9}
	for k, w := range want {
		if got := peek(t, m, sliding(k, 10, 0))[0].Remaining; got != w {
			t.Errorf("%s: Remaining %d, want %d", k, got, w)
		}
	}
	if n := m.Len(); n != 3 {
		t.Errorf("Len() = %d, want 3", n)
	}
}

func TestMemoryReclaimsExpired(t *testing.T) {
	clk := testkit.NewClock(storetest.T0)
	m := memory.New(clockOpts(clk, 0))
	const stale = 10_000
	for i := 0; i < stale; i++ {
		decide(t, m, sliding("stale"+strconv.Itoa(i), 10, 1))
	}
	if n := m.Len(); n != stale {
		t.Fatalf("Len() = %d, want %d", n, stale)
	}
	clk.Advance(2 * time.Second) // the sliding TTL: all stale
	// Traffic on a few live keys sweeps every shard.
	const live = 200
	for round := 0; round < 200 && m.Len() > live; round++ {
		for i := 0; i < live; i++ {
			clk.Advance(time.Microsecond)
			decide(t, m, sliding("live"+strconv.Itoa(i), 1000, 1))
		}
	}
	if n := m.Len(); n != live {
		t.Fatalf("Len() = %d after the sweep, want %d", n, live)
	}

	// Lazy reclaim on access: an expired key starts fresh.
	clk.Advance(2 * time.Second)
	if got := decide(t, m, sliding("live0", 1000, 0))[0].Remaining; got != 1000 {
		t.Errorf("expired key: Remaining %d, want 1000", got)
	}
}

func TestMemoryPeekAndDelete(t *testing.T) {
	clk := testkit.NewClock(storetest.T0)
	m := memory.New(clockOpts(clk, 0))
	decide(t, m, sliding("k", 10, 4))
	tests := []struct {
		name  string
		check store.Check
		want  store.Result
	}{
		{"consuming", sliding("k", 10, 3), store.Result{Allowed: true, Remaining: 6, Reset: time.Second}},
		{"refund", store.Check{Key: "k", Limit: 10, Window: time.Second, Hits: 3, Refund: true},
			store.Result{Allowed: true, Remaining: 6, Reset: time.Second}},
		{"over", sliding("k", 5, 9), store.Result{Allowed: true, Remaining: 1, Reset: time.Second}},
		{"absent", sliding("other", 10, 3), store.Result{Allowed: true, Remaining: 10, Reset: time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := peek(t, m, tt.check)[0]; got != tt.want {
				t.Errorf("Peek = %+v, want %+v", got, tt.want)
			}
		})
	}
	if n := m.Len(); n != 1 {
		t.Errorf("Len() = %d after Peek, want 1", n)
	}
	if err := m.Delete(context.Background(), store.Check{Key: "k"}, store.Check{Key: "missing"}); err != nil {
		t.Fatal(err)
	}
	if n := m.Len(); n != 0 {
		t.Errorf("Len() = %d after Delete, want 0", n)
	}
	if got := peek(t, m, sliding("k", 10, 0))[0].Remaining; got != 10 {
		t.Errorf("deleted key: Remaining %d, want 10", got)
	}
}

func TestMemoryErrors(t *testing.T) {
	m := memory.New(memory.Options{})
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		checks  []store.Check
		results int
	}{
		{"length mismatch", context.Background(), []store.Check{sliding("k", 1, 1)}, 2},
		{"zero window", context.Background(), []store.Check{{Key: "k", Limit: 1, Hits: 1}}, 1},
		{"fractional window", context.Background(), []store.Check{{Key: "k", Limit: 1, Window: 1500 * time.Millisecond, Hits: 1}}, 1},
		{"canceled", canceled, []store.Check{sliding("k", 1, 1)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := m.Decide(tt.ctx, tt.checks, make([]store.Result, tt.results)); err == nil {
				t.Error("Decide: no error")
			}
		})
	}
	if n := m.Len(); n != 0 {
		t.Errorf("Len() = %d, want 0", n)
	}
	if err := m.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestMemoryCrossShardAtomic races batches over many key pairs (so most span
// shards) in both orders: every allowed batch consumes on both keys, so both
// counts must end equal, and lock ordering must not deadlock.
func TestMemoryCrossShardAtomic(t *testing.T) {
	clk := testkit.NewClock(storetest.T0)
	m := memory.New(clockOpts(clk, 0))
	const pairs, goroutines, perG = 16, 32, 200
	check := func(key string, limit, hits uint64) store.Check {
		return store.Check{Key: key, Algorithm: store.FixedWindow, Limit: limit, Window: time.Hour, Hits: hits}
	}
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := make([]store.Result, 2)
			for i := 0; i < perG; i++ {
				p := (g + i) % pairs
				a, b := check(fmt.Sprintf("a%d", p), 100, 1), check(fmt.Sprintf("b%d", p), 1000, 1)
				checks := []store.Check{a, b}
				if g%2 == 1 {
					checks = []store.Check{b, a}
				}
				if err := m.Decide(context.Background(), checks, res); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for p := 0; p < pairs; p++ {
		got := peek(t, m, check(fmt.Sprintf("a%d", p), 100, 0), check(fmt.Sprintf("b%d", p), 1000, 0))
		if got[0].Remaining != 0 || got[1].Remaining != 900 {
			t.Errorf("pair %d: remaining a %d b %d, want 0 and 900", p, got[0].Remaining, got[1].Remaining)
		}
	}
}

func TestMemoryDecideAllocs(t *testing.T) {
	clk := testkit.NewClock(storetest.T0)
	m := memory.New(clockOpts(clk, 0))
	tests := []struct {
		name   string
		checks []store.Check
	}{
		{"sliding", []store.Check{sliding("k", 1<<40, 1)}},
		{"bucket", []store.Check{{Key: "t", Algorithm: store.TokenBucket, Limit: 1 << 40, Window: time.Second, Hits: 1}}},
		{"fixed", []store.Check{{Key: "f", Algorithm: store.FixedWindow, Limit: 1 << 40, Window: time.Second, Hits: 1}}},
		{"batch of 4", []store.Check{sliding("b1", 1<<40, 1), sliding("b2", 1<<40, 1), sliding("b3", 1<<40, 1), sliding("b4", 1<<40, 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := make([]store.Result, len(tt.checks))
			ctx := context.Background()
			_ = m.Decide(ctx, tt.checks, res)
			allocs := testing.AllocsPerRun(1000, func() {
				clk.Advance(time.Microsecond)
				_ = m.Decide(ctx, tt.checks, res)
			})
			if allocs != 0 {
				t.Errorf("%v allocs per Decide, want 0", allocs)
			}
		})
	}
}

func benchChecks() []struct {
	name  string
	check store.Check
} {
	return []struct {
		name  string
		check store.Check
	}{
		{"sliding", store.Check{Key: "rl:{api_key_0123456789}:route", Algorithm: store.SlidingWindow, Limit: 1 << 40, Window: time.Second, Hits: 1}},
		{"bucket", store.Check{Key: "rl:{api_key_0123456789}:route", Algorithm: store.TokenBucket, Limit: 1 << 40, Window: time.Second, Hits: 1}},
		{"fixed", store.Check{Key: "rl:{api_key_0123456789}:route", Algorithm: store.FixedWindow, Limit: 1 << 40, Window: time.Second, Hits: 1}},
	}
}

// BenchmarkMemoryDecide measures a steady-state Decide of one check on an
// existing key, with the real clock.
func BenchmarkMemoryDecide(b *testing.B) {
	for _, bc := range benchChecks() {
		b.Run(bc.name, func(b *testing.B) {
			m := memory.New(memory.Options{})
			checks := []store.Check{bc.check}
			res := make([]store.Result, 1)
			ctx := context.Background()
			_ = m.Decide(ctx, checks, res)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				_ = m.Decide(ctx, checks, res)
			}
		})
	}
}

// BenchmarkMemoryDecideParallel measures Decide from GOMAXPROCS goroutines,
// each on its own existing keys ("distinct") or all on one key ("shared").
func BenchmarkMemoryDecideParallel(b *testing.B) {
	for _, shared := range []bool{false, true} {
		name := "distinct"
		if shared {
			name = "shared"
		}
		b.Run(name, func(b *testing.B) {
			m := memory.New(memory.Options{})
			var next atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				const keys = 64
				n := next.Add(1)
				checks := make([][]store.Check, keys)
				for i := range checks {
					key := "shared"
					if !shared {
						key = fmt.Sprintf("rl:{key_%d_%d}:route", n, i)
					}
					checks[i] = []store.Check{{Key: key, Limit: 1 << 40, Window: time.Second, Hits: 1}}
				}
				res := make([]store.Result, 1)
				ctx := context.Background()
				for i := 0; pb.Next(); i++ {
					_ = m.Decide(ctx, checks[i%keys], res)
				}
			})
		})
	}
}

// BenchmarkMemoryDecideBatch measures a batch of four checks spanning shards.
func BenchmarkMemoryDecideBatch(b *testing.B) {
	m := memory.New(memory.Options{})
	checks := make([]store.Check, 4)
	for i := range checks {
		checks[i] = store.Check{Key: "rl:{api_key}:route" + strconv.Itoa(i), Limit: 1 << 40, Window: time.Second, Hits: 1}
	}
	res := make([]store.Result, len(checks))
	ctx := context.Background()
	_ = m.Decide(ctx, checks, res)
	b.ReportAllocs()
	for b.Loop() {
		_ = m.Decide(ctx, checks, res)
	}
}
