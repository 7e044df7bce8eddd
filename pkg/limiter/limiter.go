// Package limiter makes the decision around a store: its routes (the
// over-limit cache, leases, the store, the fallback, the refund of a
// request denied after all) are docs/ARCHITECTURE.md's table, and their
// invariants docs/redis.md's 10 to 17.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rls-project/rls/pkg/logthrottle"
	"github.com/rls-project/rls/pkg/store"
)

// Source says where a check's result came from.
type Source uint8

// The sources of a result.
const (
	FromStore      Source = iota // the store decided
	FromCache                    // the local over-limit cache denied it
	FromFailOpen                 // store unavailable: the local fail-open bucket decided
	FromFailClosed               // store unavailable: denied by the rule's fail_closed
	FromReserve                  // admitted from a lease of hits counted in the store (lease.go)
	numSources
)

// Sources lists every Source, in order.
var Sources = [numSources]Source{FromStore, FromCache, FromFailOpen, FromFailClosed, FromReserve}

// String names the source as metrics and logs show it.
func (s Source) String() string {
	if s < numSources {
		return [...]string{"store", "local_cache", "fail_open", "fail_closed", "reserved"}[s]
	}
	return "unknown"
}

// Cause says why a batch was decided without the store.
type Cause uint8

// The causes of a fallback.
const (
	CauseDeadline    Cause = iota // the caller's deadline (or the store timeout) ran out first
	CauseUnavailable              // the store answered with an error (refused, down, failing over)
	CauseCircuitOpen              // the store's circuit breaker is open: it has been failing
	numCauses
)

// Causes lists every Cause, in order.
var Causes = [numCauses]Cause{CauseDeadline, CauseUnavailable, CauseCircuitOpen}

// String names the cause as metrics show it.
func (c Cause) String() string {
	if c < numCauses {
		return [...]string{"deadline", "unavailable", "circuit_open"}[c]
	}
	return "unknown"
}

func causeOf(err error) Cause {
	switch {
	case errors.Is(err, store.ErrCircuitOpen):
		return CauseCircuitOpen
	case errors.Is(err, context.DeadlineExceeded):
		return CauseDeadline
	}
	return CauseUnavailable
}

// Options configure a Limiter. Zero fields take the defaults in brackets.
// An entry of a local table counts len(key) plus a per-entry overhead
// measured on linux/amd64 against its byte cap.
type Options struct {
	FleetSize             func() int    // replicas sharing the limits [always 1]
	OverLimitCacheSize    int           // entries of what the store last said per key [100000]
	BucketsSize           int           // entries of the fail-open buckets, and of the pending write-backs [100000]
	OverLimitCacheBytes   int64         // [DefaultOverLimitCacheBytes]
	BucketsBytes          int64         // each of the fail-open buckets and the write-backs [DefaultBucketsBytes]
	FailClosedRetry       time.Duration // the retry time of a fail_closed denial [1s]
	DisableOverLimitCache bool          // no cached denials (what the store said still seeds the fallback)
	Reserve               bool          // leases (lease.go)
	ReserveBytes          int64         // the lease table's bytes [DefaultReserveBytes]
	Now                   func() time.Time
	After                 func(time.Duration) <-chan time.Time // the retries' backoff timer [time.After]
	Log                   *slog.Logger                         // fallback reports and write-back failures [discard]
}

// The default byte caps of the local tables: 64 MiB in all, half for what
// the store last said, a quarter each for the fail-open buckets and the
// pending write-backs.
const (
	DefaultOverLimitCacheBytes = 32 << 20
	DefaultBucketsBytes        = 16 << 20
)

// What one entry of each local table costs beyond len(key): heap in use
// per entry on linux/amd64 over every point of the maps' growth, rounded
// up (TestLRUEntryOverhead measures them again).
const (
	overLimitCacheOverhead = 176 // measured 150-169
	bucketOverhead         = 192 // measured 167-185
	writeBackOverhead      = 272 // measured 175-256.1 (the map holds the check inline)
)

// Item is one check of a request as the limiter decides it: the check and
// its policies in, the result and where it came from out.
type Item struct {
	Check      store.Check
	FailClosed bool // deny, rather than take from the local share, when the store cannot answer
	Quota      bool // envoyproxy/ratelimit's quota_mode (see vetoes); the store sees a shadow check
	NoReserve  bool // never leases (the rule's reserve: false)
	Result     store.Result
	Source     Source
}

