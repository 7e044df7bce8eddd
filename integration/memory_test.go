package integration

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

// TestServeExampleConfig drives the shipped example config (what `make run`
// serves) through the real binary: the RLS service is listed by reflection,
// the demo key counts down to OVER_LIMIT, health answers on gRPC and HTTP.
func TestServeExampleConfig(t *testing.T) {
	light(t)
	p := startRLS(t, "../config")

	// Reflection lists the service, as `grpcurl -plaintext ... list` does.
	rc, err := reflectionpb.NewServerReflectionClient(p.conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	lr, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range lr.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	rc.CloseSend()
	for _, want := range []string{"envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("reflection lists %v, want %s", names, want)
		}
	}

	c := p.client()
	for i, wantRemaining := range []uint32{2, 1, 0} {
		r := should(t, c, "example", desc("api_key", "demo"))
		st := r.Statuses[0]
		if r.OverallCode != rlsv3.RateLimitResponse_OK || st.Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v, want OK", i+1, r)
		}
		if st.CurrentLimit.GetRequestsPerUnit() != 3 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || st.CurrentLimit.GetName() != "demo" {
			t.Errorf("call %d: current_limit %v, want 3/minute named demo", i+1, st.CurrentLimit)
		}
		if st.LimitRemaining != wantRemaining {
			t.Errorf("call %d: limit_remaining %d, want %d", i+1, st.LimitRemaining, wantRemaining)
		}
		if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > time.Minute {
			t.Errorf("call %d: duration_until_reset %v, want in (0, 1m]", i+1, d)
		}
	}
	r := should(t, c, "example", desc("api_key", "demo"))
	st := r.Statuses[0]
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th call: %v, want OVER_LIMIT", r)
	}
	if st.LimitRemaining != 0 || st.DurationUntilReset.AsDuration() <= 0 {
		t.Errorf("4th call: remaining %d, reset %v; want 0 and > 0", st.LimitRemaining, st.DurationUntilReset.AsDuration())
	}

	// Several descriptors: statuses in request order; an unmatched one is OK
	// without a limit; an unlimited one is OK.
	r = should(t, c, "example",
		desc("api_key", "k1", "route", "/v1/search"),
		desc("nope", "x"),
		desc("api_key", "internal-batch-job"))
	if len(r.Statuses) != 3 || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("3 descriptors: %v", r)
	}
	if r.Statuses[0].CurrentLimit.GetName() != "search" || r.Statuses[0].LimitRemaining != 9 {
		t.Errorf("search status %v, want limit search, remaining 9 (burst 10)", r.Statuses[0])
	}
	if r.Statuses[1].CurrentLimit != nil || r.Statuses[2].CurrentLimit != nil {
		t.Errorf("unmatched/unlimited statuses carry a limit: %v", r.Statuses)
	}

	hc := healthpb.NewHealthClient(p.conn)
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService", "ratelimit"} { // "ratelimit": envoyproxy/ratelimit's name
		h, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v", svc, h, err)
		}
	}
	resp, err := http.Get("http://" + p.HTTPAddr + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "OK" {
		t.Errorf("/healthcheck: %d %q", resp.StatusCode, body)
	}
	if !strings.Contains(strings.SplitN(p.Log.String(), "\n", 2)[0], "memory store") {
		t.Errorf("first log line does not say it runs on the memory store:\n%s", p.Log.String())
	}
}

// TestMalformedRequests asserts InvalidArgument with a message naming the
// problem, and that the server keeps serving afterwards.
func TestMalformedRequests(t *testing.T) {
	light(t)
	p := startRLS(t, "../config")
	c := p.client()
	cases := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("a", "b")}}, "domain is empty"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "example"}, "descriptors is empty"},
		{"no entries", &rlsv3.RateLimitRequest{Domain: "example", Descriptors: []*rlcommon.RateLimitDescriptor{{}}}, "descriptors[0] has no entries"},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "example", Descriptors: []*rlcommon.RateLimitDescriptor{desc("a", "b"), desc("", "v")}}, "descriptors[1].entries[0].key is empty"},
		{"override unit unknown", &rlsv3.RateLimitRequest{Domain: "example", Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: desc("api_key", "x").Entries,
			Limit:   &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5},
		}}}, "descriptors[0].limit: unit UNKNOWN"},
		{"override unit out of range", &rlsv3.RateLimitRequest{Domain: "example", Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: desc("api_key", "x").Entries,
			Limit:   &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit(42)},
		}}}, "descriptors[0].limit: unit 42"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := c.ShouldRateLimit(ctx, tc.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("got %v, want InvalidArgument containing %q", err, tc.want)
			}
		})
	}
	if r := should(t, c, "example", desc("api_key", "after")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after malformed requests: %v", r)
	}
}

// TestBadConfigIsAStartupError: a broken initial config stops start-up with
// the file:line of each error, rather than serving and failing every call.
func TestBadConfigIsAStartupError(t *testing.T) {
	light(t)
	dir := writeConfig(t, map[string]string{
		"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
		"b.yaml": "domain: b\ndescriptors:\n  - key: k\n    bogus: 1\n",
	})
	p := startRLSNoWait(t, dir)
	err := p.wait(t, 20*time.Second)
	if err == nil {
		t.Fatalf("rls started on a broken config:\n%s", p.Log.String())
	}
	log := p.Log.String()
	for _, want := range []string{"a.yaml:4", "b.yaml:4", "bogus"} {
		if !strings.Contains(log, want) {
			t.Errorf("start-up error does not mention %q:\n%s", want, log)
		}
	}
}

// TestValidateCommand: `rls validate DIR` prints every error as file:line and
// exits 1; on a good directory it exits 0.
func TestValidateCommand(t *testing.T) {
	light(t)
	dir := writeConfig(t, map[string]string{
		"one.yaml":  "domain: one\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
		"two.yml":   "domain: one\ndescriptors: []\n",
		"notes.txt": "not yaml, ignored",
	})
	out, err := exec.Command(rlsBin, "validate", dir).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("validate on a broken dir: err %v, want exit 1\n%s", err, out)
	}
	for _, want := range []string{"one.yaml:4", "two.yml:1", "requests_per_unit", "notes.txt"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("validate output lacks %q:\n%s", want, out)
		}
	}
	out, err = exec.Command(rlsBin, "validate", "../config").CombinedOutput()
	if err != nil {
		t.Fatalf("validate ../config: %v\n%s", err, out)
	}
}

// TestSIGTERMExitsCleanly: SIGTERM ends serve with exit status 0 after
// reporting NOT_SERVING and stopping gRPC before the store.
func TestSIGTERMExitsCleanly(t *testing.T) {
	light(t)
	p := startRLS(t, "../config")
	should(t, p.client(), "example", desc("api_key", "x"))
	if err := p.cmd.Process.Signal(sigterm); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(t, 15*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.Log.String())
	}
	log := p.Log.String()
	order := []string{"shutdown requested", "serving=false", "grpc stopped", "store closed"}
	last := -1
	for _, s := range order {
		i := strings.Index(log, s)
		if i < 0 || i < last {
			t.Fatalf("shutdown log out of order; want %q in order:\n%s", order, log)
		}
		last = i
	}
}
