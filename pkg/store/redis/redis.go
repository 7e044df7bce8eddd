// Package redisstore implements store.Store on Redis (a single server,
// Sentinel or Redis Cluster) with the scripts of package lua.
//
// Each Decide groups its checks by Redis Cluster hash slot and decides every
// group with one script call (EVALSHA, EVAL on NOSCRIPT), so a group is
// atomic exactly as store.Store specifies. Keys hash by their {tag} (rls puts
// the domain and the tenant there), so one tenant's counters share a slot and
// its batch is one atomic call. Outside cluster mode every key is on one
// server and the whole batch is one call.
//
// Concurrent script calls to one node are coalesced (see coalesce.go): a
// call sent while the node has a free send slot (Options.MaxInFlight) goes
// out at once, alone; calls that arrive while every slot is busy leave
// together as soon as a send returns, merged into one script call per hash
// slot, each still decided alone and in order.
//
// In cluster mode a batch whose keys span several slots is decided per slot,
// in parallel: each slot group is atomic, but the batch as a whole is not (a
// denial in one slot does not undo consumption in another: Result.Consumed
// says what each slot wrote, and the limiter refunds it when the request is
// denied). Only requests that mix tenants can span slots.
//
// A call is bounded by its context's deadline when it has one (the limiter
// sets it from its gRPC caller's), else by Options.Timeout. Each node has a
// circuit breaker (package breaker) that counts round trips and opens only
// when the node has answered nothing for a while. Errors say what went
// wrong (see errors.go): a node that cannot answer gives errors wrapping
// store.ErrUnavailable (store.ErrCircuitOpen while its breaker is open), on
// which callers fall back; an answer rls cannot use (a script error, a
// reply of the wrong shape) gives errors wrapping store.ErrProtocol, which
// is a bug, not an outage.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/lua"
	"github.com/rls-project/rls/pkg/breaker"
	"github.com/rls-project/rls/pkg/store"
)

var _ store.Store = (*Store)(nil)

// Store decides rate-limit checks in Redis. It is safe for concurrent use.
type Store struct {
	client   redis.UniversalClient
	cluster  bool
	owned    bool // Close closes client
	timeout  time.Duration
	now      func() time.Time // test clock; nil means Redis TIME
	counters bool             // counter calls (counters.go)
	// counterStats: requests decided by counter calls alone, and sent to
	// the script after one (CounterCalls); denied by a probe, and sent on
	// after one (Probes).
	counterStats [4]atomic.Uint64
	fleetKey     string // KeyPrefix + FleetKey
	demandPrefix string // KeyPrefix + DemandKeyPart
	replica      string // this process's id in the fleet's heartbeats and the demand hashes (replicaID)

	brOpts       breaker.Options
	onChange     func(node string, from, to breaker.State)
	onScriptMode func(node, mode, reason string)
	breakers     sync.Map // node address ("" outside cluster mode) -> *breaker.Breaker

	maxInFlight, maxBatch int
	coMu                  sync.Mutex
	coalescers            sync.Map // node address -> *coalescer
	closed                bool
	lastReload            atomic.Int64 // unix nanoseconds of the last cluster state reload
}

// New validates opts and returns a Store: on opts.Client when it is set,
// else on a go-redis client of its own made from opts. It does not
// connect: a Redis that is down makes calls fail, never New, which fails
// only on invalid options (see Options.Validate).
func New(opts Options) (*Store, error) {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	s := &Store{client: o.Client, timeout: o.Timeout, now: o.Clock, counters: !o.NoCounters, brOpts: o.Breaker, onChange: o.OnBreakerChange,
		onScriptMode: o.OnScriptMode, maxInFlight: o.MaxInFlight, maxBatch: o.MaxBatch, fleetKey: o.KeyPrefix + FleetKey,
		demandPrefix: o.KeyPrefix + DemandKeyPart, replica: replicaID()}
	if s.client == nil {
		p, err := o.clientOptions()
		if err != nil {
			return nil, err
		}
		s.client, s.owned = p.newClient(), true
	}
	_, s.cluster = s.client.(*redis.ClusterClient)
	return s, nil
}

// Decide decides checks and writes one Result per Check into results (see
// store.Store). The call as a whole is bounded by ctx's deadline when it has
// one, else by the store's timeout. Errors from a Redis that cannot answer
// (unreachable, slow, cluster down, loading, failing over, its circuit
// breaker open) wrap store.ErrUnavailable, and the results of the slot
// groups that failed are marked Undecided (all of them outside cluster
// mode); the other groups' results are valid decisions. An answer rls
// cannot use (a script error, a reply of the wrong shape) gives an error
// wrapping store.ErrProtocol. Invalid checks, a protocol error and a
// cancelled ctx give an error that does not wrap store.ErrUnavailable, and
// no valid result.
func (s *Store) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	return s.run(ctx, lua.ModeDecide, checks, results)
}

