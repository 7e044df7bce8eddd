package integration

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/integration/redistest"
)

// TestStartWithRedisDown: rls started while Redis is down serves at once
// (degraded, deciding locally, not a crash loop) and moves to Redis when
// it appears.
func TestStartWithRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	srv.Stop() // a port where Redis will appear later
	dir := writeConfig(t, map[string]string{"d.yaml": `
domain: d
descriptors:
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 100, on_error: fail_closed}
`})
	p := startRLS(t, dir, "--store", "redis", "--redis-url", "redis://"+srv.Addr, "--redis-timeout", "200ms")
	storeHealth := func() healthpb.HealthCheckResponse_ServingStatus {
		h, err := healthpb.NewHealthClient(p.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "rls.store"})
		if err != nil {
			t.Fatal(err)
		}
		return h.Status
	}
	healthcheck := func() string {
		resp, err := http.Get("http://" + p.HTTPAddr + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strconv.Itoa(resp.StatusCode) + " " + string(b)
	}
	if r := should(t, p.client(), "d", desc("closed", "x")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("fail_closed rule with Redis down: %v", r)
	}
	if got := healthcheck(); !strings.HasPrefix(got, "200 DEGRADED") {
		t.Errorf("/healthcheck with Redis down: %q", got)
	}
	if got := storeHealth(); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("rls.store health with Redis down: %v", got)
	}

	srv.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := should(t, p.client(), "d", desc("closed", "x"))
		if r.OverallCode == rlsv3.RateLimitResponse_OK && storeHealth() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not deciding on Redis 10 s after it started: %v, rls.store %v\n%s", r, storeHealth(), p.Log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOversizedRequest: a request over the gRPC port's 1 MiB is refused with
// ResourceExhausted and the server keeps serving.
func TestOversizedRequest(t *testing.T) {
	t.Parallel()
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
