package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

const testConfig = `
domain: test
descriptors:
  - key: api_key
    rate_limit: {name: per-key, unit: minute, requests_per_unit: 5}
    descriptors:
      - key: route
        rate_limit: {name: per-route, unit: second, requests_per_unit: 2}
  - key: small
    rate_limit: {name: small, unit: hour, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {name: shadow, unit: hour, requests_per_unit: 1}
  - key: ip
    rate_limit: {name: per-ip, unit: second, requests_per_unit: 100}
  - key: ip_strict
    rate_limit:
      name: strict
      unit: second
      requests_per_unit: 1
      replaces: [{name: per-ip}]
  - key: weekly
    rate_limit: {name: weekly, unit: week, requests_per_unit: 1}
`

func newTestService(t *testing.T) (*Service, *testkit.Clock) {
	t.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"test.yaml": []byte(testConfig)})
	if err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0)) // on a window boundary of every unit up to a day
	st := memory.New(memory.Options{Now: clk.Now})
	return New(cfg, limiter.New(st, limiter.Options{Now: clk.Now}), Options{}), clk
}

func d(kv ...string) *rlcommon.RateLimitDescriptor {
	out := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func call(t *testing.T, s *Service, hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	r, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test", Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatal(err)
	}
	if r.OverallCode == rlsv3.RateLimitResponse_UNKNOWN {
		t.Fatal("overall_code UNKNOWN")
	}
	if len(r.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(r.Statuses), len(ds))
	}
	for i, st := range r.Statuses {
		if st.Code == rlsv3.RateLimitResponse_UNKNOWN {
			t.Fatalf("status %d UNKNOWN", i)
		}
	}
	return r
}

// brief renders statuses compactly: code/remaining/limit-name per status.
func brief(r *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.OverallCode.String())
	for _, st := range r.Statuses {
		fmt.Fprintf(&b, " %s/%d/%s", st.Code, st.LimitRemaining, st.CurrentLimit.GetName())
	}
	return b.String()
}

func TestStatusesInOrderWithFullLimit(t *testing.T) {
	s, _ := newTestService(t)
	r := call(t, s, 0, d("api_key", "a"), d("unknown", "x"), d("api_key", "a", "route", "/r"), d("free", "x"))
	if got, want := brief(r), "OK OK/4/per-key OK/0/ OK/1/per-route OK/4294967295/"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	st := r.Statuses[0]
	if st.CurrentLimit.RequestsPerUnit != 5 || st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("current_limit %v", st.CurrentLimit)
	}
	if got := st.DurationUntilReset.AsDuration(); got != time.Minute {
		t.Errorf("duration_until_reset %v at a window start, want 1m", got)
	}
	if r.Statuses[1].CurrentLimit != nil || r.Statuses[3].CurrentLimit != nil {
		t.Error("unmatched or unlimited descriptor carries current_limit")
	}
}

func TestOverLimitAndRetry(t *testing.T) {
	s, clk := newTestService(t)
	if got := brief(call(t, s, 0, d("small", "x"))); got != "OK OK/0/small" {
		t.Fatal(got)
	}
	clk.Advance(10 * time.Minute)
	r := call(t, s, 0, d("small", "x"))
	if got := brief(r); got != "OVER_LIMIT OVER_LIMIT/0/small" {
		t.Fatal(got)
	}
	// Sliding window: one hit in a 1/hour window passes once the previous
	// window's weight decays below the limit, i.e. just after the next window
	// starts (the rate there is exactly the limit).
	if got := r.Statuses[0].DurationUntilReset.AsDuration(); got != 50*time.Minute+time.Microsecond {
		t.Errorf("retry after %v, want 50m0.000001s", got)
	}
}

func TestWeekUnit(t *testing.T) {
	s, _ := newTestService(t)
	r := call(t, s, 0, d("weekly", "x"))
	if r.Statuses[0].CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_WEEK {
		t.Fatalf("unit %v, want WEEK", r.Statuses[0].CurrentLimit.Unit)
	}
}

