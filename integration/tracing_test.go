package integration

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	collectortracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
)

// Tracing: the real binary exports its spans by OTLP to an
// in-process collector, over gRPC and over HTTP.

// otlpReceiver is an OTLP trace collector on a loopback port: it keeps
// every export request as it arrived.
type otlpReceiver struct {
	collectortracepb.UnimplementedTraceServiceServer
	Addr string

	mu    sync.Mutex
	raw   [][]byte // each request's bytes, to search for values
	spans []recvSpan
	paths []string      // HTTP request paths
	hold  chan struct{} // while open, Export waits (a stuck collector)
}

// recvSpan is one received span with its resource's attributes.
type recvSpan struct {
	*tracepb.Span
	Resource map[string]any
}

func (r *otlpReceiver) Export(ctx context.Context, req *collectortracepb.ExportTraceServiceRequest) (*collectortracepb.ExportTraceServiceResponse, error) {
	if r.hold != nil {
		select {
		case <-r.hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	r.add(req)
	return &collectortracepb.ExportTraceServiceResponse{}, nil
}

func (r *otlpReceiver) add(req *collectortracepb.ExportTraceServiceRequest) {
	b, _ := proto.Marshal(req)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.raw = append(r.raw, b)
	for _, rs := range req.ResourceSpans {
		res := attrMap(rs.GetResource().GetAttributes())
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, recvSpan{Span: s, Resource: res})
			}
		}
	}
}

// named returns the spans received so far with that name.
func (r *otlpReceiver) named(name string) []recvSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []recvSpan
	for _, s := range r.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// holds reports whether any received request contains b.
func (r *otlpReceiver) holds(b string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, raw := range r.raw {
		if bytes.Contains(raw, []byte(b)) {
			return true
		}
	}
	return false
}

// startGRPCReceiver serves OTLP/gRPC on a loopback port until the test ends.
func startGRPCReceiver(t *testing.T, hold chan struct{}) *otlpReceiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &otlpReceiver{Addr: lis.Addr().String(), hold: hold}
	srv := grpc.NewServer()
	collectortracepb.RegisterTraceServiceServer(srv, r)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return r
}

// startHTTPReceiver serves OTLP/HTTP (protobuf) on a loopback port until
// the test ends.
func startHTTPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &otlpReceiver{Addr: lis.Addr().String()}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
		body, err := io.ReadAll(q.Body)
		req := &collectortracepb.ExportTraceServiceRequest{}
		if err == nil {
			err = proto.Unmarshal(body, req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.paths = append(r.paths, q.Method+" "+q.URL.Path+" "+q.Header.Get("Content-Type"))
		r.mu.Unlock()
		r.add(req)
		out, _ := proto.Marshal(&collectortracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	})}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return r
}

func attrMap(kvs []*commonpb.KeyValue) map[string]any {
	m := map[string]any{}
	for _, kv := range kvs {
		m[kv.Key] = anyValue(kv.Value)
	}
	return m
}

// anyValue is v as a Go value: string, int64, bool, float64 or []any.
func anyValue(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_ArrayValue:
		var out []any
		for _, e := range x.ArrayValue.Values {
			out = append(out, anyValue(e))
		}
		return out
	}
	return fmt.Sprintf("%v", v)
}

// wantAttrs checks attributes of s (arrays written as []any).
func wantAttrs(t *testing.T, what string, s recvSpan, want map[string]any) {
	t.Helper()
	got := attrMap(s.Attributes)
	for k, v := range want {
		if fmt.Sprint(got[k]) != fmt.Sprint(v) {
			t.Errorf("%s: %s = %v, want %v", what, k, got[k], v)
		}
	}
}

// startTraced starts the binary with env added and waits until it serves.
func startTraced(t *testing.T, env []string, configDir string, args ...string) *rlsProc {
	t.Helper()
	p := startRLSBinEnv(t, rlsBin, env, configDir, args...)
	p.waitServing(t, 20*time.Second)
	return p
}

const traceConfig = `domain: trace
descriptors:
  - key: api_key
    rate_limit: {name: per-key, unit: hour, requests_per_unit: 2}
`

// traced calls ShouldRateLimit with traceparent in its metadata (none when
// empty).
func traced(t *testing.T, p *rlsProc, traceparent, value string) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if traceparent != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent)
	}
	resp, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "trace", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key", value)}})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// TestTracingOTLPGRPC: rls on Redis with an http:// OTLP endpoint exports
