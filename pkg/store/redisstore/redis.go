// Package redisstore implements store.Store on Redis (a single server,
// Sentinel or Redis Cluster). A request's checks of one hash slot are
// decided atomically by plain commands on window-named keys (plain.go)
// where they can, else by decide.lua (scripts.go); concurrent calls to a
// node share pipelines (pipe.go); a request that spans slots is decided
// per slot, and Result.Consumed says what each slot wrote. Calls are
// bounded by their context's deadline, else Options.Timeout. Errors
// (errors.go) wrap store.ErrUnavailable when a node cannot answer,
// store.ErrProtocol when its answer is unusable.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/breaker"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore/lua"
)

var (
	_ store.Store   = (*Store)(nil)
	_ store.Batcher = (*Store)(nil)
)

// Store decides rate-limit checks in Redis. It is safe for concurrent use.
type Store struct {
	client  redis.UniversalClient
	cluster bool
	owned   bool // Close closes client
	timeout time.Duration
	now     func() time.Time // test clock; nil means Redis's
	plain   bool             // plain commands (plain.go)
	routes  [numRoutes]atomic.Uint64
	prevs   prevCounts // sliding windows' previous counts (prev.go)

	fleetKey     string // KeyPrefix + FleetKey
	demandPrefix string // KeyPrefix + DemandKeyPart
	replica      string // this process's id in the fleet's heartbeats and the demand hashes

	brOpts       breaker.Options
	onChange     func(node string, from, to breaker.State)
	onScriptMode func(node, mode, reason string)

	maxInFlight, maxBatch int
	mu                    sync.Mutex
	nodes                 sync.Map // address ("" outside cluster mode) -> *node
	closed                bool
	lastReload            atomic.Int64 // unix nanoseconds of the last cluster state reload
}

// The routes a slot's part of a request takes, counted by Routes.
const (
	RoutePlain       = iota // decided by plain commands
	RoutePlainScript        // plain commands, then the script (taken back)
	RouteScript             // the script alone
	numRoutes
)

// New validates opts and returns a Store on opts.Client. It does not
// connect: a Redis that is down makes calls fail, never New.
func New(opts Options) (*Store, error) {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	s := &Store{client: o.Client, owned: o.CloseClient, timeout: o.Timeout, now: o.Clock, plain: !o.NoPlain, brOpts: o.Breaker,
		onChange: o.OnBreakerChange, onScriptMode: o.OnScriptMode, maxInFlight: o.MaxInFlight, maxBatch: o.MaxBatch,
		fleetKey: o.KeyPrefix + FleetKey, demandPrefix: o.KeyPrefix + DemandKeyPart, replica: replicaID()}
	_, s.cluster = s.client.(*redis.ClusterClient)
	return s, nil
}

// Decide decides checks and writes one Result per Check into results (see
// store.Store). Errors from a Redis that cannot answer wrap
// store.ErrUnavailable, and the results of the slots that failed are
// marked Undecided (all of them outside cluster mode); the others are
// valid. An answer rls cannot use gives an error wrapping
// store.ErrProtocol; invalid checks and a cancelled ctx give errors that
// wrap neither, with no valid result.
func (s *Store) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	return s.run(ctx, false, checks, results)
}

// Peek reports what Decide would answer for check-only versions of checks
// and writes nothing. Errors as for Decide.
func (s *Store) Peek(ctx context.Context, checks []store.Check, results []store.Result) error {
	return s.run(ctx, true, checks, results)
}

// DecideBatch decides each request of reqs as Decide would, sending them
// together: one pipeline per node (store.Batcher).
func (s *Store) DecideBatch(ctx context.Context, reqs []store.Request) {
	var wg sync.WaitGroup
	for i := range reqs {
		r := &reqs[i]
		wg.Go(func() { r.Err = s.Decide(ctx, r.Checks, r.Results) })
	}
	wg.Wait()
}

