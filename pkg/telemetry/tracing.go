package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
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

	"github.com/rls-project/rls/pkg/logthrottle"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store"
)

// TracerName is the instrumentation scope of rls's spans.
const TracerName = "github.com/rls-project/rls"

// StoreSpanName is the name of the span of a store call.
const StoreSpanName = "rls.store.Decide"

// TracingOptions configures NewTracing.
type TracingOptions struct {
	// OTLP is where and how spans are exported (OTLPEnv.Settings).
	OTLP OTLPSettings
	// Store names the counter store (memory, redis) and RedisMode its
	// topology (single, cluster, sentinel), recorded on the spans.
	Store, RedisMode string
	// DescriptorValues records the descriptors' entries, values included.
	DescriptorValues bool
	// Registerer takes rls_trace_spans_dropped_total; required.
	Registerer prometheus.Registerer
	// Log receives the SDK's messages and, throttled, its errors; required.
	Log *slog.Logger
	// SampleRatio, when set, samples ParentBased(TraceIDRatioBased(ratio)),
	// as envoyproxy/ratelimit's TRACING_SAMPLING_RATE; nil leaves the
	// sampler to OpenTelemetry's variables (OTEL_TRACES_SAMPLER) and the
	// SDK's default, parentbased_always_on.
	SampleRatio *float64
}

// Tracing is the tracer provider of an rls that traces: an OTLP span of
// every ShouldRateLimit call (made by pkg/service) and of its Redis store
// call. Spans wait in a bounded queue; those beyond it, and those the
// collector refuses, are counted in rls_trace_spans_dropped_total, and
// ending a span never blocks. The queue is bounded in bytes as well
// (DefaultQueueBytes), and the spans' attributes are copies, bounded in
// size, of what the request held (service.Tracing): a queued span never
// keeps a request's memory alive. A nil *Tracing is tracing off: its methods
// do nothing.
type Tracing struct {
	tp      *sdktrace.TracerProvider
	svc     *service.Tracing
	store   string
	mode    string
	dropped *prometheus.CounterVec
}

// NewTracing starts exporting when o.OTLP.On, and returns nil (tracing
// off, said in the log when OTEL_SDK_DISABLED is why) otherwise. It does
// not connect: the exporter dials on its first export.
func NewTracing(o TracingOptions) (*Tracing, error) {
	if !o.OTLP.On {
		if o.OTLP.Disabled && o.OTLP.Endpoint != "" {
			o.Log.Warn("tracing off: "+EnvSDKDisabled+" is true", o.OTLP.EndpointVar, o.OTLP.Endpoint)
		}
		return nil, nil
	}
	// The SDK's and exporters' own messages go to rls's log, errors (mostly
	// failed exports) at most once per logthrottle.Every.
	otel.SetLogger(logr.FromSlogHandler(o.Log.Handler()))
	otel.SetErrorHandler(newThrottledErrors(o.Log, nil))

	t := &Tracing{store: o.Store, mode: o.RedisMode, dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rls_trace_spans_dropped_total",
		Help: "Trace spans not exported, by reason: queue_full (the export queue, OTEL_BSP_MAX_QUEUE_SIZE spans or 16 MiB, was full), export_failed (the collector did not take them).",
	}, []string{"reason"})}
	o.Registerer.MustRegister(t.dropped)
	exp, err := newExporter(o.OTLP)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.OTLP.EndpointVar, err)
	}
	res, err := newResource()
	if err != nil {
		o.Log.Warn("trace resource incomplete", "err", err)
	}
	opts := []sdktrace.TracerProviderOption{ // the sampler: OTEL_TRACES_SAMPLER, else parentbased_always_on
		sdktrace.WithResource(res),
		sdktrace.WithSpanProcessor(newBoundedProcessor(exp, o.OTLP.QueueSize, DefaultQueueBytes, t.dropped))}
	if o.SampleRatio != nil {
		opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(*o.SampleRatio))))
	}
	t.tp = sdktrace.NewTracerProvider(opts...)
	t.svc = &service.Tracing{Tracer: t.tp.Tracer(TracerName), Store: o.Store, DescriptorValues: o.DescriptorValues}
	o.Log.Info("tracing on", "otlp_endpoint", o.OTLP.Endpoint, "from", o.OTLP.EndpointVar, "protocol", o.OTLP.Protocol,
		"descriptor_values", o.DescriptorValues)
	if o.DescriptorValues {
		o.Log.Warn("trace spans carry descriptor values: API keys, client addresses and the like reach the trace backend")
	}
	return t, nil
}