func TestHitsAddend(t *testing.T) {
	s, _ := newTestService(t)
	// Request hits_addend 0 means 1; 3 consumes 3.
	if got := brief(call(t, s, 0, d("api_key", "h"))); got != "OK OK/4/per-key" {
		t.Fatal(got)
	}
	if got := brief(call(t, s, 3, d("api_key", "h"))); got != "OK OK/1/per-key" {
		t.Fatal(got)
	}
	// A descriptor's hits_addend wins over the request's.
	withHits := func(n uint64, ds *rlcommon.RateLimitDescriptor) *rlcommon.RateLimitDescriptor {
		ds.HitsAddend = wrapperspb.UInt64(n)
		return ds
	}
	if got := brief(call(t, s, 3, withHits(1, d("api_key", "h")))); got != "OK OK/0/per-key" {
		t.Fatal(got)
	}
	// Explicit 0 checks without consuming: OVER_LIMIT once the budget is spent.
	if got := brief(call(t, s, 0, withHits(0, d("api_key", "h")))); got != "OVER_LIMIT OVER_LIMIT/0/per-key" {
		t.Fatal(got)
	}
	if got := brief(call(t, s, 0, withHits(0, d("api_key", "fresh")))); got != "OK OK/5/per-key" {
		t.Fatal(got)
	}
	if got := brief(call(t, s, 0, withHits(0, d("api_key", "fresh")))); got != "OK OK/5/per-key" {
		t.Fatalf("check-only consumed: %s", got)
	}
	// is_negative_hits refunds and is never OVER_LIMIT.
	ref := withHits(2, d("api_key", "h"))
	ref.IsNegativeHits = true
	if got := brief(call(t, s, 0, ref)); got != "OK OK/2/per-key" {
		t.Fatal(got)
	}
	if got := brief(call(t, s, 2, d("api_key", "h"))); got != "OK OK/0/per-key" {
		t.Fatal(got)
	}
}

func TestShadowModeCountsButNeverDenies(t *testing.T) {
	s, _ := newTestService(t)
	call(t, s, 0, d("shadow", "x"))
	r := call(t, s, 0, d("shadow", "x"), d("api_key", "shadowed"))
	if got := brief(r); got != "OK OK/0/shadow OK/4/per-key" {
		t.Fatal(got)
	}
	// The shadow rule's denial did not veto the other descriptor.
	if got := brief(call(t, s, 0, d("api_key", "shadowed"))); got != "OK OK/3/per-key" {
		t.Fatal(got)
	}
}

func TestAllOrNothing(t *testing.T) {
	s, _ := newTestService(t)
	call(t, s, 0, d("small", "y"))
	r := call(t, s, 0, d("api_key", "aon"), d("small", "y"))
	// The passing descriptor reports what it found: nothing was consumed.
	if got := brief(r); got != "OVER_LIMIT OK/5/per-key OVER_LIMIT/0/small" {
		t.Fatal(got)
	}
	if got := brief(call(t, s, 0, d("api_key", "aon"))); got != "OK OK/4/per-key" {
		t.Fatalf("denied request consumed quota: %s", got)
	}
}

func TestReplaces(t *testing.T) {
	s, _ := newTestService(t)
	r := call(t, s, 0, d("ip", "1.2.3.4"), d("ip_strict", "1.2.3.4"))
	if got := brief(r); got != "OK OK/0/ OK/0/strict" {
		t.Fatal(got)
	}
	if r.Statuses[0].CurrentLimit != nil {
		t.Error("replaced limit still reported")
	}
}

func TestUnknownDomain(t *testing.T) {
	s, _ := newTestService(t)
	r, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*rlcommon.RateLimitDescriptor{d("api_key", "a")}})
	if err != nil || brief(r) != "OK OK/0/" {
		t.Fatalf("%v %v", r, err)
	}
}

