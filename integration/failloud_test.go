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
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
)

// flRun runs the binary with args and env (KEY=value) and returns its
// output; it must exit within 20 s.
func flRun(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, rlsBin, args...)
	cmd.Env = append(cleanEnv(), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("rls %v did not exit within 20 s:\n%s", args, out)
	}
	return string(out), err
}

// TestRedisSettingWithMemoryStoreRefused: a Redis setting given with the
// memory store (the default) refuses to start, serve and --dry-run alike,
// naming the setting and --store: the fleet would count per replica.
func TestRedisSettingWithMemoryStoreRefused(t *testing.T) {
	light(t)
	serve := []string{"serve", "--config-dir", "../config", "--grpc-addr", "127.0.0.1:0", "--http-addr", "", "--debug-addr", ""}
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"flag", nil, []string{"--redis-url", "redis://redis:6379"}, "--redis-url (RLS_REDIS_URL) is set but --store (RLS_STORE) is memory"},
		{"env", []string{"RLS_REDIS_URL=redis://redis:6379"}, nil, "--redis-url (RLS_REDIS_URL) is set but --store (RLS_STORE) is memory"},
		{"password", []string{"RLS_REDIS_PASSWORD=hunter2"}, nil, "RLS_REDIS_PASSWORD is set but --store (RLS_STORE) is memory"},
		{"timeout", nil, []string{"--store", "memory", "--redis-timeout", "50ms"}, "--redis-timeout (RLS_REDIS_TIMEOUT) is set but --store (RLS_STORE) is memory"},
	} {
		for _, dry := range []bool{false, true} {
			args := append(append([]string{}, serve...), c.args...)
			if dry {
				args = append(args, "--dry-run")
			}
			out, err := flRun(t, c.env, args...)
			if err == nil || !strings.Contains(out, c.want) || strings.Contains(out, "hunter2") {
				t.Errorf("%s (dry run %v): exit %v, want a refusal containing %q (and no password):\n%s", c.name, dry, err, c.want, out)
			}
		}
	}
}

// TestWrongRedisPasswordRefusesToStart: a password Redis refuses stops rls
// at start-up with a message saying so, without the password; an outage
// would not (TestStartWithRedisDown).
func TestWrongRedisPasswordRefusesToStart(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t, "--requirepass", "right-one")
	for _, env := range [][]string{{"RLS_REDIS_PASSWORD=wrong-one"}, nil} {
		out, err := flRun(t, env, "serve", "--config-dir", "../config", "--grpc-addr", "127.0.0.1:0", "--http-addr", "", "--debug-addr", "",
			"--store", "redis", "--redis-url", srv.URL(), "--fleet-size", "1")
		if err == nil || !strings.Contains(out, "redis refused rls's credentials") || !strings.Contains(out, "RLS_REDIS_PASSWORD") ||
			strings.Contains(out, "wrong-one") {
			t.Errorf("password %v: exit %v, want a refusal naming RLS_REDIS_PASSWORD, without the password:\n%s", env, err, out)
		}
	}
}

// TestRedisPasswordChangedAtRunTime: when Redis starts refusing rls's
// credentials (its password changed; Redis keeps authenticated connections,
// so they are dropped as a restart or failover would), rls turns NOT_SERVING
// within 2 s, answers Unavailable without deciding from any fail-open
// bucket, reports rls_store_up{reason="auth"} 0, logs it at ERROR a bounded
// number of times, and serves again once the password is set back.
func TestRedisPasswordChangedAtRunTime(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	dir := writeConfig(t, map[string]string{"d.yaml": `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 100}
`})
	p := startRLS(t, dir, "--store", "redis", "--redis-url", srv.URL(), "--redis-timeout", "200ms", "--fleet-size", "1")
	if r := should(t, p.client(), "d", desc("k", "a")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("before: %v", r)
	}
	health := func() healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		h, err := healthpb.NewHealthClient(p.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		if err != nil {
			t.Fatal(err)
		}
		return h.Status
	}
	healthcheck := func() int {
		resp, err := http.Get("http://" + p.HTTPAddr + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	admin := srv.Client()
	defer admin.Close()
	ctx := context.Background()
	if err := admin.ConfigSet(ctx, "requirepass", "rotated").Err(); err != nil {
		t.Fatal(err)
	}
	admin = redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "rotated"})
	defer admin.Close()
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	testkit.WaitForEvery(t, "health NOT_SERVING once Redis refuses rls's credentials", 5*time.Second, pollEvery, func() bool {
		return health() == healthpb.HealthCheckResponse_NOT_SERVING
	})
	if d := time.Since(changed); d > 2*time.Second {
		t.Errorf("NOT_SERVING %v after the password changed, want within 2 s", d)
	}
	for i := range 20 {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := p.client().ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", string(rune('a'+i)))}})
		cancel()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("call %d while Redis refuses rls's credentials: %v, want Unavailable", i, err)
		}
	}
	m := series(scrape(t, p))
	if got := storeUp(m); got != "0 auth" {
		t.Errorf("rls_store_up while refused: %q, want 0 auth", got)
	}
	if n := m[`rls_fallback_decisions_total{mode="fail_open"}`] + m[`rls_checks_total{source="fail_open"}`] +
		m[`rls_local_table_entries{table="fail_open_buckets"}`]; n != 0 {
		t.Errorf("fail-open decisions or buckets while Redis refuses rls's credentials: %v\n%s", n, scrape(t, p))
	}
	if m[`rls_store_errors_total{kind="auth",op="decide"}`] < 1 {
		t.Errorf("no decide error of kind auth counted")
	}
	if c := healthcheck(); c != http.StatusServiceUnavailable {
		t.Errorf("/healthcheck while refused: %d, want 503", c)
	}
	if n := strings.Count(p.Log.String(), "store refused rls's credentials"); n < 1 || n > 2 {
		t.Errorf("%d ERROR lines for the refusal, want 1 or 2 (throttled):\n%s", n, p.Log.String())
	}

	if err := admin.ConfigSet(ctx, "requirepass", "").Err(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitForEvery(t, "SERVING again once the password is set back", 10*time.Second, pollEvery, func() bool {
		return health() == healthpb.HealthCheckResponse_SERVING
	})
	if r := should(t, p.client(), "d", desc("k", "a")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after: %v", r)
	}
	if got := storeUp(series(scrape(t, p))); got != "1 none" {
		t.Errorf("rls_store_up once recovered: %q", got)
	}
}

