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
// together as one pipeline as soon as a send returns.
//
// In cluster mode a batch whose keys span several slots is decided per slot,
// in parallel: each slot group is atomic, but the batch as a whole is not (a
// denial in one slot does not undo consumption in another). Only requests
// that mix tenants can span slots.
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
	client  redis.UniversalClient
	cluster bool
	owned   bool // Close closes client
	timeout time.Duration
	now     func() time.Time // test clock; nil means Redis TIME
	args    argCache         // script arguments, formatted and boxed once

	brOpts   breaker.Options
	onChange func(node string, from, to breaker.State)
	breakers sync.Map // node address ("" outside cluster mode) -> *breaker.Breaker

	maxInFlight, maxBatch int
	coMu                  sync.Mutex
	coalescers            sync.Map // node address -> *coalescer
	closed                bool
	redirects             atomic.Int64 // calls re-sent through the cluster client
	lastReload            atomic.Int64 // unix nanoseconds of the last cluster state reload
}

// Option configures a Store built by NewFromClient.
type Option func(*Store)

// WithClock makes every script evaluation use now() instead of Redis's TIME.
// It exists for tests (a deterministic clock shared with the memory store's
// conformance suite); production stores take time from Redis so every rls
// replica agrees on window boundaries. Nothing in a request can set it.
func WithClock(now func() time.Time) Option {
	return func(s *Store) { s.now = now }
}

// WithBreaker sets the per-node circuit breakers' options and state-change
// hook (see Options.Breaker and Options.OnBreakerChange).
func WithBreaker(o breaker.Options, onChange func(node string, from, to breaker.State)) Option {
	return func(s *Store) { s.brOpts, s.onChange = o, onChange }
}

// WithPipelining sets how many sends (single calls or pipelines) may be in
// flight per node and the most script calls one pipeline carries (see
// Options.MaxInFlight and Options.MaxBatch; 0 keeps a default).
func WithPipelining(maxInFlight, maxBatch int) Option {
	return func(s *Store) {
		if maxInFlight > 0 {
			s.maxInFlight = maxInFlight
		}
		if maxBatch > 0 {
			s.maxBatch = maxBatch
		}
	}
}

// WithTimeout sets the per-call budget of Decide and Peek (default
// DefaultTimeout).
func WithTimeout(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.timeout = d
		}
	}
}

// New validates opts and returns a Store with its own go-redis client. It
// does not connect: a Redis that is down makes calls fail, never New, which
// fails only on invalid options (see Options.Validate).
func New(opts Options) (*Store, error) {
	p, err := opts.clientOptions()
	if err != nil {
		return nil, err
	}
	s := &Store{owned: true, timeout: opts.timeout(), brOpts: opts.Breaker, onChange: opts.OnBreakerChange,
		maxInFlight: opts.MaxInFlight, maxBatch: opts.MaxBatch}
	switch {
	case p.cluster != nil:
		s.client, s.cluster = redis.NewClusterClient(p.cluster), true
	case p.failover != nil:
		s.client = redis.NewFailoverClient(p.failover)
	default:
		s.client = redis.NewClient(p.single)
	}
	return s, nil
}

// NewFromClient returns a Store using c, which it does not close (Close is a
// no-op for the client). A *redis.ClusterClient selects cluster mode (checks
// grouped by hash slot); any other client sends each batch in one call.
func NewFromClient(c redis.UniversalClient, opts ...Option) *Store {
	s := &Store{client: c, timeout: DefaultTimeout}
	_, s.cluster = c.(*redis.ClusterClient)
	for _, o := range opts {
		o(s)
	}
	return s
}

// Decide decides checks and writes one Result per Check into results (see
// store.Store). The call as a whole is bounded by the store's timeout.
// Errors from Redis (unreachable, slow, cluster down, loading, failing over)
// wrap store.ErrUnavailable, and the results of the slot groups that failed
// are marked Undecided (all of them outside cluster mode); the other groups'
// results are valid decisions. Invalid checks and a cancelled ctx give an
// error that does not wrap store.ErrUnavailable, and no valid result.
func (s *Store) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	return s.run(ctx, lua.ModeDecide, checks, results)
}

// Peek reports what Decide would answer for check-only versions of checks
// (Hits 0, no refund) and writes nothing. Errors as for Decide.
func (s *Store) Peek(ctx context.Context, checks []store.Check, results []store.Result) error {
	return s.run(ctx, lua.ModePeek, checks, results)
}

