package connguard

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/pkg/logthrottle"
)

// DefaultFirstCall is LimitOptions.FirstCall's default: a client (Envoy,
// a probe, a scrape) makes its first call as soon as it has connected.
const DefaultFirstCall = 10 * time.Second

// LimitOptions configures Limit.
type LimitOptions struct {
	// Port names the listener in metrics and logs (the port label), e.g.
	// "grpc-addr".
	Port string
	// Max is the most connections open at once; 0 is no cap (connections
	// are still counted).
	Max int
	// MaxStreams is the most streaming calls (RLQS streams, health Watch,
	// reflection) open at once over all the port's connections; one more
	// is refused ResourceExhausted. 0 is no cap.
	MaxStreams int
	// FirstCall is how long a connection may stay open without making a
	// call (or an HTTP request) before it is closed; <= 0 is
	// DefaultFirstCall.
	FirstCall time.Duration
	// Metrics counts the connections; required.
	Metrics *Metrics
	// Log receives the throttled warnings of refused and evicted
	// connections [discard].
	Log *slog.Logger
	// Now is the clock of the idle times and of the warnings' throttles
	// [time.Now].
	Now func() time.Time
}

// Listener is a net.Listener with at most Max connections open at once.
//
// When a new connection finds the cap reached, the listener makes room:
// it closes the connection idle the longest (no call in flight; one that
// never made a call before any other, then those without a stream open
// before those whose only calls are streams), counted as
// rls_connections_closed_total{reason="idle_evicted"}, as nginx closes
// idle keep-alive connections. A streaming call (an RLQS stream, a health
// Watch) is a tenant of its connection, not a call in flight: it lasts as
// long as its peer likes, so a connection holding only streams is evicted
// like an idle one, and its streams end Unavailable, which Envoy and gRPC
// clients retry on another connection. Only when every connection has a
// unary call in flight is the new one refused: accepted and closed at
// once, not left in the kernel's backlog, so its client (an Envoy) sees
// the failure at once and can use another replica or its
// failure_mode_deny policy. Peers that connect and never call cannot shut
// new clients out, and each is closed FirstCall after it connected anyway
// (reason="no_call"). Streams have a cap of their own over the port
// (MaxStreams).
//
// The listener learns which connections are busy from the servers: an
// http.Server's ConnState hook (ConnState) and a gRPC server's
// interceptors (ServerOptions). Each connection gets a peer address of
// its own: a Unix socket's peers, which share one address, are named
// apart (RemoteAddr), so their calls are told apart as TCP ones are. A
// connection neither reports is always idle. Closing a connection Accept
// returned frees its slot, once however often it is closed. The listener
// is safe for concurrent use, as l is.
type Listener struct {
	net.Listener
	port      string
	max       int64
	firstCall time.Duration
	now       func() time.Time
	n         atomic.Int64
	open      prometheus.Gauge
	refused   prometheus.Counter
	evicted   prometheus.Counter
	noCall    prometheus.Counter
	log       *slog.Logger
	warned    *logthrottle.Throttle
	warnedEv  *logthrottle.Throttle

	maxStreams int64
	streams    atomic.Int64  // streaming calls open over the port
	ids        atomic.Uint64 // names of Unix-socket connections

	mu       sync.Mutex
	conns    map[*trackedConn]struct{}
	byRemote map[string]*trackedConn // for the gRPC interceptors, when byAddr misses
	// byAddr finds a connection by the address its RemoteAddr returned
	// (the very pointer gRPC puts in the call's peer), without the lock.
	byAddr sync.Map // net.Addr (a pointer) → *trackedConn
}

// Limit returns l with at most o.Max connections open at once (see
// Listener).
func Limit(l net.Listener, o LimitOptions) *Listener {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.FirstCall <= 0 {
		o.FirstCall = DefaultFirstCall
	}
	return &Listener{Listener: l, port: o.Port, max: int64(o.Max), maxStreams: int64(o.MaxStreams), firstCall: o.FirstCall, now: o.Now, log: o.Log,
		open: o.Metrics.open.WithLabelValues(o.Port), refused: o.Metrics.refused.WithLabelValues(o.Port),
		evicted: o.Metrics.closed.WithLabelValues(o.Port, ReasonIdleEvicted),
		noCall:  o.Metrics.closed.WithLabelValues(o.Port, ReasonNoCall),
		warned:  logthrottle.New(logthrottle.Every, o.Now), warnedEv: logthrottle.New(logthrottle.Every, o.Now),
		conns: map[*trackedConn]struct{}{}, byRemote: map[string]*trackedConn{}}
}

