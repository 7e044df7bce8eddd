package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"gopkg.in/yaml.v3"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
	"github.com/rls-project/rls/pkg/tlsconfig/tlstest"
	"github.com/rls-project/rls/pkg/xds/xdstest"
)

// The xDS tests: rls configured by a go-control-plane xDS server (a
// snapshot cache, as Envoy Gateway runs) instead of files.

// xdsHealth returns rls's gRPC health for service.
func xdsHealth(t *testing.T, p *rlsProc, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(p.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health %q: %v", service, err)
	}
	return r.GetStatus()
}

// xdsHealthcheck returns /healthcheck's status code and body.
func xdsHealthcheck(t *testing.T, p *rlsProc) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.HTTPAddr + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// xdsAllows sends n requests for tenant and then one more, and fails the
// test unless the n pass and the last is over the limit.
func xdsAllows(t *testing.T, p *rlsProc, tenant string, n int) {
	t.Helper()
	for i := 0; i <= n; i++ {
		got := should(t, p.client(), "xds", desc("tenant", tenant)).GetOverallCode()
		want := rlsv3.RateLimitResponse_OK
		if i == n {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if got != want {
			t.Fatalf("tenant %s, request %d: %v, want %v (a limit of %d)", tenant, i+1, got, want, n)
		}
	}
}

func tenantLimit(rpu uint32) *rlsconf.RateLimitConfig {
	return xdstest.Limit("xds", "xds", "tenant", rpu, rlsconf.RateLimitUnit_MINUTE)
}

// TestXDSConfig: rls waits NOT_SERVING for its first config, follows
// updates, NACKs a bad one (naming the resource and field) while keeping
// the last good config, keeps deciding while the server is down, and takes
// the restarted server's snapshot, whose version numbers start again.
func TestXDSConfig(t *testing.T) {
	light(t)
	start := time.Now()
	cp := xdstest.Start(t, "127.0.0.1:0")
	p := startRLSNoWait(t, t.TempDir(), "--config-source", "xds", "--xds-server", cp.Addr, "--xds-node-id", "test")

	// Connected, no snapshot yet: not ready, and no decisions.
	testkit.WaitForEvery(t, "rls's stream to the xDS server", 20*time.Second, pollEvery, func() bool { return cp.Streams() > 0 })
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService", "ratelimit"} {
		if s := xdsHealth(t, p, svc); s != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health %q before any config: %v, want NOT_SERVING", svc, s)
		}
	}
	if code, body := xdsHealthcheck(t, p); code != http.StatusServiceUnavailable {
		t.Errorf("/healthcheck before any config: %d %q, want 503", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "xds", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "a")}})
	cancel()
	if status.Code(err) != codes.Unavailable {
		t.Errorf("ShouldRateLimit before any config: %v, want Unavailable", err)
	}

	// The initial config.
	cp.Set(t, "test", "1", tenantLimit(3))
	if _, ack := cp.AnswerTo(t, "1", 10*time.Second); ack.GetErrorDetail() != nil || ack.GetVersionInfo() != "1" {
		t.Fatalf("version 1: %v, want an ACK", ack)
	}
	p.waitServing(t, 10*time.Second)
	if code, _ := xdsHealthcheck(t, p); code != http.StatusOK {
		t.Errorf("/healthcheck with a config: %d", code)
	}
	xdsAllows(t, p, "a", 3)

	// An update changes the limit.
	cp.Set(t, "test", "2", tenantLimit(5))
	if _, ack := cp.AnswerTo(t, "2", 10*time.Second); ack.GetErrorDetail() != nil || ack.GetVersionInfo() != "2" {
		t.Fatalf("version 2: %v, want an ACK", ack)
	}
	xdsAllows(t, p, "b", 5)

	// A bad update: a unit of UNKNOWN, and a descriptor defined twice in
	// another resource. NACKed with both errors; 5 a minute stays.
	bad := tenantLimit(50)
	bad.Descriptors[0].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	dup := xdstest.Limit("other", "other", "k", 1, rlsconf.RateLimitUnit_SECOND)
	dup.Descriptors = append(dup.Descriptors, dup.Descriptors[0])
	cp.Set(t, "test", "3", bad, dup)
	resp, nack := cp.AnswerTo(t, "3", 10*time.Second)
	want := `xds:other: descriptors[1].key: duplicate descriptor key "k" at this level (first at descriptors[0])` + "\n" +
		`xds:xds: descriptors[0].rate_limit.unit: invalid unit "UNKNOWN"; choices are second, minute, hour, day, week, month, year`
	if d := nack.GetErrorDetail(); nack.GetVersionInfo() != "2" || nack.GetResponseNonce() != resp.GetNonce() ||
		d.GetCode() != int32(codes.InvalidArgument) || d.GetMessage() != want {
		t.Fatalf("answer to the bad version 3: version %q nonce %q (response's %q), error %d %q\nwant a NACK naming version 2 and\n%s",
			nack.GetVersionInfo(), nack.GetResponseNonce(), resp.GetNonce(), d.GetCode(), d.GetMessage(), want)
	}
	xdsAllows(t, p, "c", 5)
	m := series(scrape(t, p))
	if m[`rls_config_reloads_total{result="failure"}`] != 1 || m[`rls_config_reloads_total{result="success"}`] != 2 ||
		m["rls_config_last_reload_successful"] != 0 || m["rls_xds_connected"] != 1 {
		t.Errorf("metrics after a NACK: failure %v success %v last_ok %v connected %v; want 1, 2, 0, 1",
			m[`rls_config_reloads_total{result="failure"}`], m[`rls_config_reloads_total{result="success"}`],
			m["rls_config_last_reload_successful"], m["rls_xds_connected"])
	}

	// The server goes away: rls keeps serving its last good config.
	addr := cp.Addr
	cp.Stop()
	testkit.WaitForEvery(t, "rls_xds_connected 0", 10*time.Second, pollEvery, func() bool { return series(scrape(t, p))["rls_xds_connected"] == 0 })
	if s := xdsHealth(t, p, "envoy.service.ratelimit.v3.RateLimitService"); s != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without the xDS server: %v, want SERVING", s)
	}
	xdsAllows(t, p, "d", 5)

	// It comes back on the same address, restarted: its versions count
	// from 1 again, with other content.
	cp2 := xdstest.Start(t, addr)
	cp2.Set(t, "test", "1", tenantLimit(7))
	if _, ack := cp2.AnswerTo(t, "1", 15*time.Second); ack.GetErrorDetail() != nil {
		t.Fatalf("the restarted server's version 1 NACKed: %v", ack.GetErrorDetail())
	}
	xdsAllows(t, p, "e", 7)
	if !strings.Contains(p.Log.String(), "xds: config rejected (NACK)") {
		t.Errorf("the NACK is not in rls's log")
	}
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}