// Delete removes the counters at keys (a missing key is not an error), one
// DEL per hash slot, bounded by the store's timeout. Errors from Redis wrap
// store.ErrUnavailable.
func (s *Store) Delete(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if !s.cluster {
		return s.wrap(ctx, "delete", s.client.Del(ctx, keys...).Err())
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
	return s.wrap(ctx, "delete", err)
}

// Ping checks that Redis answers (every master in cluster mode), for
// readiness probes. It is bounded by ctx only. Errors wrap
// store.ErrUnavailable.
func (s *Store) Ping(ctx context.Context) error {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
		return s.wrap(ctx, "ping", err)
	}
	return s.wrap(ctx, "ping", s.client.Ping(ctx).Err())
}

// Close stops the coalescers' flushers (calls still queued fail with
// ErrUnavailable) and closes the client if New created it.
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
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	now := argNoClock
	if s.now != nil {
		now = strconv.FormatInt(s.now().UnixMicro(), 10)
	}

	// Unavailable groups are Undecided, the others stand (store.Store).
	// Any other error makes the whole outcome unknown.
	undecided := func(g []int) {
		forEach(g, len(checks), func(i int) { results[i] = store.Result{Undecided: true} })
	}
	groups := s.groups(checks)
	if len(groups) == 1 { // no goroutine or error slice for the usual call
		err := s.eval(ctx, mode, now, checks, results, groups[0])
		if errors.Is(err, store.ErrUnavailable) {
			undecided(groups[0])
		}
		return err
	}
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for g := 1; g < len(groups); g++ {
		wg.Go(func() { errs[g] = s.eval(ctx, mode, now, checks, results, groups[g]) })
	}
	errs[0] = s.eval(ctx, mode, now, checks, results, groups[0])
	wg.Wait()
	var unavailable []error
	for g, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, store.ErrUnavailable):
			unavailable = append(unavailable, err)
			undecided(groups[g])
		default:
			return err
		}
	}
	return errors.Join(unavailable...)
}

// forEach calls f with every index of a group (nil: 0 to n-1).
func forEach(idx []int, n int, f func(int)) {
	if idx == nil {
		for i := 0; i < n; i++ {
			f(i)
		}
		return
	}
	for _, i := range idx {
		f(i)
	}
}

// allChecks is the one group of every check; shared, never modified.
var allChecks = [][]int{nil}

