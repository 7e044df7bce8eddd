package telemetry

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// TestOTLPEnvSettings: tracing is off without an endpoint variable, on
// with either; the *_TRACES_* variables win; OTLP/HTTP posts to the traces
// path; OTEL_SDK_DISABLED turns it off.
func TestOTLPEnvSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  OTLPEnv
		want OTLPSettings
	}{
		{"nothing", OTLPEnv{}, OTLPSettings{Protocol: ProtocolGRPC, QueueSize: 2048}},
		{"base endpoint, grpc", OTLPEnv{Endpoint: "http://127.0.0.1:4317"},
			OTLPSettings{On: true, Endpoint: "http://127.0.0.1:4317", EndpointVar: EnvEndpoint, Protocol: ProtocolGRPC, QueueSize: 2048}},
		{"base endpoint, http", OTLPEnv{Endpoint: "https://c.example/otlp/", Protocol: ProtocolHTTP},
			OTLPSettings{On: true, Endpoint: "https://c.example/otlp/v1/traces", EndpointVar: EnvEndpoint, Protocol: ProtocolHTTP, QueueSize: 2048}},
		{"traces endpoint wins, as it is", OTLPEnv{TracesEndpoint: "http://c:4318/custom", Endpoint: "http://other:4318", TracesProtocol: ProtocolHTTP, Protocol: ProtocolGRPC},
			OTLPSettings{On: true, Endpoint: "http://c:4318/custom", EndpointVar: EnvTracesEndpoint, Protocol: ProtocolHTTP, QueueSize: 2048}},
		{"traces endpoint without a path", OTLPEnv{TracesEndpoint: "http://c:4318", Protocol: ProtocolHTTP},
			OTLPSettings{On: true, Endpoint: "http://c:4318/v1/traces", EndpointVar: EnvTracesEndpoint, Protocol: ProtocolHTTP, QueueSize: 2048}},
		{"queue, disabled", OTLPEnv{Endpoint: "http://c:4317", MaxQueueSize: "16", SDKDisabled: "true"},
			OTLPSettings{Disabled: true, Endpoint: "http://c:4317", EndpointVar: EnvEndpoint, Protocol: ProtocolGRPC, QueueSize: 16}},
	} {
		got, err := tc.env.Settings()
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v %v, want %+v", tc.name, got, err, tc.want)
		}
	}
}

// TestOTLPEnvErrors: a bad value is an error naming its variable, whether
// tracing is on or not, never echoing a password.
func TestOTLPEnvErrors(t *testing.T) {
	for _, tc := range []struct {
		env  OTLPEnv
		want string
	}{
		{OTLPEnv{Protocol: "bogus"}, `OTEL_EXPORTER_OTLP_PROTOCOL "bogus" is invalid; choices are [grpc http/protobuf]`},
		{OTLPEnv{TracesProtocol: "http/json"}, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL "http/json" is invalid`},
		{OTLPEnv{MaxQueueSize: "lots"}, `OTEL_BSP_MAX_QUEUE_SIZE "lots" is invalid: want a whole number`},
		{OTLPEnv{MaxQueueSize: "0"}, `OTEL_BSP_MAX_QUEUE_SIZE "0" is invalid`},
		{OTLPEnv{SDKDisabled: "yes"}, `OTEL_SDK_DISABLED "yes" is invalid: want true or false`},
		{OTLPEnv{Endpoint: "collector:4317"}, `OTEL_EXPORTER_OTLP_ENDPOINT "collector:4317" is invalid: want an http:// or https:// URL`},
		{OTLPEnv{TracesEndpoint: "grpc://collector:4317"}, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT "grpc://collector:4317" is invalid`},
		{OTLPEnv{Endpoint: "http://:4318"}, `OTEL_EXPORTER_OTLP_ENDPOINT "http://:4318" is invalid: no host`},
		{OTLPEnv{Endpoint: "http://c:99999"}, `"http://c:99999" is invalid`},
		{OTLPEnv{Endpoint: "http://c:4318/?x=1"}, `is invalid: a query or fragment`},
		{OTLPEnv{Endpoint: "https://user:hunter2@collector:4318"}, `OTEL_EXPORTER_OTLP_ENDPOINT https://user:xxxxx@collector:4318 holds credentials`},
	} {
		_, err := tc.env.Settings()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error containing %q", tc.env, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%+v: %q: want one line without the password", tc.env, err)
		}
	}
	env := ReadOTLPEnv(func(k string) string { return map[string]string{EnvProtocol: "x", EnvMaxQueueSize: "y"}[k] })
	if _, err := env.Settings(); err == nil || strings.Count(err.Error(), "\n") != 1 {
		t.Errorf("two bad variables: %v, want both", err)
	}
}