// egResources is a resource file for examples/xds-control-plane, shaped as
// Envoy Gateway names a route's global rate limit: one domain per
// listener, a descriptor per route rule.
const egResources = `- name: default/eg/http
  domain: default/eg/http
  descriptors:
    - key: httproute/default/backend/rule/0/match/0/www_example_com
      value: httproute/default/backend/rule/0/match/0/www_example_com
      descriptors:
        - key: rule-0-match-0
          rate_limit: {unit: MINUTE, requests_per_unit: %d}
`

// egManifest reads deploy/envoy-gateway/envoy-gateway.yaml: the env and
// command of the rate limit container it gives rls.
func egManifest(t *testing.T) (env map[string]string, order []string, command []string) {
	t.Helper()
	raw, err := os.ReadFile("../deploy/envoy-gateway/envoy-gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Provider struct {
			Kubernetes struct {
				RateLimitDeployment struct {
					Container struct {
						Env []struct{ Name, Value string }
					}
					Patch struct {
						Value struct {
							Spec struct {
								Template struct {
									Spec struct {
										Containers []struct {
											Name    string
											Command []string
										}
									}
								}
							}
						}
					}
				} `yaml:"rateLimitDeployment"`
			}
		}
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	d := doc.Provider.Kubernetes.RateLimitDeployment
	env = map[string]string{}
	for _, e := range d.Container.Env {
		env[e.Name] = e.Value
		order = append(order, e.Name)
	}
	for _, c := range d.Patch.Value.Spec.Template.Spec.Containers {
		if c.Name == "envoy-ratelimit" {
			command = c.Command
		}
	}
	if len(env) == 0 || len(command) == 0 {
		t.Fatalf("envoy-gateway.yaml: no env (%d) or no command patch (%v) for container envoy-ratelimit", len(env), command)
	}
	return env, order, command
}

