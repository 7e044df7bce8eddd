package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
)

// upstreamBin finds envoyproxy/ratelimit's service_cmd (make deps installs
// the version scripts/bench.sh runs).
func upstreamBin(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("service_cmd"); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", "service_cmd")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("envoyproxy/ratelimit's service_cmd is not installed: make deps installs it")
	return ""
}

// startUpstream runs upstream's service_cmd with env (upstream's variables)
// on upstream's example config, and returns a client connection to it.
func startUpstream(t *testing.T, env map[string]string) *grpc.ClientConn {
	t.Helper()
	dir := t.TempDir()
	cfgDir := filepath.Join(dir, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.yaml", "example.yaml"} {
		b, err := os.ReadFile(filepath.Join(upstreamExampleConfig, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cfgDir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	addrs := freeAddrs(t, 3)
	port := func(a string) string { return a[strings.LastIndexByte(a, ':')+1:] }
	cmd := exec.Command(upstreamBin(t))
	cmd.SysProcAttr = redistest.ChildAttr()
	cmd.Env = append(cleanEnv(), "RUNTIME_ROOT="+dir, "RUNTIME_SUBDIRECTORY=ratelimit",
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+port(addrs[0]), "HOST=127.0.0.1", "PORT="+port(addrs[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+port(addrs[2]))
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	log := &testkit.Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // by its PID
		<-done
		if t.Failed() {
			t.Logf("upstream log:\n%s", log.String())
		}
	})
	conn, err := grpc.NewClient(addrs[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := rlsv3.NewRateLimitServiceClient(conn)
	testkit.WaitForEvery(t, "upstream answering", 20*time.Second, pollEvery, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "mongo_cps", Descriptors: descs(desc("database", "default"))})
		return err == nil
	})
	return conn
}

func descs(ds ...*rlcommon.RateLimitDescriptor) []*rlcommon.RateLimitDescriptor { return ds }

// TestDropinMixedFleet: one upstream replica and one rls replica run as
// ratelimit share one Redis and upstream's example config, as during a
// rolling update. A burst of 400 requests from 200 clients, spread over
// both, admits no more than the limit (foo: 2 a minute): rls counts in
// upstream's keys. Without that, each would admit 2.
func TestDropinMixedFleet(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	env := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr, "USE_STATSD": "false",
		"RUNTIME_WATCH_ROOT": "false", "LOG_LEVEL": "warn"}
	up := rlsv3.NewRateLimitServiceClient(startUpstream(t, env))
	ours := startAsRatelimit(t, env).client()
	// rls alone writes upstream's key (domain_key_value_windowstart).
	should(t, ours, "rl", desc("foo", "solo"))
	if keys, err := srv.Client().Keys(t.Context(), "rl_foo_solo_*").Result(); err != nil || len(keys) != 1 {
		t.Fatalf("after one rls call, upstream's keys %v (%v), want one", keys, err)
	}
	// One fixed window of a minute: do not start near its end.
	if s := time.Now().Second(); s > 45 {
		time.Sleep(time.Duration(61-s) * time.Second) // the next minute's window: real time on purpose
	}
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	for i := range 200 {
		c := up
		if i%2 == 1 {
			c = ours
		}
		wg.Go(func() {
			for range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: descs(desc("foo", "mixed"))})
				cancel()
				switch {
				case err != nil:
					t.Errorf("client %d: %v", i, err)
				case r.OverallCode == rlsv3.RateLimitResponse_OK:
					admitted.Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if a := admitted.Load(); a < 1 || a > 2 || a+denied.Load() != 400 {
		t.Fatalf("admitted %d, denied %d of 400; want 1 or 2 admitted (the limit is 2 a minute, shared)", a, denied.Load())
	}
	// Both count in upstream's key: domain_key_value_windowstart.
	keys, err := srv.Client().Keys(t.Context(), "rl_foo_mixed_*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("upstream's keys %v (%v), want one window's", keys, err)
	}
}
