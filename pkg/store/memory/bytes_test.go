package memory_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/store/storetest"
	"github.com/rls-project/rls/pkg/testkit"
)

// heapInUse returns the live heap after two collections.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// bigKey returns a distinct key of about 4 KB, as a descriptor with a 4 KB
// value makes.
func bigKey(i int) string {
	return fmt.Sprintf("bounds|api_key=%08d|%s", i, strings.Repeat("v", 4096))
}

func hourly(key string) store.Check {
	return store.Check{Key: key, Limit: 10, Window: time.Hour, Hits: 1}
}

// TestMemoryMaxBytes feeds 4 KB keys far beyond MaxBytes and checks both
// the accounting (Bytes) and the heap the store really keeps.
func TestMemoryMaxBytes(t *testing.T) {
	const budget = 8 << 20
	clk := testkit.NewClock(storetest.T0)
	base := heapInUse()
	m := memory.New(memory.Options{Now: clk.Now, MaxBytes: budget})
	const n = 20_000 // 80 MB of keys
	for i := range n {
		decide(t, m, hourly(bigKey(i)))
	}
	cost := int64(len(bigKey(0))) + memory.EntryOverhead
	// Each of the 64 shards may go over its share by less than one key.
	if got := m.Bytes(); got > budget {
		t.Errorf("Bytes() = %d after %d keys of %d bytes, over MaxBytes %d", got, n, len(bigKey(0)), budget)
	} else if got < budget-64*cost {
		t.Errorf("Bytes() = %d: the store keeps less than MaxBytes %d minus a key per shard", got, budget)
	}
	if got, want := int64(m.Len())*cost, m.Bytes(); got != want {
		t.Errorf("Len()*cost = %d, Bytes() = %d", got, want)
	}
	heap := heapInUse() - base
	t.Logf("%d keys of %d bytes: %d kept, Bytes() %.2f MiB, heap %.2f MiB (budget %d MiB)",
		n, len(bigKey(0)), m.Len(), float64(m.Bytes())/(1<<20), float64(heap)/(1<<20), budget>>20)
	// A 4,123-byte key takes a 4,864-byte allocation (Go's size classes):
	// allow for that rounding.
	if limit := int64(budget * 5 / 4); heap > limit {
		t.Errorf("heap grew by %d bytes, over %d (MaxBytes plus size-class rounding)", heap, limit)
	}
	runtime.KeepAlive(m)
}

// TestMemoryMaxBytesLRU checks that the byte cap evicts the least recently
// written keys, on a store of one shard.
func TestMemoryMaxBytesLRU(t *testing.T) {
	clk := testkit.NewClock(storetest.T0)
	cost := int64(len(bigKey(0))) + memory.EntryOverhead
	const fit = 10
	m := memory.New(memory.Options{Now: clk.Now, MaxKeys: 31, MaxBytes: fit * cost}) // 31 keys: one shard
	for i := range fit {
		decide(t, m, hourly(bigKey(i)))
	}
	decide(t, m, hourly(bigKey(0)))                                             // 0 is now the most recently written
	peek(t, m, hourly(bigKey(1)))                                               // a read does not count
	decide(t, m, hourly(bigKey(fit)), hourly(bigKey(fit+1)), hourly(bigKey(2))) // 2 new keys: evict 1 and 3
	if got := m.Len(); got != fit {
		t.Fatalf("Len() = %d, want %d", got, fit)
	}
	for i := range fit + 2 {
		used := 10 - peek(t, m, hourly(bigKey(i)))[0].Remaining
		want := uint64(1)
		switch i {
		case 0, 2:
			want = 2
		case 1, 3:
			want = 0 // evicted
		}
		if used != want {
			t.Errorf("key %d: %d hits counted, want %d", i, used, want)
		}
	}
}

// TestEntryOverhead measures what a key costs beyond its bytes and checks
// that EntryOverhead covers it, at several points of the maps' growth.
func TestEntryOverhead(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	for _, n := range []int{30_000, 45_000, 60_000, 90_000} {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%015d", i) // 16 bytes: no size-class rounding
		}
		clk := testkit.NewClock(storetest.T0)
		base := heapInUse()
		m := memory.New(memory.Options{Now: clk.Now, MaxKeys: 10 * n, MaxBytes: 1 << 40})
		for _, k := range keys {
			decide(t, m, hourly(k))
		}
		per := float64(heapInUse()-base) / float64(n)
		t.Logf("%d keys: %.1f bytes per entry beyond the key (EntryOverhead %d)", n, per, memory.EntryOverhead)
		if per > memory.EntryOverhead {
			t.Errorf("%d keys: %.1f bytes per entry beyond the key, over EntryOverhead %d", n, per, memory.EntryOverhead)
		}
		runtime.KeepAlive(m)
		runtime.KeepAlive(keys)
	}
}
