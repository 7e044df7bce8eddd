package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/lua"
	"github.com/rls-project/rls/pkg/store"
)

// Counter calls: the usual check decided by plain commands instead of a
// script call.
//
// A request whose checks all consume hits of a two-counter sliding window
// or of a fixed window (no refund, write-back, shadow or peek; Redis's own
// clock; a check the limiter marked store.Check.Scarce, near its limit
// where an INCRBY would mostly be taken back, sends a request of several
// checks to the script at once, and a request of one through a probe
// first, see Probes below) is sent as one INCRBY per
// check of its key's compact value by Hits * lua.CounterStep (the count
// field), then one TIME, pipelined on
// the node with the other requests ready (Redis runs a plain INCRBY in a
// fraction of a script call's time). Its checks are allowed, and consumed,
// when every reply is the compact form of the check's algorithm, of the
// window TIME is in, and the count fits the limit:
//
//   - a fixed window's key expires when its window ends, and a sliding
//     window's two windows after its last write, which decide.lua makes
//     in every window the value is rolled into: a value whose window index
//     (mod 4) is TIME's window was written in that window, so the INCRBY,
//     which ran after that write and before TIME, ran in the same window;
//   - the budget is that of the state before the INCRBY at the earliest
//     moment the INCRBY can have run (the last TIME this node answered
//     before the call was sent, plus the time elapsed since that answer
//     arrived on rls's monotonic clock, less 0.1 % for a Redis clock that
//     runs slow, see earliest; else the window's start): a sliding
//     window's budget only grows as its previous count fades, so the check
//     fits whenever it ran;
//   - a sliding value that may have been created by the INCRBY itself (no
//     TTL yet: Hits in window 0 mod 4, no previous count) is not trusted.
//
// Anything else (a count over the limit, a value of another form or
// window, an INCRBY refused) sends the request to decide.lua, marked with
// each INCRBY's reply: the script first takes back what the INCRBYs added,
// where the value still holds it, then decides the request exactly as it
// would have without them, and writes the key (with its TTL). So the
// budget a concurrent request sees is never larger than without counter
// calls: between an INCRBY and the script call that takes it back, hits
// that were not admitted are counted (a request there may be denied that
// would have fitted, never the reverse). Near the limit, and in the first
// request of a key in each window, a decision costs the INCRBY and a
// script call; everywhere else it costs the INCRBY.

// Probes: a denial by plain commands.
//
// A request of one check marked store.Check.Scarce (the limiter last saw
// its key near the limit, where an INCRBY would mostly be taken back) is
// first sent as a probe: a GET of the key's compact value instead of the
// INCRBY, pipelined with TIME like a counter call. When the value is of
// TIME's window and the check's hits do not fit the budget at TIME, the
// request is denied then and there, exactly: the GET ran in that window
// before TIME, and the budget only grows with time within a window (a
// sliding window's previous count fades; a fixed window's stays), so they
// did not fit when the GET ran either. Nothing was written, so nothing is
// taken back. Otherwise the request goes on as a counter call (an INCRBY,
// then the script where that cannot decide). A node that refuses GET (an
// ACL without it) is sent no more probes. A key held at its limit, whose
// hits are denied several times for each one that frees up, thus costs
// plain commands for its denials as for its admissions, where each denial
// was a script call.

// maxCounterHits bounds the hits of a check sent as a counter call, so
// that INCRBY's increment (Hits * 2^27) stays far inside int64.
const maxCounterHits = 1 << 20

// countable reports whether every check of cs may be sent as a counter
// call.
func countable(cs []*store.Check) bool {
	for _, c := range cs {
		if !c.Consuming() || c.Shadow || c.Hits >= maxCounterHits || (c.Scarce && len(cs) > 1) {
			return false
		}
		switch c.Algorithm {
		case store.FixedWindow:
		case store.SlidingWindow:
			if c.Precision >= 2 || c.Paced { // a paced budget is the script's
				return false
			}
		default:
			return false
		}
	}
	return len(cs) > 0
}