// TestXDSEnvoyGatewayStyle runs the documented Envoy Gateway setup: rls
// with the env of deploy/envoy-gateway/envoy-gateway.yaml (paths and
// addresses pointed at test files), against examples/xds-control-plane
// serving a resource file over mutual TLS 1.3 as Envoy Gateway's xDS
// server does, on Redis; Envoy's calls come over mutual TLS too. The file
// changes, then turns bad (NACKed; the example logs it).
func TestXDSEnvoyGatewayStyle(t *testing.T) {
	light(t)
	env, order, command := egManifest(t)
	dockerfile, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dockerfile), "COPY --from=build /out/rls "+command[0]+"\n") || len(command) != 2 || command[1] != "serve" {
		t.Errorf("the patched command %v does not run the image's rls (see the Dockerfile)", command)
	}

	dir := t.TempDir()
	bin := filepath.Join(dir, "xds-control-plane")
	build := exec.Command("go", "build", "-o", bin, "../examples/xds-control-plane")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the example: %v\n%s", err, out)
	}
	ca := tlstest.NewCA(t, "envoy-gateway CA") // one CA signs everything, as Envoy Gateway's
	server, client := ca.Server(t, "envoy-gateway"), ca.Client(t, "envoy-ratelimit")
	files := map[string]string{
		"ca.crt":         tlstest.Write(t, dir, "ca.crt", ca.PEM),
		"server.crt":     tlstest.Write(t, dir, "server.crt", server.CertPEM),
		"server.key":     tlstest.Write(t, dir, "server.key", server.KeyPEM),
		"client.crt":     tlstest.Write(t, dir, "client.crt", client.CertPEM),
		"client.key":     tlstest.Write(t, dir, "client.key", client.KeyPEM),
		"resources.yaml": filepath.Join(dir, "resources.yaml"),
	}
	writeResources := func(body string) {
		t.Helper()
		tmp := files["resources.yaml"] + ".tmp"
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, files["resources.yaml"]); err != nil {
			t.Fatal(err)
		}
	}
	writeResources(fmt.Sprintf(egResources, 3))

	cpAddr := freeAddr(t)
	cpLog := &testkit.Buffer{}
	cp := exec.Command(bin, "--addr", cpAddr, "--node-id", env["RLS_XDS_NODE_ID"], "--config", files["resources.yaml"], "--poll", "100ms",
		"--tls-cert", files["server.crt"], "--tls-key", files["server.key"], "--tls-client-ca", files["ca.crt"])
	cp.Stdout, cp.Stderr = cpLog, cpLog
	cp.SysProcAttr = redistest.ChildAttr()
	if err := cp.Start(); err != nil {
		t.Fatal(err)
	}
	cpDone := make(chan struct{})
	go func() { _ = cp.Wait(); close(cpDone) }()
	t.Cleanup(func() {
		_ = cp.Process.Signal(syscall.SIGTERM)
		select {
		case <-cpDone:
		case <-time.After(10 * time.Second):
			t.Errorf("the example control plane did not exit; killing pid %d", cp.Process.Pid)
			_ = cp.Process.Kill()
			<-cpDone
		}
		if t.Failed() {
			t.Logf("control plane log:\n%s", cpLog.String())
		}
	})
	testkit.WaitForEvery(t, "the example control plane serving", 10*time.Second, pollEvery, func() bool { return strings.Contains(cpLog.String(), "serving RateLimitConfig") })

	// The manifest's env, its paths and addresses pointed at this test's.
	rs := redistest.StartServer(t)
	local := map[string]string{
		"RLS_XDS_SERVER": cpAddr, "RLS_REDIS_URL": rs.URL(),
		"RLS_XDS_TLS_CA": files["ca.crt"], "RLS_XDS_TLS_CERT": files["client.crt"], "RLS_XDS_TLS_KEY": files["client.key"],
		"RLS_GRPC_TLS_CERT": files["server.crt"], "RLS_GRPC_TLS_KEY": files["server.key"], "RLS_GRPC_TLS_CLIENT_CA": files["ca.crt"],
	}
	var procEnv []string
	for _, name := range order {
		v := env[name]
		if l, ok := local[name]; ok {
			if strings.HasPrefix(v, "/certs/") != strings.HasPrefix(l, dir) {
				t.Fatalf("%s=%s in the manifest, %s here: a path for a path, an address for an address", name, v, l)
			}
			v = l
		}
		procEnv = append(procEnv, name+"="+v)
	}
	p := startRLSEnv(t, rlsBin, dir, procEnv)
	envoy := &tls.Config{RootCAs: x509.NewCertPool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	envoy.RootCAs.AddCert(ca.Cert)
	kp, err := tls.X509KeyPair(client.CertPEM, client.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	envoy.Certificates = []tls.Certificate{kp}
	p.conn = tlDial(t, p.GRPCAddr, envoy)
	p.waitServing(t, 20*time.Second)

	route := func(user string) *rlcommon.RateLimitDescriptor {
		return desc("httproute/default/backend/rule/0/match/0/www_example_com", "httproute/default/backend/rule/0/match/0/www_example_com",
			"rule-0-match-0", user)
	}
	allows := func(user string, n int) {
		t.Helper()
		for i := 0; i <= n; i++ {
			got := should(t, p.client(), "default/eg/http", route(user)).GetOverallCode()
			if want := (i == n); (got == rlsv3.RateLimitResponse_OVER_LIMIT) != want {
				t.Fatalf("%s request %d: %v (a limit of %d)", user, i+1, got, n)
			}
		}
	}
	allows("u1", 3)
	testkit.WaitForEvery(t, "the example logs rls's ACK of version 1", 5*time.Second, pollEvery, func() bool {
		return strings.Contains(cpLog.String(), `ACK from envoy-ratelimit: version "1"`)
	})

	writeResources(fmt.Sprintf(egResources, 5))
	testkit.WaitForEvery(t, "ACK of version 2", 10*time.Second, pollEvery, func() bool { return strings.Contains(cpLog.String(), `ACK from envoy-ratelimit: version "2"`) })
	allows("u2", 5)

	writeResources(strings.Replace(fmt.Sprintf(egResources, 9), "MINUTE", "UNKNOWN", 1))
	testkit.WaitForEvery(t, "NACK of version 3", 10*time.Second, pollEvery, func() bool {
		return strings.Contains(cpLog.String(), `NACK from envoy-ratelimit: version "2" kept, response`) &&
			strings.Contains(cpLog.String(), `xds:default/eg/http: descriptors[0].descriptors[0].rate_limit.unit: invalid unit "UNKNOWN"`)
	})
	allows("u3", 5)
}

// TestXDSReadmeSnippets: the Go code docs/xds.md shows for a control plane
// is examples/xds-control-plane's, line for line, so it compiles and
// TestXDSEnvoyGatewayStyle runs it.
func TestXDSReadmeSnippets(t *testing.T) {
	light(t)
	src, err := os.ReadFile("../examples/xds-control-plane/main.go")
	if err != nil {
		t.Fatal(err)
	}
	norm := func(s string) string {
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, l)
			}
		}
		return strings.Join(lines, "\n")
	}
	example := norm(string(src))
	n := 0
	for _, b := range docBlocks(t, "docs/xds.md") {
		if b.lang != "go" {
			continue
		}
		n++
		if !strings.Contains(example, norm(b.text)) {
			t.Errorf("docs/xds.md:%d: this Go block is not in examples/xds-control-plane/main.go:\n%s", b.line, b.text)
		}
	}
	if n < 2 {
		t.Errorf("docs/xds.md has %d Go blocks, want the control plane's two", n)
	}
}