// Delete removes the counters of checks (a missing one is not an error):
// a token bucket's or precision window's key, a windowed check's keys of
// the windows that count now (the previous, the current and, near its
// end, the next). Bounded by ctx's deadline, else the store's timeout.
// Errors wrap store.ErrUnavailable.
func (s *Store) Delete(ctx context.Context, checks ...store.Check) error {
	if len(checks) == 0 {
		return nil
	}
	ctx, cancel, b := s.bound(ctx)
	defer cancel()
	now := time.Now()
	if s.now != nil {
		now = s.now()
	}
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range checks {
			c := &checks[i]
			p.Del(ctx, c.Key)
			if !lua.Windowed(c) {
				continue
			}
			w := int64(c.Window / time.Second)
			start := now.Unix() / w * w
			for ws := start - w; ws <= start+w; ws += w {
				k := string(lua.WindowKey(nil, c.Key, ws))
				p.Del(ctx, k)
				s.prevs.drop(k)
			}
		}
		return nil
	})
	return s.fail(ctx, "delete", b, err)
}

// Ping checks that Redis answers (every master in cluster mode), for
// readiness probes, and loads the Function library on each node whose
// script mode is not known yet, and measures its clock. It is bounded by
// ctx only. Errors wrap store.ErrUnavailable.
func (s *Store) Ping(ctx context.Context) error {
	prepare := func(ctx context.Context, addr string, c *redis.Client) error {
		n, err := s.newNode(addr, c)
		if err != nil {
			return err
		}
		n.scripts.functions(ctx, n.cmdable())
		p := n.cmdable().Pipeline()
		st := localUS()
		ping, tc := p.Ping(ctx), p.Time(ctx)
		if _, err := p.Exec(ctx); err != nil {
			return err
		}
		n.clock.observe(tc.Val().UnixMicro(), st, localUS())
		return ping.Err()
	}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return s.wrap(ctx, "ping", cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return prepare(ctx, c.Options().Addr, c)
		}))
	}
	return s.wrap(ctx, "ping", prepare(ctx, "", nil))
}

// Close stops the nodes' flushers (calls still queued fail with
// ErrUnavailable) and closes the client unless it came in Options.Client.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.nodes.Range(func(_, v any) bool {
		v.(*node).close()
		return true
	})
	if !s.owned {
		return nil
	}
	return s.client.Close()
}

// Routes returns how many slot parts of requests each route decided since
// start, by RoutePlain, RoutePlainScript and RouteScript.
func (s *Store) Routes() [numRoutes]uint64 {
	var r [numRoutes]uint64
	for i := range r {
		r[i] = s.routes[i].Load()
	}
	return r
}

// run validates checks and decides them, one slot at a time.
func (s *Store) run(ctx context.Context, peek bool, checks []store.Check, results []store.Result) error {
	op := "decide"
	if peek {
		op = "peek"
	}
	if len(results) != len(checks) {
		return fmt.Errorf("redis %s: %d results for %d checks", op, len(results), len(checks))
	}
	if len(checks) == 0 {
		return nil
	}
	for i := range checks {
		if w := checks[i].Window; w < time.Second || w%time.Second != 0 {
			return fmt.Errorf("redis %s: check %d (key %q): window %v is not a whole number of seconds of at least 1s", op, i, checks[i].Key, w)
		}
	}
	ctx, cancel, b := s.bound(ctx)
	defer cancel()
	if !s.cluster || sameSlot(checks) {
		return s.slot(ctx, b, op, peek, checks, results)
	}
	return s.runSlots(ctx, b, op, peek, checks, results)
}