// Reasons of rls_connections_closed_total besides refused_streams.
const (
	ReasonIdleEvicted = "idle_evicted" // closed to make room at the cap
	ReasonNoCall      = "no_call"      // made no call within FirstCall
)

// Accept returns the next connection within the cap, making room by
// closing an idle one when the cap is reached; connections beyond it when
// every one is busy are closed here and never reach the server.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if n := l.n.Add(1); l.max > 0 && n > l.max && !l.evictIdle() {
			l.n.Add(-1)
			l.refused.Inc() // counted before the peer can see the close
			c.Close()
			if held, ok := l.warned.Allow(); ok {
				l.log.Warn("connection limit reached with a call in flight on every connection; closing new connections",
					"port", l.port, "max_conns", l.max, "refused", held+1, "note", "logged at most every "+l.warned.Interval().String())
			}
			continue
		}
		l.open.Inc()
		return l.track(c), nil
	}
}

// track registers a new connection and arms its first-call timer.
func (l *Listener) track(c net.Conn) *trackedConn {
	t := &trackedConn{Conn: c, l: l, opened: l.now().UnixNano()}
	t.last.Store(t.opened)
	t.addr = c.RemoteAddr()
	if _, ok := t.addr.(*net.TCPAddr); !ok {
		// A Unix socket's peers share one address (often none): a name of
		// its own tells this connection's calls from another's.
		t.addr = &net.UnixAddr{Name: "@rls-conn-" + strconv.FormatUint(l.ids.Add(1), 10), Net: "unix"}
	}
	l.mu.Lock()
	l.conns[t] = struct{}{}
	l.byRemote[t.addr.String()] = t
	l.byAddr.Store(t.addr, t)
	l.mu.Unlock()
	t.timer.Store(time.AfterFunc(l.firstCall, func() {
		if !t.called.Load() && t.claim() {
			l.noCall.Inc()
			t.Close()
		}
	}))
	return t
}

// evictIdle closes the connection idle the longest, if one has no call in
// flight, and reports whether it did. Connections that never made a call
// go first, the oldest first; then the one whose last call ended the
// longest ago. The evicted connection's slot is free on return.
func (l *Listener) evictIdle() bool {
	for range 3 { // a call may begin on the chosen one: choose again
		victim := l.idlest()
		if victim == nil {
			return false
		}
		if victim.claim() {
			l.evicted.Inc() // counted before the peer can see the close
			victim.Close()
			if held, ok := l.warnedEv.Allow(); ok {
				l.log.Warn("connection limit reached; closed the longest-idle connection to accept a new one",
					"port", l.port, "max_conns", l.max, "peer", victim.RemoteAddr().String(), "evicted", held+1,
					"note", "logged at most every "+l.warnedEv.Interval().String())
			}
			return true
		}
	}
	return false
}

// idlest returns the connection without a call in flight that eviction
// takes first, or nil when every connection is busy.
func (l *Listener) idlest() *trackedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	var best *trackedConn
	for c := range l.conns {
		if c.active.Load() != 0 {
			continue
		}
		if best == nil || c.idleBefore(best) {
			best = c
		}
	}
	return best
}

// ConnState is an http.Server's ConnState hook: a connection is busy from
// StateActive (a request being read or answered) to StateIdle.
func (l *Listener) ConnState(c net.Conn, s http.ConnState) {
	t, ok := c.(*trackedConn)
	if !ok {
		return
	}
	switch s {
	case http.StateActive:
		t.begin()
	case http.StateIdle:
		t.end()
	}
}

