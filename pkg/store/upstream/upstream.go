// Package upstream counts envoyproxy/ratelimit's fixed windows in
// upstream's own Redis keys, with the plain commands upstream sends, so
// that replicas of upstream and of rls sharing one Redis share one count
// while both run (a rolling update from one image to the other), and so
// that a twemproxy (nutcracker), which proxies neither scripts nor HELLO
// nor TIME, may stand between rls and Redis as it stands in front of
// upstream.
//
// A check is upstream's when its key, after the prefix, is not one of
// rls's ("rl:{...", "tb:{..."): the service builds it as upstream's
// src/limiter/cache_key.go does, prefix + domain + "_" + (key "_" value
// "_")..., and Store appends the window's start, (now / window) * window
// on this replica's clock, as upstream does. The counter is a plain
// integer, incremented with INCRBY and given the window as its TTL with
// EXPIRE, pipelined, as upstream's. Unlike upstream, a denial takes its
// hits back (DECRBY), so a denied request consumes nothing: while a denied
// request's hits are counted, a concurrent request may be denied with them
// (a denial too many, never an admission too many). Other checks go to the
// inner store, rls's own (Options.Inner).
//
// Invariants, each held by the test named:
//  1. A key is counted in upstream's name with the window's start
//     appended, with the window as its TTL (TestUpstreamKeys).
//  2. No check is admitted beyond the limit, from any number of
//     concurrent callers (TestConcurrentNeverOver, and behind twemproxy
//     integration's TestTwemproxyTwoReplicasExact).
//  3. A denied request leaves its counters as they were: its own hits and
//     those of its allowed checks go back (TestDenialTakesBack).
//  4. No command other than GET, INCRBY, DECRBY, EXPIRE and DEL is sent,
//     and no HELLO on a twemproxy client (TestTwemproxyCommands).
package upstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore"
)

var _ store.Store = (*Store)(nil)

// Options configures New.
type Options struct {
	// Inner decides the checks of rls's own keys. Nil: there is none
	// (behind twemproxy, which proxies no scripts), and Decide refuses
	// such checks with an error wrapping store.ErrProtocol.
	Inner store.Store
	// Client counts upstream's keys; required. Close closes it.
	Client redis.UniversalClient
	// KeyPrefix begins every key (--key-prefix, CACHE_KEY_PREFIX).
	KeyPrefix string
	// Now is the windows' clock [time.Now]: each replica's own, as
	// upstream's.
	Now func() time.Time
	// Timeout bounds a call whose context has no deadline [a second].
	Timeout time.Duration
}

// Store is a store.Store that counts upstream's keys itself and hands the
// others to its inner store. It is safe for concurrent use.
type Store struct {
	inner   store.Store
	client  redis.UniversalClient
	prefix  string
	now     func() time.Time
	timeout time.Duration
}

// New returns the Store of o.
func New(o Options) *Store {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	return &Store{inner: o.Inner, client: o.Client, prefix: o.KeyPrefix, now: o.Now, timeout: o.Timeout}
}

// IsUpstream reports whether key is one of upstream's keys.
func (s *Store) IsUpstream(key string) bool {
	k := strings.TrimPrefix(key, s.prefix)
	return !strings.HasPrefix(k, "rl:{") && !strings.HasPrefix(k, "tb:{")
}

// ErrNoScripts is the error of a check in rls's own keys on a Store
// without an inner store (behind twemproxy): such keys need scripts.
var ErrNoScripts = fmt.Errorf("%w: behind twemproxy rls counts only envoyproxy/ratelimit's fixed windows of one unit (its keys need no script)", store.ErrProtocol)

// Decide decides upstream's checks here and the others in the inner store
// (see store.Store). The two parts are decided apart: a request denied in
// one part keeps what the other consumed (Result.Consumed), for the
// caller to refund, as a Redis Cluster's slots are.
func (s *Store) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	return s.split(ctx, checks, results, false)
}

// Peek is Decide writing nothing.
func (s *Store) Peek(ctx context.Context, checks []store.Check, results []store.Result) error {
	return s.split(ctx, checks, results, true)
}

