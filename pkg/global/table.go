package global

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/store"
)

// Table is a replica's view of its region's shares of the global keys it
// decides, and the demand it saw for them. Share is on the request path
// (no I/O); Run exchanges in the background. Safe for concurrent use.
type Table struct {
	s      Settings
	client redis.UniversalClient
	log    *slog.Logger
	now    func() time.Time

	mu    sync.RWMutex
	keys  map[string]*entry // by MetaKey
	kick  chan struct{}     // a key without a grant: exchange it now
	round []*entry          // the keys this round published, for its grant

	clock    atomic.Pointer[clockFix]
	lastOK   atomic.Int64 // local Unix ns of the last exchange the global store answered
	failures atomic.Uint64
	calls    atomic.Uint64
}

// clockFix is the global store's clock against this replica's: global
// µs = local Unix µs + off, within err.
type clockFix struct{ off, err int64 }

// entry is one global key: its rule's limit and window, the demand seen,
// and the region's shares as the global store last granted them.
type entry struct {
	domain  string // the rule's, for metrics
	rule    string
	key     string
	limit   uint64
	window  time.Duration
	sliding bool

	mu        sync.Mutex
	hits      uint64 // asked this interval (admitted and denied)
	mark      uint64 // hits when the interval's window boundary passed (markHits)
	demand    uint64 // last interval's, per window
	shift     bool   // demand is its last quarter's (demandRate)
	lastHit   int64  // local Unix ns
	granted   bool
	shares    map[int64]uint64 // window -> share, the largest granted
	floor     uint64
	floorFrom int64
	seen      int64 // the global store's clock of the last grant, µs
	leaseEnd  int64
}

// maxEntriesPer is how many keys the table holds per key exchanged: a key
// beyond it decides on nothing (denies) until older keys go.
const maxEntriesPer = 4

// NewTable returns a table exchanging with the global store client.
func NewTable(client redis.UniversalClient, s Settings, log *slog.Logger) *Table {
	s.defaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Table{s: s, client: client, log: log, now: time.Now, keys: map[string]*entry{}, kick: make(chan struct{}, 1)}
}

// Share sets c.Limit, the limit of a scope: global rule's check, to its
// region's share of the window it counts in: the least share of the
// windows the region's Redis may count it in, sent now and answered by
// deadline (Settings.RegionClock), else of those the clocks' error allows.
// It counts c's hits as demand. A key never granted, or beyond the
// table's bound, gets 0: its requests are denied until its first
// exchange, which starts at once.
func (t *Table) Share(domain, rule string, c *store.Check, deadline time.Time) {
	e := t.entry(domain, rule, c)
	if e == nil {
		c.Limit = 0
		return
	}
	var sp span
	if t.s.RegionClock != nil {
		from, to, ok := t.s.RegionClock(c.Key, deadline)
		sp = span{from.UnixMicro(), to.UnixMicro(), ok}
	}
	now := t.now()
	e.mu.Lock()
	if c.Consuming() {
		e.hits += c.Hits
	}
	e.lastHit = now.UnixNano()
	lim := t.limitLocked(e, now, sp)
	granted := e.granted
	e.mu.Unlock()
	if !granted {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
	c.Limit = lim
}

// entry returns c's entry, made when missing; nil when the table is full.
func (t *Table) entry(domain, rule string, c *store.Check) *entry {
	k := MetaKey(c.Key, c.Limit, c.Window)
	t.mu.RLock()
	e := t.keys[k]
	t.mu.RUnlock()
	if e != nil {
		return e
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e = t.keys[k]; e == nil {
		if len(t.keys) >= maxEntriesPer*t.s.MaxKeys {
			return nil
		}
		e = &entry{domain: domain, rule: rule, key: c.Key, limit: c.Limit, window: c.Window, sliding: c.Algorithm == store.SlidingWindow, shares: map[int64]uint64{}}
		t.keys[k] = e
	}
	return e
}

// span is when the region's Redis may count a hit, in its Unix µs; ok
// false: unknown.
type span struct {
	from, to int64
	ok       bool
}

// limitLocked returns e's limit at local time now: the least share of the
// windows of span (the region's Redis's time, from now to the call's
// deadline), else of those the global clock may be in, given its error and
// the margin allowed between the stores' clocks.
func (t *Table) limitLocked(e *entry, now time.Time, sp span) uint64 {
	fix := t.clock.Load()
	if fix == nil || !e.granted {
		return 0
	}
	g := now.UnixMicro() + fix.off
	eps := fix.err + t.s.Margin.Microseconds()
	w := e.window.Microseconds()
	lo, hi := (g-eps)/w, (g+eps)/w
	if sp.ok {
		lo, hi = sp.from/w, sp.to/w
	}
	lim := e.shareLocked(lo, g+eps, t.s.Lease)
	for v := lo + 1; v <= hi; v++ {
		lim = min(lim, e.shareLocked(v, g+eps, t.s.Lease))
	}
	return lim
}

// shareLocked returns e's share of window v at global time at most g: the
// share granted, else its floor while the floor lasts (10 leases after
// its last grant, when the global store may give it to others), else 0.
func (e *entry) shareLocked(v, g int64, lease time.Duration) uint64 {
	if s, ok := e.shares[v]; ok {
		return s
	}
	if v >= e.floorFrom && g < e.seen+10*lease.Microseconds() {
		return e.floor
	}
	return 0
}

// Run exchanges every interval (and at once for a key never granted)
// until ctx ends: each round marks the hits at its boundary, publishes the
// demand a quarter into the interval and asks for the grants half into it.
func (t *Table) Run(ctx context.Context) {
	mark := time.NewTimer(t.until(0))
	defer mark.Stop()
	publish := time.NewTimer(t.until(t.s.Interval / 4))
	defer publish.Stop()
	grant := time.NewTimer(t.until(t.s.Interval / 2))
	defer grant.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-mark.C:
			t.markHits()
			mark.Reset(t.until(0))
		case <-publish.C:
			t.publish(ctx)
			publish.Reset(t.until(t.s.Interval / 4))
		case <-grant.C:
			t.exchange(ctx, true)
			grant.Reset(t.until(t.s.Interval / 2))
		case <-t.kick:
			t.exchange(ctx, false)
		}
	}
}

