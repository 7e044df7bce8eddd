// Package redisclient makes the go-redis client of a Redis, Redis Cluster
// or Sentinel from a URL and rls's settings: it validates them (errors name
// the field and never show a password), sets the connection defaults rls
// relies on (one dial, no command retries, socket timeouts, context
// deadlines) and redacts URLs for logs. The Redis store takes the client.
package redisclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Modes are the values of Options.Mode.
const (
	// ModeSingle is one Redis server (the default).
	ModeSingle = "single"
	// ModeCluster is a Redis Cluster.
	ModeCluster = "cluster"
	// ModeSentinel is a master found through Redis Sentinel.
	ModeSentinel = "sentinel"
)

var modes = []string{ModeSingle, ModeCluster, ModeSentinel}

// Options configures a client. URL is required. Zero fields take the
// defaults their comments name.
type Options struct {
	// URL locates Redis. Mode single: redis[s]://[user:pass@]host:port[/db][?opts]
	// as redis.ParseURL reads it, or unix:///path. Mode cluster:
	// redis[s]://h1:p1?addr=h2:p2&addr=h3:p3 (seed nodes,
	// redis.ParseClusterURL). Mode sentinel: the sentinels,
	// redis[s]://[user:pass@]s1:p1?addr=s2:p2[&master_name=m] (the URL's
	// credentials authenticate to the sentinels). rediss:// means TLS.
	URL string
	// Mode is single (the default when empty), cluster or sentinel.
	Mode string
	// MasterName is the Sentinel master set; it overrides the URL's
	// master_name. Required in sentinel mode, in one or the other.
	MasterName string
	// Username and Password, when not empty, override the URL's credentials
	// for the data nodes.
	Username, Password string
	// PoolSize is the connection pool size per node; 0 keeps the URL's
	// pool_size, else DefaultPoolSize.
	PoolSize int
	// Timeout is the store's budget of a call without a deadline: socket
	// timeouts default to twice it (socketTimeouts).
	Timeout time.Duration
	// TLSConfig, when not nil, enables TLS with this configuration (cloned;
	// ServerName defaults to the URL's host). rediss:// alone enables TLS
	// with the system roots.
	TLSConfig *tls.Config
}

// clusterRedirects is how often a Cluster call follows MOVED, ASK and
// TRYAGAIN (go-redis's MaxRedirects, 3 by default): a slot being migrated
// answers TRYAGAIN to a command of two keys split between its nodes (a
// sliding window's two) until the migration moves the second.
const clusterRedirects = 16

// New validates o and returns its client. It does not connect.
func New(o Options) (redis.UniversalClient, error) {
	if o.Mode == "" {
		o.Mode = ModeSingle
	}
	if o.Timeout < 0 {
		return nil, optionErr("Timeout", "%v is invalid; it must be positive", o.Timeout)
	}
	p, err := o.clientOptions()
	if err != nil {
		return nil, err
	}
	switch {
	case p.cluster != nil:
		if p.cluster.MaxRedirects == 0 {
			p.cluster.MaxRedirects = clusterRedirects
		}
		return redis.NewClusterClient(p.cluster), nil
	case p.failover != nil:
		return redis.NewFailoverClient(p.failover), nil
	}
	return redis.NewClient(p.single), nil
}

// OptionError is an invalid field of Options: Option names the field (URL,
// Mode, MasterName, PoolSize, Timeout, ...), Msg says what is wrong with
// its value and what is allowed, and never holds a password. The caller
// names the setting behind the field its own way (a flag, say).
type OptionError struct {
	Option string
	Msg    string
}

// Error is the message with the field's name.
func (e *OptionError) Error() string { return "redis option " + e.Option + ": " + e.Msg }

// optionErr returns an *OptionError for option.
func optionErr(option, format string, args ...any) error {
	return &OptionError{Option: option, Msg: fmt.Sprintf(format, args...)}
}

// parsed holds the go-redis options built from Options; exactly one is set.
type parsed struct {
	single   *redis.Options
	cluster  *redis.ClusterOptions
	failover *redis.FailoverOptions
}

