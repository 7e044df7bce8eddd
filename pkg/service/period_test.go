package service

import (
	"context"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// periodConfig has a two-minute rule of each algorithm.
const periodConfig = `
domain: test
descriptors:
  - key: fixed
    rate_limit: {name: fixed, unit: minute, unit_multiplier: 2, requests_per_unit: 3, algorithm: fixed_window}
  - key: sliding
    rate_limit: {name: sliding, unit: minute, unit_multiplier: 2, requests_per_unit: 3}
  - key: precise
    rate_limit: {name: precise, unit: minute, unit_multiplier: 2, requests_per_unit: 4, precision: 4}
  - key: bucket
    rate_limit: {name: bucket, unit: minute, unit_multiplier: 2, requests_per_unit: 2, algorithm: token_bucket}
  - key: route
    rate_limit: {name: route, unit: minute, requests_per_unit: 100}
`

// newPeriodService returns a service of periodConfig on the memory store,
// its clock on a two-minute (and thirty-minute) boundary.
func newPeriodService(t *testing.T, opts Options) (*Service, *testkit.Clock) {
	t.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"p.yaml": []byte(periodConfig)})
	if err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0)) // a multiple of 1800 s
	st := memory.New(memory.Options{Now: clk.Now})
	return New(cfg, limiter.New(st, limiter.Options{Now: clk.Now}), opts), clk
}

// step is one request of a period test: after advancing the clock by
// after, the request gets code, with a duration_until_reset in
// [resetMin, resetMax].
type step struct {
	after              time.Duration
	code               rlsv3.RateLimitResponse_Code
	resetMin, resetMax time.Duration
}

const (
	codeOK   = rlsv3.RateLimitResponse_OK
	codeOver = rlsv3.RateLimitResponse_OVER_LIMIT
)

// TestTwoMinuteRule: a rule of unit minute and unit_multiplier 2 limits
// over two minutes with each algorithm, where a one-minute rule would
// already pass again; its current_limit says so.
func TestTwoMinuteRule(t *testing.T) {
	const us = time.Microsecond
	for _, tt := range []struct {
		key   string
		steps []step
	}{
		{"fixed", []step{
			{0, codeOK, 2 * time.Minute, 2 * time.Minute}, {0, codeOK, 0, time.Hour}, {0, codeOK, 0, time.Hour},
			{0, codeOver, 2 * time.Minute, 2 * time.Minute},
			{61 * time.Second, codeOver, 59 * time.Second, 59 * time.Second}, // a 1-minute window would have ended
			{58 * time.Second, codeOver, time.Second, time.Second},
			{time.Second, codeOK, 2 * time.Minute, 2 * time.Minute}, // the epoch-aligned window ends at 120 s
		}},
		{"sliding", []step{
			{0, codeOK, 2 * time.Minute, 2 * time.Minute}, {0, codeOK, 0, time.Hour}, {0, codeOK, 0, time.Hour},
			{0, codeOver, 0, 2*time.Minute + us},
			{61 * time.Second, codeOver, 0, 59*time.Second + us}, // a 1-minute window: 3*(59/60) < 3 passes
			{58 * time.Second, codeOver, 0, 2*time.Minute + us},
			{time.Second, codeOver, 0, 2*time.Minute + us},       // the previous window still weighs 3
			{60 * time.Second, codeOK, time.Minute, time.Minute}, // weighs 1.5 at half way
		}},
		{"precise", []step{ // four 30-second sub-windows
			{0, codeOK, 0, time.Hour}, {0, codeOK, 0, time.Hour}, {0, codeOK, 0, time.Hour}, {0, codeOK, 0, time.Hour},
			{0, codeOver, 0, 2*time.Minute + us},
			{61 * time.Second, codeOver, 0, 59*time.Second + us},
			{58 * time.Second, codeOver, 0, 2*time.Minute + us},
			{31 * time.Second, codeOK, 0, 2 * time.Minute}, // at 150 s sub-window 0 has left
		}},
		{"bucket", []step{ // 2 per 2 minutes: one token a minute
			{0, codeOK, 0, time.Hour}, {0, codeOK, 0, time.Hour},
			{0, codeOver, time.Minute, time.Minute + us}, // a 1-minute bucket refills in 30 s
			{30 * time.Second, codeOver, 30 * time.Second, 30*time.Second + us},
			{31 * time.Second, codeOK, 0, time.Hour},
		}},
	} {
		t.Run(tt.key, func(t *testing.T) {
			s, clk := newPeriodService(t, Options{})
			for i, st := range tt.steps {
				clk.Advance(st.after)
				r := call(t, s, 0, d(tt.key, "u"))
				got := r.Statuses[0]
				reset := got.DurationUntilReset.AsDuration()
				if got.Code != st.code || reset < st.resetMin || reset > st.resetMax {
					t.Fatalf("step %d (+%v): %s reset %v, want %s reset in [%v, %v]", i, st.after, got.Code, reset, st.code, st.resetMin, st.resetMax)
				}
				l := got.CurrentLimit
				if l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || l.GetUnitMultiplier().GetValue() != 2 || l.GetUnitMultiplier() == nil {
					t.Fatalf("step %d: current_limit %v, want unit MINUTE, unit_multiplier 2", i, l)
				}
			}
		})
	}
}

