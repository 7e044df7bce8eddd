package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
	adminv1 "github.com/rls-project/rls/proto/rls/admin/v1"
)

// scrape returns the Prometheus text of rls's /metrics.
func scrape(t testing.TB, p *rlsProc) string {
	t.Helper()
	resp, err := http.Get("http://" + p.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

// storeUp returns rls_store_up and the reason of rls_store_down that is 1
// as "value reason" ("1 none", "0 auth"), or "" when rls_store_up is not
// there or no reason (or two) is 1 while it is 0.
func storeUp(m map[string]float64) string {
	up, ok := m["rls_store_up"]
	if !ok {
		return ""
	}
	reason := "none"
	for k, v := range m {
		if r, ok := strings.CutPrefix(k, `rls_store_down{reason="`); ok && v == 1 {
			if reason != "none" {
				return ""
			}
			reason = strings.TrimSuffix(r, `"}`)
		}
	}
	if (up == 1) != (reason == "none") {
		return ""
	}
	return fmt.Sprintf("%v %s", up, reason)
}

// series returns the rls_* sample lines of a scrape, name{labels} → value.
func series(text string) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "rls_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out
}

// TestMetricsEndpoint: after traffic /metrics shows the documented series,
// and 10,000 distinct api_key values add no series.
func TestMetricsEndpoint(t *testing.T) {
	light(t)
	p := startRLS(t, "../config")
	c := p.client()
	for range 4 {
		should(t, c, "example", desc("api_key", "demo"))
	}
	should(t, c, "example", desc("api_key", "k0", "route", "/v1/search"), desc("nothing", "x"), desc("api_key", "internal-batch-job"))
	should(t, c, "example", desc("generic_key", "login"))
	// A series appears with its first count: one customer before, so that
	// the 10,000 after add none.
	should(t, c, "example", desc("api_key", "customer-first"))
	before := series(scrape(t, p))

	var wg sync.WaitGroup
	var failed atomic.Int64
	for g := range 20 {
		wg.Go(func() {
			for i := g; i < 10_000; i += 20 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "example",
					Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key", fmt.Sprint("customer-", i))}})
				cancel()
				if err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d calls failed", failed.Load())
	}
	text := scrape(t, p)
	after := series(text)
	for name := range after {
		if _, ok := before[name]; !ok {
			t.Errorf("new series after 10,000 distinct api_key values: %s", name)
		}
	}
	if strings.Contains(text, "customer-") {
		t.Error("a descriptor value appears in /metrics")
	}
	want := []string{
		`rls_decisions_total{domain="example",outcome="ok",rule="per-api-key"}`,
		`rls_decisions_total{domain="example",outcome="over_limit",rule="demo"}`,
		`rls_decisions_total{domain="example",outcome="near_limit",rule="demo"}`,
		`rls_decisions_total{domain="example",outcome="unlimited",rule="api_key=internal-batch-job"}`,
		`rls_decisions_total{domain="example",outcome="no_rule",rule=""}`,
		`rls_detailed_decisions_total{domain="example",outcome="ok",rule="login-trial",value="generic_key=login"}`,
		`rls_decision_duration_seconds_count`,
		`rls_store_duration_seconds_count{op="decide"}`,
		`rls_store_errors_total{kind="deadline",op="decide"}`,
		`rls_store_errors_total{kind="protocol",op="decide"}`,
		`rls_checks_total{source="store"}`,
		`rls_checks_total{source="local_cache"}`,
		`rls_fallback_batches_total{cause="deadline"}`,
		`rls_writeback_hits_total{result="written"}`,
		`rls_store_protocol_errors_total`,
		`rls_fallback_decisions_total{mode="fail_open"}`,
		`rls_fallback_decisions_total{mode="fail_closed"}`,
		`rls_local_cache_hits_total`,
		`rls_fleet_size`,
		`rls_config_reloads_total{result="failure"}`,
		`rls_config_loaded_timestamp_seconds`,
	}
	for _, name := range want {
		if _, ok := after[name]; !ok {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if got := after[`rls_decisions_total{domain="example",outcome="ok",rule="per-api-key"}`]; got < 10_000 {
		t.Errorf("per-api-key ok decisions %v, want >= 10000", got)
	}
	if !regexp.MustCompile(`rls_config_info\{hash="[0-9a-f]{64}"\} 1`).MatchString(text) {
		t.Error("rls_config_info with the config hash missing")
	}
	if after[`rls_checks_total{source="store"}`] < 10_000 {
		t.Errorf("checks decided by the store %v, want >= 10000", after[`rls_checks_total{source="store"}`])
	}
	if after["rls_fleet_size"] != 1 {
		t.Errorf("fleet size %v on the memory store, want 1", after["rls_fleet_size"])
	}
}

// TestHotReloadUnderTraffic edits, breaks, fixes, adds and removes config
// files while traffic flows: no call fails, every answer comes from a valid
// config, and the metrics count each reload's result.
func TestHotReloadUnderTraffic(t *testing.T) {
	light(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "main.yaml")
	limitYAML := func(n int) string {
		return fmt.Sprintf("domain: main\ndescriptors:\n  - key: k\n    rate_limit: {name: lim, unit: second, requests_per_unit: %d}\n", n)
	}
	replace := func(path, body string) {
		t.Helper()
		tmp := filepath.Join(dir, ".tmp-"+filepath.Base(path))
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	replace(file, limitYAML(1_000_000))
	p := startRLS(t, dir)
	c := p.client()

	// Valid limits, in the order they are written; a response must show one
	// of them and never go back to an earlier one.
	valid := map[uint32]int{1_000_000: 0, 2_000_000: 1, 3_000_000: 2}
	var (
		stop     atomic.Bool
		failures atomic.Int64
		wrong    atomic.Int64
		calls    atomic.Int64
		wg       sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			last := 0
			for !stop.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "main", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}})
				cancel()
				calls.Add(1)
				if err != nil {
					failures.Add(1)
					continue
				}
				st := r.Statuses[0]
				v, ok := valid[st.CurrentLimit.GetRequestsPerUnit()]
				if !ok || v < last || st.Code != rlsv3.RateLimitResponse_OK {
					wrong.Add(1)
					continue
				}
				last = v
			}
		})
	}
	waitLog := func(substr string, n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(p.Log.String(), substr) < n {
			if time.Now().After(deadline) {
				t.Fatalf("no %d× %q in the log:\n%s", n, substr, p.Log.String())
			}
			time.Sleep(20 * time.Millisecond) // the poll's interval
		}
	}
	testkit.WaitForEvery(t, "traffic on the first config", 5*time.Second, 5*time.Millisecond, func() bool { return calls.Load() > 0 })
	replace(file, limitYAML(2_000_000)) // edit
	waitLog("config reloaded", 1)
	replace(file, "domain: main\ndescriptors:\n  - key: k\n    bogus: true\n") // break
	waitLog("config reload rejected", 1)
	time.Sleep(300 * time.Millisecond) // traffic on the last good config
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	replace(file, limitYAML(3_000_000)) // fix
	waitLog("config reloaded", 2)
	replace(filepath.Join(dir, "extra.yaml"), "domain: extra\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n") // add
	waitLog("config reloaded", 3)
	if r := should(t, c, "extra", desc("k", "v")); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Errorf("added domain not in force: %v", r)
	}
	if err := os.Remove(filepath.Join(dir, "extra.yaml")); err != nil { // remove
		t.Fatal(err)
	}
	waitLog("config reloaded", 4)
	if r := should(t, c, "extra", desc("k", "v")); r.Statuses[0].CurrentLimit != nil {
		t.Errorf("removed domain still limits: %v", r)
	}
	time.Sleep(200 * time.Millisecond) // traffic after the last reload: real time on purpose
	stop.Store(true)
	wg.Wait()
	if failures.Load() > 0 || wrong.Load() > 0 {
		t.Fatalf("%d failed and %d wrong decisions out of %d", failures.Load(), wrong.Load(), calls.Load())
	}
	if strings.Count(p.Log.String(), "main.yaml:4") != 1 {
		t.Errorf("the broken file's error (main.yaml:4) should be logged exactly once:\n%s", p.Log.String())
	}
	m := series(scrape(t, p))
	if m[`rls_config_reloads_total{result="success"}`] < 4 || m[`rls_config_reloads_total{result="failure"}`] < 1 {
		t.Errorf("reload metrics: success %v, failure %v", m[`rls_config_reloads_total{result="success"}`], m[`rls_config_reloads_total{result="failure"}`])
	}
	t.Logf("%d decisions during reloads, none failed or wrong", calls.Load())
}