// runSlots decides a Cluster request whose keys span hash slots, one slot
// at a time, in parallel: the unavailable slots' results are Undecided,
// the others stand (store.Store); any other error makes the outcome
// unknown.
func (s *Store) runSlots(ctx context.Context, b budget, op string, peek bool, checks []store.Check, results []store.Result) error {
	var order []int
	bySlot := map[int][]int{}
	for i := range checks {
		sl := Slot(checks[i].Key)
		if _, ok := bySlot[sl]; !ok {
			order = append(order, sl)
		}
		bySlot[sl] = append(bySlot[sl], i)
	}
	errs := make([]error, len(order))
	var wg sync.WaitGroup
	for g, sl := range order {
		wg.Go(func() {
			idx := bySlot[sl]
			cs, rs := make([]store.Check, len(idx)), make([]store.Result, len(idx))
			for j, i := range idx {
				cs[j] = checks[i]
			}
			errs[g] = s.slot(ctx, b, op, peek, cs, rs)
			for j, i := range idx {
				results[i] = rs[j]
			}
		})
	}
	wg.Wait()
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

// sameSlot reports whether every check's key is in the first one's slot.
func sameSlot(checks []store.Check) bool {
	first := Slot(checks[0].Key)
	for i := 1; i < len(checks); i++ {
		if Slot(checks[i].Key) != first {
			return false
		}
	}
	return true
}

// slot decides checks of one hash slot: by plain commands when they can,
// else (or after them) by the script. When the node cannot answer, every
// result is Undecided.
func (s *Store) slot(ctx context.Context, b budget, op string, peek bool, checks []store.Check, results []store.Result) error {
	n, err := s.node(ctx, checks[0].Key)
	route := RouteScript
	if err == nil {
		var back []plainBack
		if !peek && s.plain && !n.noPlain.Load() && plainable(checks) {
			var decided bool
			decided, back, err = s.decidePlain(ctx, n, checks, results)
			route = RoutePlain
			if !decided && err == nil {
				route = RoutePlainScript
			}
			if decided || err != nil {
				s.routes[route].Add(1)
				return s.settle(ctx, b, op, n, checks, results, err)
			}
		}
		err = s.script(ctx, n, peek, checks, results, back)
	}
	s.routes[route].Add(1)
	return s.settle(ctx, b, op, n, checks, results, err)
}

// settle classifies err, marks the results Undecided when the node could
// not answer, and names the node of an open breaker.
func (s *Store) settle(ctx context.Context, b budget, op string, n *node, checks []store.Check, results []store.Result, err error) error {
	if errors.Is(err, errOpen) {
		err = circuitOpen(n.addr)
	}
	err = s.fail(ctx, op, b, err)
	if errors.Is(err, store.ErrUnavailable) {
		for i := range results {
			results[i] = store.Result{Undecided: true}
		}
	}
	return err
}

// script decides checks with decide.lua in one round trip, after taking
// back what plain commands counted (back), and sets results.
func (s *Store) script(ctx context.Context, n *node, peek bool, checks []store.Check, results []store.Result, back []plainBack) error {
	now, _, ok := n.clock.bounds(localUS())
	if !ok {
		now = time.Now().UnixMicro() // a guess the script corrects
	}
	var fetched map[string]int64
	for range 4 {
		prevs := s.prevsOf(checks, now, fetched)
		reply, err := s.scriptOnce(ctx, n, peek, checks, now, back, prevs)
		back = nil // taken back, or lost with err
		if err != nil && fetched == nil && s.cluster && redis.IsTryAgainError(err) {
			// A slot being migrated refuses a call on keys only some of
			// which it holds: read the previous counts alone (GET follows
			// ASK), and send the call again with one key per check.
			if fetched, err = s.fetchPrevs(ctx, checks, now); err == nil {
				continue
			}
		}
		if err != nil {
			return err
		}
		if t, wrong := lua.WrongWindow(reply); wrong {
			now = t
			continue
		}
		for i := range checks {
			if prevs[i] < 0 && checks[i].Refund && twoCounter(&checks[i]) {
				s.prevs.drop(prevKey(&checks[i], now)) // the refund may have lowered it
			}
		}
		return decodeReply(reply, peek, checks, results)
	}
	return fmt.Errorf("%w: the script's window kept moving", store.ErrProtocol)
}

// twoCounter reports whether c is a two-counter sliding window, which
// reads its previous window's count.
func twoCounter(c *store.Check) bool {
	return lua.Windowed(c) && c.Algorithm != store.FixedWindow
}

// unknownPrev reports whether the script reads a previous count from its
// key.
func unknownPrev(checks []store.Check, prevs []int64) bool {
	for i := range checks {
		if prevs[i] < 0 && twoCounter(&checks[i]) {
			return true
		}
	}
	return false
}

// windowStart returns the start (Unix seconds) of c's window at now (µs).
func windowStart(c *store.Check, now int64) int64 {
	w := int64(c.Window / time.Second)
	return store.FloorDiv(now, w*1e6) * w
}

// prevKey names c's previous window's key at now (µs).
func prevKey(c *store.Check, now int64) string {
	return string(lua.WindowKey(nil, c.Key, windowStart(c, now)-int64(c.Window/time.Second)))
}

// prevsOf returns the previous counts the script call for checks at now
// gives (-1: it reads the key): those kept, but none to a refund (which
// may lower it), and every one fetched after a TRYAGAIN.
func (s *Store) prevsOf(checks []store.Check, now int64, fetched map[string]int64) []int64 {
	prevs := make([]int64, len(checks))
	for i := range checks {
		c := &checks[i]
		prevs[i] = -1
		if !twoCounter(c) {
			continue
		}
		k := prevKey(c, now)
		if n, ok := fetched[k]; ok {
			prevs[i] = n
		} else if n, ok := s.prevs.get(k, now); ok && !c.Refund {
			prevs[i] = n
		}
	}
	return prevs
}

// fetchPrevs reads the previous counts of checks at now, each by a GET
// the cluster client sends where the key is, and keeps them.
func (s *Store) fetchPrevs(ctx context.Context, checks []store.Check, now int64) (map[string]int64, error) {
	gets := map[string]*redis.StringCmd{}
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range checks {
			if c := &checks[i]; twoCounter(c) {
				if k := prevKey(c, now); gets[k] == nil {
					gets[k] = p.Get(ctx, k)
				}
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make(map[string]int64, len(gets))
	for k, g := range gets {
		n, _ := parseCount(g) // not a count reads as 0, as in the script
		out[k] = n
	}
	return out, nil
}

// scriptOnce runs decide.lua once for checks, its window keys named for
// now (Unix µs) with the previous counts prevs (prevsOf), after the
// take-backs back, and returns its reply.
func (s *Store) scriptOnce(ctx context.Context, n *node, peek bool, checks []store.Check, now int64, back []plainBack, prevs []int64) (string, error) {
	keys, args := s.scriptArgs(peek, checks, now, prevs)
	functions := n.scripts.functions(ctx, n.cmdable())
	sent := time.Now().UnixNano()
	var cmd *redis.Cmd
	c := newCall(func(ctx context.Context, p redis.Pipeliner) {
		queueBack(ctx, p, back)
		if functions {
			cmd = fcall(ctx, p, keys, args)
		} else {
			cmd = p.EvalSha(ctx, lua.Decide.Hash(), keys, args...)
		}
	})
	if err := n.do(ctx, c); err != nil {
		return "", err
	}
	reply, err := scriptReply(cmd)
	backFailed := backErr(back)
	if s.cluster && ctx.Err() == nil {
		// The slot moved or is moving: the cluster client follows MOVED
		// and ASK, for the take-backs that did not run and the script (by
		// EVALSHA, which any node runs).
		backFailed = s.redoBack(ctx, back, backFailed)
		if redirected(err) && !(unknownPrev(checks, prevs) && redis.IsTryAgainError(err)) {
			reply, err = runEval(ctx, s.client, keys, args)
		}
	}
	if err == nil {
		err = backFailed
	}
	switch {
	case err != nil && noScript(err):
		reply, err = scriptReply(n.cmdable().Eval(ctx, lua.DecideSource, keys, args...))
	case err != nil && (functionMissing(err) || fcallRefused(err)):
		reply, err = n.run(ctx, n.cmdable(), keys, args, sent)
	}
	return reply, err
}

// scriptArgs returns decide.lua's KEYS and ARGV for checks, their windows
// named for now (Unix µs).
func (s *Store) scriptArgs(peek bool, checks []store.Check, now int64, prevs []int64) ([]string, []any) {
	keys := make([]string, 0, 2*len(checks))
	blob := make([]byte, 0, lua.CheckBytes*len(checks))
	for i := range checks {
		c := &checks[i]
		start := windowStart(c, now)
		keys = lua.Keys(keys, c, start, prevs[i] >= 0)
		blob = lua.AppendCheck(blob, c, start, prevs[i])
	}
	args := []any{argNoClock, argModeDecide, blob}
	if s.now != nil {
		args[0] = strconv.FormatInt(s.now().UnixMicro(), 10)
	}
	if peek {
		args[1] = argModePeek
	}
	return keys, args
}

// redoBack sends again, through the cluster client, the take-backs of back
// that a redirect kept from running, and returns the take-backs' error
// (failed, when none was redone).
func (s *Store) redoBack(ctx context.Context, back []plainBack, failed error) error {
	rb := redone(back)
	if len(rb) == 0 {
		return failed
	}
	_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		queueBack(ctx, p, rb)
		return nil
	})
	return cmp(otherErr(back), backErr(rb))
}

// decodeReply stores the script's reply in results. When decided (not
// peeked), the allowed consuming checks are Consumed unless a denied
// consuming non-shadow check vetoed the request.
func decodeReply(reply string, peek bool, checks []store.Check, results []store.Result) error {
	if len(reply) != lua.ResultBytes*len(checks) {
		return fmt.Errorf("%w: the script replied %d bytes for %d checks", store.ErrProtocol, len(reply), len(checks))
	}
	veto := false
	for j := range checks {
		r := lua.ResultAt(reply, j)
		results[j] = store.Result{Allowed: r.Allowed, Remaining: toUint(r.Remaining), Reset: micros(toUint(r.ResetUS)),
			Lease: store.Lease{Hits: toUint(r.LeaseHits), Now: toUint(r.LeaseNow), From: micros(toUint(r.LeaseFromUS)), Every: micros(toUint(r.LeaseEveryUS))}}
		if !r.Allowed {
			results[j].RetryAfter = micros(toUint(r.RetryUS))
		}
		if checks[j].Consuming() && !r.Allowed && !checks[j].Shadow {
			veto = true
		}
	}
	for j := range checks {
		results[j].Consumed = !peek && !veto && checks[j].Consuming() && results[j].Allowed
	}
	return nil
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
// background, at most twice a second) after a failed call: a dead master
// only refuses connections and sends no redirect.
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

// node returns the node that owns key ("" outside cluster mode).
func (s *Store) node(ctx context.Context, key string) (*node, error) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		if n, ok := s.nodes.Load(""); ok {
			return n.(*node), nil
		}
		return s.newNode("", nil)
	}
	c, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	addr := c.Options().Addr
	if v, ok := s.nodes.Load(addr); ok {
		n := v.(*node)
		if n.client.Load() != c {
			n.client.Store(c) // the cluster client replaced the node's client
		}
		return n, nil
	}
	return s.newNode(addr, c)
}

// newNode returns the node at addr, creating it (and its flushers) unless
// the store is closed.
func (s *Store) newNode(addr string, c *redis.Client) (*node, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.nodes.Load(addr); ok {
		return v.(*node), nil
	}
	if s.closed {
		return nil, redis.ErrClosed
	}
	n := newNode(addr, s.breaker(addr), s.client, c, s.maxInFlight, s.maxBatch)
	n.scripts.onMode, n.clock.fake = s.onScriptMode, s.now
	s.nodes.Store(addr, n)
	return n, nil
}

// breaker returns a new closed circuit breaker for node.
func (s *Store) breaker(node string) *breaker.Breaker {
	o := s.brOpts
	if s.onChange != nil {
		o.OnChange = func(from, to breaker.State) { s.onChange(node, from, to) }
	}
	return breaker.New(o)
}

// BreakerStates returns the state of every node's circuit breaker seen so
// far, by node address ("" outside cluster mode).
func (s *Store) BreakerStates() map[string]breaker.State {
	m := map[string]breaker.State{}
	s.nodes.Range(func(k, v any) bool {
		m[k.(string)] = v.(*node).br.State()
		return true
	})
	return m
}
