package service

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// tracedService is newTestService's service on st (nil: the memory store
// on the test clock), tracing into the returned recorder.
func tracedService(t *testing.T, st store.Store, values bool, sampler sdktrace.Sampler) (*Service, *tracetest.SpanRecorder) {
	t.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"test.yaml": []byte(testConfig)})
	if err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	if st == nil {
		st = memory.New(memory.Options{Now: clk.Now})
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sampler))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := &Tracing{Tracer: tp.Tracer("test"), Store: "memory", DescriptorValues: values}
	return New(cfg, limiter.New(st, limiter.Options{Now: clk.Now}), Options{Tracing: tr}), rec
}

// lastSpan returns the one span recorded since the last call, by name.
func lastSpan(t *testing.T, rec *tracetest.SpanRecorder, seen *int) sdktrace.ReadOnlySpan {
	t.Helper()
	spans := rec.Ended()
	if len(spans) != *seen+1 {
		t.Fatalf("%d spans ended, want %d", len(spans), *seen+1)
	}
	*seen = len(spans)
	s := spans[len(spans)-1]
	if s.Name() != SpanName || s.SpanKind() != trace.SpanKindServer {
		t.Fatalf("span %q kind %v, want %q server", s.Name(), s.SpanKind(), SpanName)
	}
	return s
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// noValue fails when any attribute, the status or an event of s holds v.
func noValue(t *testing.T, s sdktrace.ReadOnlySpan, v string) {
	t.Helper()
	all := fmt.Sprint(s.Attributes(), s.Status(), s.Events(), s.Links(), s.Name())
	if strings.Contains(all, v) {
		t.Errorf("span holds descriptor value %q: %s", v, all)
	}
}

func want(t *testing.T, s sdktrace.ReadOnlySpan, key string, v any) {
	t.Helper()
	got, ok := attrs(s)[attribute.Key(key)]
	if !ok {
		t.Errorf("span has no %s; want %v", key, v)
		return
	}
	if !reflect.DeepEqual(got.AsInterface(), v) {
		t.Errorf("%s = %#v, want %#v", key, got.AsInterface(), v)
	}
}

func callCtx(ctx context.Context, t *testing.T, s *Service, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	r, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "test", Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestTracingSpan: a span per call, child of the caller's traceparent, with
// the outcome, rule and source of every descriptor, and no descriptor value.
func TestTracingSpan(t *testing.T) {
	s, rec := tracedService(t, nil, false, sdktrace.ParentBased(sdktrace.AlwaysSample()))
	seen := 0
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", parent))
	callCtx(ctx, t, s, d("api_key", "secret-a"), d("free", "secret-b"), d("nothing", "secret-c"))
	sp := lastSpan(t, rec, &seen)
	if got := sp.Parent().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" || !sp.Parent().IsRemote() {
		t.Errorf("parent trace %s (remote %v), want the traceparent's", got, sp.Parent().IsRemote())
	}
	if sp.SpanContext().TraceID() != sp.Parent().TraceID() || sp.Parent().SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("span %v is not a child of the traceparent", sp.SpanContext())
	}
	want(t, sp, "rls.domain", "test")
	want(t, sp, "rls.descriptors", int64(3))
	want(t, sp, "rls.hits_addend", int64(0))
	want(t, sp, "rls.store", "memory")
	want(t, sp, "rls.overall_code", "OK")
	want(t, sp, "rpc.grpc.status_code", int64(0))
	want(t, sp, "rls.fallback", false)
	want(t, sp, "rls.descriptor.outcomes", []string{"ok", "unlimited", "no_rule"})
	want(t, sp, "rls.descriptor.rules", []string{"per-key", "free", ""})
	want(t, sp, "rls.descriptor.sources", []string{"store", "none", "none"})
	if _, ok := attrs(sp)["rls.descriptor.entries"]; ok {
		t.Error("rls.descriptor.entries without DescriptorValues")
	}
	for _, v := range []string{"secret-a", "secret-b", "secret-c"} {
		noValue(t, sp, v)
	}

	// No traceparent: a root span. Over the limit, then from the local cache.
	callCtx(context.Background(), t, s, d("small", "secret-d"))
	sp = lastSpan(t, rec, &seen)
	if sp.Parent().IsValid() {
		t.Errorf("span without traceparent has parent %v", sp.Parent())
	}
	want(t, sp, "rls.descriptor.outcomes", []string{"near_limit"}) // 1 of 1 used
	callCtx(context.Background(), t, s, d("small", "secret-d"))
	sp = lastSpan(t, rec, &seen)
	want(t, sp, "rls.overall_code", "OVER_LIMIT")
	want(t, sp, "rls.descriptor.outcomes", []string{"over_limit"})
	want(t, sp, "rls.descriptor.sources", []string{"store"})
	callCtx(context.Background(), t, s, d("small", "secret-d"))
	sp = lastSpan(t, rec, &seen)
	want(t, sp, "rls.descriptor.sources", []string{"local_cache"})
	noValue(t, sp, "secret-d")

	// Shadow mode: over its limit, answered OK.
	callCtx(context.Background(), t, s, d("shadow", "x"))
	seen++
	callCtx(context.Background(), t, s, d("shadow", "x"))
	sp = lastSpan(t, rec, &seen)
	want(t, sp, "rls.overall_code", "OK")
	want(t, sp, "rls.descriptor.outcomes", []string{"shadow_over_limit"})

	// An invalid request: the code, no status error (the caller's fault).
	_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test",
		Descriptors: []*rlcommon.RateLimitDescriptor{d("api_key", strings.Repeat("v", 5000))}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v, want InvalidArgument", err)
	}
	sp = lastSpan(t, rec, &seen)
	want(t, sp, "rpc.grpc.status_code", int64(codes.InvalidArgument))
	want(t, sp, "rls.error", "InvalidArgument")
	if sp.Status().Code != otelcodes.Unset {
		t.Errorf("status %v for the caller's error, want unset", sp.Status())
	}
	noValue(t, sp, "vvvv")
}

