package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore/lua"
)

// Plain commands: per check, INCRBY of the window's key by Hits + Want,
// PEXPIRE of it, and for a sliding window GET of the previous window's key
// unless its count is kept (prev.go), in one pipeline. They never admit
// what the script would deny (docs/redis.md, invariant 3).

// plainable reports whether every check of a request may go by plain
// commands.
func plainable(checks []store.Check) bool {
	for i := range checks {
		c := &checks[i]
		if !c.Consuming() || c.Shadow || c.Paced || c.Exact || c.Limit == 0 || !lua.Windowed(c) || c.Hits+c.Want >= 1<<50 {
			return false
		}
	}
	return true
}

// plainBack is an INCRBY to take back: the key, how much, and its TTL.
type plainBack struct {
	key    string
	n      int64
	ttl    time.Duration
	incr   *redis.IntCmd
	expire *redis.BoolCmd
}

// queueBack queues the take-backs of back.
func queueBack(ctx context.Context, p redis.Pipeliner, back []plainBack) {
	for i := range back {
		b := &back[i]
		b.incr, b.expire = p.IncrBy(ctx, b.key, -b.n), p.PExpire(ctx, b.key, b.ttl)
	}
}

// backErr returns the first error of back's commands, after their round
// trip.
func backErr(back []plainBack) error {
	for i := range back {
		if err := back[i].incr.Err(); err != nil {
			return err
		}
	}
	return nil
}

// otherErr returns the first error of back's commands that is not a
// redirect.
func otherErr(back []plainBack) error {
	for i := range back {
		if err := back[i].incr.Err(); err != nil && !redirected(err) {
			return err
		}
	}
	return nil
}

// redone returns the take-backs of back that did not run (a redirect), to
// send again.
func redone(back []plainBack) []plainBack {
	var out []plainBack
	for _, b := range back {
		if redirected(b.incr.Err()) {
			out = append(out, plainBack{key: b.key, n: b.n, ttl: b.ttl})
		}
	}
	return out
}

// plainCheck is one check's commands and what they name.
type plainCheck struct {
	key, prevKey string
	start, wus   int64 // the window's start and length, µs
	ttl          time.Duration
	incr         *redis.IntCmd
	expire       *redis.BoolCmd
	get          *redis.StringCmd // the previous count's, when not kept
	prev         int64            // the previous count
}

// decidePlain sends checks as plain commands and sets results when they
// decide the request. Otherwise it returns the take-backs that the script
// call must carry (decided false, err nil).
func (s *Store) decidePlain(ctx context.Context, n *node, checks []store.Check, results []store.Result) (decided bool, back []plainBack, err error) {
	lo, hi, ok := n.clock.bounds(localUS())
	if !ok {
		return false, nil, nil
	}
	pcs, ok := s.planPlain(checks, lo, hi)
	if !ok {
		return false, nil, nil
	}
	err = n.do(ctx, newCall(func(ctx context.Context, p redis.Pipeliner) {
		for i := range pcs {
			pc := &pcs[i]
			pc.incr = p.IncrBy(ctx, pc.key, int64(checks[i].Hits+checks[i].Want))
			pc.expire = p.PExpire(ctx, pc.key, pc.ttl)
			if pc.prev < 0 {
				pc.get = p.Get(ctx, pc.prevKey)
			}
		}
	}))
	if err != nil {
		return false, nil, err // the INCRBYs may have run or not: nothing to take back
	}
	back, fits := s.readPlain(n, checks, pcs, results, lo)
	if !fits {
		return false, back, nil
	}
	// The request stands: take back only what its leases did not get.
	back = back[:0]
	for i := range checks {
		if short := int64(checks[i].Want - results[i].Lease.Hits); short > 0 {
			back = append(back, plainBack{key: pcs[i].key, n: short, ttl: pcs[i].ttl})
		}
	}
	if len(back) > 0 {
		_ = n.do(ctx, newCall(func(ctx context.Context, p redis.Pipeliner) { queueBack(ctx, p, back) }))
	}
	return true, nil, nil
}