func TestOverride(t *testing.T) {
	s, _ := newTestService(t)
	over := func(ds *rlcommon.RateLimitDescriptor, rpu uint32, u typev3.RateLimitUnit) *rlcommon.RateLimitDescriptor {
		ds.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: u}
		return ds
	}
	// An override applies to a key the config does not know.
	r := call(t, s, 0, over(d("tenant", "t1"), 2, typev3.RateLimitUnit_HOUR))
	if got := brief(r); got != "OK OK/1/" || r.Statuses[0].CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_HOUR {
		t.Fatalf("%s %v", got, r.Statuses[0].CurrentLimit)
	}
	// It replaces a configured limit, keeps its name, and counts separately.
	if got := brief(call(t, s, 0, over(d("api_key", "o"), 10, typev3.RateLimitUnit_MINUTE))); got != "OK OK/9/per-key" {
		t.Fatal(got)
	}
	if got := brief(call(t, s, 0, d("api_key", "o"))); got != "OK OK/4/per-key" {
		t.Fatalf("override shared the configured counter: %s", got)
	}
	if got := brief(call(t, s, 0, over(d("api_key", "o"), 20, typev3.RateLimitUnit_MINUTE))); got != "OK OK/19/per-key" {
		t.Fatalf("two overrides shared a counter: %s", got)
	}
}

func TestInvalidArgument(t *testing.T) {
	s, _ := newTestService(t)
	cases := map[string]*rlsv3.RateLimitRequest{
		"domain is empty":                    {Descriptors: []*rlcommon.RateLimitDescriptor{d("a", "b")}},
		"descriptors is empty":               {Domain: "test"},
		"descriptors[0] has no entries":      {Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{{}}},
		"descriptors[0].entries[1].key":      {Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{d("a", "b", "", "c")}},
		"descriptors[0].limit: unit UNKNOWN": {Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: d("a", "b").Entries, Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}}},
		"descriptors[0].limit: unit 7":       {Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: d("a", "b").Entries, Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 7}}}},
	}
	for want, req := range cases {
		t.Run(want, func(t *testing.T) {
			_, err := s.ShouldRateLimit(context.Background(), req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), want) {
				t.Fatalf("got %v, want InvalidArgument with %q", err, want)
			}
		})
	}
}

// failingStore is a hand-written fake for the error mapping only.
type failingStore struct{ err error }

func (f failingStore) Decide(context.Context, []store.Check, []store.Result) error { return f.err }
func (f failingStore) Peek(context.Context, []store.Check, []store.Result) error   { return f.err }
func (f failingStore) Delete(context.Context, ...store.Check) error                { return f.err }
func (f failingStore) Close() error                                                { return nil }

func TestStoreErrorsBecomeGRPCCodes(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"test.yaml": []byte(testConfig)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{errors.New("bad reply"), codes.Internal},
		// A script error is a bug, not an outage: no fallback, Internal.
		{fmt.Errorf("redis decide: %w: ERR user_script:1: oops", store.ErrProtocol), codes.Internal},
	} {
		s := New(cfg, limiter.New(failingStore{tc.err}, limiter.Options{}), Options{})
		_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{d("api_key", "a")}})
		if status.Code(err) != tc.want {
			t.Errorf("%v: got %v, want %v", tc.err, err, tc.want)
		}
	}
	// No store call at all when nothing matches.
	s := New(cfg, limiter.New(failingStore{errors.New("must not be called")}, limiter.Options{}), Options{})
	if _, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{d("nothing", "a")}}); err != nil {
		t.Fatal(err)
	}
}

// TestStoreOutageFallsBackPerRule: with the store down, a fail_closed rule
// is OVER_LIMIT, a fail_open rule is decided on the local share, and a rule
// that says nothing follows Options.FailClosed.
func TestStoreOutageFallsBackPerRule(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"t.yaml": []byte(`
domain: test
descriptors:
  - key: open
    rate_limit: {unit: second, requests_per_unit: 2, on_error: fail_open}
  - key: closed
    rate_limit: {unit: second, requests_per_unit: 2, on_error: fail_closed}
  - key: silent
    rate_limit: {unit: second, requests_per_unit: 2}
`)})
	if err != nil {
		t.Fatal(err)
	}
	down := failingStore{fmt.Errorf("connection refused: %w", store.ErrUnavailable)}
	for _, tc := range []struct {
		failClosed bool
		want       string
	}{
		{false, "OVER_LIMIT OK/1/ OVER_LIMIT/0/ OK/1/"},
		{true, "OVER_LIMIT OK/1/ OVER_LIMIT/0/ OVER_LIMIT/0/"},
	} {
		s := New(cfg, limiter.New(down, limiter.Options{}), Options{FailClosed: tc.failClosed})
		r, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test",
			Descriptors: []*rlcommon.RateLimitDescriptor{d("open", "a"), d("closed", "a"), d("silent", "a")}})
		if err != nil {
			t.Fatal(err)
		}
		if got := brief(r); got != tc.want {
			t.Errorf("FailClosed %v: got %q, want %q", tc.failClosed, got, tc.want)
		}
		// Each alone: the fail_open rule allows its local share.
		r, _ = s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test",
			Descriptors: []*rlcommon.RateLimitDescriptor{d("open", "a")}})
		if got := brief(r); got != "OK OK/1/" {
			t.Errorf("FailClosed %v: fail_open alone: %q", tc.failClosed, got)
		}
	}
}