// groups returns the indexes of checks per hash slot, in check order within
// a group; nil-group means "all checks" (one call).
func (s *Store) groups(checks []store.Check) [][]int {
	if !s.cluster {
		return allChecks
	}
	first := Slot(checks[0].Key)
	same := true
	for i := 1; i < len(checks) && same; i++ {
		same = Slot(checks[i].Key) == first
	}
	if same {
		return allChecks
	}
	var groups [][]int
	index := make(map[int]int) // slot -> groups index
	for i := range checks {
		slot := Slot(checks[i].Key)
		g, ok := index[slot]
		if !ok {
			g = len(groups)
			index[slot] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// eval runs the script once for the checks at idx (nil: all checks), via
// the coalescer of the node that owns them, and stores their results.
//
// The node's breaker counts round trips (see coalesce.go). While it is open
// calls fail at once; while it is half-open each call asks it alone and,
// when let through, is sent alone as a probe, outside the coalescer.
func (s *Store) eval(ctx context.Context, mode string, now any, checks []store.Check, results []store.Result, idx []int) error {
	n := len(idx)
	if idx == nil {
		n = len(checks)
	}
	at := func(j int) int {
		if idx == nil {
			return j
		}
		return idx[j]
	}
	c := getCall()
	keys := slices.Grow(c.keys[:0], n)
	args := slices.Grow(c.args[:0], lua.HeaderArgs+lua.ArgsPerCheck*n)
	modeArg := argModeDecide
	if mode == lua.ModePeek {
		modeArg = argModePeek
	}
	args = append(args, now, modeArg)
	for j := 0; j < n; j++ {
		ch := &checks[at(j)]
		keys = append(keys, ch.Key)
		var flags uint64
		if ch.Refund {
			flags |= lua.FlagRefund
		}
		if ch.Shadow {
			flags |= lua.FlagShadow
		}
		args = append(args,
			s.args.arg(uint64(ch.Algorithm)),
			s.args.arg(ch.Limit),
			s.args.arg(uint64(ch.Window/time.Second)),
			s.args.arg(ch.Burst),
			s.args.arg(ch.Hits),
			s.args.arg(flags),
		)
	}
	c.keys, c.args = keys, args
	co, node, err := s.coalescer(ctx, keys[0])
	if err != nil {
		putCall(c)
		return s.wrap(ctx, modeName(mode), err)
	}
	var reply []any
	if br := co.br; br.State() == breaker.Closed {
		reply, err = co.do(ctx, c)
	} else if br.Allow() {
		reply, err = runDecide(ctx, s.client, keys, args)
		br.Done(nodeAnswered(ctx, err))
	} else {
		err = errOpen
	}
	if errors.Is(err, errOpen) {
		putCall(c)
		return fmt.Errorf("redis %s: %w: circuit open for node %q after repeated failures", modeName(mode), store.ErrUnavailable, node)
	}
	if s.cluster && redirected(err) && ctx.Err() == nil {
		// The slot moved or is moving (resharding): the cluster client
		// follows MOVED and ASK and refreshes its slot map.
		s.redirects.Add(1)
		reply, err = runDecide(ctx, s.client, keys, args)
	}
	if c.state.Load() != callAbandoned {
		putCall(c)
	}
	if err != nil {
		return s.wrap(ctx, modeName(mode), err)
	}
	if len(reply) != lua.ReplyPerCheck*n {
		return fmt.Errorf("redis %s: script replied %d values for %d checks", modeName(mode), len(reply), n)
	}
	for j := 0; j < n; j++ {
		r, err := decodeResult(reply[lua.ReplyPerCheck*j : lua.ReplyPerCheck*(j+1)])
		if err != nil {
			return fmt.Errorf("redis %s: reply for %s: %w", modeName(mode), checks[at(j)].Key, err)
		}
		results[at(j)] = r
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

// decodeResult decodes one check's four reply values (see decide.lua's
// Reply: integers, or decimal strings beyond 2^53).
func decodeResult(v []any) (store.Result, error) {
	var r store.Result
	allowed, err := replyUint(v[0])
	if err != nil {
		return r, err
	}
	r.Allowed = allowed == 1
	if r.Remaining, err = replyUint(v[1]); err != nil {
		return r, err
	}
	retry, err := replyUint(v[2])
	if err != nil {
		return r, err
	}
	reset, err := replyUint(v[3])
	if err != nil {
		return r, err
	}
	r.RetryAfter, r.Reset = micros(retry), micros(reset)
	return r, nil
}

// replyUint reads a non-negative integer reply or decimal string; negative
// values become 0 and values beyond uint64 (or "inf") saturate.
func replyUint(v any) (uint64, error) {
	var s string
	switch v := v.(type) {
	case int64:
		return uint64(max(v, 0)), nil
	case string:
		s = v
	default:
		return 0, fmt.Errorf("unexpected reply value %T", v)
	}
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return u, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange):
		return 0, fmt.Errorf("reply value %q is not a number", s)
	case math.IsNaN(f) || f <= 0:
		return 0, nil
	case f >= math.MaxUint64:
		return math.MaxUint64, nil
	}
	return uint64(f), nil
}

// micros converts microseconds to a Duration, saturating.
func micros(us uint64) time.Duration {
	if us > math.MaxInt64/uint64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// wrap adds context to err and marks Redis trouble as store.ErrUnavailable:
// every error of a Redis call (network, timeout, pool, CLUSTERDOWN, LOADING,
// READONLY, MASTERDOWN, TRYAGAIN, BUSY, OOM, even a script error) means
// Redis gave no answer the caller can use, so the caller's fallback applies.
// A ctx cancelled by the caller is returned as is.
func (s *Store) wrap(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("redis %s: %w", op, err)
	}
	s.reloadClusterState()
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("redis %s: %w: no answer within %v: %w", op, store.ErrUnavailable, s.timeout, err)
	}
	return fmt.Errorf("redis %s: %w: %w", op, store.ErrUnavailable, err)
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
	limit, batch := s.maxInFlight, s.maxBatch
	if limit <= 0 {
		limit = DefaultMaxInFlight
	}
	limit = min(limit, MaxMaxInFlight)
	if batch <= 0 {
		batch = DefaultMaxBatch
	}
	co := newCoalescer(s.breaker(node), s.client, s.client, limit, batch)
	if c != nil {
		co.batch.Store(c)
	}
	s.coalescers.Store(node, co)
	return co, nil
}

// coalescerStats sums the counters of every node's coalescer (for tests).
func (s *Store) coalescerStats() coalescerStats {
	var t coalescerStats
	s.coalescers.Range(func(_, v any) bool {
		st := v.(*coalescer).stats()
		t.Sends += st.Sends
		t.Pipelines += st.Pipelines
		t.Calls += st.Calls
		t.MaxBatch = max(t.MaxBatch, st.MaxBatch)
		t.NoScript += st.NoScript
		return true
	})
	return t
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
