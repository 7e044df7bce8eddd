package redisstore

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/store"
)

// UpstreamKeys counts fixed-window checks in envoyproxy/ratelimit's own
// keys, so that replicas of upstream and of rls sharing one Redis share one
// count while both run (a rolling update from one image to the other).
//
// A check is upstream's when its key, after the prefix, is not one of rls's
// ("rl:{...", "tb:{..."): the service builds it as upstream's
// src/limiter/cache_key.go does, prefix + domain + "_" + (key "_" value
// "_")..., and UpstreamKeys appends the window's start, (now / window) *
// window on this replica's clock, as upstream does. The counter is a plain
// integer, incremented with INCRBY and given the window as EXPIRE, as
// upstream's; unlike upstream, a denied check takes its hits back in the
// same script, so a denial consumes nothing. Other checks go to the Store.
type UpstreamKeys struct {
	*Store
	prefix string
	now    func() time.Time
}

// NewUpstreamKeys wraps s; prefix is the keys' prefix (--key-prefix).
func NewUpstreamKeys(s *Store, prefix string) *UpstreamKeys {
	return &UpstreamKeys{Store: s, prefix: prefix, now: time.Now}
}

// isUpstream reports whether key is an upstream key.
func (u *UpstreamKeys) isUpstream(key string) bool {
	k := strings.TrimPrefix(key, u.prefix)
	return !strings.HasPrefix(k, "rl:{") && !strings.HasPrefix(k, "tb:{")
}

// upstreamScript: KEYS[1] the window's key; ARGV hits, limit, window
// seconds, mode (0 decide, 1 shadow: count whatever, 2 force, 3 refund,
// 4 peek). It returns {allowed, count after}.
var upstreamScript = redis.NewScript(`
local hits, limit, ttl, mode = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if mode == 4 or hits == 0 then
  local c = tonumber(redis.call('GET', KEYS[1]) or '0')
  return {c <= limit and 1 or 0, c}
end
if mode == 3 then
  local c = tonumber(redis.call('GET', KEYS[1]) or '0')
  if c <= 0 then return {1, 0} end
  return {1, redis.call('DECRBY', KEYS[1], math.min(hits, c))}
end
local c = redis.call('INCRBY', KEYS[1], hits)
redis.call('EXPIRE', KEYS[1], ttl)
if c <= limit or mode == 1 or mode == 2 then
  return {c <= limit and 1 or 0, c}
end
return {0, redis.call('DECRBY', KEYS[1], hits)}
`)

// Decide decides the upstream checks in upstream's keys and the others in
// the Store (see store.Store).
func (u *UpstreamKeys) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	return u.split(ctx, checks, results, false)
}

// Peek is Decide writing nothing.
func (u *UpstreamKeys) Peek(ctx context.Context, checks []store.Check, results []store.Result) error {
	return u.split(ctx, checks, results, true)
}

func (u *UpstreamKeys) split(ctx context.Context, checks []store.Check, results []store.Result, peek bool) error {
	var up, rest []int
	for i := range checks {
		if u.isUpstream(checks[i].Key) {
			up = append(up, i)
		} else {
			rest = append(rest, i)
		}
	}
	inner := u.Store.Decide
	if peek {
		inner = u.Store.Peek
	}
	if len(up) == 0 {
		return inner(ctx, checks, results)
	}
	var restErr error
	if len(rest) > 0 {
		cs, rs := make([]store.Check, len(rest)), make([]store.Result, len(rest))
		for j, i := range rest {
			cs[j] = checks[i]
		}
		restErr = inner(ctx, cs, rs)
		for j, i := range rest {
			results[i] = rs[j]
		}
	}
	if err := u.decideUpstream(ctx, checks, results, up, peek, false); err != nil {
		return err
	}
	return restErr
}

// decideUpstream runs the script for each upstream check, pipelined.
func (u *UpstreamKeys) decideUpstream(ctx context.Context, checks []store.Check, results []store.Result, idx []int, peek, loaded bool) error {
	ctx, cancel, _ := u.bound(ctx)
	defer cancel()
	now := u.now()
	cmds := make([]*redis.Cmd, len(idx))
	resets := make([]time.Duration, len(idx))
	_, err := u.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j, i := range idx {
			c := &checks[i]
			win := int64(c.Window / time.Second)
			start := now.Unix() / win * win
			resets[j] = time.Unix(start+win, 0).Sub(now)
			cmds[j] = upstreamScript.EvalSha(ctx, p, []string{c.Key + strconv.FormatInt(start, 10)},
				c.Hits, c.Limit, win, upstreamMode(c, peek))
		}
		return nil
	})
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") && !loaded {
		// A Redis that has not seen the script yet (its first call, a
		// restart): load it where the keys are, then run once more.
		if err = upstreamScript.Load(ctx, u.client).Err(); err == nil {
			return u.decideUpstream(ctx, checks, results, idx, peek, true)
		}
	}
	if err != nil {
		for _, i := range idx {
			results[i] = store.Result{Undecided: true}
		}
		return u.wrap(ctx, "decide upstream keys", err)
	}
	for j, i := range idx {
		v, err := cmds[j].Int64Slice()
		if err != nil || len(v) != 2 {
			return u.wrap(ctx, "decide upstream keys", err)
		}
		c := &checks[i]
		count := uint64(max(v[1], 0))
		r := store.Result{Allowed: v[0] == 1, Reset: resets[j], Remaining: c.Limit - min(count, c.Limit)}
		if !r.Allowed {
			r.RetryAfter = resets[j]
		}
		r.Consumed = r.Allowed && c.Consuming() && !peek
		results[i] = r
	}
	return nil
}

// upstreamMode is the script's mode of a check.
func upstreamMode(c *store.Check, peek bool) int {
	switch {
	case peek:
		return 4
	case c.Refund:
		return 3
	case c.Force:
		return 2
	case c.Shadow:
		return 1
	}
	return 0
}