// markHits notes each key's hits at the interval's boundary, a quarter
// interval before the publish: demandRate follows the rate of the hits
// since when they show a shift, so a round publishes a shift of demand
// that happened at its boundary rather than an interval later.
func (t *Table) markHits() {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, e := range t.keys {
		e.mu.Lock()
		e.mark = e.hits
		e.mu.Unlock()
	}
}

// until returns the time to the next instant at phase into an interval on
// the global store's clock, at least an eighth of an interval away (a
// timer that fires a little early, or a clock estimate that moved, does
// not run a phase twice in one interval). Every replica so measures its
// demand over the same intervals, and a round's grants, half into it,
// extend the shares to the next window well before it starts (with a
// lease of one window).
func (t *Table) until(phase time.Duration) time.Duration {
	var off int64
	if fix := t.clock.Load(); fix != nil {
		off = fix.off
	}
	iv, ph := t.s.Interval.Microseconds(), phase.Microseconds()
	g := t.now().UnixMicro() + off
	next := (g-ph)/iv*iv + iv + ph
	if next-g < iv/8 {
		next += iv
	}
	return time.Duration(next-g) * time.Microsecond
}

// pick returns the keys to exchange (see exchange), taking each key's
// demand when all, and drops the keys gone idle.
func (t *Table) pick(all bool) []*entry {
	now := t.now()
	var es []*entry
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, e := range t.keys {
		e.mu.Lock()
		idle := now.UnixNano() - e.lastHit
		if all {
			e.demand, e.shift = demandRate(e.hits, e.hits-min(e.mark, e.hits), t.s.Interval, e.window)
			e.hits, e.mark = 0, 0
		}
		gone := idle > 10*int64(t.s.Interval) && (!e.granted || e.leaseEnd < e.seen/e.window.Microseconds())
		want := (all && idle <= 3*int64(t.s.Interval)) || !e.granted
		e.mu.Unlock()
		switch {
		case gone:
			delete(t.keys, k)
		case want:
			es = append(es, e)
		}
	}
	return es
}

// demandRate returns a key's demand per window from the hits of the
// interval since its last round, recent of them in its last quarter (since
// markHits): the whole interval's rate, which counts four times the hits
// and so wobbles half as much from one round to the next, unless the
// quarter's count is over three standard deviations (of a Poisson count)
// from its share of the interval's, when demand has shifted and the
// quarter's rate is the one to follow (shift true).
func demandRate(hits, recent uint64, interval, window time.Duration) (rate uint64, shift bool) {
	q := uint64(interval / 4)
	if expect := float64(hits) / 4; math.Abs(float64(recent)-expect) > 3*math.Sqrt(max(expect, 1)) {
		return (recent*uint64(window) + q - 1) / q, true
	}
	return (hits*uint64(window) + uint64(interval) - 1) / uint64(interval), false
}

