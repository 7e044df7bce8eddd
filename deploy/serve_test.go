package deploy

// A running rls for the dashboard test: the binary TestMain built, on
// loopback ports, with its gRPC client and its /metrics.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
)

// serving is one rls process started by startServing.
type serving struct {
	httpAddr string
	client   rlsv3.RateLimitServiceClient
	log      *testkit.Buffer
}

// startServing starts rls serve on configDir with args, waits until its
// gRPC health says SERVING, and stops it (SIGTERM, then SIGKILL after 15 s)
// when the test ends.
func startServing(t *testing.T, configDir string, args ...string) *serving {
	t.Helper()
	grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
	p := &serving{httpAddr: httpAddr, log: &testkit.Buffer{}}
	cmd := exec.Command(rlsBin, append([]string{"serve", "--config-dir", configDir,
		"--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--debug-addr", ""}, args...)...)
	cmd.SysProcAttr = redistest.ChildAttr()
	cmd.Env = cleanEnv()
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("rls log:\n%s", p.log.String())
		}
	})
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p.client = rlsv3.NewRateLimitServiceClient(conn)
	hc := healthpb.NewHealthClient(conn)
	exited := false
	testkit.WaitFor(t, "rls SERVING", 20*time.Second, func() bool {
		select {
		case <-done:
			exited = true
			return true
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && r.Status == healthpb.HealthCheckResponse_SERVING
	})
	if exited {
		t.Fatalf("rls exited before serving:\n%s", p.log.String())
	}
	return p
}

// scrape returns the text of rls's /metrics.
func (p *serving) scrape(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
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
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// cleanEnv is the test's environment without RLS_* and OTEL_* variables,
// so a developer's shell cannot change what the binary under test does.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RLS_") && !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return env
}

// freeAddr returns a loopback address free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// should calls ShouldRateLimit with a bounded deadline.
func should(t *testing.T, c rlsv3.RateLimitServiceClient, domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// writeConfig writes files (name → YAML) into a new directory.
func writeConfig(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
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