// clientOptions validates o (its Mode set) and builds the go-redis
// options for its mode.
func (o Options) clientOptions() (parsed, error) {
	u, err := o.checkURL()
	if err != nil {
		return parsed{}, err
	}
	if o.Mode != ModeSentinel && o.MasterName != "" {
		return parsed{}, optionErr("MasterName", "a master name is only valid in sentinel mode, not %s", o.Mode)
	}
	bad := func(err error) error {
		return optionErr("URL", "%s is invalid in %s mode: %s", redactedURL(o.URL), o.Mode, redact(err.Error(), o))
	}
	var p parsed
	switch o.Mode {
	case ModeSingle:
		c, err := redis.ParseURL(o.URL)
		if err != nil {
			return parsed{}, bad(err)
		}
		o.apply(u, connFields{&c.Username, &c.Password, &c.PoolSize, &c.TLSConfig, &c.ContextTimeoutEnabled,
			&c.DialTimeout, &c.ReadTimeout, &c.WriteTimeout, &c.DialerRetries, &c.MaxRetries})
		p.single = c
	case ModeCluster:
		c, err := redis.ParseClusterURL(o.URL)
		if err != nil {
			return parsed{}, bad(err)
		}
		o.apply(u, connFields{&c.Username, &c.Password, &c.PoolSize, &c.TLSConfig, &c.ContextTimeoutEnabled,
			&c.DialTimeout, &c.ReadTimeout, &c.WriteTimeout, &c.DialerRetries, &c.MaxRetries})
		p.cluster = c
	case ModeSentinel:
		c, err := redis.ParseFailoverURL(o.URL)
		if err != nil {
			return parsed{}, bad(err)
		}
		c.MasterName = override(c.MasterName, o.MasterName)
		if c.MasterName == "" {
			return parsed{}, optionErr("MasterName", "the Sentinel master name is required in sentinel mode (master_name in the URL)")
		}
		o.apply(u, connFields{&c.Username, &c.Password, &c.PoolSize, &c.TLSConfig, &c.ContextTimeoutEnabled,
			&c.DialTimeout, &c.ReadTimeout, &c.WriteTimeout, &c.DialerRetries, &c.MaxRetries})
		p.failover = c
	}
	return p, nil
}

// checkURL checks the mode, the URL's presence, scheme and host, and the
// pool size, and returns the parsed URL.
func (o Options) checkURL() (*url.URL, error) {
	if !slices.Contains(modes, o.Mode) {
		return nil, optionErr("Mode", "%q is invalid; choices are %v", o.Mode, modes)
	}
	if o.URL == "" {
		return nil, optionErr("URL", "a URL is required for the redis store")
	}
	if o.PoolSize < 0 {
		return nil, optionErr("PoolSize", "%d is invalid; it must be 0 (the default) or more", o.PoolSize)
	}
	u, err := url.Parse(o.URL)
	if err != nil {
		why := "it is not a URL"
		var ue *url.Error
		if errors.As(err, &ue) {
			why += " (" + redact(ue.Err.Error(), o) + ")"
		}
		return nil, optionErr("URL", "%s is invalid: %s", redactedURL(o.URL), why)
	}
	if v := u.Query().Get("pool_size"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n < 0 { // go-redis would panic on it
			return nil, optionErr("URL", "%s is invalid: pool_size=%s is invalid; it must be 0 (the default) or more", redactedURL(o.URL), v)
		}
	}
	if u.Scheme == "unix" { // a local Redis or proxy's socket, as upstream's REDIS_SOCKET_TYPE=unix
		if o.Mode != ModeSingle || u.Path == "" {
			return nil, optionErr("URL", "%s is invalid: unix:///path/to/socket is for a single Redis (--store redis)", redactedURL(o.URL))
		}
		return u, nil
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, optionErr("URL", "%s is invalid: the scheme must be redis, rediss or unix", redactedURL(o.URL))
	}
	if u.Host == "" {
		return nil, optionErr("URL", "%s is invalid: it has no host:port", redactedURL(o.URL))
	}
	return u, nil
}