// TestAdminExplainAndReset: Explain shows the rule, key and count without
// consuming; ResetCounters frees a blocked key; on both stores. The admin
// API is on --admin-addr only, not on the gRPC port. The Explain call also
// runs through grpcurl, as the README shows it.
func TestAdminExplainAndReset(t *testing.T) {
	light(t)
	for _, tc := range []struct {
		name  string
		flags func(t *testing.T) []string
	}{
		{"memory", func(*testing.T) []string { return nil }},
		{"redis", func(t *testing.T) []string {
			r := redistest.StartServer(t)
			return []string{"--store", "redis", "--redis-url", "redis://" + r.Addr, "--redis-timeout", "500ms"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			adminAddr := freeAddr(t)
			p := startRLS(t, "../config", append(tc.flags(t), "--admin-addr", adminAddr)...)
			c := p.client()
			for range 3 {
				should(t, c, "example", desc("api_key", "demo"))
			}
			if r := should(t, c, "example", desc("api_key", "demo")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("demo key not blocked: %v", r)
			}
			req := &adminv1.ExplainRequest{Domain: "example", Descriptors: []*adminv1.Descriptor{
				{Entries: []*adminv1.Entry{{Key: "api_key", Value: "demo"}}},
				{Entries: []*adminv1.Entry{{Key: "nothing", Value: "x"}}},
			}}
			if _, err := adminv1.NewAdminServiceClient(p.conn).Explain(context.Background(), req); status.Code(err) != codes.Unimplemented {
				t.Fatalf("Explain on the gRPC port: %v, want Unimplemented (the admin API is on --admin-addr only)", err)
			}
			conn, err := grpc.NewClient(adminAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			admin := adminv1.NewAdminServiceClient(conn)
			for range 2 { // explaining twice consumes nothing
				ex, err := admin.Explain(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				e := ex.Explanations[0]
				if e.Rule.GetName() != "demo" || e.Rule.GetPath() != "api_key=demo" || !strings.HasSuffix(e.Rule.GetFile(), "example.yaml") || e.Rule.GetLine() == 0 {
					t.Errorf("rule %v", e.Rule)
				}
				if e.Key != "rl:{example|api_key=demo}:s60" || !e.State.GetOverLimit() || e.State.GetRemaining() != 0 || e.State.GetRetryAfter().AsDuration() <= 0 {
					t.Errorf("key %q state %v", e.Key, e.State)
				}
				if ex.Explanations[1].Matched || ex.Explanations[1].Note == "" {
					t.Errorf("unmatched explanation %v", ex.Explanations[1])
				}
			}
			out := runGrpcurl(t, "-plaintext", "-d", `{"domain":"example","descriptors":[{"entries":[{"key":"api_key","value":"demo"}]}]}`,
				adminAddr, "rls.admin.v1.AdminService/Explain")
			for _, want := range []string{`"name": "demo"`, `"key": "rl:{example|api_key=demo}:s60"`, `"overLimit": true`} {
				if !strings.Contains(out, want) {
					t.Errorf("grpcurl Explain lacks %s:\n%s", want, out)
				}
			}
			rr, err := admin.ResetCounters(context.Background(), &adminv1.ResetCountersRequest{Domain: "example", Descriptors: req.Descriptors[:1]})
			if err != nil || len(rr.Keys) != 1 {
				t.Fatalf("reset: %v %v", rr, err)
			}
			if r := should(t, c, "example", desc("api_key", "demo")); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 2 {
				t.Fatalf("after reset: %v", r)
			}
		})
	}
}

// runGrpcurl runs the grpcurl binary (make deps installs it).
func runGrpcurl(t testing.TB, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("grpcurl")
	if err != nil {
		gopath, _ := exec.Command("go", "env", "GOPATH").Output()
		bin = filepath.Join(strings.TrimSpace(string(gopath)), "bin", "grpcurl")
		if _, err := os.Stat(bin); err != nil {
			t.Fatal("grpcurl not found: run make deps")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("grpcurl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestResponseHeaders: with --response-headers an OVER_LIMIT response
// carries Retry-After and the RateLimit headers, matching its statuses.
func TestResponseHeaders(t *testing.T) {
	light(t)
	p := startRLS(t, "../config", "--response-headers")
	c := p.client()
	var r *rlsv3.RateLimitResponse
	for range 4 {
		r = should(t, c, "example", desc("api_key", "demo"), desc("remote_address", "10.0.0.1"))
	}
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("want OVER_LIMIT: %v", r)
	}
	h := map[string]string{}
	for _, hv := range r.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	demo := r.Statuses[0]
	retry := demo.DurationUntilReset.AsDuration()
	secs := int64((retry + time.Second - 1) / time.Second)
	want := map[string]string{
		"RateLimit-Limit":     `3, 3;w=60;name="demo", 50;w=1;name="per-ip"`,
		"RateLimit-Remaining": "0",
		"RateLimit-Reset":     strconv.FormatInt(secs, 10),
		"Retry-After":         strconv.FormatInt(max(secs, 1), 10),
	}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("%s: %q, want %q (statuses %v)", k, h[k], v, r.Statuses)
		}
	}
}

// TestGracefulShutdownDrains re-executes the binary and sends SIGTERM under
// traffic: health turns NOT_SERVING at once, calls keep being answered
// during the drain, then gRPC stops before the store is closed.
func TestGracefulShutdownDrains(t *testing.T) {
	light(t)
	r := redistest.StartServer(t)
	p := startRLS(t, "../config", "--store", "redis", "--redis-url", "redis://"+r.Addr, "--redis-timeout", "500ms",
		"--shutdown-drain", "1s")
	c := p.client()
	var stop atomic.Bool
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "example", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key", "drain")}})
				cancel()
				if err != nil {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
			}
		})
	}
	testkit.WaitForEvery(t, "traffic answered", 5*time.Second, 5*time.Millisecond, func() bool { return ok.Load() > 0 })
	if err := p.cmd.Process.Signal(sigterm); err != nil {
		t.Fatal(err)
	}
	// Health turns NOT_SERVING at once, well inside the 1 s drain.
	var h *healthpb.HealthCheckResponse
	var err error
	notServing := testkit.EventuallyEvery(600*time.Millisecond, pollEvery, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		h, err = healthpb.NewHealthClient(p.conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && h.Status == healthpb.HealthCheckResponse_NOT_SERVING
	})
	if !notServing {
		t.Errorf("health during drain: %v %v, want NOT_SERVING", h, err)
	}
	during := ok.Load()
	if !testkit.EventuallyEvery(300*time.Millisecond, 5*time.Millisecond, func() bool { return ok.Load() > during }) {
		t.Error("no call answered during the drain")
	}
	if failed.Load() > 0 {
		t.Errorf("%d calls failed during the drain", failed.Load())
	}
	if err := p.wait(t, 15*time.Second); err != nil {
		t.Fatalf("exit: %v", err)
	}
	stop.Store(true)
	wg.Wait()
	log := p.Log.String()
	order := []string{"shutdown requested", "serving=false", "draining", "grpc stopped", "store closed"}
	last := -1
	for _, s := range order {
		i := strings.Index(log, s)
		if i < 0 || i < last {
			t.Fatalf("shutdown steps out of order; want %q in order:\n%s", order, log)
		}
		last = i
	}
}
