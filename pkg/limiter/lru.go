package limiter

import (
	"hash/maphash"
	"sync"

	"github.com/rls-project/rls/pkg/lru"
)

// lruMap is a bounded map from store keys to V, split into shards that each
// evict their least recently used entries beyond their share of the caps:
// a number of entries and a number of bytes. An entry costs len(key) plus a
// per-entry overhead measured for V (the map slot, the node and the value:
// see the *Overhead constants and TestLRUEntryOverhead). It is safe for
// concurrent use; with locks held per shard, f must not block.
type lruMap[V any] struct {
	seed       maphash.Seed
	shards     []lruShard[V]
	shardCap   int
	shardBytes int64
	overhead   int64
}

type lruShard[V any] struct {
	mu      sync.Mutex
	list    *lru.List[V]
	evicted uint64 // entries dropped at a cap, since start
}

const lruShards = 32

// newLRU returns a map holding at most about capacity entries and maxBytes
// bytes, an entry costing len(key)+overhead (at least one entry per shard
// whatever its cost).
func newLRU[V any](capacity int, maxBytes, overhead int64) *lruMap[V] {
	per := (capacity + lruShards - 1) / lruShards
	if per < 1 {
		per = 1
	}
	l := &lruMap[V]{seed: maphash.MakeSeed(), shards: make([]lruShard[V], lruShards), shardCap: per,
		shardBytes: maxBytes / lruShards, overhead: overhead}
	for i := range l.shards {
		l.shards[i].list = lru.New[V](0)
	}
	return l
}

func (l *lruMap[V]) shard(key string) *lruShard[V] {
	return &l.shards[maphash.String(l.seed, key)%lruShards]
}

// lruWith runs f on the entry of key under its shard's lock. f gets the
// value and whether it exists, and returns the value to keep, whether to
// keep it (false deletes it), and a result passed back to the caller.
func lruWith[V, R any](l *lruMap[V], key string, f func(v V, ok bool) (V, bool, R)) R {
	s := l.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.list.Get(key)
	var v V
	if n != nil {
		v = n.Value
	}
	nv, keep, r := f(v, n != nil)
	switch {
	case !keep && n != nil:
		s.list.Remove(n)
	case keep && n != nil:
		n.Value = nv
		s.list.Touch(n)
	case keep:
		n = s.list.Add(key, nv, l.cost(key))
		for (s.list.Len() > l.shardCap || s.list.Bytes() > l.shardBytes) && s.list.Oldest() != n {
			s.list.Remove(s.list.Oldest())
			s.evicted++
		}
	}
	return r
}

// cost is what an entry of key counts against the byte cap.
func (l *lruMap[V]) cost(key string) int64 { return int64(len(key)) + l.overhead }

// stats returns the number of entries, what they cost and how many were
// evicted since start, in one pass over the shards.
func (l *lruMap[V]) stats() (n int, bytes int64, evicted uint64) {
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n, bytes, evicted = n+s.list.Len(), bytes+s.list.Bytes(), evicted+s.evicted
		s.mu.Unlock()
	}
	return n, bytes, evicted
}