// Counters are the limiter's running totals since it was made.
type Counters struct {
	Sources        [numSources]uint64 // results by source
	Causes         [numCauses]uint64  // batches decided without the store, by cause
	WrittenBack    uint64             // hits admitted locally, then written to the store
	WriteBackLost  uint64             // ... that could not be (the table was full, or the limiter closed)
	ProtocolErrors uint64             // store answers rls could not use (store.ErrProtocol)
	// Undone: checks refunded for a request denied after the store consumed
	// them (undo.go); UndoRetried: refunds (clients' too) retried in the
	// background; UndoLost: never taken; UndoUnknown: a call that timed out
	// after it may have been sent, neither refunded nor retried.
	Undone, UndoRetried, UndoLost, UndoUnknown uint64
	// Lease hits: granted, used, returned unused, expired unused (lease.go).
	ReservedGranted, ReservedUsed, ReservedReturned, ReservedExpired uint64
}

// Limiter decides batches of checks. It is safe for concurrent use.
type Limiter struct {
	st             store.Store
	opts           Options
	overLimitCache *lruMap[overLimitEntry]
	local          *lruMap[*bucket]
	wb             writeBacks
	res            *leases   // nil: leases are off
	pool           sync.Pool // *scratch
	answered       atomic.Bool

	sources      [numSources]atomic.Uint64
	causes       [numCauses]atomic.Uint64
	protocol     atomic.Uint64
	lastFallbk   atomic.Int64 // unix nanoseconds of the last fallback decision
	fallbackLog  *logthrottle.Throttle
	refundLog    *logthrottle.Throttle
	writeBackLog *logthrottle.Throttle
	bg           background
	closed       atomic.Bool // Close has returned: no background work is left

	undone, undoRetried, undoLost atomic.Uint64
	undoUnknown                   atomic.Uint64
	undoInFlight                  atomic.Int64
	undoBackoff                   []time.Duration
}