func (s *Store) split(ctx context.Context, checks []store.Check, results []store.Result, peek bool) error {
	if len(results) != len(checks) {
		return fmt.Errorf("upstream keys: %d results for %d checks", len(results), len(checks))
	}
	var up, rest []int
	for i := range checks {
		if s.IsUpstream(checks[i].Key) {
			up = append(up, i)
		} else {
			rest = append(rest, i)
		}
	}
	var restErr error
	switch {
	case len(rest) > 0 && s.inner == nil:
		restErr = fmt.Errorf("key %q: %w", checks[rest[0]].Key, ErrNoScripts)
	case len(up) == 0:
		if peek {
			return s.inner.Peek(ctx, checks, results)
		}
		return s.inner.Decide(ctx, checks, results)
	case len(rest) > 0:
		cs, rs := make([]store.Check, len(rest)), make([]store.Result, len(rest))
		for j, i := range rest {
			cs[j] = checks[i]
		}
		if peek {
			restErr = s.inner.Peek(ctx, cs, rs)
		} else {
			restErr = s.inner.Decide(ctx, cs, rs)
		}
		for j, i := range rest {
			results[i] = rs[j]
		}
	}
	if err := s.decide(ctx, checks, results, up, peek); err != nil {
		return err
	}
	return restErr
}

// counted is one upstream check in flight.
type counted struct {
	key      string
	reset    time.Duration // to the window's end
	count    int64         // the counter after the check's command
	hits     int64
	incr     *redis.IntCmd    // INCRBY (consuming, forced) or DECRBY (refund)
	get      *redis.StringCmd // GET (peek, check-only)
	allowed  bool
	takeBack bool // its hits go back: denied, or allowed in a denied request
}

// decide counts the upstream checks idx of checks: one pipeline of GET,
// or INCRBY (DECRBY for a refund) and EXPIRE, per check; then, in a second
// pipeline, the take-backs of a denied request and the repair of a refund
// that went below zero.
func (s *Store) decide(ctx context.Context, checks []store.Check, results []store.Result, idx []int, peek bool) error {
	if len(idx) == 0 {
		return nil
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	cs, err := s.count(ctx, checks, idx, peek)
	if err != nil {
		for _, i := range idx {
			results[i] = store.Result{Undecided: true}
		}
		return redisstore.Classify(ctx, "decide upstream keys", unavailable(err))
	}
	veto := judge(checks, cs, idx, peek)
	if !peek {
		s.settle(ctx, checks, cs, idx, veto)
	}
	for j, i := range idx {
		results[i] = cs[j].result(&checks[i], peek)
	}
	return nil
}

// count runs the first pipeline of decide and returns each check's count.
func (s *Store) count(ctx context.Context, checks []store.Check, idx []int, peek bool) ([]counted, error) {
	now := s.now()
	cs := make([]counted, len(idx))
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j, i := range idx {
			cs[j].queue(ctx, p, &checks[i], now, peek)
		}
		return nil
	})
	if errors.Is(err, redis.Nil) { // a GET of a key not counted yet: 0
		err = nil
	}
	for j := range cs {
		if err != nil {
			break
		}
		cs[j].count, err = cs[j].value()
	}
	return cs, err
}

// queue adds c's commands to p: GET for a peek, else INCRBY (DECRBY for a
// refund) and EXPIRE on the key of the window now is in.
func (k *counted) queue(ctx context.Context, p redis.Pipeliner, c *store.Check, now time.Time, peek bool) {
	win := max(int64(c.Window/time.Second), 1)
	start := now.Unix() / win * win
	k.key = c.Key + strconv.FormatInt(start, 10)
	k.reset = time.Unix(start+win, 0).Sub(now)
	k.hits = int64(min(c.Hits, 1<<62))
	switch {
	case peek || c.Hits == 0:
		k.get = p.Get(ctx, k.key)
		return
	case c.Refund:
		k.incr = p.DecrBy(ctx, k.key, k.hits)
	default:
		k.incr = p.IncrBy(ctx, k.key, k.hits)
	}
	p.Expire(ctx, k.key, time.Duration(win)*time.Second)
}

// judge decides each check of idx from its count, and reports whether a
// denial vetoes the request (its other checks' hits go back).
func judge(checks []store.Check, cs []counted, idx []int, peek bool) bool {
	veto := false
	for j, i := range idx {
		c, k := &checks[i], &cs[j]
		switch {
		case peek || c.Hits == 0: // as upstream's hits_addend 0: over only past the limit
			k.allowed = k.count <= int64(c.Limit)
		case c.Refund || c.Force:
			k.allowed = true
		default:
			k.allowed = k.count <= int64(c.Limit)
			if !k.allowed && !c.Shadow { // a shadow's denial counts, as upstream's, and vetoes nothing
				veto, k.takeBack = true, true
			}
		}
	}
	return veto
}

