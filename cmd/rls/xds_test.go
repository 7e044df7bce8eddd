package main

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/pkg/telemetry"
	"github.com/rls-project/rls/pkg/testkit"
	"github.com/rls-project/rls/pkg/tlsconfig/tlstest"
	"github.com/rls-project/rls/pkg/xds"
	"github.com/rls-project/rls/pkg/xds/xdstest"
)

func TestXDSFlags(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "xds CA")
	pair := ca.Client(t, "rls")
	caFile := tlstest.Write(t, dir, "ca.crt", ca.PEM)
	certFile := tlstest.Write(t, dir, "tls.crt", pair.CertPEM)
	keyFile := tlstest.Write(t, dir, "tls.key", pair.KeyPEM)
	noEnv := func(string) string { return "" }

	// --config-dir is not read with xds: a missing directory is fine.
	c, err := parseConfig([]string{"--config-dir", "/does/not/exist", "--config-source", "xds", "--xds-server", "cp.example:18001",
		"--xds-node-id", "envoy-ratelimit", "--xds-tls-ca", caFile,
		"--xds-tls-cert", certFile, "--xds-tls-key", keyFile}, noEnv, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.fromXDS() || !c.xdsTLSSet() || c.XDSMaxRecvBytes != 4<<20 {
		t.Errorf("config %+v", c)
	}
	if m, _ := xds.ParseNodeMetadata("cluster=rls, zone=a"); len(m) != 2 || m["cluster"] != "rls" || m["zone"] != "a" {
		t.Errorf("node metadata %v", m)
	}
	env := map[string]string{"RLS_CONFIG_SOURCE": "xds", "RLS_XDS_SERVER": "127.0.0.1:18000", "RLS_XDS_NODE_ID": "n"}
	if c, err := parseConfig(nil, func(k string) string { return env[k] }, &bytes.Buffer{}); err != nil || c.XDSServer != "127.0.0.1:18000" {
		t.Errorf("from the environment: %v %+v", err, c)
	}

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--config-source", "xds"}, []string{
			"--xds-server (RLS_XDS_SERVER) is required with --config-source xds",
			"--xds-node-id (RLS_XDS_NODE_ID) is required with --config-source xds"}},
		{[]string{"--config-source", "etcd"}, []string{`--config-source (RLS_CONFIG_SOURCE) "etcd" is invalid; choices are [file xds]`}},
		{[]string{"--xds-server", "127.0.0.1:1"}, []string{"the --xds-* flags need --config-source (RLS_CONFIG_SOURCE) xds"}},
		{[]string{"--xds-tls-ca", caFile}, []string{"the --xds-* flags need --config-source (RLS_CONFIG_SOURCE) xds"}},
		{[]string{"--config-source", "xds", "--xds-server", "cp", "--xds-node-id", "n"}, []string{`--xds-server (RLS_XDS_SERVER) "cp" is invalid: want host:port`}},
		{[]string{"--config-source", "xds", "--xds-server", "cp:1", "--xds-node-id", "n", "--xds-tls-cert", certFile},
			[]string{"--xds-tls-cert (RLS_XDS_TLS_CERT) and --xds-tls-key (RLS_XDS_TLS_KEY) go together"}},
		{[]string{"--config-source", "xds", "--xds-server", "cp:1", "--xds-node-id", "n", "--xds-tls-ca", keyFile},
			[]string{"--xds-tls-ca (RLS_XDS_TLS_CA)"}},
	} {
		_, err := parseConfig(append([]string{"--config-dir", "../../config"}, tc.args...), noEnv, &bytes.Buffer{})
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: got %v, want an error containing %q", tc.args, err, w)
			}
		}
	}
	// Node metadata has no flag; its parse errors still reach Validate.
	for md, want := range map[string]string{"a=1,b": `"b" is not key=value`, "a=1,a=2": `key "a" given twice`} {
		c.XDSNodeMetadata = md
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("node metadata %q: got %v, want an error containing %q", md, err, want)
		}
	}
}

