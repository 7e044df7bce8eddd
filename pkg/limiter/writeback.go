package limiter

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// writeBacks are the keys whose fail-open buckets admitted hits the store
// has not been told of. After the store answers a call, one goroutine
// writes them back (store.Check.Force), at most every writeBackEvery; what
// it cannot write stays queued for the next time.
type writeBacks struct {
	mu  sync.Mutex
	m   map[string]writeBack
	cap int

	n       atomic.Int64 // len(m), read without the lock on every decision
	running atomic.Bool
	last    atomic.Int64 // unix nanoseconds of the last start
	written atomic.Uint64
	lost    atomic.Uint64
}

// writeBack is one key's pending write-back: its rule (as a check) and the
// bucket that counted what it admitted.
type writeBack struct {
	check store.Check
	b     *bucket
}

// writeBackEvery spaces the write-back runs (a store that answers some
// calls but not all, such as a Cluster with one shard down, would
// otherwise start one per answered call).
const writeBackEvery = 50 * time.Millisecond

// writeBackBatch is the most checks one write-back store call carries.
const writeBackBatch = 64

func (w *writeBacks) init(capacity int) {
	w.m, w.cap = make(map[string]writeBack), capacity
}

// add queues c's key for write-back of what b admits.
func (w *writeBacks) add(c *store.Check, b *bucket, now int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.m[c.Key]
	switch {
	case ok && e.b != b:
		// The key's bucket was evicted and made anew: carry the old one's
		// pending hits over.
		b.restore(e.b.drain(now), now)
	case !ok && len(w.m) >= w.cap:
		w.lost.Add(c.Hits)
		b.drain(now)
		return
	}
	check := *c
	check.Hits, check.Refund, check.Shadow = 0, false, false
	w.m[c.Key] = writeBack{check: check, b: b}
	w.n.Store(int64(len(w.m)))
}

// drop forgets key's pending write-back (its counter was reset).
func (w *writeBacks) drop(key string) {
	w.mu.Lock()
	delete(w.m, key)
	w.n.Store(int64(len(w.m)))
	w.mu.Unlock()
}

// take removes and returns every pending write-back.
func (w *writeBacks) take() []writeBack {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]writeBack, 0, len(w.m))
	for _, e := range w.m {
		out = append(out, e)
	}
	clear(w.m)
	w.n.Store(0)
	return out
}

// kick starts a write-back run in the background if hits are pending and
// none ran within writeBackEvery.
func (w *writeBacks) kick(l *Limiter) {
	if w.n.Load() == 0 {
		return
	}
	now := l.opts.Now().UnixNano()
	if now-w.last.Load() < int64(writeBackEvery) || !w.running.CompareAndSwap(false, true) {
		return
	}
	w.last.Store(now)
	go func() {
		defer w.running.Store(false)
		_ = l.WriteBack(context.Background())
	}()
}

// WriteBack writes the hits admitted locally while the store could not
// answer back to the store, so the window after an outage counts them. Only
// hits that still count in their rule's trailing window are written. What
// the store cannot take now (store.ErrUnavailable) stays queued; it returns
// the first error. It runs by itself after the store answers again; call it
// on shutdown to hand over what is pending. The call is bounded by ctx's
// deadline, or the store's own timeout.
func (l *Limiter) WriteBack(ctx context.Context) error {
	pending := l.wb.take()
	if len(pending) == 0 {
		return nil
	}
	now := l.opts.Now().UnixNano()
	var firstErr error
	checks := make([]store.Check, 0, writeBackBatch)
	from := make([]writeBack, 0, writeBackBatch)
	flush := func() {
		if len(checks) == 0 {
			return
		}
		if err := l.writeBatch(ctx, checks, from, now); err != nil && firstErr == nil {
			firstErr = err
		}
		checks, from = checks[:0], from[:0]
	}
	for _, e := range pending {
		n := e.b.drain(now)
		if n == 0 {
			continue
		}
		c := e.check
		c.Hits, c.Force = n, true
		checks = append(checks, c)
		from = append(from, e)
		if len(checks) == writeBackBatch {
			flush()
		}
	}
	flush()
	return firstErr
}

// writeBatch sends one batch of write-backs and accounts for it.
func (l *Limiter) writeBatch(ctx context.Context, checks []store.Check, from []writeBack, now int64) error {
	results := make([]store.Result, len(checks))
	err := l.st.Decide(ctx, checks, results)
	for i := range checks {
		switch {
		case err == nil || (errors.Is(err, store.ErrUnavailable) && !results[i].Undecided && anyUndecided(results)):
			// Written (on a Cluster, the shards that answered took theirs).
			l.wb.written.Add(checks[i].Hits)
			l.learn(&checks[i], &results[i], now)
		case errors.Is(err, store.ErrUnavailable):
			from[i].b.restore(checks[i].Hits, now)
			l.wb.add(&checks[i], from[i].b, now)
		default:
			l.wb.lost.Add(checks[i].Hits)
		}
	}
	if err != nil && !errors.Is(err, store.ErrUnavailable) {
		l.opts.Log.Error("write-back of locally admitted hits failed; they are lost", "err", err, "keys", len(checks))
	}
	return err
}

func anyUndecided(results []store.Result) bool {
	for i := range results {
		if results[i].Undecided {
			return true
		}
	}
	return false
}
