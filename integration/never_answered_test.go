package integration

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
)

// TestStoreNeverAnswered: two replicas pointed at a Redis port nothing
// listens on (a typo'd port) start, but stay NOT_SERVING (gRPC health of
// the rate limit service, upstream's name and "", and /healthcheck 503
// naming the address; rls.live, the chart's liveness, stays SERVING), say
// so at WARN with the address, and every rule, fail_open too, denies
// meanwhile; both turn SERVING within seconds of a Redis
// starting on that port, and decide on it.
func TestStoreNeverAnswered(t *testing.T) {
	light(t)
	_, portText, _ := net.SplitHostPort(freeAddr(t))
	port, _ := strconv.Atoi(portText)
	url := "redis://127.0.0.1:" + portText
	dir := writeConfig(t, map[string]string{"d.yaml": `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 100, on_error: fail_closed}
`})
	var reps []*rlsProc
	for range 2 {
		reps = append(reps, startRLSNoWait(t, dir, "--store", "redis", "--redis-url", url))
	}
	status := func(p *rlsProc, service string) healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := healthpb.NewHealthClient(p.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return r.Status
	}
	const notServing, serving = healthpb.HealthCheckResponse_NOT_SERVING, healthpb.HealthCheckResponse_SERVING
	for i, p := range reps {
		testkit.WaitForEvery(t, "the server up, its store not", 20*time.Second, pollEvery, func() bool {
			return strings.Contains(p.Log.String(), "store has not answered since rls started") && status(p, "rls.store") == notServing
		})
		for _, svc := range []string{"", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"} {
			if got := status(p, svc); got != notServing {
				t.Errorf("replica %d: health %q = %v before the store ever answered, want NOT_SERVING", i, svc, got)
			}
		}
		if got := status(p, "rls.live"); got != serving { // the chart's liveness: no restart loop
			t.Errorf("replica %d: health rls.live = %v while it waits, want SERVING", i, got)
		}
		if code, body := ftHTTPGet(t, "http://"+p.HTTPAddr+"/healthcheck"); code != 503 || !strings.Contains(body, url) {
			t.Errorf("replica %d: /healthcheck %d %q, want 503 naming %s", i, code, body, url)
		}
		if log := p.Log.String(); !strings.Contains(log, "level=WARN") || !strings.Contains(log, "addr="+url) {
			t.Errorf("replica %d: no WARN naming %s:\n%s", i, url, log)
		}
		if r := should(t, p.client(), "d", desc("closed", "x")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("replica %d: fail_closed rule before the store answered: %v, want OVER_LIMIT", i, r)
		}
	}
	// Meanwhile a fail_open rule denies too: a Redis never reached is a
	// wrong address, not an outage, and each replica admitting its share
	// would make k's 3 a minute the fleet's size times that.
	admitted := 0
	for _, p := range reps {
		for range 4 {
			if should(t, p.client(), "d", desc("k", "x")).OverallCode == rlsv3.RateLimitResponse_OK {
				admitted++
			}
		}
	}
	if admitted != 0 {
		t.Errorf("before Redis answered, the two replicas admitted %d of 8 calls of a 3/minute fail_open rule, want 0", admitted)
	}
	start := time.Now()
	redistest.StartServerOn(t, port)
	for i, p := range reps {
		testkit.WaitForEvery(t, "SERVING once Redis listens", 10*time.Second, pollEvery, func() bool {
			return status(p, "envoy.service.ratelimit.v3.RateLimitService") == serving && status(p, "") == serving
		})
		if code, body := ftHTTPGet(t, "http://"+p.HTTPAddr+"/healthcheck"); code != 200 {
			t.Errorf("replica %d: /healthcheck %d %q once Redis answers, want 200", i, code, body)
		}
		testkit.WaitForEvery(t, "the fail_closed rule decided on Redis", 10*time.Second, pollEvery, func() bool {
			return should(t, p.client(), "d", desc("closed", "x")).OverallCode == rlsv3.RateLimitResponse_OK
		})
	}
	t.Logf("both replicas SERVING %v after Redis started", time.Since(start).Round(time.Millisecond))
}