// a span per call (the caller's traceparent its parent, an unsampled one
// followed) and a store span per Redis call, with the outcome, source and
// service.name, and no descriptor value anywhere.
func TestTracingOTLPGRPC(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	rcv := startGRPCReceiver(t, nil)
	dir := writeConfig(t, map[string]string{"trace.yaml": traceConfig})
	p := startTraced(t, []string{"OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://" + rcv.Addr}, dir,
		"--store", "redis", "--redis-url", srv.URL())

	secret := "secret-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	codes := []string{
		traced(t, p, "00-"+traceID+"-"+parentID+"-01", secret).OverallCode.String(),
		traced(t, p, "", secret).OverallCode.String(),
		traced(t, p, "", secret).OverallCode.String(), // over the limit: the store says so
		traced(t, p, "", secret).OverallCode.String(), // the over-limit cache says so
	}
	if fmt.Sprint(codes) != "[OK OK OVER_LIMIT OVER_LIMIT]" {
		t.Fatalf("codes %v", codes)
	}
	traced(t, p, "00-"+traceID+"-"+parentID+"-00", secret+"-unsampled") // Envoy did not sample it
	testkit.WaitForEvery(t, "4 call spans and 3 store spans", 10*time.Second, pollEvery, func() bool {
		return len(rcv.named("rls.ShouldRateLimit")) >= 4 && len(rcv.named("rls.store.Decide")) >= 3
	})
	p.stop(t) // flushes anything left
	calls, stores := rcv.named("rls.ShouldRateLimit"), rcv.named("rls.store.Decide")
	if len(calls) != 4 || len(stores) != 3 {
		t.Fatalf("%d call spans and %d store spans, want 4 and 3 (the unsampled call has none)", len(calls), len(stores))
	}
	// Spans arrive in the order they ended: the calls were sequential.
	first := calls[0]
	if hex.EncodeToString(first.TraceId) != traceID || hex.EncodeToString(first.ParentSpanId) != parentID {
		t.Errorf("first span: trace %x parent %x, want the traceparent's %s %s", first.TraceId, first.ParentSpanId, traceID, parentID)
	}
	if first.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("call span kind %v, want server", first.Kind)
	}
	if len(calls[1].ParentSpanId) != 0 || bytes.Equal(calls[1].TraceId, first.TraceId) {
		t.Errorf("second span (no traceparent): trace %x parent %x, want a new root", calls[1].TraceId, calls[1].ParentSpanId)
	}
	for i, c := range calls {
		if c.Resource["service.name"] != "rls" {
			t.Errorf("call %d: resource %v, want service.name rls", i, c.Resource)
		}
		wantAttrs(t, fmt.Sprint("call ", i), c, map[string]any{"rls.domain": "trace", "rls.descriptors": 1, "rls.store": "redis",
			"rls.overall_code": codes[i], "rls.descriptor.rules": []any{"per-key"}, "rpc.grpc.status_code": 0, "rls.fallback": false})
	}
	wantAttrs(t, "call 1", calls[1], map[string]any{"rls.descriptor.outcomes": []any{"near_limit"}, "rls.descriptor.sources": []any{"store"}})
	wantAttrs(t, "call 2", calls[2], map[string]any{"rls.descriptor.outcomes": []any{"over_limit"}, "rls.descriptor.sources": []any{"store"}})
	wantAttrs(t, "call 3", calls[3], map[string]any{"rls.descriptor.outcomes": []any{"over_limit"}, "rls.descriptor.sources": []any{"local_cache"}})
	for i, s := range stores {
		c := calls[i] // calls 0-2 went to Redis, call 3 did not
		if !bytes.Equal(s.ParentSpanId, c.SpanId) || !bytes.Equal(s.TraceId, c.TraceId) || s.Kind != tracepb.Span_SPAN_KIND_CLIENT {
			t.Errorf("store span %d: trace %x parent %x kind %v, want a client child of call %d (%x %x)", i, s.TraceId, s.ParentSpanId, s.Kind, i, c.TraceId, c.SpanId)
		}
		wantAttrs(t, fmt.Sprint("store span ", i), s, map[string]any{"rls.store": "redis", "db.system.name": "redis", "rls.redis.mode": "single", "rls.store.checks": 1})
	}
	if _, ok := attrMap(first.Attributes)["rls.descriptor.entries"]; ok {
		t.Error("rls.descriptor.entries without --trace-descriptor-values")
	}
	if rcv.holds(secret) {
		t.Errorf("the exported spans hold the descriptor value %q", secret)
	}
	if rcv.holds(srv.Addr) {
		t.Errorf("the exported spans hold the Redis address %q", srv.Addr)
	}
}