// Peek reports what Decide would answer for check-only versions of checks
// (Hits 0, no refund, no force) and writes nothing. Errors as for Decide.
func (s *Store) Peek(ctx context.Context, checks []store.Check, results []store.Result) error {
	return s.run(ctx, lua.ModePeek, checks, results)
}

// Delete removes the counters at keys (a missing key is not an error), one
// DEL per hash slot, bounded by ctx's deadline when it has one, else by the
// store's timeout. Errors from Redis wrap store.ErrUnavailable.
func (s *Store) Delete(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel, b := s.bound(ctx)
	defer cancel()
	if !s.cluster {
		return s.fail(ctx, "delete", b, s.client.Del(ctx, keys...).Err())
	}
	groups := make(map[int][]string)
	for _, k := range keys {
		slot := Slot(k)
		groups[slot] = append(groups[slot], k)
	}
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, g := range groups {
			p.Del(ctx, g...)
		}
		return nil
	})
	return s.fail(ctx, "delete", b, err)
}

// Ping checks that Redis answers (every master in cluster mode), for
// readiness probes, and on a node that answers and whose script mode is
// not known yet loads the Function library (see scripts.go): so the
// library is on every master before the first request, and on a new
// master after a failover or resharding once the probe has seen it. It is
// bounded by ctx only. Errors wrap store.ErrUnavailable.
func (s *Store) Ping(ctx context.Context) error {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			if err := c.Ping(ctx).Err(); err != nil {
				return err
			}
			if co, err := s.newCoalescer(c.Options().Addr, c); err == nil {
				co.prepare(ctx)
			}
			return nil
		})
		return s.wrap(ctx, "ping", err)
	}
	if err := s.client.Ping(ctx).Err(); err != nil {
		return s.wrap(ctx, "ping", err)
	}
	if co, _, err := s.coalescer(ctx, ""); err == nil {
		co.prepare(ctx)
	}
	return nil
}

// Close stops the coalescers' flushers (calls still queued fail with
// ErrUnavailable) and closes the client unless it came in Options.Client.
func (s *Store) Close() error {
	s.coMu.Lock()
	s.closed = true
	s.coMu.Unlock()
	s.coalescers.Range(func(_, v any) bool {
		v.(*coalescer).close()
		return true
	})
	if !s.owned {
		return nil
	}
	return s.client.Close()
}

// run validates checks, groups them by slot and evaluates each group.
func (s *Store) run(ctx context.Context, mode string, checks []store.Check, results []store.Result) error {
	if len(results) != len(checks) {
		return fmt.Errorf("redis %s: %d results for %d checks", modeName(mode), len(results), len(checks))
	}
	if len(checks) == 0 {
		return nil
	}
	for i := range checks {
		if err := validate(&checks[i]); err != nil {
			return fmt.Errorf("redis %s: check %d (key %q): %w", modeName(mode), i, checks[i].Key, err)
		}
	}
	ctx, cancel, b := s.bound(ctx)
	defer cancel()
	now := argNoClock
	if s.now != nil {
		now = strconv.FormatInt(s.now().UnixMicro(), 10)
	}
	if !s.cluster || sameSlot(checks) { // one call: the usual case
		c := getCall()
		for i := range checks {
			c.add(&checks[i], &results[i])
		}
		return s.eval(ctx, b, mode, now, c)
	}
	return s.runSlots(ctx, b, mode, now, checks, results)
}

// runSlots evaluates the checks of a Cluster batch whose keys span hash
// slots, one call per slot, at once. It is run's rare path, apart so that
// its goroutines' captures do not move run's variables to the heap.
func (s *Store) runSlots(ctx context.Context, b budget, mode string, now any, checks []store.Check, results []store.Result) error {
	calls := slotGroups(checks, results)
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for g := 1; g < len(calls); g++ {
		wg.Go(func() { errs[g] = s.eval(ctx, b, mode, now, calls[g]) })
	}
	errs[0] = s.eval(ctx, b, mode, now, calls[0])
	wg.Wait()
	// Unavailable groups are Undecided, the others stand (store.Store).
	// Any other error makes the whole outcome unknown.
	var unavailable []error
	for _, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, store.ErrUnavailable):
			unavailable = append(unavailable, err)
		default:
			return err
		}
	}
	return errors.Join(unavailable...)
}

// sameSlot reports whether every check's key is in the first one's hash
// slot.
func sameSlot(checks []store.Check) bool {
	first := Slot(checks[0].Key)
	for i := 1; i < len(checks); i++ {
		if Slot(checks[i].Key) != first {
			return false
		}
	}
	return true
}

