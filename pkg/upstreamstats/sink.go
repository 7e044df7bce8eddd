package upstreamstats

import (
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	gostats "github.com/lyft/gostats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/statsd_exporter/pkg/event"
	"github.com/prometheus/statsd_exporter/pkg/exporter"
	"github.com/prometheus/statsd_exporter/pkg/mapper"

	"github.com/rls-project/rls/pkg/logthrottle"
)

// Target is where statsd goes: --statsd-addr, host:port (UDP), or
// udp:// or tcp://host:port?flush_interval=10s&tags=k:v,k2:v2.
type Target struct {
	Addr     string
	Protocol string // udp or tcp
	Flush    time.Duration
	Tags     map[string]string
}

// ParseTarget parses --statsd-addr.
func ParseTarget(s string) (Target, error) {
	t := Target{Addr: s, Protocol: "udp", Flush: 10 * time.Second}
	if strings.Contains(s, "://") {
		var err error
		if t, err = parseURL(s); err != nil {
			return Target{}, err
		}
	}
	host, port, err := net.SplitHostPort(t.Addr)
	if err != nil || host == "" {
		return Target{}, fmt.Errorf("%q is not host:port", t.Addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return Target{}, fmt.Errorf("port %q: want a number up to 65535", port)
	}
	return t, nil
}

// parseURL parses udp:// or tcp://host:port?flush_interval=10s&tags=k:v,k2:v2.
func parseURL(s string) (Target, error) {
	t := Target{Flush: 10 * time.Second}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "udp" && u.Scheme != "tcp") || u.Host == "" || u.Path != "" {
		return t, errors.New("want host:port, udp://host:port or tcp://host:port[?flush_interval=10s&tags=k:v,...]")
	}
	t.Addr, t.Protocol = u.Host, u.Scheme
	q := u.Query()
	for k := range q {
		if k != "flush_interval" && k != "tags" {
			return t, fmt.Errorf("unknown parameter %q: want flush_interval or tags", k)
		}
	}
	if f := q.Get("flush_interval"); f != "" {
		if t.Flush, err = time.ParseDuration(f); err != nil || t.Flush < 100*time.Millisecond {
			return t, fmt.Errorf("flush_interval %q: want a duration of at least 100ms", f)
		}
	}
	t.Tags, err = ParseTags(q.Get("tags"))
	return t, err
}

// ParseTags parses EXTRA_TAGS as upstream's envconfig does: k:v,k2:v2.
func ParseTags(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	tags := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, ":")
		if !ok || k == "" {
			return nil, fmt.Errorf("tag %q: want key:value", kv)
		}
		tags[k] = v
	}
	return tags, nil
}

// NewStatsdSink sends to a statsd over UDP: gostats's sink, whose buffers
// are bounded (it drops stats when its queue is full) and which never
// blocks a flush on the network.
func NewStatsdSink(t Target, log *slog.Logger) gostats.Sink {
	host, port, _ := net.SplitHostPort(t.Addr) // parsed by ParseTarget
	p, _ := strconv.Atoi(port)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	th := logthrottle.New(logthrottle.Every, nil)
	return gostats.NewNetSink(gostats.WithStatsdHost(host), gostats.WithStatsdPort(p), gostats.WithStatsdProtocol(t.Protocol),
		gostats.WithLogger(&sinkLogger{log: log, th: th}))
}

// sinkLogger routes gostats's messages (a statsd that cannot be reached,
// a full queue) to the log, throttled.
type sinkLogger struct {
	log *slog.Logger
	th  *logthrottle.Throttle
}

func (l *sinkLogger) Errorf(msg string, args ...any) {
	if held, ok := l.th.Allow(); ok {
		l.log.Warn("statsd: "+fmt.Sprintf(msg, args...), "not_logged_since", held)
	}
}

func (l *sinkLogger) Warnf(msg string, args ...any) { l.Errorf(msg, args...) }

//go:embed default_mapper.yaml
var defaultMapper string

