// Package integration holds black-box tests: they build the real rls binary,
// start it (and real redis-server processes) on free loopback ports, and talk
// to it over gRPC and HTTP as Envoy and operators do.
package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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

// rlsBin is the binary under test, built once by TestMain with the race
// detector on. rlsFastBin is the same code built as for production, for the
// tests that assert latency bounds (the race detector slows rls several
// times over).
var rlsBin, rlsFastBin string

func TestMain(m *testing.M) {
	if os.Getenv("HC_FLOOD_ADDR") != "" {
		// The flood process of TestHostileZeroWindowFlood runs no rls:
		// building (linking) two binaries would take its first seconds of
		// flood, and CPU from the latency it measures.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "rls-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rlsBin, rlsFastBin = filepath.Join(dir, "rls"), filepath.Join(dir, "rls-fast")
	// Both at once: each link is one process, and the two share the cache.
	builds := [][]string{{"build", "-race", "-o", rlsBin, "../cmd/rls"}, {"build", "-o", rlsFastBin, "../cmd/rls"}}
	errs := make([]error, len(builds))
	var wg sync.WaitGroup
	for i, args := range builds {
		wg.Go(func() {
			build := exec.Command("go", args...)
			build.Stdout, build.Stderr = os.Stdout, os.Stderr
			errs[i] = build.Run()
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			fmt.Fprintln(os.Stderr, "build rls:", err)
			os.Exit(1)
		}
	}
	raiseParallel("64")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	return freeAddrs(t, 1)[0]
}

// freeAddrs returns n free loopback addresses, none handed out before in
// this test process: the kernel may give a port it just freed to the next
// listener, and a gRPC and an HTTP port once came out the same.
func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, 0, n)
	for tries := 0; len(addrs) < n; tries++ {
		if tries > 1000 {
			t.Fatal("no fresh free port in 1000 tries")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		a := l.Addr().String()
		handedOutMu.Lock()
		fresh := !handedOut[a]
		handedOut[a] = true
		handedOutMu.Unlock()
		if fresh {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

var (
	handedOutMu sync.Mutex
	handedOut   = map[string]bool{}
)

// rlsProc is one running rls binary.
type rlsProc struct {
	GRPCAddr, HTTPAddr string
	ConfigDir          string // the directory of its descriptor YAML
	cmd                *exec.Cmd
	Log                *testkit.Buffer
	done               chan struct{}
	exitErr            error
	conn               *grpc.ClientConn
	ownConn            *grpc.ClientConn // the connection launch made (a test may set conn to its own)
	bin                string
	env, args          []string
	relaunches         int
}

// startRLS starts the binary with a config directory and extra flags, waits
// until its gRPC health says SERVING, and stops it when the test ends.
func startRLS(t testing.TB, configDir string, args ...string) *rlsProc {
	t.Helper()
	p := startRLSNoWait(t, configDir, args...)
	p.waitServing(t, 20*time.Second)
	return p
}

// startRLSFast is startRLS with the binary built without the race detector,
// for tests that measure latency.
func startRLSFast(t testing.TB, configDir string, args ...string) *rlsProc {
	t.Helper()
	p := startRLSBin(t, rlsFastBin, configDir, args...)
	p.waitServing(t, 20*time.Second)
	return p
}

func startRLSNoWait(t testing.TB, configDir string, args ...string) *rlsProc {
	t.Helper()
	return startRLSBin(t, rlsBin, configDir, args...)
}

func startRLSBin(t testing.TB, bin, configDir string, args ...string) *rlsProc {
	t.Helper()
	return startRLSBinEnv(t, bin, nil, configDir, args...)
}

// startRLSEnv is startRLSBinEnv with its arguments in another order (the
// xDS tests' helper).
func startRLSEnv(t testing.TB, bin, configDir string, env []string, args ...string) *rlsProc {
	t.Helper()
	return startRLSBinEnv(t, bin, env, configDir, args...)
}

// startRLSBinEnv is startRLSBin with env (KEY=value) added to cleanEnv's.
func startRLSBinEnv(t testing.TB, bin string, env []string, configDir string, args ...string) *rlsProc {
	t.Helper()
	p := newRLSProc(t, bin, env, configDir, args...)
	p.launch(t, freeAddrs(t, 2))
	return p
}

// newRLSProc is an rls not started yet, stopped (and its log shown if the
// test failed) when the test ends.
func newRLSProc(t testing.TB, bin string, env []string, configDir string, args ...string) *rlsProc {
	p := &rlsProc{ConfigDir: configDir, Log: &testkit.Buffer{}, bin: bin, env: env, args: args}
	t.Cleanup(func() {
		p.stop(t)
		// The race detector reports to the log and carries on: a race in
		// rls fails the test that drove it, here.
		if strings.Contains(p.Log.String(), "WARNING: DATA RACE") {
			t.Errorf("the race detector found a data race in rls (%s)", bin)
		}
		if t.Failed() {
			t.Logf("rls log (%s):\n%s", p.GRPCAddr, p.Log.String())
		}
		if p.conn != nil {
			p.conn.Close()
		}
		if p.ownConn != p.conn {
			p.ownConn.Close()
		}
	})
	return p
}

// launch starts the binary on addrs (gRPC, HTTP), with a client connection
// to the first.
func (p *rlsProc) launch(t testing.TB, addrs []string) {
	t.Helper()
	p.GRPCAddr, p.HTTPAddr = addrs[0], addrs[1]
	all := append([]string{"serve", "--config-dir", p.ConfigDir, "--grpc-addr", p.GRPCAddr,
		"--http-addr", p.HTTPAddr, "--debug-addr", "", "--admin-addr", ""}, p.args...)
	p.cmd = exec.Command(p.bin, all...)
	p.cmd.SysProcAttr = redistest.ChildAttr()
	p.cmd.Env = append(cleanEnv(), p.env...)
	p.cmd.Stdout, p.cmd.Stderr = p.Log, p.Log
	p.done = make(chan struct{})
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd, done := p.cmd, p.done
	go func() { p.exitErr = cmd.Wait(); close(done) }()
	conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	p.conn, p.ownConn = conn, conn
}

// relaunchOnTakenPort starts rls again on new addresses when it exited
// because another process took a port freeAddrs handed out (it listened
// and closed, and anything on the machine may bind the port before rls
// does), as long as the test still talks through the connection launch
// made. It reports whether it did.
func (p *rlsProc) relaunchOnTakenPort(t testing.TB) bool {
	t.Helper()
	if p.relaunches >= 3 || p.conn != p.ownConn || !strings.Contains(p.Log.String(), "address already in use") {
		return false
	}
	p.relaunches++
	t.Logf("rls could not bind %s or %s (taken since freeAddrs freed it): starting it again on new addresses", p.GRPCAddr, p.HTTPAddr)
	fmt.Fprintf(p.Log, "--- relaunched: a port was taken ---\n")
	p.conn.Close()
	p.launch(t, freeAddrs(t, 2))
	return true
}

// cleanEnv is the test's environment without RLS_* and OTEL_* variables,
// so a developer's shell cannot change what the binary under test does (or
// turn tracing on), and with GORACE's atexit_sleep_ms=0: the race-built
// rls otherwise sleeps a second before it exits, which every stop waited.
func cleanEnv() []string {
	var env []string
	race := "atexit_sleep_ms=0"
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "GORACE="):
			if !strings.Contains(kv, "atexit_sleep_ms") {
				race = strings.TrimPrefix(kv, "GORACE=") + " " + race
			} else {
				race = strings.TrimPrefix(kv, "GORACE=")
			}
		case !strings.HasPrefix(kv, "RLS_") && !strings.HasPrefix(kv, "OTEL_"):
			env = append(env, kv)
		}
	}
	return append(env, "GORACE="+race)
}

func (p *rlsProc) waitServing(t testing.TB, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	hc := healthpb.NewHealthClient(p.conn)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			if p.relaunchOnTakenPort(t) {
				hc = healthpb.NewHealthClient(p.conn)
				continue
			}
			t.Fatalf("rls exited before serving: %v\n%s", p.exitErr, p.Log.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
		time.Sleep(50 * time.Millisecond) // the poll's interval
	}
	t.Fatalf("rls not SERVING within %v\n%s", within, p.Log.String())
}

// pollEvery is how often the tests evaluate what they wait for: most
// conditions scrape /metrics or call rls, which should not be hammered.
const pollEvery = 50 * time.Millisecond

// stop sends SIGTERM and waits for the exit, killing by PID after 15 s.
func (p *rlsProc) stop(t testing.TB) {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Errorf("rls did not exit 15s after SIGTERM; killing pid %d", p.cmd.Process.Pid)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// wait waits for the process to exit by itself and returns its error.
func (p *rlsProc) wait(t testing.TB, within time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.exitErr
	case <-time.After(within):
		t.Fatalf("rls still running after %v", within)
		return nil
	}
}

func (p *rlsProc) client() rlsv3.RateLimitServiceClient {
	return rlsv3.NewRateLimitServiceClient(p.conn)
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
func should(t testing.TB, c rlsv3.RateLimitServiceClient, domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
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
func writeConfig(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

var sigterm = syscall.SIGTERM
