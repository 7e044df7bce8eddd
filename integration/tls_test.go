package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
	"github.com/rls-project/rls/pkg/tlsconfig/tlstest"
)

// The TLS tests: the gRPC port over TLS and mutual TLS (with certificates
// rotated while running), Redis over TLS with a client certificate, and
// passwords kept out of logs and error output.

// tlFiles is a server CA with a server pair, and a client CA with a client
// pair, written to a directory.
type tlFiles struct {
	dir                           string
	ca, clientCA                  *tlstest.CA
	server, client                tlstest.Pair
	caFile, certFile, keyFile     string
	clientCAFile                  string
	clientCertFile, clientKeyFile string
}

func tlNewFiles(t *testing.T) *tlFiles {
	t.Helper()
	f := &tlFiles{dir: t.TempDir(), ca: tlstest.NewCA(t, "rls test CA"), clientCA: tlstest.NewCA(t, "rls test client CA")}
	f.server = f.ca.Server(t, "rls-1")
	f.client = f.clientCA.Client(t, "envoy")
	f.caFile = tlstest.Write(t, f.dir, "ca.crt", f.ca.PEM)
	f.certFile = tlstest.Write(t, f.dir, "tls.crt", f.server.CertPEM)
	f.keyFile = tlstest.Write(t, f.dir, "tls.key", f.server.KeyPEM)
	f.clientCAFile = tlstest.Write(t, f.dir, "client-ca.crt", f.clientCA.PEM)
	f.clientCertFile = tlstest.Write(t, f.dir, "client.crt", f.client.CertPEM)
	f.clientKeyFile = tlstest.Write(t, f.dir, "client.key", f.client.KeyPEM)
	return f
}

// clientConfig trusts the server CA and presents the given certificates.
func (f *tlFiles) clientConfig(t *testing.T, certs ...tlstest.Pair) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(f.ca.Cert)
	c := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	for _, p := range certs {
		kp, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = append(c.Certificates, kp)
	}
	return c
}

// tlStartRLS starts rls with TLS flags and waits until its gRPC health, asked
// over TLS with client, says SERVING; p.client() then speaks TLS too.
func tlStartRLS(t *testing.T, configDir string, client *tls.Config, args ...string) *rlsProc {
	t.Helper()
	p := startRLSNoWait(t, configDir, args...)
	p.conn = tlDial(t, p.GRPCAddr, client)
	p.waitServing(t, 20*time.Second)
	return p
}