// New returns a Limiter deciding on st.
func New(st store.Store, opts Options) *Limiter {
	if opts.FleetSize == nil {
		opts.FleetSize = func() int { return 1 }
	}
	if opts.OverLimitCacheSize <= 0 {
		opts.OverLimitCacheSize = 100_000
	}
	if opts.BucketsSize <= 0 {
		opts.BucketsSize = 100_000
	}
	if opts.OverLimitCacheBytes <= 0 {
		opts.OverLimitCacheBytes = DefaultOverLimitCacheBytes
	}
	if opts.BucketsBytes <= 0 {
		opts.BucketsBytes = DefaultBucketsBytes
	}
	if opts.FailClosedRetry <= 0 {
		opts.FailClosedRetry = time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.After == nil {
		opts.After = time.After
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	l := &Limiter{st: st, opts: opts, undoBackoff: defaultUndoBackoff,
		overLimitCache: newLRU[overLimitEntry](opts.OverLimitCacheSize, opts.OverLimitCacheBytes, overLimitCacheOverhead),
		local:          newLRU[*bucket](opts.BucketsSize, opts.BucketsBytes, bucketOverhead)}
	l.wb.init(opts.BucketsSize, opts.BucketsBytes)
	l.bg.init()
	l.fallbackLog = logthrottle.New(logthrottle.Every, opts.Now)
	l.refundLog = logthrottle.New(logthrottle.Every, opts.Now)
	l.writeBackLog = logthrottle.New(logthrottle.Every, opts.Now)
	if opts.Reserve {
		if opts.ReserveBytes <= 0 {
			opts.ReserveBytes = DefaultReserveBytes
		}
		l.res = newLeases(opts.ReserveBytes)
	}
	l.pool.New = func() any { return new(scratch) }
	return l
}

// scratch is the sub-batch sent to the store: the checks neither the
// cache nor a lease answered, and their positions in the caller's batch.
// A write-back riding along has position rideWriteBack (its entry in wb,
// in order), a lease's unused hits going back rideReturn.
type scratch struct {
	idx     []int
	checks  []store.Check
	results []store.Result
	wb      []flight
}

// Positions of the checks that ride along with a batch.
const (
	rideWriteBack = -1
	rideReturn    = -2
)

// Decide decides items: it sets each item's Result and Source. Its routes,
// in order, are docs/ARCHITECTURE.md's: a local denial, live leases, the
// store (which also grants leases), the fallback, and the refund of a
// request denied after all. It returns an error only when the caller's
// context ends or the store fails in a way no fallback covers (an error
// that is not store.ErrUnavailable).
func (l *Limiter) Decide(ctx context.Context, items []Item) error {
	now := l.opts.Now()
	nowNs := now.UnixNano()
	vetoed := l.fromCache(items, nowNs)
	if !vetoed && l.res != nil && l.fromLeases(items, nowNs) {
		return nil
	}
	sc := l.pool.Get().(*scratch)
	defer l.pool.Put(sc)
	if !sc.fill(items, vetoed) {
		return nil
	}
	l.prepare(items, sc, vetoed, nowNs)
	sc.clearResults()

	err := l.callStore(ctx, now, sc)
	if err == nil || (errors.Is(err, store.ErrUnavailable) && undecided(sc.results) < len(sc.results)) {
		l.answered.Store(true)
	}
	if len(sc.wb) > 0 {
		l.settleWriteBacks(sc, err, nowNs)
		clear(sc.wb) // the pool must not keep buckets alive
	}
	if stop, err := l.storeFailed(ctx, err, nowNs, items, sc); stop {
		l.settleLeases(items, sc, false, nowNs)
		return err
	}
	unknown := l.collect(items, sc, err, nowNs)
	denied := vetoes(items, func(i int) bool { return !items[i].Result.Allowed })
	l.settleLeases(items, sc, !denied, nowNs)
	if denied {
		l.undoUnknown.Add(uint64(unknown))
		l.undo(ctx, items)
	}
	return nil
}

// StoreAnswered reports whether the store has answered a decision since
// the limiter was made. Until it has, fail_open rules deny as fail_closed
// ones do: a store never reached is a wrong address, not an outage
// (docs/redis.md, invariant 13).
func (l *Limiter) StoreAnswered() bool { return l.answered.Load() }

// MarkStoreAnswered records that the store answered outside a decision
// (a readiness probe).
func (l *Limiter) MarkStoreAnswered() { l.answered.Store(true) }

// fill makes sc the sub-batch of items no local answer took (only
// checking, when a local denial vetoed the request), and reports whether
// it has any check.
func (sc *scratch) fill(items []Item, vetoed bool) bool {
	sc.idx, sc.checks, sc.wb = sc.idx[:0], sc.checks[:0], sc.wb[:0]
	for i := range items {
		if items[i].Source != FromStore {
			continue
		}
		c := items[i].Check
		c.Shadow = c.Shadow || items[i].Quota // quotas never veto in the store: see vetoes
		if vetoed && !c.Refund && !c.Force {
			c.Hits = 0 // a local denial vetoed the request: the rest only checks
		}
		sc.idx = append(sc.idx, i)
		sc.checks = append(sc.checks, c)
	}
	return len(sc.checks) > 0
}

// prepare completes the sub-batch: a consuming check whose key the store
// last reported near its limit is marked Exact (the script decides it);
// leasable checks of a request no local denial vetoed ask for leases and
// carry back their ended leases' unused hits; write-backs ride along.
func (l *Limiter) prepare(items []Item, sc *scratch, vetoed bool, now int64) {
	fleet := l.opts.FleetSize()
	n := len(sc.checks)
	ask := l.res != nil && !vetoed && allLeasable(items) // a lease serves requests like this one
	for j := 0; j < n; j++ {
		if !sc.checks[j].Consuming() {
			continue
		}
		k, known := l.lookup(&sc.checks[j])
		if ask {
			if ret := l.res.ask(&sc.checks[j], k, known, fleet, now); ret.Hits > 0 {
				sc.idx = append(sc.idx, rideReturn)
				sc.checks = append(sc.checks, ret)
			}
		}
		c := &sc.checks[j]
		c.Exact = known && (k.deniedHits > 0 || k.remaining < nearBelow*(c.Hits+c.Want))
	}
	if l.wb.n.Load() > 0 {
		l.attachWriteBacks(sc, now)
	}
}

// settleLeases accounts for the lease requests and returns of a store
// call: a lease the store granted starts deciding when the request stood
// (else the request's refund takes it back); a return that did not land
// counts its hits expired.
func (l *Limiter) settleLeases(items []Item, sc *scratch, stood bool, sent int64) {
	if l.res == nil {
		return
	}
	arrived := l.opts.Now().UnixNano()
	for j, i := range sc.idx {
		c, r := &sc.checks[j], &sc.results[j]
		switch {
		case i == rideReturn:
			l.res.settleReturn(c.Hits, !r.Undecided && r.Allowed)
		case i >= 0 && c.Want > 0:
			// A denied check may hold a queued lease (store's Leases).
			l.res.grant(c, r, (stood && r.Consumed) || (!r.Allowed && !r.Undecided), sent, arrived)
		}
	}
}

// clearResults sizes sc.results to sc.checks, zeroed.
func (sc *scratch) clearResults() {
	if cap(sc.results) < len(sc.checks) {
		sc.results = make([]store.Result, len(sc.checks))
	}
	sc.results = sc.results[:len(sc.checks)]
	clear(sc.results)
}

// storeFailed handles the store call's err: nothing to do but start the
// write-backs when it answered, the fallback when it could not, and stop
// (with the error Decide returns) when no fallback covers it or the caller
// is gone.
func (l *Limiter) storeFailed(ctx context.Context, err error, now int64, items []Item, sc *scratch) (stop bool, _ error) {
	switch {
	case err == nil:
		l.wb.kick(l)
		return false, nil
	case errors.Is(err, store.ErrProtocol):
		l.protocol.Add(1)
		return true, err
	case !errors.Is(err, store.ErrUnavailable):
		return true, err
	case ctx.Err() != nil:
		return true, ctx.Err() // the caller is gone; no fallback answer is wanted
	}
	l.fallback(now, items, sc, err)
	return false, nil
}

// collect copies the sub-batch's results into items and learns what the
// store decided. It returns the number of consuming checks whose call may
// have run after it timed out: their consumption is unknown, and is not
// refunded (docs/redis.md, invariant 10).
func (l *Limiter) collect(items []Item, sc *scratch, err error, now int64) (unknown int) {
	sent := err != nil && maybeSent(err)
	fromStore := 0
	for j, i := range sc.idx {
		if i < 0 {
			continue // a write-back riding along
		}
		it := &items[i]
		it.Result = sc.results[j]
		if it.Result.Undecided {
			it.Result.Undecided = false
			if sent && sc.checks[j].Consuming() {
				unknown++
			}
			continue
		}
		fromStore++
		l.learn(&sc.checks[j], &it.Result, sc, now) // the check as sent (a vetoed one only checked)
		if l.res != nil && it.Result.Lease.Hits == 0 {
			l.res.observe(&sc.checks[j], it.Result.Remaining)
		}
		it.Result.Remaining += it.Result.Lease.Now // held here for the key's next requests
	}
	l.sources[FromStore].Add(uint64(fromStore))
	return unknown
}

// keyHits returns the hits the sub-batch asks of key in all, a check-only
// check counting one. The store decides a key's checks of a batch in turn,
// so a denial of any of them is a denial of this total.
func (sc *scratch) keyHits(key string) uint64 {
	var n uint64
	for j := range sc.checks {
		c := &sc.checks[j]
		if sc.idx[j] >= 0 && c.Key == key && !c.Refund && !c.Force {
			n += max(c.Hits, 1)
		}
	}
	return n
}

// maybeSent reports whether a store call that failed with err may have
// reached Redis and run after all: it timed out after it was sent (the
// caller's deadline, or a socket's read timeout, which the net package
// reports as os.ErrDeadlineExceeded).
func maybeSent(err error) bool {
	return (causeOf(err) == CauseDeadline && !errors.Is(err, errNoTime)) || errors.Is(err, os.ErrDeadlineExceeded)
}

// errNoTime is the store's answer when the caller's deadline leaves no time
// to ask it.
var errNoTime = fmt.Errorf("%w: the caller's deadline leaves no time for the store: %w", store.ErrUnavailable, context.DeadlineExceeded)

// callStore asks the store, within the caller's deadline less a margin for
// the answer (the store's own timeout when the caller sent no deadline).
func (l *Limiter) callStore(ctx context.Context, now time.Time, sc *scratch) error {
	return l.callStoreWith(ctx, now, sc.checks, sc.results)
}

// callStoreWith is callStore for any checks and results.
func (l *Limiter) callStoreWith(ctx context.Context, now time.Time, checks []store.Check, results []store.Result) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		return l.st.Decide(ctx, checks, results)
	}
	left := deadline.Sub(now)
	budget := left - answerMargin(left)
	if budget <= 0 {
		return errNoTime
	}
	sctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	return l.st.Decide(sctx, checks, results)
}