// planPlain names each check's keys and TTL on the node's clock (lo, hi:
// its earliest and latest time, µs). It reports false when a window may
// end before the reply comes.
func (s *Store) planPlain(checks []store.Check, lo, hi int64) ([]plainCheck, bool) {
	pcs := make([]plainCheck, len(checks))
	for i := range checks {
		c, pc := &checks[i], &pcs[i]
		pc.wus = int64(c.Window / time.Microsecond)
		pc.start = store.FloorDiv(lo, pc.wus) * pc.wus
		if hi+boundaryMargin.Microseconds() >= pc.start+pc.wus {
			return nil, false
		}
		pc.key = string(lua.WindowKey(nil, c.Key, pc.start/1e6))
		until := pc.start + pc.wus
		if c.Algorithm != store.FixedWindow {
			pc.prevKey = string(lua.WindowKey(nil, c.Key, (pc.start-pc.wus)/1e6))
			until += pc.wus
			pc.prev = -1
			if n, ok := s.prevs.get(pc.prevKey, lo); ok {
				pc.prev = n
			}
		}
		pc.ttl = time.Duration(until+lua.MarginUS-hi) * time.Microsecond
	}
	return pcs, true
}

// readPlain reads the replies of pcs: the INCRBYs that ran, to take back
// unless the request stands, and whether every check fits (results set).
func (s *Store) readPlain(n *node, checks []store.Check, pcs []plainCheck, results []store.Result, lo int64) (back []plainBack, fits bool) {
	_, hiR, fits := n.clock.bounds(localUS())
	for i := range checks {
		c, pc := &checks[i], &pcs[i]
		if err := pc.incr.Err(); err != nil {
			if redis.HasErrorPrefix(err, "NOPERM") || redis.HasErrorPrefix(err, "ERR unknown command") {
				n.noPlain.Store(true) // an ACL without the command: scripts only
			}
			fits = false
			continue
		}
		back = append(back, plainBack{key: pc.key, n: int64(c.Hits + c.Want), ttl: pc.ttl})
		if pc.get != nil {
			if n, ok := parseCount(pc.get); ok {
				pc.prev = n
				s.prevs.put(pc.prevKey, n, pc.start+pc.wus, lo)
			}
		}
		if !fits || hiR >= pc.start+pc.wus || !pc.decide(c, &results[i], lo, hiR) {
			fits = false
		}
	}
	return back, fits
}

// decide sets r from c's replies when c fits: the budget before the INCRBY
// at lo (Redis's earliest time, µs), the window ending no earlier than hi.
func (pc *plainCheck) decide(c *store.Check, r *store.Result, lo, hi int64) bool {
	count := pc.incr.Val()
	before := count - int64(c.Hits+c.Want)
	prev := pc.prev
	if prev < 0 && c.Algorithm != store.FixedWindow {
		return false // not a count (or not read): the script reads it as fresh and writes over it
	}
	if before < 0 {
		return false
	}
	into := lo - pc.start
	var budget uint64
	if c.Algorithm == store.FixedWindow {
		budget = uint64(max(0, int64(c.Limit)-before))
	} else {
		budget = store.SlidingBudget(prev, before, c.Limit, into, pc.wus)
	}
	if c.Hits > budget {
		return false
	}
	lease := min(c.Want, budget-c.Hits)
	if lease < c.Want && c.Horizon > 0 && prev > 0 && c.Algorithm != store.FixedWindow {
		return false // the script may grant hits that pass later (store.SlidingLease)
	}
	*r = store.Result{Allowed: true, Remaining: budget - c.Hits - lease, Reset: time.Duration(pc.start+pc.wus-hi) * time.Microsecond,
		Lease: store.Lease{Hits: lease, Now: lease}, Consumed: true}
	if c.Algorithm != store.FixedWindow {
		r.Remaining = store.SlidingBudget(prev, before+int64(c.Hits+lease), c.Limit, into, pc.wus)
	}
	return true
}