// tlDial returns a gRPC client connection over TLS, closed when t ends.
func tlDial(t *testing.T, addr string, c *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(c)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// tlShould calls ShouldRateLimit and returns the error, for refusals.
func tlShould(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx,
		&rlsv3.RateLimitRequest{Domain: "example", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key", "x")}})
	return err
}

// tlServedSerial does a raw TLS handshake with the gRPC port (ALPN h2) and
// returns the serial number of the certificate served.
func tlServedSerial(t *testing.T, addr string, c *tls.Config) *big.Int {
	t.Helper()
	c = c.Clone()
	c.NextProtos = []string{"h2"}
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, c)
	if err != nil {
		t.Fatalf("tls.Dial %s: %v", addr, err)
	}
	defer conn.Close()
	st := conn.ConnectionState()
	if st.NegotiatedProtocol != "h2" {
		t.Errorf("ALPN negotiated %q, want h2", st.NegotiatedProtocol)
	}
	return st.PeerCertificates[0].SerialNumber
}

// tlHealth GETs /healthcheck (plaintext HTTP even with TLS on gRPC).
func tlHealth(t *testing.T, p *rlsProc) string {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.HTTPAddr + "/healthcheck")
	if err != nil {
		t.Fatalf("GET /healthcheck: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestTLSMutualGRPC(t *testing.T) {
	light(t)
	f := tlNewFiles(t)
	good := f.clientConfig(t, f.client)
	p := tlStartRLS(t, "../config", good,
		"--grpc-tls-cert", f.certFile, "--grpc-tls-key", f.keyFile, "--grpc-tls-client-ca", f.clientCAFile)

	if r := should(t, p.client(), "example", desc("api_key", "x")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("client with a certificate of the client CA: %v, want OK", r.OverallCode)
	}
	refused := map[string]grpc.DialOption{
		"no client certificate": grpc.WithTransportCredentials(credentials.NewTLS(f.clientConfig(t))),
		"certificate of another CA": grpc.WithTransportCredentials(credentials.NewTLS(
			f.clientConfig(t, tlstest.NewCA(t, "other CA").Client(t, "mallory")))),
		"certificate of the server CA": grpc.WithTransportCredentials(credentials.NewTLS(
			f.clientConfig(t, f.ca.Client(t, "not-a-client-CA")))),
		"plaintext": grpc.WithTransportCredentials(insecure.NewCredentials()),
	}
	for name, opt := range refused {
		conn, err := grpc.NewClient(p.GRPCAddr, opt)
		if err != nil {
			t.Fatal(err)
		}
		err = tlShould(conn)
		conn.Close()
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: ShouldRateLimit = %v, want Unavailable (refused in the handshake)", name, err)
		}
	}
	// A raw handshake without a certificate fails too (TLS 1.3 reports the
	// refusal on the first read).
	conn, err := tls.Dial("tcp", p.GRPCAddr, &tls.Config{RootCAs: f.clientConfig(t).RootCAs, ServerName: "127.0.0.1", NextProtos: []string{"h2"}})
	if err == nil {
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("raw handshake without a client certificate: %v, want a certificate error", err)
	}
	// A TLS 1.1 client is refused.
	old := good.Clone()
	old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	if conn, err := tls.Dial("tcp", p.GRPCAddr, old); err == nil {
		conn.Close()
		t.Error("a TLS 1.1 handshake succeeded; the minimum is TLS 1.2")
	}
	// Health and metrics stay plaintext HTTP.
	if h := tlHealth(t, p); !strings.HasPrefix(h, "OK") {
		t.Errorf("/healthcheck over plaintext HTTP: %q", h)
	}
}

func TestTLSCertificateRotation(t *testing.T) {
	light(t)
	f := tlNewFiles(t)
	cfg := f.clientConfig(t, f.client)
	p := tlStartRLS(t, "../config", cfg,
		"--grpc-tls-cert", f.certFile, "--grpc-tls-key", f.keyFile, "--grpc-tls-client-ca", f.clientCAFile)
	if s := tlServedSerial(t, p.GRPCAddr, cfg); s.Cmp(f.server.Cert.SerialNumber) != 0 {
		t.Fatalf("served serial %v, want %v", s, f.server.Cert.SerialNumber)
	}
	should(t, p.client(), "example", desc("api_key", "x"))

	// Rotate: a new pair, each file replaced by a rename as rotators do
	// (between the two renames the pair does not match).
	next := f.ca.Server(t, "rls-2")
	start := time.Now()
	tlstest.WriteAtomic(t, f.dir, "tls.crt", next.CertPEM)
	time.Sleep(20 * time.Millisecond) // the pair mismatched a moment, as rotators do: real time on purpose
	tlstest.WriteAtomic(t, f.dir, "tls.key", next.KeyPEM)
	for {
		if tlServedSerial(t, p.GRPCAddr, cfg).Cmp(next.Cert.SerialNumber) == 0 {
			break
		}
		if time.Since(start) > 2500*time.Millisecond {
			t.Fatalf("new certificate not served %v after rotation", time.Since(start))
		}
		time.Sleep(50 * time.Millisecond) // the poll's interval
	}
	t.Logf("rotated certificate served after %v", time.Since(start).Round(time.Millisecond))
	// The connection made before the rotation still works, and new gRPC
	// connections verify the new certificate.
	should(t, p.client(), "example", desc("api_key", "x"))
	if err := tlShould(tlDial(t, p.GRPCAddr, cfg)); err != nil {
		t.Fatalf("new connection after rotation: %v", err)
	}

	// A broken certificate file keeps the last good pair, logged once.
	tlstest.WriteAtomic(t, f.dir, "tls.crt", []byte("-----BEGIN CERTIFICATE-----\nhalf"))
	// The files are looked at on a handshake, at most once a second:
	// handshake until the broken file is seen, each time served the last
	// good pair.
	testkit.WaitForEvery(t, "the broken certificate file logged", 5*time.Second, pollEvery, func() bool {
		if s := tlServedSerial(t, p.GRPCAddr, cfg); s.Cmp(next.Cert.SerialNumber) != 0 {
			t.Fatalf("after a broken file served %v, want the last good %v", s, next.Cert.SerialNumber)
		}
		return strings.Contains(p.Log.String(), "do not load")
	})
	if err := tlShould(tlDial(t, p.GRPCAddr, cfg)); err != nil {
		t.Fatalf("new connection with a broken file on disk: %v", err)
	}
	time.Sleep(1100 * time.Millisecond) // past the once-a-second look at the files: real time on purpose
	tlServedSerial(t, p.GRPCAddr, cfg)
	if n := strings.Count(p.Log.String(), "do not load"); n != 1 {
		t.Errorf("broken TLS files logged %d times, want once:\n%s", n, p.Log.String())
	}
}

// tlRedis is a redis-server listening only on a TLS port.
type tlRedis struct {
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// tlStartRedis starts redis-server with --port 0 (no plaintext port) and a
// TLS port that requires client certificates of f's client CA, waits until
// a TLS client with f's client certificate gets PONG, and kills it by PID
// when the test ends.
func tlStartRedis(t *testing.T, f *tlFiles, args ...string) *tlRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found: run `apt-get install -y redis-server`")
	}
	dir := t.TempDir()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port := strconv.Itoa(tlFreePort(t))
		all := append([]string{"--port", "0", "--tls-port", port, "--bind", "127.0.0.1",
			"--tls-cert-file", f.certFile, "--tls-key-file", f.keyFile, "--tls-ca-cert-file", f.clientCAFile,
			"--tls-auth-clients", "yes", "--save", "", "--appendonly", "no", "--dir", dir,
			"--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning"}, args...)
		r := &tlRedis{Addr: "127.0.0.1:" + port, cmd: exec.Command(bin, all...), done: make(chan struct{})}
		logf, err := os.Create(filepath.Join(dir, "redis-"+port+".log"))
		if err != nil {
			t.Fatal(err)
		}
		r.cmd.Stdout, r.cmd.Stderr, r.cmd.Dir = logf, logf, dir
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = r.cmd.Wait(); logf.Close(); close(r.done) }()
		t.Cleanup(r.stop)
		if lastErr = r.waitPing(f.redisClientTLS(t, true)); lastErr == nil {
			return r
		}
		r.stop()
		b, _ := os.ReadFile(logf.Name())
		lastErr = fmt.Errorf("%v; log: %s", lastErr, b)
	}
	t.Fatalf("start TLS redis-server: %v", lastErr)
	return nil
}