// xdsServe runs serve with --config-source xds against server (node
// "test") and returns its gRPC connection and its config (its addresses).
func xdsServe(t *testing.T, server string, args ...string) (*grpc.ClientConn, *Config) {
	t.Helper()
	log := &testkit.Buffer{}
	cfg := testConfig(t, append([]string{"--config-source", "xds", "--xds-server", server, "--xds-node-id", "test"}, args...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, log) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("serve still running 15 s after cancellation")
		}
		if t.Failed() {
			t.Logf("log:\n%s", log.String())
		}
	})
	waitListening(t, "ports listening", cfg.DebugAddr)
	conn, err := grpc.NewClient(cfg.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, cfg
}

func healthOf(t *testing.T, conn *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health %q: %v", service, err)
	}
	return r.GetStatus()
}

func decide(conn *grpc.ClientConn, domain, key, value string) (rlsv3.RateLimitResponse_Code, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain,
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}})
	return resp.GetOverallCode(), err
}

// TestServeFromXDS: NOT_SERVING and no decision until the first valid
// config; decisions follow it; a bad or empty update is NACKed and the
// config in force stays; each counts in upstream's config_load_success or
// _error, as a file reload does; losing the server changes nothing but
// the connected gauge.
func TestServeFromXDS(t *testing.T) {
	cp := xdstest.Start(t, "127.0.0.1:0")
	statsd, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer statsd.Close()
	conn, cfg := xdsServe(t, cp.Addr, "--statsd-addr", "udp://"+statsd.LocalAddr().String()+"?flush_interval=100ms")
	httpAddr := cfg.HTTPAddr

	testkit.WaitFor(t, "stream open", 5*time.Second, func() bool { return cp.Streams() > 0 })
	for _, svc := range []string{"", rlsServiceName, telemetry.UpstreamHealth} {
		if s := healthOf(t, conn, svc); s != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health %q before any config: %v", svc, s)
		}
	}
	if code, body := httpGet(t, "http://"+httpAddr+"/healthcheck"); code != 503 || !strings.Contains(body, "waiting for the first valid config") {
		t.Errorf("/healthcheck before any config: %d %q", code, body)
	}
	if _, err := decide(conn, "api", "k", "v"); status.Code(err) != codes.Unavailable {
		t.Errorf("ShouldRateLimit before any config: %v, want Unavailable", err)
	}
	if m := metricsOf(t, httpAddr); !strings.Contains(m, "rls_xds_connected 1") {
		t.Errorf("rls_xds_connected not 1 with the stream open")
	}

	cp.Set(t, "test", "1", xdstest.Limit("api", "api", "k", 2, rlsconf.RateLimitUnit_MINUTE))
	if _, ack := cp.AnswerTo(t, "1", 5*time.Second); ack.GetErrorDetail() != nil || ack.GetVersionInfo() != "1" {
		t.Fatalf("version 1 not ACKed: %v", ack)
	}
	testkit.WaitFor(t, "SERVING", 5*time.Second, func() bool { return healthOf(t, conn, rlsServiceName) == healthpb.HealthCheckResponse_SERVING })
	if code, body := httpGet(t, "http://"+httpAddr+"/healthcheck"); code != 200 {
		t.Errorf("/healthcheck with a config: %d %q", code, body)
	}
	want := func(key string, codes ...rlsv3.RateLimitResponse_Code) {
		t.Helper()
		for i, w := range codes {
			got, err := decide(conn, "api", "k", key)
			if err != nil || got != w {
				t.Fatalf("%s call %d: %v %v, want %v", key, i+1, got, err, w)
			}
		}
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	want("a", ok, ok, over)

	bad := xdstest.Limit("api", "api", "k", 50, rlsconf.RateLimitUnit_UNKNOWN)
	cp.Set(t, "test", "2", bad)
	if _, nack := cp.AnswerTo(t, "2", 5*time.Second); nack.GetVersionInfo() != "1" ||
		!strings.Contains(nack.GetErrorDetail().GetMessage(), `xds:api: descriptors[0].rate_limit.unit: invalid unit "UNKNOWN"`) {
		t.Fatalf("version 2 not NACKed as it should: %v", nack)
	}
	want("a", over)
	want("b", ok, ok, over) // still 2 a minute, not 50

	cp.Set(t, "test", "3")
	if _, nack := cp.AnswerTo(t, "3", 5*time.Second); nack.GetVersionInfo() != "1" ||
		!strings.Contains(nack.GetErrorDetail().GetMessage(), "has no RateLimitConfig with a domain") {
		t.Fatalf("an empty version 3 not NACKed: %v", nack)
	}
	m := metricsOf(t, httpAddr)
	for _, s := range []string{`rls_config_reloads_total{result="failure"} 2`, `rls_config_reloads_total{result="success"} 1`,
		"rls_config_last_reload_successful 0"} {
		if !strings.Contains(m, s) {
			t.Errorf("metrics lack %s", s)
		}
	}

	cp.Set(t, "test", "4", xdstest.Limit("api", "api", "k", 4, rlsconf.RateLimitUnit_MINUTE))
	cp.AnswerTo(t, "4", 5*time.Second)
	want("c", ok, ok, ok, ok, over)
	if code, body := httpGet(t, "http://"+cfg.DebugAddr+"/rlconfig"); code != 200 || !strings.Contains(body, "api: k 4/minute sliding_window (xds:api)") {
		t.Errorf("/rlconfig: %d %q", code, body)
	}

	loads := map[string]int{}
	buf := make([]byte, 65536)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) &&
		(loads["ratelimit.service.config_load_success"] < 2 || loads["ratelimit.service.config_load_error"] < 2); {
		_ = statsd.SetReadDeadline(deadline)
		n, _, err := statsd.ReadFrom(buf)
		if err != nil {
			break
		}
		for _, line := range strings.Split(string(buf[:n]), "\n") {
			if name, v, ok := strings.Cut(line, ":"); ok && strings.HasPrefix(name, "ratelimit.service.config_load") {
				c, _ := strconv.Atoi(strings.TrimSuffix(v, "|c"))
				loads[name] += c
			}
		}
	}
	if loads["ratelimit.service.config_load_success"] != 2 || loads["ratelimit.service.config_load_error"] != 2 {
		t.Errorf("upstream's load stats %v, want 2 successes (versions 1, 4) and 2 errors (2, 3)", loads)
	}

	cp.Stop()
	testkit.WaitFor(t, "rls_xds_connected 0", 5*time.Second, func() bool { return strings.Contains(metricsOf(t, httpAddr), "rls_xds_connected 0") })
	if s := healthOf(t, conn, rlsServiceName); s != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health while disconnected: %v", s)
	}
	want("d", ok, ok, ok, ok, over)
}

// TestServeFromXDSAllowEmpty: with --allow-empty-config an empty first
// snapshot is a config: rls serves, limiting nothing.
func TestServeFromXDSAllowEmpty(t *testing.T) {
	cp := xdstest.Start(t, "127.0.0.1:0")
	conn, _ := xdsServe(t, cp.Addr, "--allow-empty-config")
	cp.Set(t, "test", "1")
	if _, ack := cp.AnswerTo(t, "1", 5*time.Second); ack.GetErrorDetail() != nil {
		t.Fatalf("empty snapshot NACKed: %v", ack.GetErrorDetail())
	}
	testkit.WaitFor(t, "SERVING", 5*time.Second, func() bool { return healthOf(t, conn, "") == healthpb.HealthCheckResponse_SERVING })
	if code, err := decide(conn, "api", "k", "v"); err != nil || code != rlsv3.RateLimitResponse_OK {
		t.Errorf("decision on an empty config: %v %v", code, err)
	}
}

func metricsOf(t *testing.T, httpAddr string) string {
	t.Helper()
	code, body := httpGet(t, "http://"+httpAddr+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	return body
}
