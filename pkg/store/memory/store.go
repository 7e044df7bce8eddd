// Package memory is the in-process store.Store: the arithmetic of package
// store's doc over counter state kept in a sharded, bounded table, for a
// single rls instance, tests and fallback. See Store.
package memory

// This file is the storage: the sharded table, eviction, expiry and the
// Store's methods. batch.go decides a batch over it; algorithms.go is the
// per-algorithm arithmetic.

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/rls-project/rls/pkg/lru"
	"github.com/rls-project/rls/pkg/store"
)

// DefaultMaxKeys is the key capacity of a Store whose Options.MaxKeys is 0.
const DefaultMaxKeys = 1_000_000

// DefaultMaxBytes is the byte capacity of a Store whose Options.MaxBytes is 0.
const DefaultMaxBytes = 128 << 20

// EntryOverhead is what a key costs against MaxBytes beyond len(key): the
// map slot (with the spare room of a map that just grew) and the entry.
// Measured as heap in use after GC (runtime.ReadMemStats) per key on
// linux/amd64, Go 1.26, over table sizes at every point of the maps'
// growth, rounded up; TestEntryOverhead measures it again. A sliding window
// of precision N >= 2 costs 8*N+32 bytes more (its sub-window counts).
const EntryOverhead = 176

const (
	maxShards     = 64 // at most 64, so a batch's shards fit in one uint64 mask
	minShardKeys  = 16 // fewer shards than maxShards when MaxKeys is small
	sweepPerShard = 2  // entries examined for expiry per locked shard per call
	maxFree       = 64 // removed entries kept per shard for reuse
)

// Options configures New. The zero value is usable.
type Options struct {
	// Now returns the current time; nil means time.Now. The store takes all
	// its time from it, at microsecond precision.
	Now func() time.Time
	// MaxKeys bounds the number of keys holding state; 0 means
	// DefaultMaxKeys. Negative values are treated as 0.
	MaxKeys int
	// MaxBytes bounds the bytes of the keys holding state, each counting
	// len(key)+EntryOverhead; 0 means DefaultMaxBytes. Negative values are
	// treated as 0.
	MaxBytes int64
}

// Store is an in-process store.Store: docs/arithmetic.md's arithmetic over
// state kept in a sharded map, for a single rls instance, tests and
// fallback. It is safe for concurrent use; a batch is atomic even when its
// keys span shards (the shards are locked in ascending order).
//
// Time never runs backwards for a key: the clock is read before the shards
// are locked, so a batch may reach a key after another batch that read a
// later time; a key is then decided at the time of its last write (never
// rewinding its window or bucket), as it is when the clock itself steps
// back.
//
// Store is bounded. State whose TTL has passed is treated as absent and is
// reclaimed lazily when its key is accessed and by an incremental sweep: each
// Decide examines a few entries of the shards it locks and of one other
// shard (no background goroutine).
// At the cap, keys are spread over up to 64 shards, each holding at most
// MaxKeys/shards keys and MaxBytes/shards bytes (a key counting
// len(key)+EntryOverhead); writing a new key into a full shard first evicts
// that shard's least recently written keys, live or not, until the new key
// fits (a shard keeps at least the new key), so Len never exceeds MaxKeys,
// Bytes never exceeds MaxBytes by more than one key per shard, and an
// evicted key starts fresh on its next check (which, for a limit, errs
// towards allowing). Reads (check-only, Peek) do not count as
// writes for this order.
type Store struct {
	now    func() time.Time
	seed   maphash.Seed
	mask   uint64 // number of shards - 1
	shards []shard
}

var _ store.Store = (*Store)(nil)

// shard is one lock and list of keys, from the most recently written to
// the least.
type shard struct {
	mu     sync.Mutex
	list   *lru.List[counter]
	cursor *entry // next entry the sweep examines, walking oldest to newest
	cap    int
	maxB   int64
	_      [64]byte // keep hot shards on separate cache lines
}

// entry is one key's node in its shard's list.
type entry = lru.Node[counter]

