package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/testkit"
)

// testConfig is a memory-store config on free loopback ports that leaves
// the process's GC setting alone (GOGC set) and polls the config
// directory only on file events. The test picks the ports (freeAddr), so
// that it knows the server's addresses from the config: cfg.GRPCAddr,
// cfg.HTTPAddr, cfg.DebugAddr, cfg.AdminAddr.
func testConfig(t *testing.T, args ...string) *Config {
	t.Helper()
	all := append([]string{"--config-dir", "../../config", "--grpc-addr", freeAddr(t, "127.0.0.1"), "--http-addr", freeAddr(t, "127.0.0.1"),
		"--debug-addr", freeAddr(t, "127.0.0.1"), "--admin-addr", freeAddr(t, "127.0.0.1")}, args...)
	cfg, err := parseConfig(all, func(k string) string { return map[string]string{"GOGC": "100"}[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConfigPoll = -1 // file events only
	return cfg
}

// handedOut holds the ports freeAddr returned, so that no two servers of
// this test binary are given the same one.
var handedOut sync.Map

// freeAddr returns host:port for a port that was free a moment ago and
// that freeAddr has not returned before.
func freeAddr(t *testing.T, host string) string {
	t.Helper()
	for {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if _, taken := handedOut.LoadOrStore(port, true); !taken {
			return net.JoinHostPort(host, strconv.Itoa(port))
		}
	}
}

// waitListening waits until addr accepts connections (serve opens the
// debug port last of its ports).
func waitListening(t *testing.T, what, addr string) {
	t.Helper()
	testkit.WaitFor(t, what, 5*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeRunsAndShutsDownInOrder: serve opens its three ports, reports
// OK once the store answers, and on cancellation stops in order, closing
// the store last.
func TestServeRunsAndShutsDownInOrder(t *testing.T) {
	log := &testkit.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	cfg := testConfig(t)
	go func() { done <- serve(ctx, cfg, log) }()

	waitListening(t, "both HTTP ports listening", cfg.DebugAddr)
	httpAddr := cfg.HTTPAddr
	testkit.WaitFor(t, "/healthcheck OK", 5*time.Second, func() bool {
		code, body := httpGet(t, "http://"+httpAddr+"/healthcheck")
		return code == 200 && body == "OK\n"
	})
	if code, body := httpGet(t, "http://"+cfg.DebugAddr+"/rlconfig"); code != 200 || !strings.HasPrefix(body, "# config ") {
		t.Errorf("/rlconfig: %d %q", code, body)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve still running 15 s after cancellation")
	}
	got := log.String()
	last := -1
	for _, s := range []string{"config loaded", "grpc listening", "http listening", "shutdown requested",
		"serving=false", "grpc stopped", "store closed"} {
		i := strings.Index(got, s)
		if i < 0 || i < last {
			t.Fatalf("%q missing or out of order:\n%s", s, got)
		}
		last = i
	}
}

// TestServeStartFailureStopsEverything: a port that cannot be opened fails
// serve, after the gRPC server already started is stopped (its port free
// again) and the store closed.
func TestServeStartFailureStopsEverything(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	log := &testkit.Buffer{}
	cfg := testConfig(t, "--http-addr", busy.Addr().String())
	err = serve(context.Background(), cfg, log)
	if err == nil || !strings.HasPrefix(err.Error(), "--http-addr: ") {
		t.Fatalf("serve with --http-addr in use: %v, want an error naming --http-addr", err)
	}
	got := log.String()
	if !strings.Contains(got, "store closed") {
		t.Errorf("store not closed after the failed start:\n%s", got)
	}
	grpcAddr := cfg.GRPCAddr
	if !strings.Contains(got, `msg="grpc listening" addr=`+grpcAddr) {
		t.Fatalf("gRPC not started on %s before the failure:\n%s", grpcAddr, got)
	}
	l, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		t.Fatalf("the gRPC port %s is still open after the failed start: %v", grpcAddr, err)
	}
	l.Close()
}

// TestServeWarnsOfPublicPorts: the admin API and the debug port (pprof)
// on an address beyond loopback are each a WARN at start; on loopback
// (testConfig's) neither is.
func TestServeWarnsOfPublicPorts(t *testing.T) {
	for _, public := range []bool{false, true} {
		log := &testkit.Buffer{}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		var args []string
		if public {
			args = []string{"--admin-addr", freeAddr(t, "0.0.0.0"), "--debug-addr", freeAddr(t, "0.0.0.0")}
		}
		cfg := testConfig(t, args...)
		go func() { done <- serve(ctx, cfg, log) }()
		waitListening(t, "the debug port listening", cfg.DebugAddr)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		for _, flag := range []string{"--admin-addr", "--debug-addr"} {
			warned := strings.Contains(log.String(), "level=WARN msg=\""+flag+" listens beyond loopback")
			if warned != public {
				t.Errorf("public %v: %s warned %v, want %v:\n%s", public, flag, warned, public, log.String())
			}
		}
	}
}