func tlFreePort(t *testing.T) int {
	t.Helper()
	_, port, err := net.SplitHostPort(freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	return n
}

// redisClientTLS is a TLS configuration for Redis (served with f's server
// pair), with or without f's client certificate.
func (f *tlFiles) redisClientTLS(t *testing.T, withCert bool) *tls.Config {
	t.Helper()
	if withCert {
		return f.clientConfig(t, f.client)
	}
	return f.clientConfig(t)
}

func (r *tlRedis) waitPing(c *tls.Config) error {
	rc := r.client(c)
	defer rc.Close()
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		select {
		case <-r.done:
			return fmt.Errorf("redis-server exited")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err = rc.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond) // the poll's interval
	}
	return fmt.Errorf("no PONG over TLS within 10s: %v", err)
}

func (r *tlRedis) client(c *tls.Config) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.Addr, TLSConfig: c, MaxRetries: -1, ContextTimeoutEnabled: true})
}

var tlStopMu sync.Mutex

// stop kills the server by PID and waits for it, at most 10 s.
func (r *tlRedis) stop() {
	tlStopMu.Lock()
	defer tlStopMu.Unlock()
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
	}
}

// tlRedisConfig: 3 a minute per user (the store decides), and a
// fail_closed rule (denied while the store cannot answer).
const tlRedisConfig = `domain: tls
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: strict
    rate_limit: {unit: minute, requests_per_unit: 1000, on_error: fail_closed}
`

