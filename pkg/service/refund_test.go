package service

import (
	"context"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store/memory"
)

// refund is a descriptor that gives hits back (is_negative_hits).
func refund(hits uint64, kv ...string) *rlcommon.RateLimitDescriptor {
	r := d(kv...)
	r.IsNegativeHits, r.HitsAddend = true, wrapperspb.UInt64(hits)
	return r
}

// TestRefundsCountedPerRule: by default a refund gives its hits back (the
// spent key admits again) and is counted in rls_refunded_hits_total on its
// rule's series, as rls_decisions_total names it.
func TestRefundsCountedPerRule(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := mustParse(t, testConfig)
	s := New(cfg, limiter.New(memory.New(memory.Options{}), limiter.Options{DisableOverLimitCache: true}), Options{Metrics: NewMetrics(reg, 10)})
	call(t, s, 1, d("small", "k"))
	if r := call(t, s, 1, d("small", "k")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("the second call of 1/hour: %v, want OVER_LIMIT", r.OverallCode)
	}
	call(t, s, 0, refund(1, "small", "k"), refund(3, "api_key", "a"), refund(2, "nothing", "x"))
	if r := call(t, s, 1, d("small", "k")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("after a refund of 1: %v, want OK", r.OverallCode)
	}
	want := `
# HELP rls_refunded_hits_total Hits given back by requests with is_negative_hits, by domain and rule (as rls_decisions_total).
# TYPE rls_refunded_hits_total counter
rls_refunded_hits_total{domain="test",rule="per-key"} 3
rls_refunded_hits_total{domain="test",rule="small"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "rls_refunded_hits_total"); err != nil {
		t.Error(err)
	}
}

// TestRefuseRefunds: with RefuseRefunds a request with a refund is
// InvalidArgument naming the descriptor by index and keys, and consumes
// nothing; requests without one are decided as before.
func TestRefuseRefunds(t *testing.T) {
	s := New(mustParse(t, testConfig), limiter.New(memory.New(memory.Options{}), limiter.Options{}), Options{RefuseRefunds: true})
	_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test",
		Descriptors: []*rlcommon.RateLimitDescriptor{d("small", "k"), refund(5, "api_key", "a", "route", "/x")}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptors[1] (api_key, route): refunds (is_negative_hits) are not allowed") {
		t.Fatalf("got %v, want InvalidArgument naming descriptors[1] (api_key, route)", err)
	}
	if strings.Contains(err.Error(), "/x") {
		t.Errorf("%v: names the value, want the keys only", err)
	}
	// The refused request consumed nothing: the 1/hour key admits once.
	if r := call(t, s, 1, d("small", "k")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("first call after the refused one: %v, want OK", r.OverallCode)
	}
	if r := call(t, s, 1, d("small", "k")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("second call: %v, want OVER_LIMIT", r.OverallCode)
	}
}