// TestXDSStartWithoutConfig: with --allow-empty-config (upstream's
// FORCE_START_WITHOUT_INITIAL_CONFIG, which Envoy Gateway sets) rls serves
// before the xDS server sends anything, every descriptor without a rule,
// and applies the config when it comes.
func TestXDSStartWithoutConfig(t *testing.T) {
	light(t)
	cp := xdstest.Start(t, "127.0.0.1:0")
	p := startRLS(t, t.TempDir(), "--config-source", "xds", "--xds-server", cp.Addr, "--xds-node-id", "test",
		"--allow-empty-config")
	if code, _ := xdsHealthcheck(t, p); code != http.StatusOK {
		t.Errorf("/healthcheck before any config with --allow-empty-config: %d, want 200", code)
	}
	for i := 0; i < 5; i++ {
		if got := should(t, p.client(), "xds", desc("tenant", "a")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d before any config: %v, want OK (no rule yet)", i+1, got)
		}
	}
	cp.Set(t, "test", "1", tenantLimit(3))
	if _, ack := cp.AnswerTo(t, "1", 10*time.Second); ack.GetErrorDetail() != nil || ack.GetVersionInfo() != "1" {
		t.Fatalf("version 1: %v, want an ACK", ack)
	}
	xdsAllows(t, p, "b", 3)
}