// answerMargin is the part of the caller's remaining time kept for
// deciding locally and answering when the store is late: a fifth, between
// 1 ms and 5 ms (Envoy's default 20 ms leaves the store 16 ms).
func answerMargin(left time.Duration) time.Duration {
	return min(max(left/5, time.Millisecond), 5*time.Millisecond)
}

// Degraded reports whether a fallback decision was made within the last
// window (the store could not answer recently).
func (l *Limiter) Degraded(window time.Duration) bool {
	last := l.lastFallbk.Load()
	return last != 0 && l.opts.Now().UnixNano()-last < int64(window)
}

// Count returns how many results came from s since start.
func (l *Limiter) Count(s Source) uint64 {
	if s >= numSources {
		return 0
	}
	return l.sources[s].Load()
}

// Counters returns the limiter's running totals.
func (l *Limiter) Counters() Counters {
	var c Counters
	for s := range numSources {
		c.Sources[s] = l.Count(s)
	}
	for i := range numCauses {
		c.Causes[i] = l.causes[i].Load()
	}
	c.WrittenBack, c.WriteBackLost = l.wb.written.Load(), l.wb.lost.Load()
	c.ProtocolErrors = l.protocol.Load()
	c.Undone, c.UndoRetried, c.UndoLost = l.undone.Load(), l.undoRetried.Load(), l.undoLost.Load()
	c.UndoUnknown = l.undoUnknown.Load()
	if l.res != nil {
		c.ReservedGranted, c.ReservedUsed = l.res.granted.Load(), l.res.used.Load()
		c.ReservedReturned, c.ReservedExpired = l.res.returned.Load(), l.res.expired.Load()
	}
	return c
}

