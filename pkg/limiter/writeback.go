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
	mu       sync.Mutex
	m        map[string]writeBack
	cap      int
	bytes    int64 // len(key)+writeBackOverhead per entry of m
	maxBytes int64

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

// flight is a write-back sent to the store and what it took.
type flight struct {
	e    writeBack
	snap wbSnap
}

// writeBackEvery spaces the write-back runs (a store that answers some
// calls but not all, such as a Cluster with one shard down, would
// otherwise start one per answered call).
const writeBackEvery = 50 * time.Millisecond

// writeBackBatch is the most checks one write-back store call carries.
const writeBackBatch = 64

func (w *writeBacks) init(capacity int, maxBytes int64) {
	w.m, w.cap, w.maxBytes = make(map[string]writeBack), capacity, maxBytes
}

// full reports whether a new entry of key would overflow a cap. w.mu is held.
func (w *writeBacks) full(key string) bool {
	return len(w.m) >= w.cap || w.bytes+writeBackCost(key) > w.maxBytes
}

func writeBackCost(key string) int64 { return int64(len(key)) + writeBackOverhead }

// put adds or replaces key's entry. w.mu is held.
func (w *writeBacks) put(key string, e writeBack) {
	if _, ok := w.m[key]; !ok {
		w.bytes += writeBackCost(key)
	}
	w.m[key] = e
	w.n.Store(int64(len(w.m)))
}

// del removes key's entry, if any. w.mu is held.
func (w *writeBacks) del(key string) {
	if _, ok := w.m[key]; ok {
		delete(w.m, key)
		w.bytes -= writeBackCost(key)
		w.n.Store(int64(len(w.m)))
	}
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
	case !ok && w.full(c.Key):
		w.lost.Add(c.Hits)
		b.drain(now)
		return
	}
	check := *c
	check.Hits, check.Refund, check.Shadow = 0, false, false
	w.put(c.Key, writeBack{check: check, b: b})
}

// requeue queues e again after a write-back the store did not take; its
// bucket still counts the hits.
func (w *writeBacks) requeue(e writeBack) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.m[e.check.Key]; !ok && !w.full(e.check.Key) {
		w.put(e.check.Key, e)
	}
}

// takeKey removes and returns key's pending write-back, if any.
func (w *writeBacks) takeKey(key string) (writeBack, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.m[key]
	if ok {
		w.del(key)
	}
	return e, ok
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
	w.bytes = 0
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
	started := l.bg.start(func() {
		defer w.running.Store(false)
		_ = l.WriteBack(l.bg.work)
	})
	if !started {
		w.running.Store(false)
	}
}

// WriteBack writes back to the store (store.Check.Force) the hits admitted
// locally that still count in their window, bounded by ctx (else the
// store's timeout), and returns the first error. What the store cannot take
// stays queued, or after Close is counted lost (Counters.WriteBackLost).
// It runs by itself when the store answers again (docs/redis.md, invariant
// 13).
func (l *Limiter) WriteBack(ctx context.Context) error {
	pending := l.wb.take()
	if len(pending) == 0 {
		return nil
	}
	now := l.opts.Now().UnixNano()
	if l.closed.Load() {
		defer l.abandonWriteBacks(now)
	}
	var firstErr error
	checks := make([]store.Check, 0, writeBackBatch)
	flights := make([]flight, 0, writeBackBatch)
	flush := func() {
		if len(checks) == 0 {
			return
		}
		results := make([]store.Result, len(checks))
		err := l.st.Decide(ctx, checks, results)
		for i := range checks {
			l.settle(flights[i], &checks[i], &results[i], err, undecided(results) > 0, now)
		}
		if err != nil && !errors.Is(err, store.ErrUnavailable) {
			if held, ok := l.writeBackLog.Allow(); ok {
				l.opts.Log.Error("write-back of locally admitted hits failed; they stay queued", "err", err, "keys", len(checks), "failures_not_logged", held)
			}
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
		checks, flights = checks[:0], flights[:0]
	}
	for _, e := range pending {
		snap := e.b.snapshot(now)
		if snap.hits == 0 {
			continue
		}
		c := e.check
		c.Hits, c.Force = snap.hits, true
		checks = append(checks, c)
		flights = append(flights, flight{e: e, snap: snap})
		if len(checks) == writeBackBatch {
			flush()
		}
	}
	flush()
	return firstErr
}

// abandonWriteBacks counts the hits still queued for write-back as lost and
// logs them once: the limiter is closed and nothing will write them.
func (l *Limiter) abandonWriteBacks(now int64) {
	var lost uint64
	for _, e := range l.wb.take() {
		lost += e.b.drain(now)
	}
	if lost == 0 {
		return
	}
	l.wb.lost.Add(lost)
	l.opts.Log.Warn("hits admitted locally could not be written back at shutdown: counted lost", "hits_lost", lost)
}

// settle accounts for one write-back the store answered with r and err:
// written where the store decided it, queued again otherwise (an unknown
// outcome too: it may count hits twice, never drops them).
func (l *Limiter) settle(f flight, c *store.Check, r *store.Result, err error, partial bool, now int64) {
	if err == nil || (errors.Is(err, store.ErrUnavailable) && partial && !r.Undecided) {
		f.e.b.commit(f.snap, now)
		l.wb.written.Add(c.Hits)
		return
	}
	l.wb.requeue(f.e)
}

// undecided counts the results the store could not decide.
func undecided(results []store.Result) (n int) {
	for i := range results {
		if results[i].Undecided {
			n++
		}
	}
	return n
}

// attachWriteBacks adds the pending write-back (a Force check) of every
// key of the sub-batch, so the store decides the request knowing what this
// replica admitted without it (a Redis that restarted empty).
func (l *Limiter) attachWriteBacks(sc *scratch, now int64) {
	n := len(sc.checks)
	for j := 0; j < n; j++ {
		e, ok := l.wb.takeKey(sc.checks[j].Key)
		if !ok {
			continue
		}
		snap := e.b.snapshot(now)
		if snap.hits == 0 {
			continue
		}
		c := e.check
		c.Hits, c.Force = snap.hits, true
		sc.idx = append(sc.idx, rideWriteBack)
		sc.checks = append(sc.checks, c)
		sc.wb = append(sc.wb, flight{e: e, snap: snap})
	}
}

// settleWriteBacks accounts for the write-backs that rode along with a
// store call that returned err.
func (l *Limiter) settleWriteBacks(sc *scratch, err error, now int64) {
	partial := undecided(sc.results) > 0
	k := 0
	for j, i := range sc.idx {
		if i != rideWriteBack {
			continue
		}
		l.settle(sc.wb[k], &sc.checks[j], &sc.results[j], err, partial, now)
		k++
	}
}