// counterState is a counter call's outcome, kept in its call.
type counterState struct {
	counted bool    // send c as a counter call
	probe   bool    // ... as a probe (GET instead of INCRBY; see Probes)
	incr    []int64 // INCRBY's reply per check; meaningful where ok[j]
	ok      []bool  // the INCRBY was applied
	low     int64   // a lower bound of the INCRBYs' time (Redis microseconds); 0: unknown
	high    int64   // TIME after them (Redis microseconds)
	undo    []int64 // for the script call after it: the reply to take back, or -1
	first   bool    // the script call after it: queued ahead of the calls never sent
}

// reset clears the counter state for the call's reuse.
func (cs *counterState) reset() {
	cs.counted, cs.probe, cs.first, cs.low, cs.high = false, false, false, 0, 0
	cs.incr, cs.ok, cs.undo = cs.incr[:0], cs.ok[:0], cs.undo[:0]
}

// count tries c as a counter call. It returns true when c is decided (its
// results set) or failed (err); false when c must go to the script, with
// c.undo set.
func (s *Store) count(ctx context.Context, c *call) (bool, error) {
	co, _, err := s.coalescer(ctx, c.checks[0].Key)
	if err != nil {
		return true, err
	}
	if co.noCounters.Load() {
		return false, nil
	}
	c.keys = c.keys[:0]
	for _, ch := range c.checks {
		c.keys = append(c.keys, ch.Key)
	}
	if len(c.checks) == 1 && c.checks[0].Scarce && !co.noProbes.Load() {
		c.cs.counted, c.cs.probe = true, true
		_, err = s.send(ctx, c)
		if err != nil {
			return true, err // c may be abandoned, still held by a flusher: leave it
		}
		c.cs.counted, c.cs.probe = false, false
		if c.deny() {
			s.counterStats[2].Add(1)
			return true, nil
		}
		s.counterStats[3].Add(1)
		// Delivered: nobody else holds c, which goes out again as a
		// counter call, ahead of calls never sent.
		c.state.Store(callPending)
		c.reply, c.err = "", nil
		c.cs.first = true
	}
	c.cs.counted = true
	_, err = s.send(ctx, c)
	if err != nil {
		return true, err // c may be abandoned, still held by a flusher: leave it
	}
	c.cs.counted = false
	if c.admit() {
		s.counterStats[0].Add(1)
		return true, nil
	}
	s.counterStats[1].Add(1)
	// Delivered (or never queued): nobody else holds c, which goes out
	// again as a script call.
	c.state.Store(callPending)
	c.reply, c.err = "", nil
	c.cs.first = true // queued ahead of calls that have not been sent yet
	c.cs.undo = c.cs.undo[:0]
	for j := range c.checks {
		u := int64(-1)
		if c.cs.ok[j] && c.cs.incr[j] >= 0 {
			u = c.cs.incr[j]
		}
		c.cs.undo = append(c.cs.undo, u)
	}
	return false, nil
}

// admit sets c's results from its counter call's replies when every
// check is allowed (see the package's counter calls), and reports whether
// they were.
func (c *call) admit() bool {
	if c.cs.high <= 0 {
		return false
	}
	for j, ch := range c.checks {
		if !c.cs.ok[j] {
			return false
		}
		r, ok := c.cs.decide(ch, c.cs.incr[j])
		if !ok {
			return false
		}
		*c.results[j] = r
	}
	return true
}