// TestEmptyConfigDirRefused: rls serve on an empty --config-dir (the
// image's default /config when the config is mounted elsewhere) exits,
// naming --allow-empty-config; with it, rls serves (every descriptor OK).
func TestEmptyConfigDirRefused(t *testing.T) {
	light(t)
	dir := t.TempDir()
	out, err := flRun(t, nil, "serve", "--config-dir", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "", "--debug-addr", "")
	if err == nil || !strings.Contains(out, "has no domain") || !strings.Contains(out, "--allow-empty-config (RLS_ALLOW_EMPTY_CONFIG)") {
		t.Fatalf("serve on an empty dir: exit %v, want a refusal naming --allow-empty-config:\n%s", err, out)
	}
	p := startRLS(t, dir, "--allow-empty-config")
	if r := should(t, p.client(), "d", desc("k", "v")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("with --allow-empty-config: %v", r)
	}
}

// TestValidateAgreesWithDryRun: rls validate DIR and rls serve --dry-run
// --config-dir DIR accept and refuse the same directories, with the same
// flags. (A directory missing altogether is the one difference: --dry-run
// reports it unchecked, as a pod's volume exists only in the pod.)
func TestValidateAgreesWithDryRun(t *testing.T) {
	light(t)
	domainD := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	for _, c := range []struct {
		name  string
		files map[string]string
		flags []string
		ok    bool
		want  string // in the output of a refusal
	}{
		{"valid", map[string]string{"d.yaml": domainD}, nil, true, ""},
		{"empty", map[string]string{}, nil, false, "has no domain"},
		{"empty allowed", map[string]string{}, []string{"--allow-empty-config"}, true, ""},
		{"no yaml", map[string]string{"README.txt": domainD}, nil, false, "has no domain"},
		{"bad yaml", map[string]string{"d.yaml": "domain: d\ndescriptors: [\n"}, nil, false, "d.yaml:"},
		{"unknown field", map[string]string{"d.yaml": domainD + "    typo: 1\n"}, nil, false, "d.yaml:"},
		{"bad unit", map[string]string{"d.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"}, nil, false, "d.yaml:"},
		{"two files one domain", map[string]string{"a.yaml": domainD, "b.yaml": "domain: d\ndescriptors:\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}, nil, false, "duplicate domain"},
		{"merged", map[string]string{"a.yaml": domainD, "b.yaml": "domain: d\ndescriptors:\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}, []string{"--merge-domains"}, true, ""},
	} {
		dir := writeConfig(t, c.files)
		vOut, vErr := flRun(t, nil, append(append([]string{"validate"}, c.flags...), dir)...)
		dOut, dErr := flRun(t, nil, append([]string{"serve", "--dry-run", "--config-dir", dir}, c.flags...)...)
		for _, r := range []struct {
			cmd, out string
			err      error
		}{{"validate", vOut, vErr}, {"serve --dry-run", dOut, dErr}} {
			if (r.err == nil) != c.ok || (!c.ok && !strings.Contains(r.out, c.want)) {
				t.Errorf("%s: rls %s: exit %v, want ok=%v (and %q):\n%s", c.name, r.cmd, r.err, c.ok, c.want, r.out)
			}
		}
	}
}

// TestUnknownDomainCountedAndLoggedOnce: requests for a domain no config
// defines are answered OK, each counted in
// rls_unknown_domain_requests_total{domain}, and warned about once (at most
// once a minute per domain); a configured domain is not counted.
func TestUnknownDomainCountedAndLoggedOnce(t *testing.T) {
	light(t)
	p := startRLS(t, "../config")
	for range 5 {
		if r := should(t, p.client(), "exmaple", desc("api_key", "demo")); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("unknown domain: %v", r)
		}
	}
	should(t, p.client(), "example", desc("api_key", "k"))
	m := series(scrape(t, p))
	if got := m[`rls_unknown_domain_requests_total{domain="exmaple"}`]; got != 5 {
		t.Errorf("rls_unknown_domain_requests_total{domain=\"exmaple\"} = %v, want 5", got)
	}
	if got, ok := m[`rls_unknown_domain_requests_total{domain="example"}`]; ok {
		t.Errorf("the configured domain counted as unknown: %v", got)
	}
	if n := strings.Count(p.Log.String(), "request for a domain that no config defines"); n != 1 {
		t.Errorf("%d warnings for 5 requests of one unknown domain, want 1:\n%s", n, p.Log.String())
	}
}