// NewPrometheusSink maps the stats to Prometheus series on reg with
// upstream's default mapper (its src/stats/prom/default_mapper.yaml),
// through statsd_exporter as upstream's USE_PROMETHEUS sink does. Its
// series grow with the stats keys, which Stats caps.
func NewPrometheusSink(reg prometheus.Registerer) (gostats.Sink, error) {
	m := &mapper.MetricMapper{Logger: slog.New(slog.DiscardHandler)}
	// The file is upstream's, unchanged; statsd_exporter has since renamed
	// timer_type to observer_type (same meaning).
	if err := m.InitFromYAMLString(strings.ReplaceAll(defaultMapper, "timer_type:", "observer_type:")); err != nil {
		return nil, fmt.Errorf("upstream's default mapper: %w", err)
	}
	// statsd_exporter's own series stay off rls's registry.
	own := prometheus.NewRegistry()
	cv := func(name string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: name}, labels)
		own.MustRegister(v)
		return v
	}
	unmapped := prometheus.NewCounter(prometheus.CounterOpts{Name: "statsd_exporter_events_unmapped_total", Help: "unmapped"})
	count := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "statsd_exporter_metrics_total", Help: "metrics"}, []string{"type"})
	own.MustRegister(unmapped, count)
	exp := exporter.NewExporter(reg, m, slog.New(slog.DiscardHandler), cv("statsd_exporter_events_actions_total", "action"),
		unmapped, cv("statsd_exporter_events_error_total", "reason"), cv("statsd_exporter_events_total", "type"),
		cv("statsd_exporter_events_conflict_total", "type"), count)
	ch := make(chan event.Events, 1024)
	go exp.Listen(ch) // for the process's life, as upstream's
	return &promSink{ch: ch}, nil
}

// promSink hands each flushed stat to the exporter's goroutine; the
// flushing goroutine waits when it is behind, never a decision.
type promSink struct {
	ch chan event.Events
}

func (p *promSink) FlushCounter(name string, value uint64) {
	name, labels := splitTags(name)
	p.ch <- event.Events{&event.CounterEvent{CMetricName: name, CValue: float64(value), CLabels: labels}}
}

func (p *promSink) FlushGauge(name string, value uint64) {
	name, labels := splitTags(name)
	p.ch <- event.Events{&event.GaugeEvent{GMetricName: name, GValue: float64(value), GLabels: labels}}
}

func (p *promSink) FlushTimer(name string, value float64) {
	name, labels := splitTags(name)
	p.ch <- event.Events{&event.ObserverEvent{OMetricName: name, OValue: value, OLabels: labels}}
}

// splitTags takes the tags gostats appends to a name (".__k=v" each) off
// it, as labels: the mapper then matches the name as it would untagged,
// and EXTRA_TAGS become labels of every series.
func splitTags(name string) (string, map[string]string) {
	labels := map[string]string{}
	base, rest, ok := strings.Cut(name, ".__")
	if !ok {
		return name, labels
	}
	for _, kv := range strings.Split(rest, ".__") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			labels[k] = v
		}
	}
	return base, labels
}

// fanout sends to every sink.
func fanout(sinks []gostats.Sink) gostats.Sink {
	if len(sinks) == 1 {
		return sinks[0]
	}
	return multiSink(sinks)
}

type multiSink []gostats.Sink

func (m multiSink) FlushCounter(name string, value uint64) {
	for _, s := range m {
		s.FlushCounter(name, value)
	}
}

func (m multiSink) FlushGauge(name string, value uint64) {
	for _, s := range m {
		s.FlushGauge(name, value)
	}
}

func (m multiSink) FlushTimer(name string, value float64) {
	for _, s := range m {
		s.FlushTimer(name, value)
	}
}

// Flush flushes the sinks that buffer.
func (m multiSink) Flush() {
	for _, s := range m {
		if f, ok := s.(gostats.FlushableSink); ok {
			f.Flush()
		}
	}
}
