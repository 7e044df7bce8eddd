package limiter

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/rls-project/rls/pkg/store"
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

func put[V any](l *lruMap[V], key string, v V) {
	lruWith(l, key, func(V, bool) (V, bool, struct{}) { return v, true, struct{}{} })
}

func has[V any](l *lruMap[V], key string) bool {
	s := l.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.list.Get(key) != nil
}

// TestLRUMaxBytes feeds the three local tables of a Limiter 4 KB keys far
// beyond their byte caps, and checks the accounting and the heap they keep.
func TestLRUMaxBytes(t *testing.T) {
	const cacheBytes, bucketsBytes = 8 << 20, 4 << 20
	base := heapInUse()
	l := New(nil, Options{OverLimitCacheBytes: cacheBytes, BucketsBytes: bucketsBytes})
	const n = 20_000 // 80 MB of keys per table
	for i := range n {
		c := store.Check{Key: bigKey(i), Limit: 10, Window: 3600e9, Hits: 1}
		l.learn(&c, &store.Result{Allowed: true, Remaining: 9}, nil, 1)
		b := l.bucket(&c, 1, 1)
		b.take(&c, 1)
		l.wb.add(&c, b, 1)
	}
	cost := int64(len(bigKey(0)))
	for _, tb := range []struct {
		name       string
		got, limit int64
		overhead   int64
		lruShards  int64
	}{
		{"over_limit_cache", lruSize(l.overLimitCache), cacheBytes, overLimitCacheOverhead, lruShards},
		{"buckets", lruSize(l.local), bucketsBytes, bucketOverhead, lruShards},
		{"write-backs", l.wb.bytes, bucketsBytes, writeBackOverhead, 1},
	} {
		if tb.got > tb.limit || tb.got < tb.limit-tb.lruShards*(cost+tb.overhead) {
			t.Errorf("%s: %d bytes after %d keys of %d bytes, want at most %d and within a key per shard of it", tb.name, tb.got, n, cost, tb.limit)
		}
	}
	if got, want := int64(lruLen(l.overLimitCache))*(cost+overLimitCacheOverhead), lruSize(l.overLimitCache); got != want {
		t.Errorf("overLimitCache: len*cost = %d, size() = %d", got, want)
	}
	// Tables (what /metrics shows) reports the same sizes, and every key
	// a cap pushed out as an eviction.
	want := [3]Table{
		{"last_answers", lruLen(l.overLimitCache), lruSize(l.overLimitCache), int64(n - lruLen(l.overLimitCache))},
		{"fail_open_buckets", lruLen(l.local), lruSize(l.local), int64(n - lruLen(l.local))},
		{"write_backs", len(l.wb.m), l.wb.bytes, -1},
	}
	if got := l.Tables(); got != want {
		t.Errorf("Tables() = %+v, want %+v", got, want)
	}
	heap := heapInUse() - base
	limit := int64(cacheBytes+2*bucketsBytes) * 5 / 4 // a 4,120-byte key takes a 4,864-byte allocation (size classes)
	t.Logf("%d keys of %d bytes: over-limit cache %d keys (%.2f MiB), buckets %d (%.2f MiB), write-backs %d (%.2f MiB); heap %.2f MiB (caps %d MiB)",
		n, cost, lruLen(l.overLimitCache), float64(lruSize(l.overLimitCache))/(1<<20), lruLen(l.local), float64(lruSize(l.local))/(1<<20),
		len(l.wb.m), float64(l.wb.bytes)/(1<<20), float64(heap)/(1<<20), (cacheBytes+2*bucketsBytes)>>20)
	if heap > limit {
		t.Errorf("heap grew by %d bytes, over %d (the caps plus size-class rounding)", heap, limit)
	}
	// Dropping and taking keep the accounting.
	l.Forget(bigKey(n - 1))
	l.wb.take()
	if l.wb.bytes != 0 {
		t.Errorf("write-backs: %d bytes after take", l.wb.bytes)
	}
	runtime.KeepAlive(l)
}

