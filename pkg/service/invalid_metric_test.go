package service

import (
	"context"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store/memory"
)

// TestInvalidRequestsAreCounted: every InvalidArgument answer counts in
// rls_invalid_requests_total, valid requests do not, and a Service without
// metrics still answers InvalidArgument.
func TestInvalidRequestsAreCounted(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"test.yaml": []byte(testConfig)})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, 1)
	s := New(cfg, limiter.New(memory.New(memory.Options{}), limiter.Options{}), Options{Metrics: m})
	bad := []*rlsv3.RateLimitRequest{
		{Descriptors: []*rlcommon.RateLimitDescriptor{d("a", "b")}}, // no domain
		{Domain: "test"}, // no descriptors
		{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{{}}},
	}
	for _, req := range bad {
		if _, err := s.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%v: %v, want InvalidArgument", req, err)
		}
	}
	call(t, s, 0, d("small", "x"))
	if got := testutil.ToFloat64(m.invalid); got != 3 {
		t.Fatalf("rls_invalid_requests_total %v, want 3", got)
	}
	if n, err := testutil.GatherAndCount(reg, "rls_invalid_requests_total"); err != nil || n != 1 {
		t.Fatalf("rls_invalid_requests_total registered %d times: %v", n, err)
	}
	var nilMetrics *Metrics
	nilMetrics.Invalid() // nil-safe, as the others
	s2 := New(cfg, limiter.New(memory.New(memory.Options{}), limiter.Options{}), Options{})
	if _, err := s2.ShouldRateLimit(context.Background(), bad[0]); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("without metrics: %v", err)
	}
}