// counter is the state of one key.
type counter struct {
	st      state
	expires int64 // Unix microseconds; the state is absent from then on
	seen    int64 // Unix microseconds of the last write: the key's time never goes below it
}

// New returns an empty Store configured by opts.
func New(opts Options) *Store {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	maxKeys := opts.MaxKeys
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	maxBytes := opts.MaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	n := maxShards
	for n > 1 && maxKeys/n < minShardKeys {
		n /= 2
	}
	m := &Store{
		now:    now,
		seed:   maphash.MakeSeed(),
		mask:   uint64(n - 1),
		shards: make([]shard, n),
	}
	for i := range m.shards {
		m.shards[i].list = lru.New[counter](maxFree)
		m.shards[i].cap = maxKeys / n
		m.shards[i].maxB = maxBytes / int64(n)
	}
	return m
}

// Decide decides checks atomically as package store's doc specifies and
// writes one Result per Check into results. It returns an error, and writes
// no state, if the lengths differ, ctx is done, or a check's Window is not a
// whole number of seconds of at least one second.
func (m *Store) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	return m.decide(ctx, checks, results, false)
}

// Peek reports what Decide would report if every check were check-only
// (Hits 0, no refund, no force), and writes nothing: no state, no expiry
// reclaim. Its errors are Decide's.
func (m *Store) Peek(ctx context.Context, checks []store.Check, results []store.Result) error {
	return m.decide(ctx, checks, results, true)
}

// Delete removes the state of checks' keys, which then start fresh. It
// never fails.
func (m *Store) Delete(_ context.Context, checks ...store.Check) error {
	for i := range checks {
		key := checks[i].Key
		sh := &m.shards[maphash.String(m.seed, key)&m.mask]
		sh.mu.Lock()
		if e := sh.list.Get(key); e != nil {
			sh.remove(e)
		}
		sh.mu.Unlock()
	}
	return nil
}

// Len returns the number of keys holding state, including state whose TTL
// has passed but that has not been reclaimed yet. It never exceeds MaxKeys.
func (m *Store) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += sh.list.Len()
		sh.mu.Unlock()
	}
	return n
}

// Bytes returns what the keys holding state count against MaxBytes
// (len(key)+EntryOverhead each), including state whose TTL has passed but
// that has not been reclaimed yet.
func (m *Store) Bytes() int64 {
	var n int64
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += sh.list.Bytes()
		sh.mu.Unlock()
	}
	return n
}

// Close releases nothing (a Store holds no goroutines or connections) and
// returns nil. The store remains usable.
func (m *Store) Close() error { return nil }

// write stores st under key (in e if it is non-nil, else in a new entry,
// evicting the least recently written keys to stay within the cap), with
// expiry exp and write time seen, and makes the key the most recently
// written. The shard must be locked.
func (sh *shard) write(e *entry, key string, st state, exp, seen int64) {
	c := counter{st: st, expires: exp, seen: seen}
	cost := int64(len(key)) + EntryOverhead + st.extraBytes()
	if e == nil {
		for (sh.list.Len() >= sh.cap || sh.list.Bytes()+cost > sh.maxB) && sh.list.Oldest() != nil {
			sh.remove(sh.list.Oldest())
		}
		sh.list.Add(key, c, cost)
		return
	}
	e.Value = c
	sh.list.SetCost(e, cost)
	if sh.cursor == e && e.Newer() != nil {
		sh.cursor = e.Newer() // the sweep moves past it
	}
	sh.list.Touch(e)
}

// remove deletes e's key, moving the sweep cursor past it.
func (sh *shard) remove(e *entry) {
	if sh.cursor == e {
		sh.cursor = e.Newer()
	}
	sh.list.Remove(e)
}

// sweep examines the next few entries from the cursor (which walks from the
// least recently written entry towards the most, and wraps around) and
// removes those whose TTL has passed.
func (sh *shard) sweep(now int64) {
	for i := 0; i < sweepPerShard; i++ {
		e := sh.cursor
		if e == nil {
			if e = sh.list.Oldest(); e == nil {
				return
			}
		}
		sh.cursor = e.Newer()
		if e.Value.expires <= now {
			sh.remove(e)
		}
	}
}