// TestNewTracingOnOff: off (nil, whose methods do nothing) unless an
// endpoint is set and the SDK not disabled; on, a Redis store is traced and
// the memory store is not.
func TestNewTracingOnOff(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, env := range []OTLPEnv{{}, {Endpoint: "http://127.0.0.1:1", SDKDisabled: "true"}} {
		s, _ := env.Settings()
		tr, err := NewTracing(TracingOptions{OTLP: s, Registerer: prometheus.NewRegistry(), Log: log})
		if err != nil || tr != nil || tr.Service() != nil || tr.Shutdown(context.Background()) != nil {
			t.Fatalf("%+v: tracing %v, %v; want off", env, tr, err)
		}
		st := memory.New(memory.Options{})
		if tr.Store(st) != st {
			t.Error("tracing off wraps the store")
		}
	}
	for _, proto := range []string{ProtocolGRPC, ProtocolHTTP} {
		s, _ := OTLPEnv{Endpoint: "http://127.0.0.1:1", Protocol: proto}.Settings()
		tr, err := NewTracing(TracingOptions{OTLP: s, Store: "redis", RedisMode: "single", Registerer: prometheus.NewRegistry(), Log: log})
		if err != nil || tr == nil || tr.Service() == nil {
			t.Fatalf("%s: tracing %v, %v; want on", proto, tr, err)
		}
		st := memory.New(memory.Options{})
		if _, ok := tr.Store(st).(*tracedStore); !ok {
			t.Errorf("%s: the redis store is not traced", proto)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		tr.Shutdown(ctx)
		cancel()
	}
}

// blockingExporter takes spans once released, counting them.
type blockingExporter struct {
	release  chan struct{}
	exported atomic.Int64
}

func (e *blockingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	select {
	case <-e.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	e.exported.Add(int64(len(spans)))
	return nil
}

func (e *blockingExporter) Shutdown(context.Context) error { return nil }

// TestBoundedProcessorCountsDrops: with the exporter stuck, spans beyond the
// queue are dropped at once (a decision never waits) and counted; every
// span taken is exported once the exporter moves, and taking resumes.
func TestBoundedProcessorCountsDrops(t *testing.T) {
	exp := &blockingExporter{release: make(chan struct{})}
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "d"}, []string{"reason"})
	const queue = 3
	p := newBoundedProcessor(exp, queue, 1<<30, dropped, sdktrace.WithMaxExportBatchSize(queue), sdktrace.WithBatchTimeout(time.Millisecond))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p))
	tr := tp.Tracer("t")
	ended := make(chan struct{})
	go func() {
		for range 10 {
			_, s := tr.Start(context.Background(), "s")
			s.End()
		}
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("ending 10 spans blocks with the exporter stuck")
	}
	if got := testutil.ToFloat64(dropped.WithLabelValues("queue_full")); got != 10-queue {
		t.Errorf("dropped %v, want %d", got, 10-queue)
	}
	close(exp.release)
	testkit.WaitFor(t, "queued spans exported", 5*time.Second, func() bool { return exp.exported.Load() == queue && p.inside.Load() == 0 })
	for range 2 {
		_, s := tr.Start(context.Background(), "s")
		s.End()
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := exp.exported.Load(); got != queue+2 {
		t.Errorf("exported %d spans, want %d", got, queue+2)
	}
	if got := testutil.ToFloat64(dropped.WithLabelValues("queue_full")); got != 10-queue {
		t.Errorf("dropped %v after the exporter moved, want still %d", got, 10-queue)
	}
}