func TestTLSRedis(t *testing.T) {
	light(t)
	f := tlNewFiles(t)
	srv := tlStartRedis(t, f)
	dir := writeConfig(t, map[string]string{"tls.yaml": tlRedisConfig})
	base := []string{"--store", "redis", "--redis-url", "rediss://" + srv.Addr, "--redis-timeout", "500ms",
		"--fleet-size", "1", "--redis-tls-ca", f.caFile}

	t.Run("client certificate", func(t *testing.T) {
		t.Parallel()
		// With the client certificate: every decision comes from Redis.
		p := startRLS(t, dir, append(base, "--redis-tls-cert", f.clientCertFile, "--redis-tls-key", f.clientKeyFile)...)
		for i := 1; i <= 4; i++ {
			want := rlsv3.RateLimitResponse_OK
			if i == 4 {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if r := should(t, p.client(), "tls", desc("user", "alice")); r.OverallCode != want {
				t.Errorf("call %d: %v, want %v", i, r.OverallCode, want)
			}
		}
		if r := should(t, p.client(), "tls", desc("strict", "s")); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("fail_closed rule with Redis answering: %v, want OK", r.OverallCode)
		}
		if strings.Contains(p.Log.String(), rdFallbackLog) {
			t.Errorf("rls decided without Redis:\n%s", p.Log.String())
		}
		rc := srv.client(f.redisClientTLS(t, true))
		defer rc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		keys, err := rc.Keys(ctx, "*alice*").Result()
		if err != nil || len(keys) == 0 {
			t.Errorf("no counter for alice in Redis over TLS: keys %v, err %v", keys, err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for h := tlHealth(t, p); !strings.HasPrefix(h, "OK"); h = tlHealth(t, p) {
			if time.Now().After(deadline) {
				t.Errorf("/healthcheck with Redis over TLS: %q, want OK", h)
				break
			}
			time.Sleep(100 * time.Millisecond) // the poll's interval
		}
	})
	t.Run("no client certificate", func(t *testing.T) {
		t.Parallel()
		// Without the client certificate Redis refuses the handshake: rls
		// has never reached its store, so it is not ready, says why, and
		// its fail_closed rule denies.
		p := startRLSNoWait(t, dir, base...)
		var h string
		if !testkit.EventuallyEvery(20*time.Second, pollEvery, func() bool {
			if !strings.Contains(p.Log.String(), "http listening") {
				return false
			}
			_, h = ftHTTPGet(t, "http://"+p.HTTPAddr+"/healthcheck")
			return strings.HasPrefix(h, "NOT_SERVING: the store has not answered") && strings.Contains(h, "certificate required")
		}) {
			t.Fatalf("/healthcheck without a Redis client certificate: %q, want NOT_SERVING saying why", h)
		}
		if r := should(t, p.client(), "tls", desc("strict", "s")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("fail_closed rule without Redis: %v, want OVER_LIMIT", r.OverallCode)
		}
		if !strings.Contains(p.Log.String(), "certificate required") {
			t.Errorf("the log does not say Redis wants a client certificate:\n%s", p.Log.String())
		}
	})
}

func TestTLSRedisPasswordNeverShown(t *testing.T) {
	light(t)
	const flagPW, urlPW = "s3cr3t-pw", "s3cr3t-url-pw"
	srv := redistest.StartServer(t, "--requirepass", flagPW)
	dir := writeConfig(t, map[string]string{"tls.yaml": tlRedisConfig})
	args := []string{"--store", "redis", "--redis-url", "redis://:" + urlPW + "@" + srv.Addr,
		"--redis-timeout", "500ms", "--fleet-size", "1", "--log-level", "debug"}
	// A wrong password refuses to start, without showing it.
	refused, err := flRun(t, []string{"RLS_REDIS_PASSWORD=wrong-" + flagPW}, append([]string{"serve", "--config-dir", dir,
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "", "--debug-addr", ""}, args...)...)
	if err == nil || !strings.Contains(refused, "refused rls's credentials") {
		t.Errorf("a wrong password: exit %v, want a refusal:\n%s", err, refused)
	}
	// The right one (RLS_REDIS_PASSWORD wins over the URL's) serves; then
	// Redis refuses it (its password changed, connections dropped), then
	// Redis is gone: both are logged.
	p := startRLSBinEnv(t, rlsBin, []string{"RLS_REDIS_PASSWORD=" + flagPW}, dir, args...)
	p.waitServing(t, 20*time.Second)
	should(t, p.client(), "tls", desc("user", "bob"))
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: flagPW})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.ConfigSet(ctx, "requirepass", "another-password").Err(); err != nil {
		t.Fatal(err)
	}
	admin2 := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "another-password"})
	defer admin2.Close()
	if err := admin2.Do(ctx, "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitForEvery(t, "the refusal logged", 5*time.Second, pollEvery, func() bool { return strings.Contains(p.Log.String(), "store refused rls's credentials") })
	srv.Stop()
	testkit.WaitForEvery(t, "the dial error logged", 5*time.Second, pollEvery, func() bool {
		return strings.Contains(p.Log.String(), "store not ready")
	})
	p.stop(t)
	log := refused + p.Log.String()
	for _, pw := range []string{flagPW, urlPW} {
		if strings.Contains(log, pw) {
			t.Errorf("the Redis password %q is in rls's log:\n%s", pw, log)
		}
	}

	// A start-up error with a password in the URL.
	const pw = "pw-7Hq2z"
	out, err := tlRun(t, "--store", "redis", "--redis-url", "redis://:"+pw+"@127.0.0.1:1?bogus=1")
	if err == nil {
		t.Fatalf("rls with a bad --redis-url option started:\n%s", out)
	}
	if !strings.Contains(out, "--redis-url") || strings.Contains(out, pw) {
		t.Errorf("error output should name --redis-url and not show the password:\n%s", out)
	}
}