// TestLRUBytesEvictsLeastRecentlyUsed checks the byte cap evicts in LRU
// order within a shard.
func TestLRUBytesEvictsLeastRecentlyUsed(t *testing.T) {
	cost := int64(len(bigKey(0))) + overLimitCacheOverhead
	const fit = 10
	l := newLRU[int](1<<20, lruShards*fit*cost, overLimitCacheOverhead)
	// Keys of one shard.
	var keys []string
	want := l.shard(bigKey(0))
	for i := 0; len(keys) < fit+2; i++ {
		if k := bigKey(i); l.shard(k) == want {
			keys = append(keys, k)
		}
	}
	for i := range fit {
		put(l, keys[i], i)
	}
	put(l, keys[0], 0)                                          // 0 is now the most recently used
	lruWith(l, keys[1], func(v int, ok bool) (int, bool, int) { // so is 1, by a read
		return v, true, v
	})
	put(l, keys[fit], fit)
	put(l, keys[fit+1], fit+1) // evicts 2 and 3
	if _, _, got := l.stats(); got != 2 {
		t.Errorf("evicted = %d, want 2", got)
	}
	for i, k := range keys {
		if got, want := has(l, k), i != 2 && i != 3; got != want {
			t.Errorf("key %d present: %v, want %v", i, got, want)
		}
	}
	if got := lruSize(l); got != fit*cost {
		t.Errorf("size() = %d, want %d", got, fit*cost)
	}
	// A key bigger than a shard's share is kept alone.
	huge := strings.Repeat("h", int(fit*cost))
	put(l, huge, -1)
	if !has(l, huge) {
		t.Error("a key over the shard's share was not kept")
	}
}

// TestLRUEntryOverhead measures what an entry of each local table costs
// beyond its key and checks the overhead constants cover it, at several
// points of the maps' growth. HeapAlloc counts every goroutine's garbage
// and allocations, so a size whose figure is over is measured again (up
// to three times) and the least of its figures is the one held to the
// constant: others' allocations only ever add to a figure.
func TestLRUEntryOverhead(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	names := []string{"over_limit_cache", "bucket", "write-back"}
	overheads := []int{overLimitCacheOverhead, bucketOverhead, writeBackOverhead}
	for _, n := range []int{30_000, 45_000, 60_000, 90_000} {
		least := []float64{math.Inf(1), math.Inf(1), math.Inf(1)}
		for attempt := 0; attempt < 3; attempt++ {
			over := false
			for i, per := range entryCosts(n) {
				least[i] = min(least[i], per)
				t.Logf("%d keys, attempt %d: %s %.1f bytes per entry beyond the key (overhead %d)", n, attempt+1, names[i], per, overheads[i])
				over = over || least[i] > float64(overheads[i])
			}
			if !over {
				break
			}
		}
		for i := range names {
			if least[i] > float64(overheads[i]) {
				t.Errorf("%d keys: %s entries cost %.1f bytes beyond the key (the least of 3 measures), over the overhead %d", n, names[i], least[i], overheads[i])
			}
		}
	}
}

// entryCosts fills each local table with n keys of 16 bytes and returns
// the heap each entry took beyond its key: over-limit cache, bucket,
// write-back.
func entryCosts(n int) [3]float64 {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%015d", i) // 16 bytes: no size-class rounding
	}
	h0 := heapInUse()
	kn := newLRU[overLimitEntry](1<<30, 1<<40, overLimitCacheOverhead)
	for _, k := range keys {
		put(kn, k, overLimitEntry{})
	}
	h1 := heapInUse()
	lb := newLRU[*bucket](1<<30, 1<<40, bucketOverhead)
	for _, k := range keys {
		put(lb, k, &bucket{})
	}
	h2 := heapInUse()
	var w writeBacks
	w.init(1<<30, 1<<40)
	b := &bucket{window: 1}
	for _, k := range keys {
		w.add(&store.Check{Key: k}, b, 0)
	}
	h3 := heapInUse()
	runtime.KeepAlive(kn)
	runtime.KeepAlive(lb)
	runtime.KeepAlive(w.m)
	runtime.KeepAlive(keys)
	return [3]float64{float64(h1-h0) / float64(n), float64(h2-h1) / float64(n), float64(h3-h2) / float64(n)}
}

// lruLen returns the number of l's entries.
func lruLen[V any](l *lruMap[V]) int {
	n, _, _ := l.stats()
	return n
}

// lruSize returns the number of bytes l's entries count for.
func lruSize[V any](l *lruMap[V]) int64 {
	_, b, _ := l.stats()
	return b
}