// TestCountingExporterCountsFailures: spans the collector refused count as
// export_failed, and leave the queue.
func TestCountingExporterCountsFailures(t *testing.T) {
	failed := prometheus.NewCounter(prometheus.CounterOpts{Name: "f"})
	inside := &atomic.Int64{}
	inside.Store(2)
	e := &countingExporter{SpanExporter: failingExporter{}, inside: inside, bytes: &atomic.Int64{}, failed: failed}
	spans := tracetest.SpanStubs{{Name: "a"}, {Name: "b"}}.Snapshots()
	if err := e.ExportSpans(context.Background(), spans); err == nil {
		t.Fatal("want the exporter's error")
	}
	if testutil.ToFloat64(failed) != 2 || inside.Load() != 0 {
		t.Errorf("failed %v inside %d, want 2 and 0", testutil.ToFloat64(failed), inside.Load())
	}
}

type failingExporter struct{}

func (failingExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	return errors.New("connection refused")
}
func (failingExporter) Shutdown(context.Context) error { return nil }

// TestExportErrorsThrottled: a burst of export errors is one log line; the
// next one after the interval says how many were not logged.
func TestExportErrorsThrottled(t *testing.T) {
	var buf testkit.Buffer
	clk := testkit.NewClock(time.Unix(1000, 0))
	h := newThrottledErrors(slog.New(slog.NewTextHandler(&buf, nil)), clk.Now)
	for range 50 {
		h.Handle(errors.New("export failed: connection refused"))
	}
	if n := strings.Count(buf.String(), "connection refused"); n != 1 {
		t.Fatalf("%d lines for a burst of 50 errors, want 1:\n%s", n, buf.String())
	}
	clk.Advance(h.th.Interval())
	h.Handle(errors.New("export failed: connection refused"))
	if !strings.Contains(buf.String(), "not_logged_since=49") {
		t.Errorf("the next line does not count the 49 not logged:\n%s", buf.String())
	}
}

// TestBoundedProcessorBoundsBytes: with the exporter stuck, spans are taken
// while their bytes fit the byte bound, far below the span bound, and the
// rest are dropped and counted; exported spans give their bytes back.
func TestBoundedProcessorBoundsBytes(t *testing.T) {
	exp := &blockingExporter{release: make(chan struct{})}
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "d"}, []string{"reason"})
	big := strings.Repeat("x", 10_000)
	const maxBytes = 35_000 // three spans of big, not four
	p := newBoundedProcessor(exp, 1000, maxBytes, dropped, sdktrace.WithMaxExportBatchSize(1000), sdktrace.WithBatchTimeout(time.Millisecond))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p))
	tr := tp.Tracer("t")
	for range 10 {
		_, s := tr.Start(context.Background(), "s", trace.WithAttributes(attribute.String("a", big)))
		s.End()
	}
	if got := testutil.ToFloat64(dropped.WithLabelValues("queue_full")); got != 7 {
		t.Errorf("dropped %v, want 7 (3 spans of %d bytes fit %d)", got, len(big), maxBytes)
	}
	if b := p.bytes.Load(); b > maxBytes || b < 3*int64(len(big)) {
		t.Errorf("%d bytes inside, want 3 spans' worth, at most %d", b, maxBytes)
	}
	close(exp.release)
	testkit.WaitFor(t, "queued spans exported", 5*time.Second, func() bool { return exp.exported.Load() == 3 && p.bytes.Load() == 0 && p.inside.Load() == 0 })
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestTracingSampleRatio: SampleRatio 0 samples no new trace, as upstream's
// TRACING_SAMPLING_RATE=0; without it every trace is sampled.
func TestTracingSampleRatio(t *testing.T) {
	s, _ := OTLPEnv{Endpoint: "http://127.0.0.1:1"}.Settings()
	for _, c := range []struct {
		ratio *float64
		want  bool
	}{{nil, true}, {new(float64), false}} {
		tr, err := NewTracing(TracingOptions{OTLP: s, Registerer: prometheus.NewRegistry(), Log: slog.New(slog.DiscardHandler), SampleRatio: c.ratio})
		if err != nil {
			t.Fatal(err)
		}
		_, span := tr.Service().Tracer.Start(context.Background(), "probe")
		if got := span.SpanContext().IsSampled(); got != c.want {
			t.Errorf("ratio %v: sampled %v, want %v", c.ratio, got, c.want)
		}
		span.End()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond) // no collector: do not wait for it
		tr.Shutdown(ctx)
		cancel()
	}
}