// publish takes the demand per window of each key with demand in the last
// 3 intervals (pick, demandRate), keeps the MaxKeys with the most for this
// round's grant, and publishes theirs.
func (t *Table) publish(ctx context.Context) {
	es := t.pick(true)
	slices.SortFunc(es, func(a, b *entry) int { return cmp.Compare(b.demand, a.demand) })
	es = es[:min(len(es), t.s.MaxKeys)]
	t.mu.Lock()
	t.round = es
	t.mu.Unlock()
	if len(es) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, t.s.Interval/4)
	defer cancel()
	errs := Publish(cctx, t.client, t.s, asksOf(es))
	t.calls.Add(uint64(len(es)))
	t.failed(errs, "publish")
}

// exchange asks for the grants of this round's keys (all: those publish
// chose), or of the keys never granted, and takes them; it drops keys
// idle for 10 intervals whose leases have ended.
func (t *Table) exchange(ctx context.Context, all bool) {
	var es []*entry
	if all {
		t.mu.Lock()
		es, t.round = t.round, nil
		t.mu.Unlock()
	} else {
		es = t.pick(false)
	}
	if len(es) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, t.s.Interval/2)
	defer cancel()
	sent := t.now()
	grants, errs := Exchange(cctx, t.client, t.s, asksOf(es))
	recv := t.now()
	t.calls.Add(uint64(len(es)))
	clocked := false
	for i, e := range es {
		if errs[i] != nil {
			continue
		}
		if !clocked { // every answer was read between sent and recv
			clocked = true
			mid := (sent.UnixMicro() + recv.UnixMicro()) / 2
			t.clock.Store(&clockFix{off: grants[i].Now - mid, err: (recv.Sub(sent).Microseconds()+1)/2 + 1})
		}
		e.apply(&grants[i])
	}
	if t.failed(errs, "exchange") < len(es) {
		t.lastOK.Store(recv.UnixNano())
	}
}

// asksOf returns the asks of es: each key with its demand.
func asksOf(es []*entry) []Ask {
	asks := make([]Ask, len(es))
	for i, e := range es {
		e.mu.Lock()
		asks[i] = Ask{Key: e.key, Limit: e.limit, Window: e.window, Sliding: e.sliding, Demand: e.demand, Shift: e.shift}
		e.mu.Unlock()
	}
	return asks
}

// failed counts and logs the calls of errs that failed, and returns how
// many did.
func (t *Table) failed(errs []error, what string) int {
	n := 0
	for _, err := range errs {
		if err != nil {
			n++
		}
	}
	if n > 0 {
		t.failures.Add(uint64(n))
		t.log.Warn("global store: "+what+" failed; deciding on the shares held", "keys", n, "error", firstErr(errs))
	}
	return n
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// apply takes a grant: each window's share is the largest granted (the
// global store never lowers one), windows past go.
func (e *entry) apply(g *Grant) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, s := range g.Shares {
		v := g.Current + int64(i)
		e.shares[v] = max(e.shares[v], s)
	}
	for v := range e.shares {
		if v < g.Current-1 {
			delete(e.shares, v)
		}
	}
	e.floor, e.floorFrom = g.Floor, g.FloorFrom
	e.seen = max(e.seen, g.Now)
	e.leaseEnd = max(e.leaseEnd, g.LeaseEnd)
	e.granted = true
}

// Describe says what this replica holds of key's shares (the admin API's
// Explain): its share of the current window and of the next, its floor,
// the last window leased, and the age of the last grant.
func (t *Table) Describe(key string, limit uint64, window time.Duration) string {
	t.mu.RLock()
	e := t.keys[MetaKey(key, limit, window)]
	t.mu.RUnlock()
	fix := t.clock.Load()
	if e == nil || fix == nil {
		return fmt.Sprintf("scope: global, region %s: no share of this key yet (denied until its first exchange, which its first request starts)", t.s.Region)
	}
	now := t.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.granted {
		return fmt.Sprintf("scope: global, region %s: no share of this key yet (denied until its first exchange, which its first request starts)", t.s.Region)
	}
	g := now.UnixMicro() + fix.off
	v := g / window.Microseconds()
	return fmt.Sprintf("scope: global, region %s: share %d of %d in the current window (next window: %d), floor %d, leased to window %d (%d windows on), last grant %.1fs ago",
		t.s.Region, e.shareLocked(v, g, t.s.Lease), limit, e.shareLocked(v+1, g, t.s.Lease), e.floor, e.leaseEnd, e.leaseEnd-v,
		float64(g-e.seen)/1e6)
}
