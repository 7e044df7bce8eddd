package limiter

import (
	"hash/maphash"
	"sync"
)

// lru is a bounded map from store keys to V, split into shards that each
// evict their least recently used entries beyond their share of the caps:
// a number of entries and a number of bytes. An entry costs len(key) plus a
// per-entry overhead measured for V (the map slot, the node and the value:
// see the *Overhead constants and TestLRUEntryOverhead). It is safe for
// concurrent use; with locks held per shard, f must not block.
type lru[V any] struct {
	seed       maphash.Seed
	shards     []lruShard[V]
	shardCap   int
	shardBytes int64
	overhead   int64
}

type lruShard[V any] struct {
	mu         sync.Mutex
	m          map[string]*lruNode[V]
	head, tail *lruNode[V] // head is the most recently used
	bytes      int64       // the entries' cost
	evicted    uint64      // entries dropped at a cap, since start
}

type lruNode[V any] struct {
	key        string
	val        V
	prev, next *lruNode[V]
}

const lruShards = 32

// newLRU returns a map holding at most about capacity entries and maxBytes
// bytes, an entry costing len(key)+overhead (at least one entry per shard
// whatever its cost).
func newLRU[V any](capacity int, maxBytes, overhead int64) *lru[V] {
	per := (capacity + lruShards - 1) / lruShards
	if per < 1 {
		per = 1
	}
	l := &lru[V]{seed: maphash.MakeSeed(), shards: make([]lruShard[V], lruShards), shardCap: per,
		shardBytes: maxBytes / lruShards, overhead: overhead}
	for i := range l.shards {
		l.shards[i].m = make(map[string]*lruNode[V])
	}
	return l
}

func (l *lru[V]) shard(key string) *lruShard[V] {
	return &l.shards[maphash.String(l.seed, key)%lruShards]
}

// with runs f on the entry of key under its shard's lock. f gets the value
// and whether it exists, and returns the value to keep, whether to keep it
// (false deletes it), and a result passed back to the caller.
func lruWith[V, R any](l *lru[V], key string, f func(v V, ok bool) (V, bool, R)) R {
	s := l.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.m[key]
	var v V
	if n != nil {
		v = n.val
	}
	nv, keep, r := f(v, n != nil)
	switch {
	case !keep && n != nil:
		s.unlink(n)
		delete(s.m, key)
		s.bytes -= l.cost(key)
	case keep && n != nil:
		n.val = nv
		s.unlink(n)
		s.pushFront(n)
	case keep:
		n = &lruNode[V]{key: key, val: nv}
		s.m[key] = n
		s.pushFront(n)
		s.bytes += l.cost(key)
		for (len(s.m) > l.shardCap || s.bytes > l.shardBytes) && s.tail != n {
			old := s.tail
			s.unlink(old)
			delete(s.m, old.key)
			s.bytes -= l.cost(old.key)
			s.evicted++
		}
	}
	return r
}

// cost is what an entry of key counts against the byte cap.
func (l *lru[V]) cost(key string) int64 { return int64(len(key)) + l.overhead }

// size returns the number of bytes the entries count for.
func (l *lru[V]) size() int64 {
	var n int64
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += s.bytes
		s.mu.Unlock()
	}
	return n
}

// stats returns the number of entries, what they cost and how many were
// evicted since start, in one pass over the shards.
func (l *lru[V]) stats() (n int, bytes int64, evicted uint64) {
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n, bytes, evicted = n+len(s.m), bytes+s.bytes, evicted+s.evicted
		s.mu.Unlock()
	}
	return n, bytes, evicted
}

// len returns the number of entries.
func (l *lru[V]) len() int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

func (s *lruShard[V]) unlink(n *lruNode[V]) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		s.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		s.tail = n.prev
	}
	n.prev, n.next = nil, nil
}

func (s *lruShard[V]) pushFront(n *lruNode[V]) {
	n.next = s.head
	if s.head != nil {
		s.head.prev = n
	}
	s.head = n
	if s.tail == nil {
		s.tail = n
	}
}
