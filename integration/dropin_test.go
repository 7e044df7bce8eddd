package integration

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
)

// upstreamExampleConfig is envoyproxy/ratelimit's examples/ratelimit/config,
// copied unchanged from its source tree.
const upstreamExampleConfig = "testdata/upstream-example"

// startAsRatelimit runs the rls binary under the name ratelimit, as the
// upstream image's /bin/ratelimit, without arguments: everything comes from
// env, upstream's variables. The config of upstream's example is put where
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config says (env's RUNTIME_ROOT is set
// here). Ports are fresh loopback ones.
func startAsRatelimit(t testing.TB, env map[string]string) *rlsProc {
	t.Helper()
	return startAsRatelimitConn(t, env, nil)
}

// startAsRatelimitConn is startAsRatelimit with the client connection dial
// makes to GRPC_PORT's address (nil: gRPC over TCP, plaintext).
func startAsRatelimitConn(t testing.TB, env map[string]string, dial func(addr string) *grpc.ClientConn) *rlsProc {
	t.Helper()
	files := map[string]string{}
	for _, f := range []string{"config.yaml", "example.yaml"} {
		b, err := os.ReadFile(filepath.Join(upstreamExampleConfig, f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = string(b)
	}
	p := startRatelimit(t, env, files, dial)
	p.waitServing(t, 20*time.Second)
	return p
}

// startRatelimit runs the binary as ratelimit with env and the config files
// (name → YAML, in RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config), without
// waiting for it to serve.
func startRatelimit(t testing.TB, env, files map[string]string, dial func(addr string) *grpc.ClientConn) *rlsProc {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin", "ratelimit")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(rlsBin, bin); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "data")
	cfgDir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, body := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(cfgDir, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cfgDir, f), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	addrs := freeAddrs(t, 3)
	port := func(a string) string { return a[strings.LastIndexByte(a, ':')+1:] }
	vars := map[string]string{
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit",
		"GRPC_HOST": "127.0.0.1", "GRPC_PORT": port(addrs[0]),
		"HOST": "127.0.0.1", "PORT": port(addrs[1]),
		"DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": port(addrs[2]),
	}
	for k, v := range env {
		vars[k] = v
	}
	p := &rlsProc{GRPCAddr: addrs[0], HTTPAddr: addrs[1], ConfigDir: cfgDir, Log: &testkit.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin)
	p.cmd.SysProcAttr = redistest.ChildAttr()
	p.cmd.Env = cleanEnv()
	for k, v := range vars {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.Log, p.Log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exitErr = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("rls log (%s):\n%s", p.GRPCAddr, p.Log.String())
		}
	})
	if dial != nil {
		p.conn = dial(p.GRPCAddr)
	} else {
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		p.conn = conn
		t.Cleanup(func() { conn.Close() })
	}
	return p
}

// upstreamExampleEnv is the environment of upstream's example deployment
// (its docker-compose-example.yml), statsd off, with redisAddr.
func upstreamExampleEnv(redisAddr string) map[string]string {
	return map[string]string{
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redisAddr, "RUNTIME_WATCH_ROOT": "false",
		"USE_STATSD": "false", "LOG_LEVEL": "debug",
	}
}

// TestDropinUpstreamDeployment: the binary run as ratelimit with upstream's
// example deployment's environment and its example config answers as
// upstream does: limits, nested descriptors, a zero limit, shadow mode,
// unlimited rules and an unknown domain; it counts in the Redis of
// REDIS_URL, and warns once about the variable it has no use for.
func TestDropinUpstreamDeployment(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	p := startAsRatelimit(t, upstreamExampleEnv(srv.Addr))
	c := p.client()
	code := func(domain string, kv ...string) rlsv3.RateLimitResponse_Code {
		return should(t, c, domain, desc(kv...)).OverallCode
	}
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	// foo: 2 a minute.
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, over} {
		if got := code("rl", "foo", "f1"); got != want {
			t.Fatalf("foo call %d: %v, want %v", i+1, got, want)
		}
	}
	// foo/bar: 3 a minute; foo/bar=banned: 0.
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, ok, over} {
		if got := code("rl", "foo", "f2", "bar", "b"); got != want {
			t.Fatalf("foo/bar call %d: %v, want %v", i+1, got, want)
		}
	}
	if got := code("rl", "foo", "f3", "bar", "banned"); got != over {
		t.Fatalf("foo/bar=banned: %v, want OVER_LIMIT", got)
	}
	// foo/baz=shady: 3 a minute in shadow mode: always OK.
	for i := range 5 {
		if got := code("rl", "foo", "f4", "baz", "shady"); got != ok {
			t.Fatalf("shadow call %d: %v, want OK", i+1, got)
		}
	}
	// Unlimited, an unknown domain, and mongo_cps's 500 a second.
	for i := range 10 {
		if code("rl", "qux", "q") != ok || code("rl", "foo", "f5", "bay", "y") != ok || code("nope", "a", "b") != ok {
			t.Fatalf("unlimited or unknown call %d not OK", i+1)
		}
	}
	r := should(t, c, "mongo_cps", desc("database", "users"))
	if r.OverallCode != ok || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 500 || r.Statuses[0].LimitRemaining != 499 {
		t.Fatalf("mongo_cps: %v", r)
	}
	// Upstream's /json on PORT: the same decisions, 429 when over.
	for i, want := range []int{200, 200, 429} {
		resp, err := http.Post("http://"+p.HTTPAddr+"/json", "application/json",
			strings.NewReader(`{"domain":"rl","descriptors":[{"entries":[{"key":"foo","value":"json"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("/json call %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	// The counters are in REDIS_URL's Redis.
	if n, err := srv.Client().DBSize(t.Context()).Result(); err != nil || n == 0 {
		t.Fatalf("Redis holds %d keys (%v), want the counters", n, err)
	}
	log := p.Log.String()
	if strings.Count(log, "RUNTIME_WATCH_ROOT=false has no effect") != 1 || !strings.Contains(log, "level=INFO") {
		// INFO lines show LOG_LEVEL=debug in force: upstream's default, WARN, hides them.
		t.Errorf("want one WARN about RUNTIME_WATCH_ROOT, and INFO lines; log:\n%s", log)
	}
}

// TestDropinStats: as ratelimit with upstream's statsd variables (and
// USE_PROMETHEUS), the binary sends upstream's stat names to a UDP
// listener playing statsd, with EXTRA_TAGS, and serves the mapped series
// on PROMETHEUS_ADDR as upstream does.
func TestDropinStats(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	promAddr := freeAddr(t)
	env := upstreamExampleEnv(srv.Addr)
	_, port, _ := net.SplitHostPort(udp.LocalAddr().String())
	// STATSD_PROTOCOL is gostats's (TCP by default, as upstream's sink).
	for k, v := range map[string]string{"USE_STATSD": "true", "STATSD_PROTOCOL": "udp", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": port,
		"STATS_FLUSH_INTERVAL": "200ms", "EXTRA_TAGS": "env:ci", "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": promAddr} {
		env[k] = v
	}
	p := startAsRatelimit(t, env)
	c := p.client()
	for range 3 { // foo: 2 a minute
		should(t, c, "rl", desc("foo", "f"))
	}
	want := map[string]uint64{
		"ratelimit.service.rate_limit.rl.foo.total_hits.__env=ci":   3,
		"ratelimit.service.rate_limit.rl.foo.within_limit.__env=ci": 2,
		"ratelimit.service.rate_limit.rl.foo.over_limit.__env=ci":   1,
		"ratelimit.service.config_load_success.__env=ci":            1,
		"ratelimit_server.ShouldRateLimit.total_requests.__env=ci":  3,
	}
	got := map[string]uint64{}
	buf := make([]byte, 65536)
	deadline := time.Now().Add(15 * time.Second)
	for !statsReached(got, want) && time.Now().Before(deadline) {
		_ = udp.SetReadDeadline(deadline)
		n, _, err := udp.ReadFrom(buf)
		if err != nil {
			break
		}
		for _, line := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
			name, rest, _ := strings.Cut(line, ":")
			if v, ok := strings.CutSuffix(rest, "|c"); ok {
				n, _ := strconv.ParseUint(v, 10, 64)
				got[name] += n
			}
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	var body string
	testkit.WaitForEvery(t, "upstream's series on PROMETHEUS_ADDR", 10*time.Second, pollEvery, func() bool {
		resp, err := http.Get("http://" + promAddr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return strings.Contains(body, `ratelimit_service_rate_limit_total_hits{domain="rl",env="ci",key1="foo"} 3`)
	})
	if !strings.Contains(body, "rls_decisions_total") {
		t.Error("PROMETHEUS_ADDR's /metrics lacks rls's own series")
	}
}

// statsReached reports whether every counter of want has reached its value.
func statsReached(got, want map[string]uint64) bool {
	for k, v := range want {
		if got[k] < v {
			return false
		}
	}
	return true
}

// TestDropinUnixSockets: rls reaches Redis through redis-server's Unix
// socket (unix:// in --redis-url, and REDIS_SOCKET_TYPE=unix as
// ratelimit) and serves gRPC on a Unix socket (--grpc-uds, GRPC_UDS) with
// the connection cap of TCP: at --max-conns, an idle connection makes room
// for a new one.
func TestDropinUnixSockets(t *testing.T) {
	light(t)
	dir, err := os.MkdirTemp("", "rls-uds-") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	redisSock, grpcSock := filepath.Join(dir, "redis.sock"), filepath.Join(dir, "rls.sock")
	srv := redistest.StartServer(t, "--unixsocket", redisSock, "--unixsocketperm", "700")
	udsConn := func(t *testing.T, path string) *grpc.ClientConn {
		conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}

	t.Run("flags", func(t *testing.T) {
		p := startRLSNoWait(t, writeConfig(t, map[string]string{"rl.yaml": "domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"}),
			"--store", "redis", "--redis-url", "unix://"+redisSock, "--grpc-uds", grpcSock, "--max-conns", "2")
		p.conn = udsConn(t, grpcSock)
		p.waitServing(t, 20*time.Second)
		c := p.client()
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
			if got := should(t, c, "rl", desc("k", "v")).OverallCode; got != want {
				t.Fatalf("call %d: %v, want %v", i+1, got, want)
			}
		}
		if n, err := srv.Client().DBSize(t.Context()).Result(); err != nil || n == 0 {
			t.Fatalf("Redis holds %d keys (%v): rls did not count through the socket", n, err)
		}
		// The gRPC client holds one of the two connections; a second, which
		// never calls, is kept until a third comes, and then makes room for
		// it: Unix-socket connections are told apart, and idle ones evicted,
		// as on TCP (they used to count busy for good, and a full socket
		// refused every new client). The client still gets its answers.
		second, err := net.Dial("unix", grpcSock)
		if err != nil {
			t.Fatal(err)
		}
		defer second.Close()
		third, err := net.Dial("unix", grpcSock)
		if err != nil {
			t.Fatal(err)
		}
		defer third.Close()
		_ = second.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, second); err != nil {
			t.Errorf("the connection that never called, at --max-conns: %v, want it closed (EOF) to make room", err)
		}
		if got := should(t, c, "rl", desc("k", "other")).OverallCode; got != rlsv3.RateLimitResponse_OK {
			t.Errorf("the client after the eviction: %v, want OK", got)
		}
		if _, err := net.Dial("tcp", p.GRPCAddr); err == nil {
			t.Error("--grpc-addr is served too; --grpc-uds replaces it")
		}
	})

	t.Run("as ratelimit", func(t *testing.T) {
		env := map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": redisSock, "GRPC_UDS": grpcSock, "USE_STATSD": "false"}
		p := startAsRatelimitConn(t, env, func(string) *grpc.ClientConn { return udsConn(t, grpcSock) })
		c := p.client()
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
			if got := should(t, c, "rl", desc("foo", "uds")).OverallCode; got != want {
				t.Fatalf("call %d: %v, want %v", i+1, got, want)
			}
		}
	})
}