// value reads the count a check's command left.
func (k *counted) value() (int64, error) {
	if k.get == nil {
		return k.incr.Result()
	}
	v, err := k.get.Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: the counter %q holds %q, not an integer", store.ErrProtocol, k.key, v)
	}
	return n, nil
}

// settle takes back the hits of a denied request (its denied checks', and
// its allowed consuming checks' when veto) and lifts a refunded counter
// that went below zero back to zero, in one pipeline. A take-back that
// fails leaves hits counted until the window ends: a denial too many,
// never an admission too many; it is not an error of the decision.
func (s *Store) settle(ctx context.Context, checks []store.Check, cs []counted, idx []int, veto bool) {
	_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j, i := range idx {
			c, k := &checks[i], &cs[j]
			if veto && k.allowed && c.Consuming() {
				k.takeBack = true
			}
			switch {
			case k.takeBack:
				p.DecrBy(ctx, k.key, k.hits)
				k.count -= k.hits
			case c.Refund && k.count < 0:
				p.IncrBy(ctx, k.key, -k.count)
				k.count = 0
			}
		}
		return nil
	})
}

// result is the Result of check c counted as k.
func (k *counted) result(c *store.Check, peek bool) store.Result {
	left := uint64(max(k.count, 0))
	r := store.Result{Allowed: k.allowed, Reset: k.reset, Remaining: c.Limit - min(left, c.Limit)}
	r.Consumed = r.Allowed && c.Consuming() && !peek && !k.takeBack
	if !r.Allowed {
		r.RetryAfter = k.reset
	}
	return r
}

// unavailable marks twemproxy's own error replies, which say that the
// Redis behind it cannot be reached ("ERR Connection refused"), as an
// outage; the rest are left for redisstore.Classify.
func unavailable(err error) error {
	var re redis.Error
	if !errors.As(err, &re) {
		return err
	}
	msg := strings.TrimPrefix(re.Error(), "ERR ")
	for _, s := range proxyErrors {
		if strings.HasPrefix(msg, s) {
			return fmt.Errorf("%w: twemproxy: %w", store.ErrUnavailable, err)
		}
	}
	return err
}

// proxyErrors are the beginnings of twemproxy's error replies for a Redis
// it cannot reach (strerror of the socket's errno).
var proxyErrors = []string{"Connection refused", "Connection timed out", "Connection reset", "Broken pipe",
	"Host is down", "Host is unreachable", "No route to host", "Network is unreachable",
	"Transport endpoint is not connected", "Operation timed out", "unknown"}

// bound returns ctx bounded by its own deadline, else by the timeout.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.timeout)
}

// Ready reports whether Redis answers: a GET through the client (behind
// twemproxy a PING is answered by the proxy itself, Redis or not).
func (s *Store) Ready(ctx context.Context) error {
	err := s.client.Get(ctx, s.prefix+"rls:ready").Err()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	return redisstore.Classify(ctx, "ready", unavailable(err))
}

// Delete removes the counters of checks: of upstream's keys the current
// window's, of the others what the inner store deletes.
func (s *Store) Delete(ctx context.Context, checks ...store.Check) error {
	var up []string
	var rest []store.Check
	now := s.now().Unix()
	for _, c := range checks {
		if !s.IsUpstream(c.Key) {
			rest = append(rest, c)
			continue
		}
		w := max(int64(c.Window/time.Second), 1)
		up = append(up, c.Key+strconv.FormatInt(now/w*w, 10))
	}
	var errs []error
	if len(rest) > 0 {
		if s.inner == nil {
			errs = append(errs, ErrNoScripts)
		} else {
			errs = append(errs, s.inner.Delete(ctx, rest...))
		}
	}
	if len(up) > 0 {
		ctx, cancel := s.bound(ctx)
		defer cancel()
		_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range up {
				p.Del(ctx, k)
			}
			return nil
		})
		errs = append(errs, redisstore.Classify(ctx, "delete upstream keys", unavailable(err)))
	}
	return errors.Join(errs...)
}

// Close closes the inner store and the client.
func (s *Store) Close() error {
	var err error
	if s.inner != nil {
		err = s.inner.Close()
	}
	return errors.Join(err, s.client.Close())
}
