package main

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// handshakeTimeout bounds how long a new connection may take to send its
// HTTP request headers (http.Server.ReadHeaderTimeout) or to finish the TLS
// handshake and the HTTP/2 preface (grpc.ConnectionTimeout): a connection
// that sends nothing is closed after it and frees its --max-conns slot.
const handshakeTimeout = 5 * time.Second

// connMetrics counts each port's open, refused and closed connections.
type connMetrics struct {
	open    *prometheus.GaugeVec
	refused *prometheus.CounterVec
	closed  *prometheus.CounterVec
}

func newConnMetrics(reg prometheus.Registerer) *connMetrics {
	m := &connMetrics{
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rls_connections_open",
			Help: "Connections open on each listening port (grpc-addr, http-addr, debug-addr).",
		}, []string{"port"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_connections_refused_total",
			Help: "Connections accepted and closed at once because the port already had --max-conns open.",
		}, []string{"port"}),
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_connections_closed_total",
			Help: "Connections rls closed for what their peer did; reason refused_streams: a gRPC connection that kept opening streams beyond --grpc-max-streams.",
		}, []string{"port", "reason"}),
	}
	reg.MustRegister(m.open, m.refused, m.closed)
	return m
}

// capListener caps the connections open at once on one port. Beyond the
// cap a new connection is accepted and closed at once, not left waiting in
// the kernel's backlog: its client (an Envoy) sees the failure at once and
// can use another replica or its failure_mode_deny policy, instead of a
// TCP connection that connected but never answers until its request times
// out. A closed connection frees its slot. max 0 is no cap (connections
// are still counted).
type capListener struct {
	net.Listener
	port    string
	max     int64
	n       atomic.Int64
	open    prometheus.Gauge
	refused prometheus.Counter
	log     *slog.Logger

	mu       sync.Mutex
	lastWarn time.Time
	unwarned int // refused since the last warning
}

func newCapListener(l net.Listener, port string, max int, m *connMetrics, log *slog.Logger) *capListener {
	return &capListener{Listener: l, port: port, max: int64(max),
		open: m.open.WithLabelValues(port), refused: m.refused.WithLabelValues(port), log: log}
}

// Accept returns the next connection within the cap; connections beyond it
// are closed here and never reach the server.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if n := l.n.Add(1); l.max > 0 && n > l.max {
			l.n.Add(-1)
			c.Close()
			l.refused.Inc()
			l.warn()
			continue
		}
		l.open.Inc()
		return &cappedConn{Conn: c, l: l}, nil
	}
}

// warn logs refused connections at most once every 10 s.
func (l *capListener) warn() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unwarned++
	if time.Since(l.lastWarn) < 10*time.Second {
		return
	}
	l.log.Warn("connection limit reached; closing new connections", "port", l.port, "max_conns", l.max, "refused", l.unwarned)
	l.lastWarn, l.unwarned = time.Now(), 0
}

func (l *capListener) release() {
	l.n.Add(-1)
	l.open.Dec()
}

// cappedConn frees its slot when closed, once.
type cappedConn struct {
	net.Conn
	l    *capListener
	once sync.Once
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.l.release)
	return err
}

// CloseWrite half-closes like *net.TCPConn does, which net/http uses to
// flush an error response before closing.
func (c *cappedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