// override asks for rpu per mult units of unit; mult 0 leaves it unset.
func override(desc *rlcommon.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit, mult *wrapperspb.UInt32Value) *rlcommon.RateLimitDescriptor {
	desc.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit, UnitMultiplier: mult}
	return desc
}

// TestOverrideThirtyMinutes: an override of 7 per 30 minutes is enforced
// over 30 minutes (on a fixed-window rule: epoch-aligned), and returned
// with unit_multiplier 30 and the headers of a 1800-second window.
func TestOverrideThirtyMinutes(t *testing.T) {
	s, clk := newPeriodService(t, Options{ResponseHeaders: true})
	req := func() *rlsv3.RateLimitResponse {
		return call(t, s, 0, override(d("fixed", "o"), 7, typev3.RateLimitUnit_MINUTE, wrapperspb.UInt32(30)))
	}
	for i := range 7 {
		if r := req(); r.OverallCode != codeOK {
			t.Fatalf("request %d: %s, want OK", i+1, brief(r))
		}
	}
	r := req()
	st := r.Statuses[0]
	if r.OverallCode != codeOver || st.DurationUntilReset.AsDuration() != 30*time.Minute {
		t.Fatalf("8th request: %s reset %v, want OVER_LIMIT reset 30m", brief(r), st.DurationUntilReset.AsDuration())
	}
	if l := st.CurrentLimit; l.RequestsPerUnit != 7 || l.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE || l.GetUnitMultiplier().GetValue() != 30 {
		t.Errorf("current_limit %v, want 7 per 30 MINUTE", l)
	}
	h := headersOf(r)
	if got := h["RateLimit-Limit"]; got != `7, 7;w=1800;name="fixed"` {
		t.Errorf("RateLimit-Limit %q, want a policy of w=1800", got)
	}
	if h["RateLimit-Reset"] != "1800" || h["Retry-After"] != "1800" {
		t.Errorf("RateLimit-Reset %q, Retry-After %q, want 1800", h["RateLimit-Reset"], h["Retry-After"])
	}
	clk.Advance(29*time.Minute + 59*time.Second) // a 1-minute override would pass 29 times over
	if r := req(); r.OverallCode != codeOver || r.Statuses[0].DurationUntilReset.AsDuration() != time.Second {
		t.Fatalf("at 29m59s: %s reset %v, want OVER_LIMIT reset 1s", brief(r), r.Statuses[0].DurationUntilReset.AsDuration())
	}
	clk.Advance(time.Second)
	if r := req(); r.OverallCode != codeOK || r.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("at 30m: %s, want OK with 6 left", brief(r))
	}

	// Without unit_multiplier the override is one minute, with its own
	// counter, and current_limit carries no multiplier.
	r = call(t, s, 0, override(d("fixed", "o"), 7, typev3.RateLimitUnit_MINUTE, nil))
	if st := r.Statuses[0]; st.CurrentLimit.UnitMultiplier != nil || st.LimitRemaining != 6 || st.DurationUntilReset.AsDuration() != time.Minute {
		t.Errorf("one-minute override: %s limit %v reset %v", brief(r), st.CurrentLimit, st.DurationUntilReset.AsDuration())
	}
	// A rule of one unit reports no multiplier either.
	if l := call(t, s, 0, d("route", "o")).Statuses[0].CurrentLimit; l.UnitMultiplier != nil {
		t.Errorf("route: current_limit %v has a multiplier", l)
	}
}

// TestOverrideBadPeriod: a multiplier of 0 or a window above a year is
// InvalidArgument naming the descriptor's limit and unit_multiplier; it is
// refused, not clamped, and counts nothing.
func TestOverrideBadPeriod(t *testing.T) {
	s, _ := newPeriodService(t, Options{})
	for _, tt := range []struct {
		unit typev3.RateLimitUnit
		mult uint32
		msg  string
	}{
		{typev3.RateLimitUnit_MINUTE, 0, "descriptors[1].limit: unit_multiplier must be at least 1"},
		{typev3.RateLimitUnit_DAY, 366, "descriptors[1].limit: unit_multiplier 366 with unit day is a window of 366 days, longer than one year"},
		{typev3.RateLimitUnit_YEAR, 2, "descriptors[1].limit: unit_multiplier 2 with unit year"},
		{typev3.RateLimitUnit_SECOND, 4294967295, "longer than one year"},
	} {
		_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{
			d("route", "b"), override(d("fixed", "b"), 7, tt.unit, wrapperspb.UInt32(tt.mult))}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s x %d: %v, want InvalidArgument %q", tt.unit, tt.mult, err, tt.msg)
		}
	}
	if r := call(t, s, 0, d("route", "b")); r.Statuses[0].LimitRemaining != 99 {
		t.Errorf("refused requests counted: %s", brief(r))
	}
	// A year exactly is the longest period.
	r := call(t, s, 0, override(d("fixed", "b"), 7, typev3.RateLimitUnit_DAY, wrapperspb.UInt32(365)))
	if l := r.Statuses[0].CurrentLimit; r.OverallCode != codeOK || l.GetUnitMultiplier().GetValue() != 365 {
		t.Errorf("365 days: %s %v", brief(r), l)
	}
}