// decide returns the result of ch, whose INCRBY replied v, and whether the
// counter call may allow it.
func (cs *counterState) decide(ch *store.Check, v int64) (store.Result, bool) {
	cv := lua.DecodeCounter(ch.Algorithm, v)
	wus := int64(ch.Window / time.Microsecond)
	win := cs.high / wus
	if !cv.OK || cv.WindowMod4 != win%4 || cv.Count < ch.Hits {
		return store.Result{}, false
	}
	rst := time.Duration(wus-(cs.high-win*wus)) * time.Microsecond
	if ch.Algorithm == store.FixedWindow {
		if cv.Count > ch.Limit || cv.Count >= lua.CompactFixed {
			return store.Result{}, false
		}
		r := store.Result{Allowed: true, Remaining: ch.Limit - cv.Count, Reset: rst, Consumed: true}
		if r.Remaining == 0 {
			r.NextHit = rst // the count stays at the limit to the window's end
		}
		return r, true
	}
	if cv.Count >= lua.CompactCounts || (cv.Prev == 0 && cv.Count == ch.Hits && cv.WindowMod4 == 0) {
		return store.Result{}, false // may be the INCRBY's own creation, without TTL yet
	}
	var from int64 // the earliest the INCRBY ran, into the window
	if low := cs.low; low > win*wus && low <= cs.high {
		from = low - win*wus
	}
	r := store.SlidingBudget(int64(cv.Prev), int64(cv.Count-ch.Hits), ch.Limit, from, wus)
	if ch.Hits > r {
		return store.Result{}, false
	}
	res := store.Result{Allowed: true, Remaining: r - ch.Hits, Reset: rst, Consumed: true}
	if res.Remaining == 0 {
		// One more hit passes once the previous count has faded enough,
		// reckoned from TIME (after the INCRBY): the state is at least
		// this one whenever a later check runs.
		res.NextHit = store.SlidingRetry(int64(cv.Prev), int64(cv.Count), ch.Limit, 1, cs.high-win*wus, wus)
	}
	return res, true
}

// deny sets the result of c's one check from its probe's reply when its
// hits do not fit (see Probes), and reports whether they did not.
func (c *call) deny() bool {
	if c.cs.high <= 0 || len(c.checks) != 1 || !c.cs.ok[0] || c.cs.incr[0] < 0 {
		return false
	}
	ch := c.checks[0]
	cv := lua.DecodeCounter(ch.Algorithm, c.cs.incr[0])
	wus := int64(ch.Window / time.Microsecond)
	win := c.cs.high / wus
	if !cv.OK || cv.WindowMod4 != win%4 {
		return false
	}
	into := c.cs.high - win*wus
	rst := time.Duration(wus-into) * time.Microsecond
	if ch.Algorithm == store.FixedWindow {
		if cv.Count >= lua.CompactFixed || ch.Hits+cv.Count <= ch.Limit {
			return false
		}
		*c.results[0] = store.Result{Remaining: ch.Limit - min(cv.Count, ch.Limit), RetryAfter: rst, Reset: rst}
		return true
	}
	if cv.Count >= lua.CompactCounts {
		return false
	}
	r := store.SlidingBudget(int64(cv.Prev), int64(cv.Count), ch.Limit, into, wus)
	if ch.Hits <= r {
		return false
	}
	*c.results[0] = store.Result{
		Remaining:  r,
		RetryAfter: store.SlidingRetry(int64(cv.Prev), int64(cv.Count), ch.Limit, ch.Hits, into, wus),
		Reset:      rst,
	}
	return true
}

// counterClient is the client that reaches the coalescer's node itself
// (TIME must run where the INCRBYs ran): the node's own in cluster mode.
func (co *coalescer) counterClient() redis.Cmdable {
	if b := co.batch.Load(); b != nil {
		return b
	}
	return co.single
}