// connFields points at the connection fields that go-redis's options for
// every mode have.
type connFields struct {
	username, password        *string
	poolSize                  *int
	tls                       **tls.Config
	contextTimeout            *bool
	dial, readTime, writeTime *time.Duration
	dialAttempts              *int
	maxRetries                *int
}

// apply sets f from o: credentials and pool size override the URL's, TLS
// (see tls), context deadlines honoured, socket timeouts (socketTimeouts),
// one dial attempt per connection unless the URL says otherwise
// (dialer_retries): go-redis's default of five, 100 ms apart, would spend
// most of a long caller deadline re-dialing a node that refuses
// connections, where failing at once lets the breaker see the outage. And
// no command retries unless the URL says otherwise (max_retries): go-redis
// retries a failed command up to three times with a backoff, which spends
// the caller's deadline on a node that refuses connections (so the breaker
// sees timeouts instead of refusals) and can run a script twice when a
// connection drops after Redis ran it (counting hits twice). rls has its
// own answer to a failed call: the fallback and the breaker.
func (o Options) apply(u *url.URL, f connFields) {
	*f.username, *f.password = override(*f.username, o.Username), override(*f.password, o.Password)
	*f.poolSize = overrideInt(*f.poolSize, o.PoolSize)
	if *f.poolSize == 0 {
		*f.poolSize = DefaultPoolSize()
	}
	*f.tls = o.tls(*f.tls, u)
	*f.contextTimeout = true
	*f.dial, *f.readTime, *f.writeTime = socketTimeouts(*f.dial, *f.readTime, *f.writeTime, o.Timeout)
	*f.dialAttempts = overrideInt(1, *f.dialAttempts)
	if *f.maxRetries == 0 {
		*f.maxRetries = -1
	}
}

// socketTimeouts keeps timeouts the URL set and otherwise bounds dialing and
// socket I/O by twice the store's timeout: the call's context deadline
// governs every Decide, these bound background work such as cluster
// topology reloads and sentinel discovery (and a Decide whose caller's
// deadline is further away than that).
func socketTimeouts(dial, read, write, budget time.Duration) (time.Duration, time.Duration, time.Duration) {
	d := max(2*budget, 250*time.Millisecond)
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
// sentinel_password query parameters) replaced by "xxxxx". A string that
// url.Parse refuses is redacted by its text: the part of the authority
// between the first ':' and the last '@', and those query parameters.
func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return strconv.Quote(redactText(raw))
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

// queryPassword matches the password query parameters of a URL's text.
var queryPassword = regexp.MustCompile(`([?&](?:sentinel_)?password=)[^&#]*`)

// redactText hides the passwords of a URL that url.Parse refuses.
func redactText(raw string) string {
	if i := strings.Index(raw, "://"); i >= 0 {
		start := i + 3
		end := len(raw)
		if j := strings.IndexAny(raw[start:], "/?#"); j >= 0 {
			end = start + j
		}
		if at := strings.LastIndex(raw[start:end], "@"); at >= 0 {
			if colon := strings.Index(raw[start:start+at], ":"); colon >= 0 {
				raw = raw[:start+colon+1] + "xxxxx" + raw[start+at:]
			}
		}
	}
	return queryPassword.ReplaceAllString(raw, "${1}xxxxx")
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

// DefaultPoolSize is the most connections per node when neither
// Options.PoolSize nor the URL's pool_size sets it: 10 per CPU as go-redis has it, and
// at least 100. Connections are opened on demand (the store keeps a few
// in use), so the cap costs nothing; but go-redis stops dialing a node for
// a second once as many dials as the cap have failed in a row, which after
// an outage would keep a recovered Redis unused for up to a second. With
// 100 that takes about 15 s of outage (probes, pings and heartbeats dial a
// few times a second), not two.
func DefaultPoolSize() int {
	return max(100, 10*runtime.GOMAXPROCS(0))
}

// RedactURL hides a Redis URL's password so it can be logged.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
