package redisstore

import (
	"github.com/rls-project/rls/pkg/breaker"

	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Modes are the values of Options.Mode.
const (
	ModeSingle   = "single"
	ModeCluster  = "cluster"
	ModeSentinel = "sentinel"
)

var modes = []string{ModeSingle, ModeCluster, ModeSentinel}

// DefaultTimeout is the budget of one Decide or Peek call when
// Options.Timeout is zero: every shard's script call, including connecting,
// retries and the NOSCRIPT fallback, must finish within it. It is half of
// Envoy's default 20 ms rate-limit timeout, leaving the rest for the gRPC
// hop and the fallback decision.
const DefaultTimeout = 10 * time.Millisecond

// Options configures a Redis store. The zero value is not usable: URL is
// required.
type Options struct {
	// URL locates Redis (--redis-url). Mode single: redis[s]://[user:pass@]host:port[/db][?opts]
	// as redis.ParseURL reads it. Mode cluster: redis[s]://h1:p1?addr=h2:p2&addr=h3:p3
	// (seed nodes, redis.ParseClusterURL). Mode sentinel: the sentinels,
	// redis[s]://[user:pass@]s1:p1?addr=s2:p2[&master_name=m] (redis.ParseFailoverURL;
	// the URL's credentials authenticate to the sentinels). rediss:// means TLS.
	URL string
	// Mode is single (the default when empty), cluster or sentinel (--redis-mode).
	Mode string
	// MasterName is the Sentinel master set (--redis-master-name); it
	// overrides the URL's master_name. Required in sentinel mode.
	MasterName string
	// Username and Password, when not empty, override the URL's credentials
	// for the data nodes (--redis-username, --redis-password).
	Username, Password string
	// PoolSize is the connection pool size per node; 0 keeps go-redis's
	// default of 10 per GOMAXPROCS (--redis-pool-size).
	PoolSize int
	// Timeout bounds each Decide and Peek call as a whole; 0 means
	// DefaultTimeout (--redis-timeout).
	Timeout time.Duration
	// MaxInFlight is how many sends (a lone script call or a pipeline of
	// them) may be in flight to one Redis node at a time; calls that arrive
	// while all are busy are coalesced into one pipeline sent as soon as one
	// returns. 0 means DefaultMaxInFlight; at most MaxMaxInFlight.
	MaxInFlight int
	// MaxBatch caps the script calls in one pipeline; 0 means
	// DefaultMaxBatch.
	MaxBatch int
	// TLSConfig, when not nil, enables TLS with this configuration (cloned;
	// ServerName defaults to the URL's host), e.g. for a private CA or client
	// certificates. rediss:// alone enables TLS with the system roots.
	TLSConfig *tls.Config
	// Breaker configures the circuit breaker kept per Redis node (zero
	// fields take breaker's defaults; Now and OnChange are set by the store).
	Breaker breaker.Options
	// OnBreakerChange, when set, is called after a node's breaker changes
	// state (for logs and metrics). node is the node's address ("" outside
	// cluster mode).
	OnBreakerChange func(node string, from, to breaker.State)
}

// Validate reports the first invalid option. Its messages name the flag and
// never contain a password.
func (o Options) Validate() error {
	_, err := o.clientOptions()
	return err
}

// timeout returns the effective per-call budget.
func (o Options) timeout() time.Duration {
	if o.Timeout == 0 {
		return DefaultTimeout
	}
	return o.Timeout
}

// parsed holds the go-redis options built from Options; exactly one is set.
type parsed struct {
	single   *redis.Options
	cluster  *redis.ClusterOptions
	failover *redis.FailoverOptions
}

// clientOptions validates o and builds the go-redis options for its mode.
func (o Options) clientOptions() (parsed, error) {
	mode := o.Mode
	if mode == "" {
		mode = ModeSingle
	}
	if !slices.Contains(modes, mode) {
		return parsed{}, fmt.Errorf("--redis-mode %q is invalid; choices are %v", o.Mode, modes)
	}
	if o.URL == "" {
		return parsed{}, errors.New("--redis-url is required for the redis store")
	}
	if o.PoolSize < 0 {
		return parsed{}, fmt.Errorf("--redis-pool-size %d is invalid; it must be 0 (the default) or more", o.PoolSize)
	}
	if o.MaxInFlight < 0 || o.MaxInFlight > MaxMaxInFlight || o.MaxBatch < 0 {
		return parsed{}, fmt.Errorf("redis pipelining: max in flight %d must be 0 (the default) to %d and max batch %d 0 (the default) or more", o.MaxInFlight, MaxMaxInFlight, o.MaxBatch)
	}
	if o.Timeout < 0 {
		return parsed{}, fmt.Errorf("--redis-timeout %v is invalid; it must be positive (0 means %v)", o.Timeout, DefaultTimeout)
	}
	u, err := url.Parse(o.URL)
	if err != nil {
		return parsed{}, fmt.Errorf("--redis-url %s is invalid: it is not a URL", redactedURL(o.URL))
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return parsed{}, fmt.Errorf("--redis-url %s is invalid: the scheme must be redis or rediss", redactedURL(o.URL))
	}
	if u.Host == "" {
		return parsed{}, fmt.Errorf("--redis-url %s is invalid: it has no host:port", redactedURL(o.URL))
	}
	bad := func(err error) error {
		return fmt.Errorf("--redis-url %s is invalid for --redis-mode %s: %s", redactedURL(o.URL), mode, redact(err.Error(), o))
	}
	var p parsed
	timeout := o.timeout()
	switch mode {
	case ModeSingle:
		c, err := redis.ParseURL(o.URL)
		if err != nil {
			return parsed{}, bad(err)
		}
		c.Username, c.Password = override(c.Username, o.Username), override(c.Password, o.Password)
		c.PoolSize = overrideInt(c.PoolSize, o.PoolSize)
		c.TLSConfig = o.tls(c.TLSConfig, u)
		c.ContextTimeoutEnabled = true
		c.DialTimeout, c.ReadTimeout, c.WriteTimeout = socketTimeouts(c.DialTimeout, c.ReadTimeout, c.WriteTimeout, timeout)
		p.single = c
	case ModeCluster:
		c, err := redis.ParseClusterURL(o.URL)
		if err != nil {
			return parsed{}, bad(err)
		}
		c.Username, c.Password = override(c.Username, o.Username), override(c.Password, o.Password)
		c.PoolSize = overrideInt(c.PoolSize, o.PoolSize)
		c.TLSConfig = o.tls(c.TLSConfig, u)
		c.ContextTimeoutEnabled = true
		c.DialTimeout, c.ReadTimeout, c.WriteTimeout = socketTimeouts(c.DialTimeout, c.ReadTimeout, c.WriteTimeout, timeout)
		p.cluster = c
	case ModeSentinel:
		c, err := redis.ParseFailoverURL(o.URL)
		if err != nil {
			return parsed{}, bad(err)
		}
		c.MasterName = override(c.MasterName, o.MasterName)
		if c.MasterName == "" {
			return parsed{}, errors.New("--redis-master-name is required when --redis-mode is sentinel (or set master_name in --redis-url)")
		}
		c.Username, c.Password = override(c.Username, o.Username), override(c.Password, o.Password)
		c.PoolSize = overrideInt(c.PoolSize, o.PoolSize)
		c.TLSConfig = o.tls(c.TLSConfig, u)
		c.ContextTimeoutEnabled = true
		c.DialTimeout, c.ReadTimeout, c.WriteTimeout = socketTimeouts(c.DialTimeout, c.ReadTimeout, c.WriteTimeout, timeout)
		p.failover = c
	}
	if mode != ModeSentinel && o.MasterName != "" {
		return parsed{}, fmt.Errorf("--redis-master-name is only valid with --redis-mode sentinel, not %s", mode)
	}
	return p, nil
}

// socketTimeouts keeps timeouts the URL set and otherwise bounds dialing and
// socket I/O by a small multiple of the call budget: the call's context
// deadline governs every Decide, these only bound background work such as
// cluster topology reloads and sentinel discovery.
func socketTimeouts(dial, read, write, budget time.Duration) (time.Duration, time.Duration, time.Duration) {
	d := max(20*budget, 250*time.Millisecond)
	if dial == 0 {
		dial = d
	}
	if read == 0 {
		read = d
	}
	if write == 0 {
		write = d
	}
	return dial, read, write
}

func override(fromURL, flag string) string {
	if flag != "" {
		return flag
	}
	return fromURL
}

func overrideInt(fromURL, flag int) int {
	if flag != 0 {
		return flag
	}
	return fromURL
}

// tls returns the TLS configuration to use: o.TLSConfig (cloned, with the
// URL's host as ServerName by default) when set, else what the URL implied.
func (o Options) tls(fromURL *tls.Config, u *url.URL) *tls.Config {
	if o.TLSConfig == nil {
		return fromURL
	}
	c := o.TLSConfig.Clone()
	if c.ServerName == "" {
		if h, _, err := net.SplitHostPort(u.Host); err == nil {
			c.ServerName = h
		} else {
			c.ServerName = u.Host
		}
	}
	return c
}

// redactedURL returns raw with its password (userinfo and the password and
// sentinel_password query parameters) replaced by "xxxxx"; a string that is
// not a URL is not shown at all.
func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable, not shown)"
	}
	q := u.Query()
	changed := false
	for _, k := range []string{"password", "sentinel_password"} {
		if q.Has(k) {
			q.Set(k, "xxxxx")
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// redact removes every password o knows of from an error text.
func redact(s string, o Options) string {
	var secrets []string
	if o.Password != "" {
		secrets = append(secrets, o.Password)
	}
	if u, err := url.Parse(o.URL); err == nil {
		if p, ok := u.User.Password(); ok && p != "" {
			secrets = append(secrets, p)
		}
		for _, k := range []string{"password", "sentinel_password"} {
			if p := u.Query().Get(k); p != "" {
				secrets = append(secrets, p)
			}
		}
	}
	for _, p := range secrets {
		s = strings.ReplaceAll(s, p, "xxxxx")
		s = strings.ReplaceAll(s, url.QueryEscape(p), "xxxxx")
		s = strings.ReplaceAll(s, url.PathEscape(p), "xxxxx")
	}
	return s
}
