package main

import (
	"context"
	"crypto/tls"
	"fmt"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/redisclient"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store/upstream"
)

// Behind twemproxy, which proxies no script, HELLO or TIME, rls counts
// only fixed windows of one unit in upstream's keys (pkg/store/upstream)
// and refuses other rules at start, reload or xDS update. It detects
// twemproxy with no setting: at start, and until the store first answers.

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
// all (upstream.DetectLate), and if so calls stop with why: rls is not
// serving yet, and a restart finds the twemproxy.
func (a *app) lateTwemproxy(ready func(context.Context) error, tc *tls.Config, stop func(error)) func(context.Context) error {
	if a.cfg.Store != "redis" || tc != nil {
		return ready
	}
	return upstream.DetectLate(ready, a.cfg.upstreamClient(false, tc), func() {
		stop(fmt.Errorf("twemproxy at %s: it was not reachable when rls started, so rls spoke to it as to Redis (HELLO, scripts), which twemproxy refuses; "+
			"restart rls: it detects twemproxy at start", redisclient.RedactURL(a.cfg.RedisURL)))
	})
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
