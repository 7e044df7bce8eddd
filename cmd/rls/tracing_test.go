package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestTracingFlags: the tracing flags' good values pass; a bad one is one
// line naming the flag and its twin, never echoing a password.
func TestTracingFlags(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, v := range []string{"127.0.0.1:4317", "collector.monitoring:4317", "[::1]:4317", "http://collector:4318",
		"https://collector.example:443/otlp/v1/traces", "https://collector"} {
		if _, err := parseConfig([]string{"--config-dir", "../../config", "--otlp-endpoint", v}, noEnv, &bytes.Buffer{}); err != nil {
			t.Errorf("--otlp-endpoint %s: %v", v, err)
		}
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--otlp-endpoint", "collector"}, nil, `--otlp-endpoint (RLS_OTLP_ENDPOINT) "collector" is invalid: want host:port or an http:// or https:// URL`},
		{[]string{"--otlp-endpoint", ":4317"}, nil, `--otlp-endpoint (RLS_OTLP_ENDPOINT) ":4317" is invalid`},
		{[]string{"--otlp-endpoint", "collector:http"}, nil, `--otlp-endpoint (RLS_OTLP_ENDPOINT) "collector:http" is invalid`},
		{nil, map[string]string{"RLS_OTLP_ENDPOINT": "grpc://collector:4317"}, `--otlp-endpoint (RLS_OTLP_ENDPOINT) "grpc://collector:4317" is invalid: scheme "grpc"`},
		{[]string{"--otlp-endpoint", "http://:4318"}, nil, `--otlp-endpoint (RLS_OTLP_ENDPOINT) "http://:4318" is invalid: no host`},
		{[]string{"--otlp-endpoint", "http://c:99999"}, nil, `--otlp-endpoint (RLS_OTLP_ENDPOINT) "http://c:99999" is invalid`},
		{[]string{"--otlp-endpoint", "http://c:4318/?x=1"}, nil, `is invalid: a query or fragment`},
		{[]string{"--otlp-endpoint", "https://user:hunter2@collector:4318"}, nil, `--otlp-endpoint (RLS_OTLP_ENDPOINT) https://user:xxxxx@collector:4318 holds credentials`},
		{[]string{"--otlp-protocol", "http/json"}, nil, `--otlp-protocol (RLS_OTLP_PROTOCOL) "http/json" is invalid; choices are [grpc http/protobuf]`},
		{nil, map[string]string{"RLS_TRACE_DESCRIPTOR_VALUES": "yes"}, `RLS_TRACE_DESCRIPTOR_VALUES="yes": want true or false`},
	} {
		args := append([]string{"--config-dir", "../../config"}, tc.args...)
		_, err := parseConfig(args, func(k string) string { return tc.env[k] }, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: got %v, want an error containing %q", tc.args, tc.env, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%v %v: %q: want one line without the password", tc.args, tc.env, err)
		}
	}
}

// clearOTELEnv unsets the OpenTelemetry variables that turn tracing on or
// change it, for the test (a developer's shell may set them).
func clearOTELEnv(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_BSP_MAX_QUEUE_SIZE"} {
		t.Setenv(k, "")
	}
}

// TestTracingOnOff: tracing is off by default; --otlp-endpoint or
// OTEL_EXPORTER_OTLP_ENDPOINT turns it on; OTEL_SDK_DISABLED turns it off;
// a protocol the exporters lack is an error naming where it came from.
func TestTracingOnOff(t *testing.T) {
	build := func(args ...string) (*app, error) {
		a := &app{cfg: testConfig(t, args...), log: slog.New(slog.DiscardHandler), reg: prometheus.NewRegistry()}
		err := a.buildTracing()
		t.Cleanup(a.stopTracing)
		return a, err
	}
	clearOTELEnv(t)
	if a, err := build(); err != nil || a.tracing != nil || a.tracing.service() != nil {
		t.Fatalf("tracing without a flag or variable: %v %v", a.tracing, err)
	}
	if a, err := build("--otlp-endpoint", "127.0.0.1:1"); err != nil || a.tracing == nil || a.tracing.service() == nil {
		t.Fatalf("--otlp-endpoint: tracing %v, %v", a.tracing, err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	if a, err := build(); err != nil || a.tracing == nil {
		t.Fatalf("OTEL_EXPORTER_OTLP_ENDPOINT: tracing %v, %v", a.tracing, err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, err := build(); err == nil || !strings.Contains(err.Error(), `"http/json"`) || !strings.Contains(err.Error(), "--otlp-protocol") {
		t.Fatalf("OTEL_EXPORTER_OTLP_PROTOCOL=http/json: %v", err)
	}
	if a, err := build("--otlp-protocol", "grpc"); err != nil || a.tracing == nil { // the flag wins
		t.Fatalf("--otlp-protocol grpc over OTEL_EXPORTER_OTLP_PROTOCOL: %v %v", a.tracing, err)
	}
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if a, err := build("--otlp-endpoint", "127.0.0.1:1"); err != nil || a.tracing != nil {
		t.Fatalf("OTEL_SDK_DISABLED=true: tracing %v, %v", a.tracing, err)
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
	inside := &atomic.Int64{}
	const queue = 3
	bsp := sdktrace.NewBatchSpanProcessor(&countingExporter{SpanExporter: exp, inside: inside, failed: dropped.WithLabelValues("export_failed")},
		sdktrace.WithMaxQueueSize(queue), sdktrace.WithMaxExportBatchSize(queue), sdktrace.WithBatchTimeout(time.Millisecond))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(&boundedProcessor{SpanProcessor: bsp, inside: inside, max: queue,
		dropped: dropped.WithLabelValues("queue_full")}))
	tr := tp.Tracer("t")
	start := time.Now()
	for range 10 {
		_, s := tr.Start(context.Background(), "s")
		s.End()
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("ending 10 spans took %v with the exporter stuck", d)
	}
	if got := testutil.ToFloat64(dropped.WithLabelValues("queue_full")); got != 10-queue {
		t.Errorf("dropped %v, want %d", got, 10-queue)
	}
	close(exp.release)
	waitFor(t, "queued spans exported", 5*time.Second, func() bool { return exp.exported.Load() == queue && inside.Load() == 0 })
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
	e := &countingExporter{SpanExporter: failingExporter{}, inside: inside, failed: failed}
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

// TestExportErrorsRateLimited: a burst of export errors is one log line;
// the next one after the interval says how many were not logged.
func TestExportErrorsRateLimited(t *testing.T) {
	var buf logBuffer
	h := &rateLimitedErrors{log: slog.New(slog.NewTextHandler(&buf, nil)), every: 200 * time.Millisecond}
	for range 50 {
		h.Handle(errors.New("export failed: connection refused"))
	}
	if n := strings.Count(buf.String(), "connection refused"); n != 1 {
		t.Fatalf("%d lines for a burst of 50 errors, want 1:\n%s", n, buf.String())
	}
	time.Sleep(250 * time.Millisecond)
	h.Handle(errors.New("export failed: connection refused"))
	if !strings.Contains(buf.String(), "not_logged_since=49") {
		t.Errorf("the next line does not count the 49 not logged:\n%s", buf.String())
	}
}
