package main

// Tracing (issue #16): an OTLP span of every ShouldRateLimit call, with a
// child span for its store call. Off unless --otlp-endpoint, or OpenTelemetry's
// own OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, is
// set; off, the decision path pays one nil check. The spans themselves are
// made in pkg/service (see service.Tracing).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store"
)

// tracingConfig holds the tracing flags (embedded in Config).
type tracingConfig struct {
	OTLPEndpoint          string
	OTLPProtocol          string
	TraceDescriptorValues bool
}

// The OTLP protocols rls exports with (OpenTelemetry's names).
const (
	protoGRPC = "grpc"
	protoHTTP = "http/protobuf"
)

// addTracingFlags declares the tracing flags on fs.
func addTracingFlags(fs *flag.FlagSet, c *tracingConfig) {
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", "", "export a trace span of every ShouldRateLimit call by OTLP to this collector: host:port (plaintext) or an http:// or https:// (TLS) URL; empty: off unless OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set")
	fs.StringVar(&c.OTLPProtocol, "otlp-protocol", "", "OTLP protocol: grpc or http/protobuf; empty: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, else grpc")
	fs.BoolVar(&c.TraceDescriptorValues, "trace-descriptor-values", false, "record the descriptors' entries, values included (API keys, client addresses...), in trace spans")
}

// validateTracing checks the tracing flags.
func (c *tracingConfig) validateTracing() error {
	var errs []error
	if c.OTLPProtocol != "" {
		errs = append(errs, oneOf("otlp-protocol", c.OTLPProtocol, protoGRPC, protoHTTP))
	}
	if c.OTLPEndpoint != "" {
		if _, err := endpointURL(c.OTLPEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("%s %s", flagRef("otlp-endpoint"), err))
		}
	}
	return errors.Join(errs...)
}

// endpointURL turns --otlp-endpoint into a URL: host:port is
// http://host:port (plaintext); an http:// or https:// URL stays as it is.
// It refuses credentials in the URL (they would be logged and sent in
// clear): headers belong in OTEL_EXPORTER_OTLP_HEADERS.
func endpointURL(v string) (*url.URL, error) {
	const want = "want host:port or an http:// or https:// URL"
	if !strings.Contains(v, "://") {
		host, port, err := net.SplitHostPort(v)
		if err != nil || host == "" || !validPort(port) {
			return nil, fmt.Errorf("%q is invalid: %s", v, want)
		}
		return &url.URL{Scheme: "http", Host: v}, nil
	}
	u, err := url.Parse(v)
	if err != nil {
		return nil, fmt.Errorf("%s is invalid: %s", redactURL(v), want)
	}
	switch {
	case u.User != nil:
		return nil, fmt.Errorf("%s holds credentials: put headers such as Authorization in OTEL_EXPORTER_OTLP_HEADERS", u.Redacted())
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%q is invalid: scheme %q; %s", v, u.Scheme, want)
	case u.Hostname() == "" || (u.Port() != "" && !validPort(u.Port())):
		return nil, fmt.Errorf("%q is invalid: no host or a bad port; %s", v, want)
	case u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("%q is invalid: a query or fragment; %s", v, want)
	}
	return u, nil
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n <= 65535
}

// tracing is the tracer provider when tracing is on, and what it counts.
type tracing struct {
	tp      *sdktrace.TracerProvider
	svc     *service.Tracing
	dropped *prometheus.CounterVec
	log     *slog.Logger
}

// tracesEndpointEnv are OpenTelemetry's variables whose being set turns
// tracing on without --otlp-endpoint.
var tracesEndpointEnv = []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"}

// buildTracing starts the tracer provider when tracing is on (a.tracing
// stays nil when it is off) and registers its counters.
func (a *app) buildTracing() error {
	cfg := a.cfg
	on := cfg.OTLPEndpoint != ""
	for _, k := range tracesEndpointEnv {
		on = on || os.Getenv(k) != ""
	}
	if !on {
		return nil
	}
	if v, _ := strconv.ParseBool(os.Getenv("OTEL_SDK_DISABLED")); v {
		a.log.Warn("tracing off: OTEL_SDK_DISABLED is true", "otlp_endpoint", cfg.OTLPEndpoint)
		return nil
	}
	t, err := newTracing(cfg, a.reg, a.log)
	if err != nil {
		return err
	}
	a.tracing = t
	return nil
}