// TestTracingOTLPHTTPValues: OTLP/HTTP to a base URL posts to /v1/traces;
// --trace-descriptor-values records the entries; OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES win over rls's own; spans still queued at
// SIGTERM are exported before rls exits.
func TestTracingOTLPHTTPValues(t *testing.T) {
	light(t)
	rcv := startHTTPReceiver(t)
	dir := writeConfig(t, map[string]string{"trace.yaml": traceConfig})
	p := startTraced(t, []string{"OTEL_BSP_SCHEDULE_DELAY=600000", // no export before shutdown
		"OTEL_SERVICE_NAME=rls-trace-test", "OTEL_RESOURCE_ATTRIBUTES=deployment.environment.name=test,service.namespace=edge",
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://" + rcv.Addr}, dir, "--trace-descriptor-values")
	traced(t, p, "", "secret-42")
	time.Sleep(200 * time.Millisecond) // no span may come: real time on purpose
	if n := len(rcv.named("rls.ShouldRateLimit")); n != 0 {
		t.Fatalf("%d spans exported before shutdown with OTEL_BSP_SCHEDULE_DELAY=600000", n)
	}
	p.stop(t)
	if err := p.exitErr; err != nil {
		t.Fatalf("rls exit: %v", err)
	}
	calls := rcv.named("rls.ShouldRateLimit")
	if len(calls) != 1 {
		t.Fatalf("%d spans exported at shutdown, want 1", len(calls))
	}
	wantAttrs(t, "call", calls[0], map[string]any{"rls.descriptor.entries": []any{"api_key=secret-42"}, "rls.store": "memory",
		"rls.descriptor.sources": []any{"store"}})
	if r := calls[0].Resource; r["service.name"] != "rls-trace-test" || r["deployment.environment.name"] != "test" || r["service.namespace"] != "edge" {
		t.Errorf("resource %v: want OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES's", r)
	}
	rcv.mu.Lock()
	paths := fmt.Sprint(rcv.paths)
	rcv.mu.Unlock()
	if paths != "[POST /v1/traces application/x-protobuf]" {
		t.Errorf("OTLP/HTTP requests %s, want one POST /v1/traces", paths)
	}
}

// TestTracingEnvEndpoint: OpenTelemetry's OTEL_EXPORTER_OTLP_ENDPOINT (a
// base URL) turns tracing on.
func TestTracingEnvEndpoint(t *testing.T) {
	light(t)
	rcv := startGRPCReceiver(t, nil)
	dir := writeConfig(t, map[string]string{"trace.yaml": traceConfig})
	p := startTraced(t, []string{"OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_EXPORTER_OTLP_ENDPOINT=http://" + rcv.Addr}, dir)
	traced(t, p, "", "a")
	testkit.WaitForEvery(t, "a span", 10*time.Second, pollEvery, func() bool { return len(rcv.named("rls.ShouldRateLimit")) == 1 })
}

// TestTracingStuckCollector: a collector that takes nothing never holds a
// decision; the spans beyond the queue are dropped and counted.
func TestTracingStuckCollector(t *testing.T) {
	light(t)
	hold := make(chan struct{})
	rcv := startGRPCReceiver(t, hold)
	t.Cleanup(func() { close(hold) }) // runs before the receiver stops
	dir := writeConfig(t, map[string]string{"trace.yaml": traceConfig})
	p := startTraced(t, []string{"OTEL_BSP_SCHEDULE_DELAY=10", "OTEL_BSP_MAX_QUEUE_SIZE=4", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=2",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://" + rcv.Addr}, dir)
	for i := range 40 {
		start := time.Now()
		traced(t, p, "", strconv.Itoa(i))
		if d := time.Since(start); d > time.Second {
			t.Errorf("call %d took %v with the collector stuck", i, d)
		}
	}
	re := regexp.MustCompile(`(?m)^rls_trace_spans_dropped_total\{reason="queue_full"\} (\d+)$`)
	var dropped int
	testkit.WaitForEvery(t, "spans dropped", 5*time.Second, pollEvery, func() bool {
		if m := re.FindStringSubmatch(scrapeAddr(t, p.HTTPAddr)); m != nil {
			dropped, _ = strconv.Atoi(m[1])
		}
		return dropped >= 40-4
	})
	if dropped > 40 { // one span a call: the memory store has no store span
		t.Errorf("%d spans dropped of 40", dropped)
	}
	// Shutdown gives up on the stuck export after its fixed 5 s.
	start := time.Now()
	p.stop(t)
	if d := time.Since(start); d > 11*time.Second { // 5 s for the spans, 6 s of slack
		t.Errorf("shutdown took %v with the collector stuck and 5 s for the spans queued", d)
	}
	if !strings.Contains(p.Log.String(), "trace spans not all exported at shutdown") {
		t.Error("no log line for the spans not exported at shutdown")
	}
}

const (
	bigTraceCalls    = 2500
	bigTraceRSSLimit = 200 << 20 // VmHWM after bigTraceCalls requests of 1 MiB, traced, collector unreachable
)

// TestTracingBigRequestsUnreachableCollector: with tracing on (descriptor
// values included), every call sampled by the client's traceparent even at
// sampler ratio 0, and a collector nobody listens on, 2,500 requests of
// 1 MiB each (64 descriptors of 4 entries of 4 KB values, within the
// request bounds and gRPC's message cap) keep rls's peak RSS under 200 MB: a queued span holds
// copies of a few hundred bytes, not its request, and the queue is bounded
// in bytes.
func TestTracingBigRequestsUnreachableCollector(t *testing.T) {
	light(t) // processes of its own; asserts counts and memory, not time
	dir := writeConfig(t, map[string]string{"trace.yaml": traceConfig})
	p := startRLSBinEnv(t, rlsFastBin, []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://" + freeAddr(t),
		"OTEL_TRACES_SAMPLER=parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG=0"}, dir, "--trace-descriptor-values")
	p.waitServing(t, 20*time.Second)
	value := strings.Repeat("v", 4060) // the request just under gRPC's 1 MiB message cap
	req := &rlsv3.RateLimitRequest{Domain: "trace"}
	for i := range 64 {
		req.Descriptors = append(req.Descriptors, desc("a", value, "b", value, "c", value, "d"+strconv.Itoa(i), value))
	}
	if n := proto.Size(req); n < 1<<20-8<<10 || n > 1<<20 {
		t.Fatalf("request of %d bytes, want just under 1 MiB", n)
	}
	before := vmHWM(t, p.cmd.Process.Pid)
	const workers = 4
	var wg sync.WaitGroup
	var failed, calls atomic.Int64
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for i := w; i < bigTraceCalls; i += workers {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", fmt.Sprintf("00-%032x-00f067aa0ba902b7-01", i+1))
				resp, err := p.client().ShouldRateLimit(ctx, req)
				cancel()
				calls.Add(1)
				if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
					if failed.Add(1) == 1 {
						t.Errorf("call %d: %v %v", i, resp.GetOverallCode(), err)
					}
				}
			}
		})
	}
	wg.Wait()
	peak := vmHWM(t, p.cmd.Process.Pid)
	var dropped float64
	if m := regexp.MustCompile(`(?m)^rls_trace_spans_dropped_total\{reason="queue_full"\} (\S+)$`).FindStringSubmatch(scrapeAddr(t, p.HTTPAddr)); m != nil {
		dropped, _ = strconv.ParseFloat(m[1], 64)
	}
	t.Logf("%d traced calls of %d bytes in %v, collector unreachable: VmHWM %s before, %s after; %d failed; %.0f spans dropped (queue full)",
		calls.Load(), proto.Size(req), time.Since(start).Round(time.Millisecond), mib(before), mib(peak), failed.Load(), dropped)
	if calls.Load() != bigTraceCalls || failed.Load() != 0 {
		t.Errorf("%d calls, %d failed; want %d, none failed", calls.Load(), failed.Load(), bigTraceCalls)
	}
	if peak > bigTraceRSSLimit {
		t.Errorf("peak RSS %s, over %s", mib(peak), mib(bigTraceRSSLimit))
	}
}