// tlRun runs rls serve with args (no RLS_* environment) and returns its
// combined output; it must exit within 10 s.
func tlRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, rlsBin, append([]string{"serve", "--config-dir", "../config",
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "", "--debug-addr", "", "--admin-addr", ""}, args...)...)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestTLSFlagErrors(t *testing.T) {
	light(t)
	f := tlNewFiles(t)
	missing := filepath.Join(f.dir, "nope.crt")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--grpc-tls-cert", missing, "--grpc-tls-key", f.keyFile},
			[]string{"--grpc-tls-cert (RLS_GRPC_TLS_CERT)", "no such file"}},
		{[]string{"--grpc-tls-cert", f.certFile},
			[]string{"--grpc-tls-cert (RLS_GRPC_TLS_CERT) and --grpc-tls-key (RLS_GRPC_TLS_KEY) go together"}},
		{[]string{"--grpc-tls-client-ca", f.clientCAFile},
			[]string{"--grpc-tls-client-ca (RLS_GRPC_TLS_CLIENT_CA) needs --grpc-tls-cert"}},
		{[]string{"--grpc-tls-cert", f.certFile, "--grpc-tls-key", f.clientKeyFile},
			[]string{"--grpc-tls-cert (RLS_GRPC_TLS_CERT) and --grpc-tls-key (RLS_GRPC_TLS_KEY)", "private key does not match"}},
		{[]string{"--grpc-tls-cert", f.certFile, "--grpc-tls-key", f.keyFile, "--grpc-tls-client-ca", f.keyFile},
			[]string{"--grpc-tls-client-ca (RLS_GRPC_TLS_CLIENT_CA)", "no PEM certificate"}},
		{[]string{"--store", "redis", "--redis-url", "redis://:pw-9xQ@127.0.0.1:6379", "--redis-tls-ca", f.caFile},
			[]string{"need a rediss:// --redis-url (RLS_REDIS_URL)"}},
		{[]string{"--store", "redis", "--redis-url", "rediss://127.0.0.1:6379", "--redis-tls-ca", missing, "--redis-tls-cert", f.clientCertFile},
			[]string{"--redis-tls-ca (RLS_REDIS_TLS_CA)", "--redis-tls-cert (RLS_REDIS_TLS_CERT) and --redis-tls-key (RLS_REDIS_TLS_KEY) go together"}},
	} {
		out, err := tlRun(t, c.args...)
		if err == nil {
			t.Errorf("%v: rls started", c.args)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: output lacks %q:\n%s", c.args, w, out)
			}
		}
		if strings.Contains(out, "pw-9xQ") {
			t.Errorf("%v: password in the output:\n%s", c.args, out)
		}
	}
}
