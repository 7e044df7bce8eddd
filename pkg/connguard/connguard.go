// Package connguard bounds what the peers of a server can make it hold:
// Limit caps the connections open at once on any net.Listener (closing
// idle ones to make room for new ones), and
// RefusedStreams closes the gRPC connections that keep opening streams
// beyond the server's concurrent-stream limit. Both count what they do in
// one Metrics, by port, and log it at most once per logthrottle.Every.
package connguard

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts each port's open, refused and closed connections:
// rls_connections_open, rls_connections_refused_total and
// rls_connections_closed_total, labelled by port. It is safe for
// concurrent use.
type Metrics struct {
	open    *prometheus.GaugeVec
	refused *prometheus.CounterVec
	closed  *prometheus.CounterVec
}

// NewMetrics registers the connection series on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rls_connections_open",
			Help: "Connections open on each listening port (grpc-addr, http-addr, debug-addr).",
		}, []string{"port"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_connections_refused_total",
			Help: "Connections accepted and closed at once because the port already had as many open as its cap, each with a call in flight.",
		}, []string{"port"}),
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_connections_closed_total",
			Help: "Connections rls closed for what their peer did; reason refused_streams: a gRPC connection that kept opening streams beyond its concurrent-stream limit; idle_evicted: the longest-idle connection, closed to accept a new one at the port's cap; no_call: one that made no call within --first-call-timeout of opening.",
		}, []string{"port", "reason"}),
	}
	reg.MustRegister(m.open, m.refused, m.closed)
	return m
}
