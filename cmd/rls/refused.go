package main

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
)

// A peer that ignores SETTINGS_MAX_CONCURRENT_STREAMS and keeps opening
// streams beyond --grpc-max-streams gets each of them refused by grpc-go
// (RST_STREAM REFUSED_STREAM), one by one, forever: each refusal costs rls
// a HEADERS decode and a frame, and a single connection flooding that way
// keeps one CPU busy (170,000 to 290,000 refusals a second), which
// other clients pay for in latency. grpc-go has no option to close such a
// connection, so rls watches the frames the server writes on each gRPC
// connection and closes one that has made it refuse more than
// refusedStreamsLimit streams within a second, as net/http2 and others do
// against "rapid reset" (CVE-2023-44487): it stops reading it at once and
// closes it after refusedHold. A well-behaved client (Envoy, grpc-go)
// respects the limit and is refused at most a few streams sent before it
// read the server's SETTINGS.

// refusedStreamsLimit is how many refused streams within a second close a
// connection: twice its stream limit, at least 100 (what grpc-go clients
// may send before they read the server's SETTINGS).
func refusedStreamsLimit(maxStreams int) int {
	return max(2*maxStreams, 100)
}

// errRefusedStreams is the error of a held connection's reads.
var errRefusedStreams = errors.New("connection closed: too many refused streams")

// frameScanner follows the HTTP/2 frames written by a server (no preface:
// the server's side starts with a frame) across Write calls, and counts
// the RST_STREAM frames with error code REFUSED_STREAM. It reads the
// 9-byte frame headers and skips payloads, except an RST_STREAM's 4-byte
// error code.
type frameScanner struct {
	hdr  [9]byte
	nhdr int    // bytes of hdr seen; 9 once in the payload
	left uint32 // payload bytes still to come
	rst  bool   // the payload is an RST_STREAM's error code
	code uint32
}

const (
	frameHeaderLen   = 9   // length (3 bytes), type, flags, stream id (4)
	frameRSTStream   = 0x3 // type of RST_STREAM
	rstStreamPayload = 4   // its payload: the error code
	errCodeRefused   = 0x7 // REFUSED_STREAM
)

// scan reads p, the next bytes written, and returns the refused streams
// whose RST_STREAM frame ended in it.
func (f *frameScanner) scan(p []byte) (refused int) {
	for len(p) > 0 {
		if f.nhdr < frameHeaderLen {
			var h []byte
			if f.nhdr == 0 && len(p) >= frameHeaderLen {
				h, p = p[:frameHeaderLen], p[frameHeaderLen:] // the whole header here: no copy
			} else {
				n := copy(f.hdr[f.nhdr:], p)
				f.nhdr += n
				p = p[n:]
				if f.nhdr < frameHeaderLen {
					return refused
				}
				h = f.hdr[:]
			}
			f.nhdr = frameHeaderLen
			f.left = uint32(h[0])<<16 | uint32(h[1])<<8 | uint32(h[2])
			f.rst = h[3] == frameRSTStream && f.left == rstStreamPayload
			f.code = 0
		}
		n := min(f.left, uint32(len(p)))
		if f.rst {
			for _, b := range p[:n] {
				f.code = f.code<<8 | uint32(b)
			}
		}
		p = p[n:]
		f.left -= n
		if f.left == 0 {
			if f.rst && f.code == errCodeRefused {
				refused++
			}
			f.nhdr = 0
		}
	}
	return refused
}

// refusedWatch holds, then closes, the gRPC connections that make the
// server refuse more than limit streams within a second, counting them in
// rls_connections_closed_total{port,reason="refused_streams"}.
type refusedWatch struct {
	limit  int
	port   string
	closed prometheus.Counter
	log    *slog.Logger

	mu       sync.Mutex
	lastWarn time.Time
	unwarned int // closed since the last warning
}

func newRefusedWatch(limit int, port string, m *connMetrics, log *slog.Logger) *refusedWatch {
	return &refusedWatch{limit: limit, port: port, log: log,
		closed: m.closed.WithLabelValues(port, "refused_streams")}
}

// creds wraps the server's transport credentials (nil: plaintext) so that
// every connection, after its handshake, is watched: it sees the HTTP/2
// frames, not TLS records.
func (w *refusedWatch) creds(inner credentials.TransportCredentials) credentials.TransportCredentials {
	return &watchCreds{inner: inner, w: w}
}

// warn logs closed connections at most once every 10 s, with the peer of
// the last one.
func (w *refusedWatch) warn(peer net.Addr, refused int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unwarned++
	if time.Since(w.lastWarn) < 10*time.Second {
		return
	}
	w.log.Warn("closed a gRPC connection that kept opening streams beyond --grpc-max-streams",
		"port", w.port, "peer", peer.String(), "refused", refused, "within", time.Second, "closed", w.unwarned)
	w.lastWarn, w.unwarned = time.Now(), 0
}

// refusedHold is how long a connection over the refused-streams limit is
// held, unread, before it is closed: closed at once, a flooding peer
// reconnects at once, and each new connection costs rls its handshake,
// --grpc-max-streams calls actually served and the refusals up to the
// limit, more CPU than refusing streams on one connection. Held, the peer
// waits (its writes block once the socket buffers are full) and the
// connection costs rls nothing but the memory it already held; the peer
// gets one connection's worth of rls's work per refusedHold.
const refusedHold = time.Second

// watchConn is a gRPC server connection whose writes are scanned. Once
// over the limit it is held, then closed after refusedHold: its reads wait
// until it is closed, then fail; its writes go on (grpc-go closes a
// connection whose write fails, and the peer could reconnect at once).
type watchConn struct {
	net.Conn
	w *refusedWatch

	mu      sync.Mutex // grpc-go writes from one goroutine at a time; cheap insurance
	fs      frameScanner
	since   time.Time // start of the current one-second window
	refused int       // refused streams in it

	held      atomic.Bool   // then closed after refusedHold
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
	now := time.Now()
	if now.Sub(c.since) > time.Second {
		c.since, c.refused = now, 0
	}
	c.refused += r
	if c.refused > c.w.limit {
		c.held.Store(true)
		time.AfterFunc(refusedHold, func() { c.Close() })
		c.w.closed.Inc()
		c.w.warn(c.RemoteAddr(), c.refused)
	}
	return n, err
}

func (c *watchConn) Read(p []byte) (int, error) {
	if c.held.Load() {
		<-c.done
		return 0, errRefusedStreams
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
	w     *refusedWatch
}

func (c *watchCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info := raw, credentials.AuthInfo(nil) // plaintext: what grpc-go does without credentials
	if c.inner != nil {
		var err error
		if conn, info, err = c.inner.ServerHandshake(raw); err != nil {
			return nil, nil, err
		}
	}
	return &watchConn{Conn: conn, w: c.w, done: make(chan struct{})}, info, nil
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
		return &watchCreds{w: c.w}
	}
	return &watchCreds{inner: c.inner.Clone(), w: c.w}
}

func (c *watchCreds) OverrideServerName(name string) error {
	if c.inner != nil {
		//lint:ignore SA1019 the wrapper must delegate every method of credentials.TransportCredentials
		return c.inner.OverrideServerName(name) //nolint:staticcheck // part of the interface
	}
	return nil
}