// newExporter makes the OTLP exporter for s's endpoint and protocol
// (plaintext or TLS from the URL's scheme). Headers, certificates,
// timeout and compression are the exporter's own reading of the
// OTEL_EXPORTER_OTLP_* variables. It does not connect.
func newExporter(s OTLPSettings) (sdktrace.SpanExporter, error) {
	ctx := context.Background()
	if s.Protocol == ProtocolHTTP {
		return otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(s.Endpoint))
	}
	return otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(s.Endpoint))
}

// newResource describes this process: service.name rls (OTEL_SERVICE_NAME
// and OTEL_RESOURCE_ATTRIBUTES win), service.version, host.name and the
// SDK. Not the process's command line: it may hold secrets.
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

// Service returns the service's tracing options; nil when tracing is off.
func (t *Tracing) Service() *service.Tracing {
	if t == nil {
		return nil
	}
	return t.svc
}

// Shutdown exports the spans still queued and stops the exporter, within
// ctx. Spans ended later are not exported.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// Store wraps a Redis store st with a span of each Decide made under a
// recording span (a ShouldRateLimit call's): its number of checks, its
// time and its error kind. It returns st as it is when tracing is off,
// and for the memory store, whose decisions take a microsecond: a span
// each would double the spans for nothing.
func (t *Tracing) Store(st store.Store) store.Store {
	if t == nil || t.store != "redis" {
		return st
	}
	return &tracedStore{Store: st, tracer: t.tp.Tracer(TracerName), kind: t.store, mode: t.mode}
}

type tracedStore struct {
	store.Store
	tracer     trace.Tracer
	kind, mode string
}