// slotGroups splits a batch whose keys span hash slots into one call per
// slot, in order of first appearance, each with its checks in batch order.
func slotGroups(checks []store.Check, results []store.Result) []*call {
	var calls []*call
	bySlot := make(map[int]*call)
	for i := range checks {
		slot := Slot(checks[i].Key)
		c, ok := bySlot[slot]
		if !ok {
			c = getCall()
			bySlot[slot] = c
			calls = append(calls, c)
		}
		c.add(&checks[i], &results[i])
	}
	return calls
}

// add puts a check, and where its result goes, in c's group.
func (c *call) add(check *store.Check, result *store.Result) {
	c.checks = append(c.checks, check)
	c.results = append(c.results, result)
}

// eval runs the script once for c's checks and stores their results, or
// marks them Undecided when the node cannot answer. It recycles c.
func (s *Store) eval(ctx context.Context, b budget, mode string, now any, c *call) error {
	if mode == lua.ModeDecide && now == argNoClock && s.counters && countable(c.checks) {
		if done, err := s.count(ctx, c); done {
			return s.settle(ctx, b, mode, c, err)
		}
	}
	c.encode(mode, now)
	reply, err := s.send(ctx, c)
	if err == nil {
		err = c.decode(reply, mode == lua.ModeDecide)
	}
	return s.settle(ctx, b, mode, c, err)
}

// settle classifies err, the outcome of c's call, marks c's results
// Undecided when the node could not answer, and recycles c.
func (s *Store) settle(ctx context.Context, b budget, mode string, c *call, err error) error {
	err = s.fail(ctx, modeName(mode), b, err)
	if errors.Is(err, store.ErrUnavailable) {
		for _, r := range c.results {
			*r = store.Result{Undecided: true}
		}
	}
	if c.state.Load() != callAbandoned { // else the flusher may hold it
		putCall(c)
	}
	return err
}

// send runs c's script call on the node that owns its keys and returns the
// reply. While the node's breaker is closed the call goes through the
// node's coalescer; while it is half-open each call asks the breaker alone
// and, when let through, is sent alone as a probe; while it is open the
// call fails at once. A call whose slot moved (MOVED, ASK) is re-sent
// through the cluster client.
func (s *Store) send(ctx context.Context, c *call) (string, error) {
	co, node, err := s.coalescer(ctx, c.keys[0])
	if err != nil {
		return "", err
	}
	var reply string
	if br := co.br; br.State() == breaker.Closed {
		reply, err = co.do(ctx, c)
	} else if tk, ok := br.Allow(); ok {
		if c.cs.counted {
			err = co.runCounts(ctx, []*call{c})
		} else {
			reply, err = co.run(ctx, s.client, c.keys, c.args)
		}
		br.Done(tk, outcome(ctx, err))
	} else {
		err = errOpen
	}
	if errors.Is(err, errOpen) {
		return "", circuitOpen(node)
	}
	if s.cluster && redirected(err) && ctx.Err() == nil && !c.cs.counted {
		// The slot moved or is moving (resharding): the cluster client
		// follows MOVED and ASK and refreshes its slot map. By EVALSHA,
		// which any node runs: the node the slot went to may not have the
		// library yet.
		reply, err = runEval(ctx, s.client, c.keys, c.args)
	}
	return reply, err
}

// encode sets c's keys and script arguments (see decide.lua) from its
// checks: the header, then one request.
func (c *call) encode(mode string, now any) {
	keys := slices.Grow(c.keys[:0], len(c.checks))
	blob := slices.Grow(c.blob[:0], lua.CheckBytes*len(c.checks))
	modeArg := argModeDecide
	if mode == lua.ModePeek {
		modeArg = argModePeek
	}
	for j, ch := range c.checks {
		keys = append(keys, ch.Key)
		if j < len(c.cs.undo) && c.cs.undo[j] >= 0 {
			blob = lua.AppendUndo(blob, ch, c.cs.undo[j])
		} else {
			blob = lua.AppendCheck(blob, ch)
		}
	}
	c.keys, c.blob = keys, blob
	c.args = append(c.args[:0], now, modeArg, blob)
}

// decode stores the script's reply in c's results. When decided (not
// peeked), the allowed consuming checks are Consumed unless a denied
// consuming non-shadow check vetoed c's request: the script wrote all of
// its consumption or none.
func (c *call) decode(reply string, decided bool) error {
	if len(reply) != lua.ResultBytes*len(c.checks) {
		return fmt.Errorf("%w: the script replied %d bytes for %d checks", store.ErrProtocol, len(reply), len(c.checks))
	}
	veto := false
	for j, ch := range c.checks {
		r := decodeResult(lua.ResultAt(reply, j))
		*c.results[j] = r
		if ch.Consuming() && !r.Allowed && !ch.Shadow {
			veto = true
		}
	}
	if decided && !veto {
		for j, ch := range c.checks {
			if ch.Consuming() && c.results[j].Allowed {
				c.results[j].Consumed = true
			}
		}
	}
	return nil
}