func newTracing(cfg *Config, reg prometheus.Registerer, log *slog.Logger) (*tracing, error) {
	protocol := firstSet(cfg.OTLPProtocol, os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), protoGRPC)
	if protocol != protoGRPC && protocol != protoHTTP {
		return nil, fmt.Errorf("OTLP protocol %q (from OTEL_EXPORTER_OTLP_*PROTOCOL) is not supported: grpc or http/protobuf (%s)", protocol, flagRef("otlp-protocol"))
	}
	// The SDK's and exporters' own messages go to rls's log, errors (mostly
	// failed exports) at most once every 10 s.
	otel.SetLogger(logr.FromSlogHandler(log.Handler()))
	otel.SetErrorHandler(&rateLimitedErrors{log: log, every: 10 * time.Second})

	t := &tracing{log: log, dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rls_trace_spans_dropped_total",
		Help: "Trace spans not exported, by reason: queue_full (the export queue, OTEL_BSP_MAX_QUEUE_SIZE, was full), export_failed (the collector did not take them).",
	}, []string{"reason"})}
	reg.MustRegister(t.dropped)
	exp, err := newExporter(cfg.OTLPEndpoint, protocol)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagRef("otlp-endpoint"), err)
	}
	res, err := newResource()
	if err != nil {
		log.Warn("trace resource incomplete", "err", err)
	}
	queue := queueSize()
	inside := &atomic.Int64{}
	bsp := sdktrace.NewBatchSpanProcessor(&countingExporter{SpanExporter: exp, inside: inside, failed: t.dropped.WithLabelValues("export_failed")},
		sdktrace.WithMaxQueueSize(queue))
	t.tp = sdktrace.NewTracerProvider( // the sampler: OTEL_TRACES_SAMPLER, else parentbased_always_on
		sdktrace.WithResource(res),
		sdktrace.WithSpanProcessor(&boundedProcessor{SpanProcessor: bsp, inside: inside, max: int64(queue),
			dropped: t.dropped.WithLabelValues("queue_full")}))
	t.svc = &service.Tracing{
		Tracer:           t.tp.Tracer("github.com/rls-project/rls"),
		Store:            cfg.Store,
		DescriptorValues: cfg.TraceDescriptorValues,
	}
	endpoint := "from OTEL_EXPORTER_OTLP_*ENDPOINT"
	if cfg.OTLPEndpoint != "" {
		endpoint = cfg.OTLPEndpoint
	}
	log.Info("tracing on", "otlp_endpoint", endpoint, "protocol", protocol, "descriptor_values", cfg.TraceDescriptorValues)
	if cfg.TraceDescriptorValues {
		log.Warn("trace spans carry descriptor values (--trace-descriptor-values): API keys, client addresses and the like reach the trace backend")
	}
	return t, nil
}

// newExporter makes the OTLP exporter. With --otlp-endpoint it sets the
// endpoint (and plaintext or TLS from its scheme); without, the exporter
// reads OTEL_EXPORTER_OTLP_*ENDPOINT itself. Everything else (headers,
// certificates, timeout, compression) is the exporter's own reading of
// the OTEL_EXPORTER_OTLP_* variables. It does not connect.
func newExporter(endpoint, protocol string) (sdktrace.SpanExporter, error) {
	ctx := context.Background()
	var u *url.URL
	if endpoint != "" {
		var err error
		if u, err = endpointURL(endpoint); err != nil {
			return nil, err
		}
	}
	if protocol == protoHTTP {
		var opts []otlptracehttp.Option
		if u != nil {
			if u.Path == "" || u.Path == "/" {
				u.Path = "/v1/traces" // a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
		}
		return otlptracehttp.New(ctx, opts...)
	}
	var opts []otlptracegrpc.Option
	if u != nil {
		opts = append(opts, otlptracegrpc.WithEndpointURL(u.String()))
	}
	return otlptracegrpc.New(ctx, opts...)
}

// newResource describes this process: service.name rls (OTEL_SERVICE_NAME
// and OTEL_RESOURCE_ATTRIBUTES win), service.version, host.name and the
// SDK. Not the process's command line: it may hold --redis-password.
func newResource() (*resource.Resource, error) {
	own := []attribute.KeyValue{attribute.String("service.name", "rls")}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		own = append(own, attribute.String("service.version", bi.Main.Version))
	}
	detected, err := resource.New(context.Background(), resource.WithHost(), resource.WithTelemetrySDK(), resource.WithFromEnv())
	merged, mErr := resource.Merge(resource.NewSchemaless(own...), detected)
	if mErr != nil {
		return resource.NewSchemaless(own...), errors.Join(err, mErr)
	}
	return merged, err
}

