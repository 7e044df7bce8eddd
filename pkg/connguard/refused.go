package connguard

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"

	"github.com/rls-project/rls/pkg/logthrottle"
)

// A peer that ignores SETTINGS_MAX_CONCURRENT_STREAMS and keeps opening
// streams beyond the server's limit gets each of them refused by grpc-go
// (RST_STREAM REFUSED_STREAM), one by one, forever: each refusal costs the
// server a HEADERS decode and a frame, and a single connection flooding
// that way keeps one CPU busy (170,000 to 290,000 refusals a second),
// which other clients pay for in latency. grpc-go has no option to close
// such a connection, so RefusedStreams watches the frames the server
// writes on each gRPC connection and closes one that has made it refuse
// more than a limit of streams within a second, as net/http2 and others do
// against "rapid reset" (CVE-2023-44487): it stops reading it at once and
// closes it after a hold. A well-behaved client (Envoy, grpc-go) respects
// the limit and is refused at most a few streams sent before it read the
// server's SETTINGS.

// RefusedLimit is how many refused streams within a second close a
// connection of a server that allows maxStreams concurrent streams: twice
// that, at least 100 (what grpc-go clients may send before they read the
// server's SETTINGS).
func RefusedLimit(maxStreams int) int {
	return max(2*maxStreams, 100)
}

// DefaultHold is how long a connection over the refused-streams limit is
// held, unread, before it is closed: closed at once, a flooding peer
// reconnects at once, and each new connection costs the server its
// handshake, a stream limit's worth of calls actually served and the
// refusals up to the limit, more CPU than refusing streams on one
// connection. Held, the peer waits (its writes block once the socket
// buffers are full) and the connection costs nothing but the memory it
// already held; the peer gets one connection's worth of work per hold.
const DefaultHold = time.Second

// ErrRefusedStreams is the error of a held connection's reads.
var ErrRefusedStreams = errors.New("connection closed: too many refused streams")

// RefusedOptions configures RefusedStreams.
type RefusedOptions struct {
	// Limit is the most streams a connection may have refused within a
	// second (RefusedLimit of the server's stream limit); required.
	Limit int
	// Port names the server in metrics and logs (the port label).
	Port string
	// Hold is how long a connection over the limit is held before it is
	// closed [DefaultHold].
	Hold time.Duration
	// Metrics counts the closed connections, as
	// rls_connections_closed_total{reason="refused_streams"}; required.
	Metrics *Metrics
	// Log receives the throttled warning of closed connections [discard].
	Log *slog.Logger
	// Now is the clock of the one-second windows and of the warning's
	// throttle [time.Now].
	Now func() time.Time
}

// RefusedStreams holds, then closes, the gRPC connections that make the
// server refuse more than its limit of streams within a second. It is safe
// for concurrent use.
type RefusedStreams struct {
	limit  int
	hold   time.Duration
	port   string
	closed prometheus.Counter
	log    *slog.Logger
	now    func() time.Time
	warned *logthrottle.Throttle
}

// NewRefusedStreams returns the guard o describes.
func NewRefusedStreams(o RefusedOptions) *RefusedStreams {
	g := &RefusedStreams{limit: o.Limit, hold: o.Hold, port: o.Port, log: o.Log, now: o.Now,
		closed: o.Metrics.closed.WithLabelValues(o.Port, "refused_streams")}
	if g.hold <= 0 {
		g.hold = DefaultHold
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.now == nil {
		g.now = time.Now
	}
	g.warned = logthrottle.New(logthrottle.Every, g.now)
	return g
}

// Creds wraps a gRPC server's transport credentials (nil: plaintext) so
// that every connection, after its handshake, is watched: the guard sees
// the HTTP/2 frames, not TLS records.
func (g *RefusedStreams) Creds(inner credentials.TransportCredentials) credentials.TransportCredentials {
	return &watchCreds{inner: inner, g: g}
}

// over counts one connection closed, and logs it throttled, with the peer
// of the last one.
func (g *RefusedStreams) over(peer net.Addr, refused int) {
	g.closed.Inc()
	if held, ok := g.warned.Allow(); ok {
		g.log.Warn("closed a gRPC connection that kept opening streams beyond its concurrent-stream limit",
			"port", g.port, "peer", peer.String(), "refused", refused, "within", time.Second, "closed", held+1)
	}
}

// watchConn is a gRPC server connection whose writes are scanned. Once
// over the limit it is held, then closed after the hold: its reads wait
// until it is closed, then fail; its writes go on (grpc-go closes a
// connection whose write fails, and the peer could reconnect at once).
type watchConn struct {
	net.Conn
	g *RefusedStreams

	mu      sync.Mutex // grpc-go writes from one goroutine at a time; cheap insurance
	fs      frameScanner
	since   time.Time // start of the current one-second window
	refused int       // refused streams in it

	held      atomic.Bool   // then closed after the hold
	done      chan struct{} // closed by Close
	closeOnce sync.Once
}

func (c *watchConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.fs.scan(p[:n])
	if r == 0 || c.held.Load() {
		return n, err
	}
	now := c.g.now()
	if now.Sub(c.since) > time.Second {
		c.since, c.refused = now, 0
	}
	c.refused += r
	if c.refused > c.g.limit {
		c.held.Store(true)
		time.AfterFunc(c.g.hold, func() { c.Close() })
		c.g.over(c.RemoteAddr(), c.refused)
	}
	return n, err
}

func (c *watchConn) Read(p []byte) (int, error) {
	if c.held.Load() {
		<-c.done
		return 0, ErrRefusedStreams
	}
	return c.Conn.Read(p)
}

func (c *watchConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() { close(c.done) })
	return err
}

// watchCreds are the server's credentials with every connection watched.
type watchCreds struct {
	inner credentials.TransportCredentials // nil: plaintext
	g     *RefusedStreams
}

func (c *watchCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info := raw, credentials.AuthInfo(nil) // plaintext: what grpc-go does without credentials
	if c.inner != nil {
		var err error
		if conn, info, err = c.inner.ServerHandshake(raw); err != nil {
			return nil, nil, err
		}
	}
	return &watchConn{Conn: conn, g: c.g, done: make(chan struct{})}, info, nil
}

func (c *watchCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("server-side credentials")
}

func (c *watchCreds) Info() credentials.ProtocolInfo {
	if c.inner != nil {
		return c.inner.Info()
	}
	return credentials.ProtocolInfo{}
}

func (c *watchCreds) Clone() credentials.TransportCredentials {
	if c.inner == nil {
		return &watchCreds{g: c.g}
	}
	return &watchCreds{inner: c.inner.Clone(), g: c.g}
}

func (c *watchCreds) OverrideServerName(name string) error {
	if c.inner != nil {
		//lint:ignore SA1019 the wrapper must delegate every method of credentials.TransportCredentials
		return c.inner.OverrideServerName(name) //nolint:staticcheck // part of the interface
	}
	return nil
}