func modeName(mode string) string {
	if mode == lua.ModePeek {
		return "peek"
	}
	return "decide"
}

// validate rejects checks the script cannot evaluate, as the memory store
// does. (An unknown algorithm acts as the default, sliding window, in both.)
func validate(c *store.Check) error {
	if c.Window < time.Second || c.Window%time.Second != 0 {
		return fmt.Errorf("window %v is not a whole number of seconds of at least 1s", c.Window)
	}
	return nil
}

// decodeResult converts one check's result from the script's doubles.
// An allowed check's retry is its NextHit.
func decodeResult(r lua.Result) store.Result {
	res := store.Result{
		Allowed:   r.Allowed,
		Remaining: toUint(r.Remaining),
		Reset:     micros(toUint(r.ResetUS)),
	}
	if r.Allowed {
		res.NextHit = micros(toUint(r.RetryUS))
	} else {
		res.RetryAfter = micros(toUint(r.RetryUS))
	}
	return res
}

// toUint converts a whole number from the script to uint64: negative
// values and NaN become 0, values beyond uint64 saturate.
func toUint(f float64) uint64 {
	switch {
	case math.IsNaN(f) || f <= 0:
		return 0
	case f >= math.MaxUint64:
		return math.MaxUint64
	}
	return uint64(f)
}

// micros converts microseconds to a Duration, saturating.
func micros(us uint64) time.Duration {
	if us > math.MaxInt64/uint64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// reloadClusterState asks go-redis to reload a Cluster's slot map (in the
// background, at most twice a second) after a failed call. A dead master
// only refuses connections and sends no redirect, so without this go-redis
// would route its slots to it until its periodic refresh, long after a
// replica took over.
func (s *Store) reloadClusterState() {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return
	}
	now := time.Now().UnixNano()
	last := s.lastReload.Load()
	if now-last < int64(500*time.Millisecond) || !s.lastReload.CompareAndSwap(last, now) {
		return
	}
	cc.ReloadState(context.Background())
}

// coalescer returns the coalescer of the node that owns key and the node's
// address ("" outside cluster mode), which also picks its circuit breaker.
func (s *Store) coalescer(ctx context.Context, key string) (*coalescer, string, error) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		if co, ok := s.coalescers.Load(""); ok {
			return co.(*coalescer), "", nil
		}
		co, err := s.newCoalescer("", nil)
		return co, "", err
	}
	c, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, "", err
	}
	addr := c.Options().Addr
	if v, ok := s.coalescers.Load(addr); ok {
		co := v.(*coalescer)
		if co.batch.Load() != c {
			co.batch.Store(c) // the cluster client replaced the node's client
		}
		return co, addr, nil
	}
	co, err := s.newCoalescer(addr, c)
	return co, addr, err
}

// newCoalescer returns node's coalescer, creating it (and its flushers)
// unless the store is closed.
func (s *Store) newCoalescer(node string, c *redis.Client) (*coalescer, error) {
	s.coMu.Lock()
	defer s.coMu.Unlock()
	if v, ok := s.coalescers.Load(node); ok {
		return v.(*coalescer), nil
	}
	if s.closed {
		return nil, redis.ErrClosed
	}
	co := newCoalescer(s.breaker(node), s.client, s.client, s.maxInFlight, s.maxBatch)
	co.scripts.node, co.scripts.onMode = node, s.onScriptMode
	if c != nil {
		co.batch.Store(c)
	}
	s.coalescers.Store(node, co)
	return co, nil
}

// breaker returns node's circuit breaker, creating it closed.
func (s *Store) breaker(node string) *breaker.Breaker {
	if b, ok := s.breakers.Load(node); ok {
		return b.(*breaker.Breaker)
	}
	o := s.brOpts
	if s.onChange != nil {
		o.OnChange = func(from, to breaker.State) { s.onChange(node, from, to) }
	}
	b, _ := s.breakers.LoadOrStore(node, breaker.New(o))
	return b.(*breaker.Breaker)
}

// BreakerStates returns the state of every node's circuit breaker seen so
// far, by node address ("" outside cluster mode).
func (s *Store) BreakerStates() map[string]breaker.State {
	m := map[string]breaker.State{}
	s.breakers.Range(func(k, v any) bool {
		m[k.(string)] = v.(*breaker.Breaker).State()
		return true
	})
	return m
}