// runCounts sends the counter calls of calls (INCRBY per check, then TIME)
// as one pipeline on the node, and records each call's replies. It returns
// an error only when the round trip failed as a whole (TIME got no
// answer): the INCRBYs may then have run or not.
func (co *coalescer) runCounts(ctx context.Context, calls []*call) error {
	low := co.earliest()
	p := co.counterClient().Pipeline()
	n := 0
	for _, c := range calls {
		n += len(c.checks)
	}
	cmds := make([]redis.Cmder, 0, n)
	for _, c := range calls {
		for _, ch := range c.checks {
			if c.cs.probe {
				cmds = append(cmds, p.Get(ctx, ch.Key))
			} else {
				cmds = append(cmds, p.IncrBy(ctx, ch.Key, int64(ch.Hits)*lua.CounterStep(ch.Algorithm)))
			}
		}
	}
	tc := p.Time(ctx)
	_, _ = p.Exec(ctx) // every command carries its own error
	var high int64     // 0: TIME refused, so nothing is admitted here
	var re redis.Error
	switch err := tc.Err(); {
	case err == nil:
		high = tc.Val().UnixMicro()
	case !errors.As(err, &re):
		return err // no answer: the INCRBYs may have run or not
	case counterRefused(err):
		co.noCounters.Store(true)
	}
	if high > 0 {
		co.observe(high, time.Now())
	}
	k := 0
	for _, c := range calls {
		cs := &c.cs
		cs.low, cs.high = low, high
		cs.incr, cs.ok = cs.incr[:0], cs.ok[:0]
		for range c.checks {
			v, err := counterReply(cmds[k])
			k++
			switch {
			case !counterRefused(err):
			case cs.probe:
				co.noProbes.Store(true) // an ACL without GET: counter calls go on
			default:
				co.noCounters.Store(true)
			}
			cs.incr, cs.ok = append(cs.incr, v), append(cs.ok, err == nil)
		}
	}
	return nil
}

// maxSlew is how much slower than rls's clock Redis's may run: Linux slews
// a clock by at most 500 ppm; this allows twice that.
const maxSlew = 1000 // 1/maxSlew of the time elapsed

// earliest returns a lower bound of Redis's clock for a command sent now
// (Unix microseconds; 0: none known): the latest TIME the node answered,
// which it read before the answer arrived, plus the time elapsed since
// then on rls's monotonic clock, less 1/maxSlew of it and a microsecond.
func (co *coalescer) earliest() int64 {
	co.clockMu.Lock()
	t, at := co.lastTime, co.lastAt
	co.clockMu.Unlock()
	if t == 0 {
		return 0
	}
	el := time.Since(at).Microseconds()
	if el <= 1 {
		return t
	}
	return t + el - el/maxSlew - 1
}

// observe records TIME's answer t, arrived at at.
func (co *coalescer) observe(t int64, at time.Time) {
	co.clockMu.Lock()
	if t > co.lastTime {
		co.lastTime, co.lastAt = t, at
	}
	co.clockMu.Unlock()
}

// counterReply returns an INCRBY's reply, or the integer a probe's GET
// read (-1 for an absent key, or a value that is not an integer: the
// probe then denies nothing).
func counterReply(cmd redis.Cmder) (int64, error) {
	switch cmd := cmd.(type) {
	case *redis.IntCmd:
		return cmd.Result()
	case *redis.StringCmd:
		v, err := cmd.Int64()
		switch {
		case err == redis.Nil:
			return -1, nil
		case err != nil && cmd.Err() == nil:
			return -1, nil // not an integer: another form (decide.lua's)
		}
		return v, err
	}
	return 0, fmt.Errorf("counter call: unexpected command %T", cmd)
}

// counterRefused reports whether err is a node refusing INCRBY or TIME
// (an ACL without them, a renamed command): its checks then go to the
// script only.
func counterRefused(err error) bool {
	return redis.HasErrorPrefix(err, "NOPERM") || redis.HasErrorPrefix(err, "ERR unknown command")
}

// sendCounts runs a batch's counter calls and delivers them.
func (co *coalescer) sendCounts(ctx context.Context, calls []*call) error {
	err := co.runCounts(ctx, calls)
	for _, c := range calls {
		co.deliver(c, "", err)
	}
	return err
}

// CounterCalls returns how many requests counter calls decided alone, and
// how many went on to the script after one (see counters.go).
func (s *Store) CounterCalls() (decided, scripted uint64) {
	return s.counterStats[0].Load(), s.counterStats[1].Load()
}

// Probes returns how many requests a probe denied, and how many it sent
// on as counter calls (see counters.go).
func (s *Store) Probes() (denied, passed uint64) {
	return s.counterStats[2].Load(), s.counterStats[3].Load()
}