// TestTracingStoreFailures: a store that fails is an Error span with the
// gRPC code only (the error names keys); an outage is a fallback.
func TestTracingStoreFailures(t *testing.T) {
	s, rec := tracedService(t, failingStore{fmt.Errorf("%w: ERR in key test|api_key=secret-e", store.ErrProtocol)}, false, sdktrace.AlwaysSample())
	seen := 0
	_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{d("api_key", "secret-e")}})
	if status.Code(err) != codes.Internal {
		t.Fatalf("got %v, want Internal", err)
	}
	sp := lastSpan(t, rec, &seen)
	if sp.Status().Code != otelcodes.Error || sp.Status().Description != "Internal" {
		t.Errorf("status %+v, want Error Internal", sp.Status())
	}
	want(t, sp, "rpc.grpc.status_code", int64(codes.Internal))
	want(t, sp, "rls.descriptor.rules", []string{"per-key"})
	noValue(t, sp, "secret-e")

	s, rec = tracedService(t, failingStore{fmt.Errorf("%w: connection refused", store.ErrUnavailable)}, false, sdktrace.AlwaysSample())
	seen = 0
	callCtx(context.Background(), t, s, d("api_key", "a"), d("free", "b"))
	sp = lastSpan(t, rec, &seen)
	want(t, sp, "rls.fallback", true)
	want(t, sp, "rls.descriptor.sources", []string{"fail_open", "none"})
	if sp.Status().Code != otelcodes.Unset {
		t.Errorf("status %v of a fallback decision, want unset", sp.Status())
	}
}

// TestTracingDescriptorValues: with DescriptorValues, each descriptor's
// entries, bytes that are not UTF-8 escaped.
func TestTracingDescriptorValues(t *testing.T) {
	s, rec := tracedService(t, nil, true, sdktrace.AlwaysSample())
	seen := 0
	callCtx(context.Background(), t, s, d("api_key", "secret-a", "route", "/x"), d("ip", "10.0.0.\xff"))
	sp := lastSpan(t, rec, &seen)
	want(t, sp, "rls.descriptor.entries", []string{"api_key=secret-a|route=/x", `ip=10.0.0.\xff`})
}

// TestTracingSampledOut: a span the sampler drops records nothing and the
// call is answered as usual.
func TestTracingSampledOut(t *testing.T) {
	s, rec := tracedService(t, nil, true, sdktrace.ParentBased(sdktrace.AlwaysSample()))
	ctx := metadata.NewIncomingContext(context.Background(),
		metadata.Pairs("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")) // not sampled
	if r := callCtx(ctx, t, s, d("api_key", "a")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("overall %v", r.OverallCode)
	}
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans recorded for an unsampled parent", n)
	}
}

