package connguard

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/pkg/logthrottle"
)

// LimitOptions configures Limit.
type LimitOptions struct {
	// Port names the listener in metrics and logs (the port label), e.g.
	// "grpc-addr".
	Port string
	// Max is the most connections open at once; 0 is no cap (connections
	// are still counted).
	Max int
	// Metrics counts the connections; required.
	Metrics *Metrics
	// Log receives the throttled warning of refused connections [discard].
	Log *slog.Logger
	// Now is the clock of the warning's throttle [time.Now].
	Now func() time.Time
}

// Limit returns l with at most o.Max connections open at once. Beyond the
// cap a new connection is accepted and closed at once, not left waiting in
// the kernel's backlog: its client (an Envoy) sees the failure at once and
// can use another replica or its failure_mode_deny policy, instead of a
// TCP connection that connected but never answers until its request times
// out. Closing a connection Accept returned frees its slot, once however
// often it is closed. The listener is safe for concurrent use, as l is.
func Limit(l net.Listener, o LimitOptions) net.Listener {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &capListener{Listener: l, port: o.Port, max: int64(o.Max), log: log,
		open: o.Metrics.open.WithLabelValues(o.Port), refused: o.Metrics.refused.WithLabelValues(o.Port),
		warned: logthrottle.New(logthrottle.Every, o.Now)}
}

type capListener struct {
	net.Listener
	port    string
	max     int64
	n       atomic.Int64
	open    prometheus.Gauge
	refused prometheus.Counter
	log     *slog.Logger
	warned  *logthrottle.Throttle
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
			if held, ok := l.warned.Allow(); ok {
				l.log.Warn("connection limit reached; closing new connections", "port", l.port, "max_conns", l.max,
					"refused", held+1, "note", "logged at most every "+l.warned.Interval().String())
			}
			continue
		}
		l.open.Inc()
		return &cappedConn{Conn: c, l: l}, nil
	}
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
