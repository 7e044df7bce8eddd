package upstreamstats

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	gostats "github.com/lyft/gostats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/rls-project/rls/pkg/service"
)

// Config is what rls's settings ask of upstream's stats.
type Config struct {
	StatsdAddr     string                // --statsd-addr (ParseTarget); empty: no statsd
	Prometheus     prometheus.Registerer // non-nil: upstream's Prometheus series on it
	MaxDetailed    int
	NearLimitRatio float64
	Log            *slog.Logger
}

// FromConfig returns the Stats c asks for, or nil when it asks for none.
// The methods of a nil *Stats do nothing.
func FromConfig(c Config) (*Stats, error) {
	opts := Options{MaxDetailed: c.MaxDetailed, NearLimitRatio: c.NearLimitRatio, Log: c.Log}
	if c.StatsdAddr != "" {
		t, err := ParseTarget(c.StatsdAddr)
		if err != nil {
			return nil, err
		}
		opts.Sinks, opts.Tags, opts.Flush = append(opts.Sinks, NewStatsdSink(t, c.Log)), t.Tags, t.Flush
	}
	if c.Prometheus != nil {
		sink, err := NewPrometheusSink(c.Prometheus)
		if err != nil {
			return nil, err
		}
		opts.Sinks = append(opts.Sinks, sink)
	}
	if len(opts.Sinks) == 0 {
		return nil, nil
	}
	return New(opts), nil
}

// Observer is s as the service's observer (nil for a nil s).
func (s *Stats) Observer() service.Observer {
	if s == nil {
		return nil
	}
	return s
}

// Start flushes on s's interval until ctx is cancelled, then once more, in
// a goroutine of its own; done is closed after the last flush.
func (s *Stats) Start(ctx context.Context) (done <-chan struct{}) {
	ch := make(chan struct{})
	if s == nil {
		close(ch)
		return ch
	}
	go func() { defer close(ch); s.Run(ctx) }()
	return ch
}

// Unary counts ShouldRateLimit calls as upstream's server reporter does:
// ratelimit_server.ShouldRateLimit.total_requests and .response_time.
func (s *Stats) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if s == nil || info.FullMethod != "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" {
		return h(ctx, req)
	}
	start := time.Now()
	resp, err := h(ctx, req)
	s.Call(time.Since(start), err)
	return resp, err
}

// Loaded counts a config reload by its result, "success" or "failure"
// (others count nothing), as ConfigLoaded; nil-safe.
func (s *Stats) Loaded(result string) {
	if s != nil && (result == "success" || result == "failure") {
		s.ConfigLoaded(result == "success")
	}
}

var _ gostats.Sink = multiSink(nil)

// MetricsHandler serves reg's series at path, as upstream's Prometheus
// sink serves its own address.
func MetricsHandler(reg *prometheus.Registry, path string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET "+path, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}