// TestTracingOffAddsNoAllocation: without Options.Tracing a one-descriptor
// call allocates what it did before tracing existed (BenchmarkHandler: the
// response and the store key, 2): nothing of tracing runs.
func TestTracingOffAddsNoAllocation(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items: allocations vary")
	}
	cfg, err := descriptors.Parse(map[string][]byte{"test.yaml": []byte(testConfig)})
	if err != nil {
		t.Fatal(err)
	}
	s := New(cfg, limiter.New(memory.New(memory.Options{}), limiter.Options{}), Options{})
	req := &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{d("ip", "a")}}
	ctx := metadata.NewIncomingContext(context.Background(),
		metadata.Pairs("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
	if n := testing.AllocsPerRun(200, func() { _, _ = s.ShouldRateLimit(ctx, req) }); n > 2 {
		t.Errorf("allocations per call with tracing off: %v, want at most 2", n)
	}
}

// BenchmarkHandlerTracing is BenchmarkHandler with tracing on: every call
// sampled (its span handed to a batch span processor that exports to
// nowhere), and every call sampled out (Envoy's traceparent says not
// sampled: the span is not recorded).
func BenchmarkHandlerTracing(b *testing.B) {
	b.Run("sampled", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		defer tp.Shutdown(context.Background())
		benchHandler(b, &Tracing{Tracer: tp.Tracer("bench"), Store: "memory"})
	})
	b.Run("sampled_out", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSampler(sdktrace.NeverSample()))
		defer tp.Shutdown(context.Background())
		benchHandler(b, &Tracing{Tracer: tp.Tracer("bench"), Store: "memory"})
	})
}

// TestTracingSpansCopyBounded: a span's strings are copies of the
// request's, at most SpanStringBytes each, so a queued span never keeps
// the decoded request's buffer alive: a valid request's short domain and
// long values, and an invalid request's long domain, cut at a UTF-8
// boundary.
func TestTracingSpansCopyBounded(t *testing.T) {
	s, rec := tracedService(t, nil, true, sdktrace.AlwaysSample())
	seen := 0
	long := strings.Repeat("é", 2000) // 4,000 bytes: valid, cut mid-run
	for _, tc := range []struct {
		name    string
		req     *rlsv3.RateLimitRequest
		code    codes.Code
		entries bool
	}{
		{"valid, long values", &rlsv3.RateLimitRequest{Domain: "test",
			Descriptors: []*rlcommon.RateLimitDescriptor{d("api_key", long), d("free", strings.Repeat("v", 4000))}}, codes.OK, true},
		{"invalid, long domain", &rlsv3.RateLimitRequest{Domain: strings.Repeat("dé", 3000),
			Descriptors: []*rlcommon.RateLimitDescriptor{d("api_key", "a")}}, codes.InvalidArgument, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wire, err := proto.Marshal(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			req := &rlsv3.RateLimitRequest{}
			if err := DecodeRequest(wire, req); err != nil {
				t.Fatal(err)
			}
			lo := uintptr(unsafe.Pointer(unsafe.StringData(req.Domain))) // the one string every field is a substring of
			if _, err := s.ShouldRateLimit(context.Background(), req); status.Code(err) != tc.code {
				t.Fatalf("got %v, want %v", err, tc.code)
			}
			sp := lastSpan(t, rec, &seen)
			var strs []string
			for _, kv := range sp.Attributes() {
				switch kv.Value.Type() {
				case attribute.STRING:
					strs = append(strs, kv.Value.AsString())
				case attribute.STRINGSLICE:
					strs = append(strs, kv.Value.AsStringSlice()...)
				}
			}
			if _, ok := attrs(sp)["rls.descriptor.entries"]; ok != tc.entries {
				t.Errorf("rls.descriptor.entries present %v, want %v", ok, tc.entries)
			}
			for _, v := range strs {
				if len(v) > SpanStringBytes || !utf8.ValidString(v) {
					t.Errorf("attribute of %d bytes (valid UTF-8 %v), want at most %d, valid", len(v), utf8.ValidString(v), SpanStringBytes)
				}
				if p := uintptr(unsafe.Pointer(unsafe.StringData(v))); len(v) > 0 && p >= lo-uintptr(len(wire)) && p < lo+uintptr(len(wire)) {
					t.Errorf("attribute %.20q shares the request's memory", v)
				}
			}
		})
	}
}
