package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestOversizedRequest: a request over the gRPC port's 1 MiB is refused with
// ResourceExhausted and the server keeps serving.
func TestOversizedRequest(t *testing.T) {
	light(t)
	p := startRLS(t, "../config")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "example",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key", strings.Repeat("x", 1_100_000))}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("1.1 MB request with a 1 MiB limit: %v, want ResourceExhausted", err)
	}
	if r := should(t, p.client(), "example", desc("api_key", "small")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after the oversized request: %v", r)
	}
}
