package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/url"

	"github.com/redis/go-redis/v9"
	"github.com/rls-project/rls/pkg/breaker"
	"github.com/rls-project/rls/pkg/fleet"
	"github.com/rls-project/rls/pkg/redisclient"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore"
	"github.com/rls-project/rls/pkg/tlsconfig"
)

// redisOptions maps the Redis settings to the Redis client's options.
func (c *Config) redisOptions() redisclient.Options {
	return redisclient.Options{
		URL:        c.RedisURL,
		Mode:       c.redisMode(),
		MasterName: c.RedisMasterName,
		Username:   c.RedisUsername,
		Password:   c.RedisPassword,
		PoolSize:   c.RedisPoolSize,
		Timeout:    c.RedisTimeout,
	}
}

// redisTLS is the TLS configuration of the --redis-tls-* flags; nil
// without them (the URL's scheme decides).
func redisTLS(c *Config, log *slog.Logger) (*tls.Config, error) {
	skip := false
	if u, err := url.Parse(c.RedisURL); err == nil && u.Query().Get("skip_verify") == "true" {
		skip = true
		log.Warn("skip_verify=true in --redis-url: Redis's TLS certificate is not verified (testing only)")
	}
	if !c.redisTLSSet() {
		return nil, nil
	}
	tc, err := tlsconfig.Client(tlsconfig.ClientOptions{CA: c.RedisTLSCA, Cert: c.RedisTLSCert, Key: c.RedisTLSKey,
		InsecureSkipVerify: skip}, log) // the URL's skip_verify, which this configuration replaces
	if err != nil {
		return nil, fmt.Errorf("redis TLS: %w", err)
	}
	return tc, nil
}

// openRedis returns the Redis store and the client it runs on (which the
// store closes).
func openRedis(c *Config, tc *tls.Config, log *slog.Logger) (*redisstore.Store, redis.UniversalClient, error) {
	redisstore.SetLogger(log)
	opts := c.redisOptions()
	opts.TLSConfig = tc
	client, err := redisclient.New(opts)
	if err != nil {
		return nil, nil, fmt.Errorf("redis store: %w", userError(err))
	}
	s, err := redisstore.New(redisstore.Options{Client: client, CloseClient: true, Timeout: c.RedisTimeout, KeyPrefix: c.KeyPrefix,
		OnBreakerChange: func(node string, from, to breaker.State) {
			log.Warn("redis circuit breaker", "node", node, "from", from.String(), "to", to.String())
		},
		OnScriptMode: func(node, mode, reason string) {
			log.Info("redis decision script", "node", node, "mode", mode, "reason", reason)
		}})
	if err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("redis store: %w", err)
	}
	return s, client, nil
}

// newFleet returns the fleet-size source: --fleet-size when set, 1 on the
// memory store, else heartbeats in Redis.
func newFleet(cfg *Config, st store.Store, log *slog.Logger) *fleet.Fleet {
	if rs, ok := st.(*redisstore.Store); ok && cfg.FleetSize == 0 {
		id := rs.Replica()
		return fleet.New(fleet.Options{
			Beat:     func(ctx context.Context) (int, error) { return rs.Heartbeat(ctx, id, redisstore.HeartbeatTTL) },
			Leave:    func(ctx context.Context) error { return rs.Leave(ctx, id) },
			Interval: redisstore.HeartbeatInterval,
			Hold:     2 * redisstore.HeartbeatInterval, // every live replica beats within one interval
			Min:      cfg.MinFleetSize,
			Log:      log,
		})
	}
	return fleet.Fixed(cfg.FleetSize)
}
