package upstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The modes of ClientOptions.Mode, as the Redis store names them.
const (
	ModeSingle   = "single"
	ModeCluster  = "cluster"
	ModeSentinel = "sentinel"
)

// ClientOptions configures NewClient: the same Redis settings as the Redis
// store's (the caller has validated them with it), for a client of its own.
type ClientOptions struct {
	// URL is redis://, rediss:// or unix:// (single), the seeds (cluster)
	// or the sentinels (sentinel), as the Redis store reads it.
	URL                string
	Mode               string // single (""), cluster or sentinel
	MasterName         string // sentinel: overrides the URL's master_name
	Username, Password string // override the URL's
	PoolSize           int    // 0: the URL's pool_size, else go-redis's default
	// Timeout bounds dialing and socket I/O at twice it (the context of each
	// call bounds the call); 0 means a second.
	Timeout   time.Duration
	TLSConfig *tls.Config // cloned; nil: the URL's scheme decides
	// Twemproxy speaks only what twemproxy (nutcracker) proxies: RESP2, no
	// HELLO, no CLIENT SETINFO, database 0. Single mode, no TLS.
	Twemproxy bool
}

// NewClient makes the go-redis client o describes. It does not connect.
// Like the Redis store's, it retries nothing (rls has its own answer to a
// failed call: the fallback) and dials once per connection.
func NewClient(o ClientOptions) (redis.UniversalClient, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, fmt.Errorf("redis URL: %w", err)
	}
	f := clientFields{o: o, host: u.Hostname(), timeout: max(2*o.Timeout, 250*time.Millisecond)}
	if o.Timeout == 0 {
		f.timeout = 2 * time.Second
	}
	switch o.Mode {
	case ModeSingle, "":
		return singleClient(o, f)
	case ModeCluster:
		if o.Twemproxy {
			return nil, fmt.Errorf("twemproxy stands for a single Redis, not a Cluster")
		}
		c, err := redis.ParseClusterURL(o.URL)
		if err != nil {
			return nil, err
		}
		f.set(&c.Username, &c.Password, &c.PoolSize, &c.TLSConfig, &c.ContextTimeoutEnabled, &c.DialTimeout, &c.ReadTimeout, &c.WriteTimeout, &c.DialerRetries, &c.MaxRetries)
		return redis.NewClusterClient(c), nil
	case ModeSentinel:
		if o.Twemproxy {
			return nil, fmt.Errorf("twemproxy stands for a single Redis, not Sentinel")
		}
		c, err := redis.ParseFailoverURL(o.URL)
		if err != nil {
			return nil, err
		}
		if o.MasterName != "" {
			c.MasterName = o.MasterName
		}
		f.set(&c.Username, &c.Password, &c.PoolSize, &c.TLSConfig, &c.ContextTimeoutEnabled, &c.DialTimeout, &c.ReadTimeout, &c.WriteTimeout, &c.DialerRetries, &c.MaxRetries)
		return redis.NewFailoverClient(c), nil
	}
	return nil, fmt.Errorf("redis mode %q: want single, cluster or sentinel", o.Mode)
}

// singleClient makes the client of one Redis (or twemproxy).
func singleClient(o ClientOptions, f clientFields) (redis.UniversalClient, error) {
	c, err := redis.ParseURL(o.URL)
	if err != nil {
		return nil, err
	}
	f.set(&c.Username, &c.Password, &c.PoolSize, &c.TLSConfig, &c.ContextTimeoutEnabled, &c.DialTimeout, &c.ReadTimeout, &c.WriteTimeout, &c.DialerRetries, &c.MaxRetries)
	if o.Twemproxy {
		if c.TLSConfig != nil || c.DB != 0 {
			return nil, fmt.Errorf("twemproxy: no TLS and no database but 0 (it has neither)")
		}
		c.Protocol, c.DisableIdentity = 2, true
		c.Dialer = helloless(c.Network, c.DialTimeout)
	}
	return redis.NewClient(c), nil
}

// clientFields are what NewClient sets alike in every mode's options: the
// credentials, pool size and TLS of o over the URL's, the timeouts, and
// no retries.
type clientFields struct {
	o       ClientOptions
	host    string // the URL's, TLS's ServerName when o's config has none
	timeout time.Duration
}

func (f clientFields) set(user, pass *string, pool *int, tc **tls.Config, ctxTimeout *bool, dial, read, write *time.Duration, dialRetries, retries *int) {
	o := f.o
	if o.Username != "" {
		*user = o.Username
	}
	if o.Password != "" {
		*pass = o.Password
	}
	if o.PoolSize != 0 {
		*pool = o.PoolSize
	}
	if o.TLSConfig != nil {
		c := o.TLSConfig.Clone()
		if c.ServerName == "" {
			c.ServerName = f.host
		}
		*tc = c
	}
	*ctxTimeout = true
	*dial, *read, *write = f.timeout, f.timeout, f.timeout
	*dialRetries = 1
	if *retries == 0 {
		*retries = -1
	}
}

// helloless dials network connections on which go-redis's HELLO, which it
// sends on every new connection even with Protocol 2 and which twemproxy
// answers by closing the connection, never leaves: the connection answers
// it itself, as a Redis older than 6 does (an unknown command), and
// go-redis goes on in RESP2, authenticating with AUTH.
func helloless(network string, timeout time.Duration) func(context.Context, string, string) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute}
	return func(ctx context.Context, _, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &noHello{Conn: c}, nil
	}
}

// noHello is a connection that answers the HELLO commands written to it.
type noHello struct {
	net.Conn
	mu      sync.Mutex
	pending []byte // replies to HELLO not read yet
}

// helloRefused is the reply of a Redis without HELLO.
const helloRefused = "-ERR unknown command 'HELLO'\r\n"

func (c *noHello) Write(p []byte) (int, error) {
	if n := helloLen(p); n > 0 {
		c.mu.Lock()
		c.pending = append(c.pending, helloRefused...)
		c.mu.Unlock()
		if n == len(p) {
			return n, nil
		}
		m, err := c.Conn.Write(p[n:])
		return n + m, err
	}
	return c.Conn.Write(p)
}

func (c *noHello) Read(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}

// helloLen returns the length of the HELLO command p begins with (a RESP
// array of bulk strings whose first is HELLO, in any case), or 0.
func helloLen(p []byte) int {
	n, i, ok := respHeader(p, 0, '*')
	if !ok || n < 1 {
		return 0
	}
	for arg := 0; arg < n; arg++ {
		l, j, ok := respHeader(p, i, '$')
		if !ok || j+l+2 > len(p) {
			return 0
		}
		if arg == 0 && !bytes.EqualFold(p[j:j+l], []byte("hello")) {
			return 0
		}
		i = j + l + 2
	}
	return i
}

// respHeader reads a RESP header (kind, a number, CRLF) at p[i:]: the
// number and the index after it.
func respHeader(p []byte, i int, kind byte) (int, int, bool) {
	if i >= len(p) || p[i] != kind {
		return 0, 0, false
	}
	end := bytes.Index(p[i:], []byte("\r\n"))
	if end < 0 {
		return 0, 0, false
	}
	n, err := strconv.Atoi(string(p[i+1 : i+end]))
	if err != nil || n < 0 {
		return 0, 0, false
	}
	return n, i + end + 2, true
}