func (t *tracedStore) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return t.Store.Decide(ctx, checks, results)
	}
	ctx, span := t.tracer.Start(ctx, StoreSpanName, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("rls.store", t.kind), attribute.String("db.system.name", t.kind),
		attribute.String("rls.redis.mode", t.mode), attribute.Int("rls.store.checks", len(checks))))
	defer span.End()
	err := t.Store.Decide(ctx, checks, results)
	if err != nil {
		kind := ErrorKind(err)
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

// DefaultQueueBytes is the most bytes of spans waiting for export
// (queued, batched or being exported), besides the most spans
// (OTEL_BSP_MAX_QUEUE_SIZE): 2,048 spans of the largest kind rls makes,
// with descriptor values, would hold over 100 MB without it.
const DefaultQueueBytes = 16 << 20

// spanOverhead is what one ended span costs besides its strings: the SDK's
// span struct, its slices and the exporter's copy, about.
const spanOverhead = 512

// spanBytes estimates the memory an ended span holds: its name, attribute
// keys and values, events and links. It is a function of the span alone,
// so the count in at OnEnd is the count out at export.
func spanBytes(s sdktrace.ReadOnlySpan) int64 {
	n := int64(spanOverhead + len(s.Name()))
	n += attrBytes(s.Attributes())
	for _, e := range s.Events() {
		n += int64(spanOverhead/4+len(e.Name)) + attrBytes(e.Attributes)
	}
	for _, l := range s.Links() {
		n += spanOverhead/4 + attrBytes(l.Attributes)
	}
	return n
}

func attrBytes(kvs []attribute.KeyValue) int64 {
	var n int64
	for _, kv := range kvs {
		n += int64(len(kv.Key)) + 16
		switch kv.Value.Type() {
		case attribute.STRING:
			n += int64(len(kv.Value.AsString()))
		case attribute.STRINGSLICE:
			for _, v := range kv.Value.AsStringSlice() {
				n += int64(len(v)) + 16
			}
		case attribute.BOOLSLICE:
			n += int64(len(kv.Value.AsBoolSlice()))
		case attribute.INT64SLICE:
			n += 8 * int64(len(kv.Value.AsInt64Slice()))
		case attribute.FLOAT64SLICE:
			n += 8 * int64(len(kv.Value.AsFloat64Slice()))
		}
	}
	return n
}

// newBoundedProcessor is a batch span processor on exp whose queue of max
// spans and maxBytes bytes (spanBytes) is never full: spans beyond either
// are dropped and counted at once.
func newBoundedProcessor(exp sdktrace.SpanExporter, max int, maxBytes int64, dropped *prometheus.CounterVec, opts ...sdktrace.BatchSpanProcessorOption) *boundedProcessor {
	inside, bytes := &atomic.Int64{}, &atomic.Int64{}
	bsp := sdktrace.NewBatchSpanProcessor(&countingExporter{SpanExporter: exp, inside: inside, bytes: bytes, failed: dropped.WithLabelValues("export_failed")},
		append([]sdktrace.BatchSpanProcessorOption{sdktrace.WithMaxQueueSize(max)}, opts...)...)
	return &boundedProcessor{SpanProcessor: bsp, inside: inside, bytes: bytes, max: int64(max), maxBytes: maxBytes,
		dropped: dropped.WithLabelValues("queue_full")}
}

// boundedProcessor hands sampled spans to the batch span processor while
// fewer than max of them, and fewer than maxBytes of their bytes, are in
// it (queued, batched or being exported; the exporter counts them out),
// and counts the rest as dropped. The batch processor's queue, of max
// spans, is then never full: it never drops a span uncounted, never
// blocks the decision that ended one, and never holds more than maxBytes
// however large the spans are.
type boundedProcessor struct {
	sdktrace.SpanProcessor
	inside, bytes *atomic.Int64
	max, maxBytes int64
	dropped       prometheus.Counter
}

func (p *boundedProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	size := spanBytes(s)
	n, b := p.inside.Add(1), p.bytes.Add(size)
	if n > p.max || b > p.maxBytes {
		p.inside.Add(-1)
		p.bytes.Add(-size)
		p.dropped.Inc()
		return
	}
	p.SpanProcessor.OnEnd(s)
}

// countingExporter counts the spans (and their bytes) it was handed out of
// the batch processor, and those the collector did not take.
type countingExporter struct {
	sdktrace.SpanExporter
	inside, bytes *atomic.Int64
	failed        prometheus.Counter
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	var size int64
	for _, s := range spans {
		size += spanBytes(s)
	}
	e.inside.Add(-int64(len(spans)))
	e.bytes.Add(-size)
	if err != nil {
		e.failed.Add(float64(len(spans)))
	}
	return err
}

// throttledErrors logs OpenTelemetry's errors (failed exports, mostly) at
// most once per logthrottle.Every, with how many were not logged since.
type throttledErrors struct {
	log *slog.Logger
	th  *logthrottle.Throttle
}

func newThrottledErrors(log *slog.Logger, now func() time.Time) *throttledErrors {
	return &throttledErrors{log: log, th: logthrottle.New(logthrottle.Every, now)}
}

func (h *throttledErrors) Handle(err error) {
	if held, ok := h.th.Allow(); ok {
		h.log.Warn("tracing: span export or SDK error (decisions are not affected; logged at most every "+h.th.Interval().String()+")",
			"err", err, "not_logged_since", held)
	}
}
