package service

import (
	"context"
	"strings"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
)

// SpanName is the name of the span of one ShouldRateLimit call.
const SpanName = "rls.ShouldRateLimit"

// Tracing makes a span of every ShouldRateLimit call (Options.Tracing; nil,
// the default, makes none and costs one nil check per call). The span's
// parent is the W3C trace context (traceparent, tracestate) of the call's
// gRPC metadata, as Envoy sends it when its tracer is on.
//
// Attributes: rls.domain, rls.descriptors, rls.hits_addend, rls.store,
// rls.overall_code, rpc.grpc.status_code (and rls.error, the code's name,
// when the call failed), rls.fallback, and per descriptor in request order
// the arrays rls.descriptor.outcomes (the outcome label of
// rls_decisions_total), rls.descriptor.rules (the rule label), and
// rls.descriptor.sources (store, local_cache, reserved, fail_open,
// fail_closed, or none for a descriptor not counted). No descriptor value is recorded
// unless DescriptorValues is set, which adds rls.descriptor.entries to the
// spans of valid requests (each descriptor as key=value pairs joined by
// '|', bytes that are not UTF-8 written \xNN). Error messages, which may
// name store keys, are never recorded: a failed call has its code only.
// The span's status is Error for the server's failures only.
type Tracing struct {
	// Tracer starts the spans.
	Tracer trace.Tracer
	// Store names the counter store (memory, redis), recorded as rls.store.
	Store string
	// DescriptorValues records the descriptors' entries, values included.
	DescriptorValues bool
}

// propagator reads the parent's trace context from gRPC metadata.
var propagator propagation.TraceContext

// start extracts the caller's trace context from ctx's gRPC metadata and
// starts the call's span under it.
func (t *Tracing) start(ctx context.Context) (context.Context, trace.Span) {
	ctx = propagator.Extract(ctx, mdCarrier{ctx})
	return t.Tracer.Start(ctx, SpanName, trace.WithSpanKind(trace.SpanKindServer))
}

// endSpan ends span (nil when tracing is off) with what the call did, and
// returns err. res is nil when the request was not resolved, resp when the
// call failed.
func (s *Service) endSpan(span trace.Span, req *rlsv3.RateLimitRequest, res *resolution, resp *rlsv3.RateLimitResponse, err error) error {
	if span != nil {
		s.opts.Tracing.end(span, req, res, resp, err)
	}
	return err
}

func (t *Tracing) end(span trace.Span, req *rlsv3.RateLimitRequest, res *resolution, resp *rlsv3.RateLimitResponse, err error) {
	if span.IsRecording() { // sampled
		code := status.Code(err)
		span.SetAttributes(t.attributes(req, res, resp, code)...)
		if serverError(code) {
			span.SetStatus(otelcodes.Error, code.String())
		}
	}
	span.End()
}

// attributes describe a call that ended with code.
func (t *Tracing) attributes(req *rlsv3.RateLimitRequest, res *resolution, resp *rlsv3.RateLimitResponse, code codes.Code) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 12)
	kv = append(kv,
		attribute.String("rls.domain", spanString(req.Domain)),
		attribute.Int("rls.descriptors", len(req.Descriptors)),
		attribute.Int64("rls.hits_addend", int64(req.HitsAddend)),
		attribute.String("rls.store", t.Store),
		attribute.Int("rpc.grpc.status_code", int(code)))
	if code != codes.OK {
		kv = append(kv, attribute.String("rls.error", code.String()))
	}
	if res == nil || len(res.rules) != len(req.Descriptors) { // not resolved: invalid
		return kv
	}
	n := len(req.Descriptors)
	if t.DescriptorValues {
		entries := make([]string, n)
		for i, d := range req.Descriptors {
			entries[i] = spanString(spanEntries(d))
		}
		kv = append(kv, attribute.StringSlice("rls.descriptor.entries", entries))
	}
	rules := make([]string, n)
	for i, r := range res.rules {
		rules[i] = traceRule(r)
	}
	kv = append(kv, attribute.StringSlice("rls.descriptor.rules", rules))
	if resp == nil {
		return kv
	}
	outcomes, sources := make([]string, n), make([]string, n)
	fallback := false
	for i := range n {
		it := res.item(i)
		outcomes[i] = res.outcomes[i].String()
		sources[i] = "none"
		if it != nil {
			sources[i] = it.Source.String()
			fallback = fallback || it.Source == limiter.FromFailOpen || it.Source == limiter.FromFailClosed
		}
	}
	return append(kv,
		attribute.String("rls.overall_code", resp.OverallCode.String()),
		attribute.StringSlice("rls.descriptor.outcomes", outcomes),
		attribute.StringSlice("rls.descriptor.sources", sources),
		attribute.Bool("rls.fallback", fallback))
}

// SpanStringBytes is the most bytes of one string a span records of a
// request (rls.domain, each of rls.descriptor.entries); longer ones are
// cut, at a UTF-8 boundary.
const SpanStringBytes = 256

// spanString is s as a span records it: printable, at most
// SpanStringBytes, and a copy. A request's strings share the memory of
// the whole request (DecodeRequest), up to megabytes, so a span that kept
// a substring of one would keep the request alive for as long as the span
// waits for export.
func spanString(s string) string {
	if len(s) > 4*SpanStringBytes { // printable writes a byte as at most 4
		s = s[:4*SpanStringBytes]
	}
	s = printable(s)
	if len(s) > SpanStringBytes {
		cut := SpanStringBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return strings.Clone(s)
}

// spanEntries renders d's entries as key=value pairs joined by '|', bytes
// that are not UTF-8 written \xNN, until the text is long enough for
// spanString to cut: a descriptor of megabytes costs no more than one of a
// few hundred bytes.
func spanEntries(d *rlcommon.RateLimitDescriptor) string {
	var b strings.Builder
	for i, e := range d.Entries {
		if b.Len() > SpanStringBytes {
			break
		}
		if i > 0 {
			b.WriteByte('|')
		}
		writePrintable(&b, cut(e.Key, SpanStringBytes+1))
		b.WriteByte('=')
		writePrintable(&b, cut(e.Value, SpanStringBytes+1))
	}
	return b.String()
}

// cut is s's first n bytes at most (a UTF-8 sequence may be split: the
// caller writes it printable).
func cut(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// traceRule names a rule in spans as in metrics (a request's limit
// override, whose path holds its values, is "_override"; no rule is "").
func traceRule(r *descriptors.Rule) string {
	switch {
	case r == nil:
		return ""
	case r.Override:
		return overrideRule
	}
	return ruleLabel(r)
}

// serverError reports whether a call that ended with code failed on the
// server's side (OpenTelemetry's gRPC conventions): the span's status is
// Error for these, unset for the caller's own errors (InvalidArgument,
// Canceled).
func serverError(code codes.Code) bool {
	switch code {
	case codes.Unknown, codes.DeadlineExceeded, codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss:
		return true
	}
	return false
}

// mdCarrier reads a trace context from a call's incoming gRPC metadata
// (whose keys are lower case, as the propagator asks for them).
type mdCarrier struct{ ctx context.Context }

func (c mdCarrier) Get(key string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (mdCarrier) Set(string, string) {}

func (c mdCarrier) Keys() []string {
	md, _ := metadata.FromIncomingContext(c.ctx)
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	return keys
}
