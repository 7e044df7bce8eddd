package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync/atomic"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/redisclient"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store/upstream"
)

// Behind twemproxy (nutcracker), envoyproxy/ratelimit's documented sharding
// proxy, rls counts what upstream counts with the commands upstream sends
// (pkg/store/upstream): fixed windows of one unit, in upstream's keys,
// with INCRBY, EXPIRE and DECRBY. twemproxy proxies no script, HELLO or
// TIME, so every other rule is refused at start (and in a reload or an
// xDS update), naming twemproxy and the rule: a rule is enforced exactly
// or not at all. rls tells twemproxy from Redis by itself, with no
// setting: at start (upstream.Detect on a single Redis's redis:// or
// unix:// address), and, for a twemproxy not reachable then, by the
// readiness probe until the store first answers, which stops rls.

// upstreamClient is the client of upstream's keys on --redis-url (behind
// twemproxy when tw), with the Redis store's settings.
func (c *Config) upstreamClient(tw bool, tc *tls.Config) upstream.ClientOptions {
	return upstream.ClientOptions{URL: c.RedisURL, Mode: c.redisMode(), MasterName: c.RedisMasterName, Username: c.RedisUsername,
		Password: c.RedisPassword, PoolSize: c.RedisPoolSize, Timeout: c.RedisTimeout, TLSConfig: tc, Twemproxy: tw}
}

// detectTwemproxy reports whether --redis-url is a twemproxy, as
// upstream.Detect finds within --redis-timeout. An address that does not
// answer tells nothing yet (lateTwemproxy watches it).
func (a *app) detectTwemproxy(tc *tls.Config) bool {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.RedisTimeout)
	defer cancel()
	tw, err := upstream.Detect(ctx, a.cfg.upstreamClient(false, tc))
	if tw {
		a.log.Info("twemproxy detected: it closed the connection on TIME; counting envoyproxy/ratelimit's fixed windows with plain commands",
			"url", redisclient.RedactURL(a.cfg.RedisURL))
	} else if err != nil {
		a.log.Debug("twemproxy detection: no answer yet", "err", err)
	}
	return tw
}

// lateTwemproxy wraps the store's readiness probe: until the store first
// answers, a failing probe asks whether --redis-url is a twemproxy after
// all (one not reachable at start, to which rls speaks as to Redis, in
// vain), and if so calls stop with why: rls is not serving yet, and a
// restart finds the twemproxy.
func (a *app) lateTwemproxy(ready func(context.Context) error, tc *tls.Config, stop func(error)) func(context.Context) error {
	if a.cfg.Store != "redis" || tc != nil {
		return ready
	}
	var answered atomic.Bool
	opts := a.cfg.upstreamClient(false, tc)
	return func(ctx context.Context) error {
		err := ready(ctx)
		if err == nil || answered.Load() {
			answered.Store(err == nil || answered.Load())
			return err
		}
		if tw, _ := upstream.Detect(ctx, opts); tw {
			stop(fmt.Errorf("twemproxy at %s: it was not reachable when rls started, so rls spoke to it as to Redis (HELLO, scripts), which twemproxy refuses; "+
				"restart rls: it detects twemproxy at start", redisclient.RedactURL(a.cfg.RedisURL)))
		}
		return err
	}
}

// fatal stops rls with err once it serves (wait receives it); before,
// it is dropped (a later probe says it again).
func (a *app) fatal(err error) {
	if a.srv != nil {
		a.srv.Fail(err)
	}
}

// checkTwemproxy refuses, behind twemproxy, rules that rls cannot count
// there (service.CheckUpstreamKeyed).
func (a *app) checkTwemproxy(rules *descriptors.Config) error {
	if !a.twemproxy {
		return nil
	}
	return service.CheckUpstreamKeyed(rules, "twemproxy at "+redisclient.RedactURL(a.cfg.RedisURL))
}