// ServerOptions are the gRPC server options (interceptors, outermost)
// telling the listener which connections have a call in flight: a unary
// call is in flight from when its handler starts until it returns. A
// streaming call is not (see Listener): it is counted against MaxStreams,
// and refused ResourceExhausted beyond it. Interceptors, not a stats
// handler: with any stats handler grpc-go builds an event per step of
// every call (a copy of its metadata, its peer, each payload's sizes), 15
// allocations and 1.1 KB per call; and a peer that sends a unary call's
// headers and never its message holds no call in flight.
func (l *Listener) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if t := l.connOf(ctx); t != nil {
				t.begin()
				defer t.end()
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if n := l.streams.Add(1); l.maxStreams > 0 && n > l.maxStreams {
				l.streams.Add(-1)
				return status.Errorf(codes.ResourceExhausted, "this port has %d streams open (RLQS, health Watch, reflection), the most rls allows: retry later, or on another replica", l.maxStreams)
			}
			defer l.streams.Add(-1)
			if t := l.connOf(ss.Context()); t != nil {
				t.beginStream()
				defer t.endStream()
			}
			return h(srv, ss)
		}),
	}
}

// CloseIdle closes every connection without a unary call in flight (one
// whose calls are only streams counts as idle) and returns how many it
// closed. A graceful stop uses it once the streams have been ended: a
// stream whose client does not read leaves its status queued behind data
// the client never takes, and a peer that does not answer the server's
// PING holds its connection through the GOAWAY; either would hold the
// stop until its timeout.
func (l *Listener) CloseIdle() int {
	l.mu.Lock()
	var idle []*trackedConn
	for c := range l.conns {
		if c.claim() {
			idle = append(idle, c)
		}
	}
	l.mu.Unlock()
	for _, c := range idle {
		c.Close()
	}
	return len(idle)
}

// Streams returns the streaming calls open over the port.
func (l *Listener) Streams() int { return int(l.streams.Load()) }

// connOf is the connection of a call (by its peer's address), or nil when
// it is not one of l's connections.
func (l *Listener) connOf(ctx context.Context) *trackedConn {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return nil
	}
	if t, ok := l.byAddr.Load(p.Addr); ok {
		return t.(*trackedConn)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byRemote[p.Addr.String()]
}

func (l *Listener) release(t *trackedConn) {
	l.mu.Lock()
	delete(l.conns, t)
	if l.byRemote[t.addr.String()] == t {
		delete(l.byRemote, t.addr.String())
	}
	l.byAddr.CompareAndDelete(t.addr, t)
	l.mu.Unlock()
	l.n.Add(-1)
	l.open.Dec()
}

// closing is the active count of a connection claimed for closing: far
// below zero, so calls that begin on it meanwhile leave it negative.
const closing = -1 << 30

// trackedConn is a connection of a Listener: its calls in flight, its
// streams, when the last call ended, whether it ever made one. It frees
// its slot when closed, once.
type trackedConn struct {
	net.Conn
	l       *Listener
	addr    net.Addr     // RemoteAddr: the connection's own
	opened  int64        // Unix ns
	last    atomic.Int64 // Unix ns the last call ended (opened before any)
	active  atomic.Int32 // unary calls in flight; closing once claimed
	streams atomic.Int32 // streaming calls open
	called  atomic.Bool
	timer   atomic.Pointer[time.Timer] // the first-call timer
	once    sync.Once
}

func (c *trackedConn) begin() {
	c.called.Store(true)
	c.active.Add(1)
}

func (c *trackedConn) end() {
	c.last.Store(c.l.now().UnixNano())
	c.active.Add(-1)
}

func (c *trackedConn) beginStream() {
	c.called.Store(true)
	c.streams.Add(1)
}

func (c *trackedConn) endStream() {
	c.last.Store(c.l.now().UnixNano())
	c.streams.Add(-1)
}

// RemoteAddr is the peer's address, one of its own for each connection
// (a Unix socket's peers are named apart: see track).
func (c *trackedConn) RemoteAddr() net.Addr { return c.addr }

// claim marks an idle connection for closing, unless a call is in flight.
func (c *trackedConn) claim() bool { return c.active.CompareAndSwap(0, closing) }

// idleBefore reports whether eviction takes c before o: one that never
// called first, then one without a stream open, then the one whose last
// call ended the longest ago.
func (c *trackedConn) idleBefore(o *trackedConn) bool {
	cc, oc := c.called.Load(), o.called.Load()
	if cc != oc {
		return !cc
	}
	cs, os := c.streams.Load() > 0, o.streams.Load() > 0
	if cs != os {
		return !cs
	}
	return c.last.Load() < o.last.Load()
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		if t := c.timer.Load(); t != nil {
			t.Stop()
		}
		c.l.release(c)
	})
	return err
}

// CloseWrite half-closes like *net.TCPConn does, which net/http uses to
// flush an error response before closing.
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