// queueSize is the batch span processor's queue size: OTEL_BSP_MAX_QUEUE_SIZE,
// else (or when not a positive number) the SDK's default, 2048.
func queueSize() int {
	if n, err := strconv.Atoi(os.Getenv("OTEL_BSP_MAX_QUEUE_SIZE")); err == nil && n > 0 {
		return n
	}
	return sdktrace.DefaultMaxQueueSize
}

func firstSet(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// service returns the service's tracing options; nil when tracing is off.
func (t *tracing) service() *service.Tracing {
	if t == nil {
		return nil
	}
	return t.svc
}

// stopTracing exports the spans still queued and stops the exporter, within
// --shutdown-timeout. Spans ended later (there are none once gRPC has
// stopped) are not exported.
func (a *app) stopTracing() {
	if a.tracing == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	if err := a.tracing.tp.Shutdown(ctx); err != nil {
		a.log.Warn("trace spans not all exported at shutdown", "err", err)
		return
	}
	a.log.Info("tracing stopped")
}

// boundedProcessor hands sampled spans to the batch span processor while
// fewer than max of them are in it (queued, batched or being exported; the
// exporter counts them out), and counts the rest as dropped. The batch
// processor's queue, of max spans, is then never full: it never drops a
// span uncounted, and never blocks the decision that ended one.
type boundedProcessor struct {
	sdktrace.SpanProcessor
	inside  *atomic.Int64
	max     int64
	dropped prometheus.Counter
}

func (p *boundedProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	if p.inside.Add(1) > p.max {
		p.inside.Add(-1)
		p.dropped.Inc()
		return
	}
	p.SpanProcessor.OnEnd(s)
}

// countingExporter counts the spans it was handed out of the batch
// processor, and those the collector did not take.
type countingExporter struct {
	sdktrace.SpanExporter
	inside *atomic.Int64
	failed prometheus.Counter
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	e.inside.Add(-int64(len(spans)))
	if err != nil {
		e.failed.Add(float64(len(spans)))
	}
	return err
}

// rateLimitedErrors logs OpenTelemetry's errors (failed exports, mostly) at
// most once every `every`, with how many were not logged since.
type rateLimitedErrors struct {
	log    *slog.Logger
	every  time.Duration
	mu     sync.Mutex
	last   time.Time
	unlogd int
}

func (h *rateLimitedErrors) Handle(err error) {
	h.mu.Lock()
	now := time.Now()
	if now.Sub(h.last) < h.every {
		h.unlogd++
		h.mu.Unlock()
		return
	}
	h.last = now
	n := h.unlogd
	h.unlogd = 0
	h.mu.Unlock()
	h.log.Warn("tracing: span export or SDK error (decisions are not affected; logged at most every 10s)", "err", err, "not_logged_since", n)
}

// traceStore wraps the Redis store st with a span of each Decide made under
// a recording span (a ShouldRateLimit call's): its number of checks, its
// time and its error kind. st as it is when tracing is off, and for the
// memory store, whose decisions take a microsecond: a span each would
// double the spans for nothing.
func (a *app) traceStore(st store.Store) store.Store {
	if a.tracing == nil || a.cfg.Store != "redis" {
		return st
	}
	return &tracedStore{Store: st, tracer: a.tracing.tp.Tracer("github.com/rls-project/rls"), kind: a.cfg.Store, mode: a.cfg.RedisMode}
}

// storeSpanName is the name of the span of a store call.
const storeSpanName = "rls.store.Decide"

type tracedStore struct {
	store.Store
	tracer     trace.Tracer
	kind, mode string
}

func (t *tracedStore) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return t.Store.Decide(ctx, checks, results)
	}
	ctx, span := t.tracer.Start(ctx, storeSpanName, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("rls.store", t.kind), attribute.String("db.system.name", t.kind),
		attribute.String("rls.redis.mode", t.mode), attribute.Int("rls.store.checks", len(checks))))
	defer span.End()
	err := t.Store.Decide(ctx, checks, results)
	if err != nil {
		kind := errorKind(err)
		undecided := 0
		for i := range results {
			if results[i].Undecided {
				undecided++
			}
		}
		span.SetAttributes(attribute.String("rls.store.error", kind), attribute.Int("rls.store.undecided", undecided))
		span.SetStatus(otelcodes.Error, kind) // the message may name keys, which hold descriptor values
	}
	return err
}