func headersOf(r *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		m[h.Key] = h.Value
	}
	return m
}

func TestResponseHeaders(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"test.yaml": []byte(testConfig)})
	if err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0).Add(15 * time.Second))
	s := New(cfg, limiter.New(memory.New(memory.Options{Now: clk.Now}), limiter.Options{Now: clk.Now}),
		Options{ResponseHeaders: true})
	r := call(t, s, 0, d("api_key", "h"), d("small", "h"))
	h := headersOf(r)
	// small (1/hour) has the least remaining (0): it is the one reported.
	want := map[string]string{
		"RateLimit-Limit":     `1, 5;w=60;name="per-key", 1;w=3600;name="small"`,
		"RateLimit-Remaining": "0",
		"RateLimit-Reset":     "3585", // 59m45s to the end of the hour window
	}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("%s = %q, want %q (all: %v)", k, h[k], v, h)
		}
	}
	if _, ok := h["Retry-After"]; ok {
		t.Error("Retry-After on an OK response")
	}
	clk.Advance(500 * time.Millisecond)
	r = call(t, s, 0, d("api_key", "h"), d("small", "h"))
	h = headersOf(r)
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatal(brief(r))
	}
	// Retry-After: the over-limit status's duration (just past the next
	// window start, 59m44.5s away) rounded up to whole seconds.
	retry := r.Statuses[1].DurationUntilReset.AsDuration()
	if got, want := h["Retry-After"], fmt.Sprint(int64((retry+time.Second-1)/time.Second)); got != want || want != "3585" {
		t.Errorf("Retry-After %q, want %q (3585) from %v", got, want, retry)
	}
	if h["RateLimit-Remaining"] != "0" || h["RateLimit-Reset"] != "3585" {
		t.Errorf("headers %v", h)
	}
}

func TestResponseBodyOnDenial(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"t.yaml": []byte(`
domain: test
descriptors:
  - key: k
    rate_limit:
      unit: hour
      requests_per_unit: 1
      response_body: '{"error":"slow down"}'
      content_type: application/json
`)})
	if err != nil {
		t.Fatal(err)
	}
	s := New(cfg, limiter.New(memory.New(memory.Options{}), limiter.Options{}), Options{})
	if r := call(t, s, 0, d("k", "v")); r.RawBody != nil || len(r.ResponseHeadersToAdd) != 0 {
		t.Fatalf("body or headers on an OK response: %v", r)
	}
	r := call(t, s, 0, d("k", "v"))
	if string(r.RawBody) != `{"error":"slow down"}` || headersOf(r)["content-type"] != "application/json" {
		t.Fatalf("raw_body %q, headers %v", r.RawBody, r.ResponseHeadersToAdd)
	}
}