// Table is one local table's size, for metrics.
type Table struct {
	// Name is the table's metric label: last_answers (the over-limit
	// cache), fail_open_buckets or write_backs.
	Name    string
	Entries int
	Bytes   int64 // what the entries count against the table's byte cap
	// Evictions counts the least recently used entries dropped at a cap
	// since start; -1 for write_backs, which never evicts (a hit that
	// finds it full is counted in Counters.WriteBackLost).
	Evictions int64
}

// Tables returns the sizes of the local tables: the over-limit cache (what
// the store last said per key: its denials and the fail-open seeds), the
// fail-open buckets, and the keys waiting for write-back. It locks every shard in
// turn: for scrapes, not for the decision path.
func (l *Limiter) Tables() [3]Table {
	kn, kb, ke := l.overLimitCache.stats()
	bn, bb, be := l.local.stats()
	l.wb.mu.Lock()
	wn, wb := len(l.wb.m), l.wb.bytes
	l.wb.mu.Unlock()
	return [3]Table{
		{Name: "last_answers", Entries: kn, Bytes: kb, Evictions: int64(ke)},
		{Name: "fail_open_buckets", Entries: bn, Bytes: bb, Evictions: int64(be)},
		{Name: "write_backs", Entries: wn, Bytes: wb, Evictions: -1},
	}
}

// Forget drops keys from every local table (the over-limit cache, the
// leases, the fail-open buckets and their pending write-backs), so a counter reset by
// an operator is not denied, nor charged, from stale local state.
func (l *Limiter) Forget(keys ...string) {
	for _, k := range keys {
		lruWith(l.overLimitCache, k, func(v overLimitEntry, _ bool) (overLimitEntry, bool, struct{}) { return v, false, struct{}{} })
		lruWith(l.local, k, func(b *bucket, _ bool) (*bucket, bool, struct{}) { return b, false, struct{}{} })
		l.wb.takeKey(k) // its counter was reset
	}
	if l.res != nil {
		for _, k := range keys {
			sh := l.res.shard(k)
			sh.mu.Lock()
			if s := sh.m[k]; s != nil {
				l.res.expired.Add(s.l.Hits - min(s.used, s.l.Hits))
				sh.del(k)
			}
			sh.mu.Unlock()
		}
	}
}

// CachedDenial reports whether the over-limit cache denies c now, and for
// how long (for the admin API's Explain).
func (l *Limiter) CachedDenial(c *store.Check) (time.Duration, bool) {
	now := l.opts.Now().UnixNano()
	k, ok := l.lookup(c)
	if !ok || !k.denies(c, now) {
		return 0, false
	}
	return time.Duration(k.until - now), true
}

// Close stops the limiter's background work and waits for it, bounded by
// ctx (then it cancels the store calls still running, waits, and returns
// ctx's error): nothing the limiter started runs once Close returns.
// Waiting refund retries make one last try; refunds not taken are counted
// lost; locally admitted hits stay queued for WriteBack or HandOver.
// Decide works after Close, without background work. Close may be called
// twice.
func (l *Limiter) Close(ctx context.Context) error {
	lostBefore := l.undoLost.Load()
	err := l.bg.close(ctx)
	l.closed.Store(true)
	if lost := l.undoLost.Load() - lostBefore; lost > 0 {
		l.opts.Log.Warn("limiter closed with refunds the store did not take: counted lost", "refunds_lost", lost)
	}
	return err
}