func TestRequestBounds(t *testing.T) {
	s, _ := newTestService(t)
	long := strings.Repeat("x", 5000)
	many := func(n int) []*rlcommon.RateLimitDescriptor {
		out := make([]*rlcommon.RateLimitDescriptor, n)
		for i := range out {
			out[i] = d("api_key", "a")
		}
		return out
	}
	wide := &rlcommon.RateLimitDescriptor{}
	for range 33 {
		wide.Entries = append(wide.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	huge := d("api_key", "a")
	huge.HitsAddend = wrapperspb.UInt64(math.MaxUint64)
	cases := map[string]*rlsv3.RateLimitRequest{
		"65 descriptors, over the limit of 64 per request":                   {Domain: "test", Descriptors: many(65)},
		"descriptors[0] has 33 entries, over the limit of 32":                {Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{wide}},
		"descriptors[0].entries[0].key is 5000 bytes, over the limit of 256": {Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{d(long, "v")}},
		"descriptors[0].entries[1].value is 5000 bytes, over the limit of 4096": {Domain: "test",
			Descriptors: []*rlcommon.RateLimitDescriptor{d("api_key", "a", "route", long)}},
		"hits_addend 4294967295 is over the limit of 1000000000": {Domain: "test", HitsAddend: math.MaxUint32,
			Descriptors: []*rlcommon.RateLimitDescriptor{d("api_key", "a")}},
		"descriptors[0].hits_addend 18446744073709551615 is over the limit of 1000000000": {Domain: "test",
			Descriptors: []*rlcommon.RateLimitDescriptor{huge}},
		"domain is 5000 bytes": {Domain: long, Descriptors: []*rlcommon.RateLimitDescriptor{d("a", "b")}},
	}
	for want, req := range cases {
		t.Run(want, func(t *testing.T) {
			_, err := s.ShouldRateLimit(context.Background(), req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), want) {
				t.Fatalf("got %v, want InvalidArgument with %q", err, want)
			}
			var le *LimitError
			if err := validateRequest(req, &DefaultLimits); !errors.As(err, &le) || le.Got <= le.Max {
				t.Errorf("validateRequest: %v, want a *LimitError over its bound", err)
			}
		})
	}
}

// TestHugeHitsNeverOverflow: with Limits.Hits raised to its bound, hit counts
// near 2^32 and 2^53 decide exactly, and refunds never push a count below
// zero or a bucket above its capacity.
func TestHugeHitsNeverOverflow(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"t.yaml": []byte(`
domain: test
descriptors:
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 4294967295}
  - key: tb
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window}
`)})
	if err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	s := New(cfg, limiter.New(memory.New(memory.Options{Now: clk.Now}), limiter.Options{Now: clk.Now}),
		Options{Limits: Limits{Hits: math.MaxUint64}}) // clamped to MaxHitsBound
	if got := brief(call(t, s, math.MaxUint32, d("big", "x"))); got != "OK OK/0/" {
		t.Fatalf("2^32-1 hits on a 2^32-1 limit: %s", got)
	}
	if got := brief(call(t, s, 1, d("big", "x"))); got != "OVER_LIMIT OVER_LIMIT/0/" {
		t.Fatalf("one more: %s", got)
	}
	refund := func(key string, n uint64) *rlcommon.RateLimitDescriptor {
		x := d(key, "x")
		x.HitsAddend = wrapperspb.UInt64(n)
		x.IsNegativeHits = true
		return x
	}
	over := func(key string, n uint64) *rlcommon.RateLimitDescriptor {
		x := d(key, "x")
		x.HitsAddend = wrapperspb.UInt64(n)
		return x
	}
	for _, key := range []string{"big", "tb", "fw"} {
		call(t, s, 0, refund(key, MaxHitsBound))
		r := call(t, s, 0, over(key, 0))
		if r.Statuses[0].LimitRemaining != r.Statuses[0].CurrentLimit.RequestsPerUnit {
			t.Errorf("%s: after refunding 2^53 the budget is %d, want the limit %d (never above)", key,
				r.Statuses[0].LimitRemaining, r.Statuses[0].CurrentLimit.RequestsPerUnit)
		}
		if r := call(t, s, 0, over(key, MaxHitsBound)); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("%s: 2^53 hits allowed: %s", key, brief(r))
		}
	}
	if _, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test",
		Descriptors: []*rlcommon.RateLimitDescriptor{over("big", MaxHitsBound+1)}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("2^53+1 hits: %v, want InvalidArgument", err)
	}
}

func TestRecoverUnary(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, 1)
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	icpt := RecoverUnary(m, log)
	_, err := icpt(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x/Y"}, func(context.Context, any) (any, error) {
		var r *descriptors.Rule
		return r.Name, nil // nil dereference
	})
	if status.Code(err) != codes.Internal {
		t.Fatalf("got %v, want Internal", err)
	}
	if testutil.ToFloat64(m.panics) != 1 || strings.Count(logs.String(), "panic in gRPC handler") != 1 || !strings.Contains(logs.String(), "goroutine") {
		t.Fatalf("panic not counted or logged once with its stack:\n%s", logs.String())
	}
}
