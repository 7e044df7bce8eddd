package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/testkit"
)

// TestServeRefusesAnEmptyConfigDir: start-up on a directory without any
// domain fails with a message naming --allow-empty-config, unless it is set.
func TestServeRefusesAnEmptyConfigDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "README.txt"), []byte("no config here"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := serve(context.Background(), testConfig(t, "--config-dir", dir), &testkit.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "has no domain") || !strings.Contains(err.Error(), "--allow-empty-config (RLS_ALLOW_EMPTY_CONFIG)") {
		t.Fatalf("serve on an empty directory: %v, want a refusal naming --allow-empty-config", err)
	}

	log := &testkit.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := testConfig(t, "--config-dir", dir, "--allow-empty-config")
	go func() { done <- serve(ctx, cfg, log) }()
	waitListening(t, "serving with --allow-empty-config", cfg.DebugAddr)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve with --allow-empty-config: %v", err)
	}
}

// failures reads rls_config_reloads_total{result="failure"} from /metrics.
func failures(t *testing.T, httpAddr string) int {
	t.Helper()
	_, body := httpGet(t, "http://"+httpAddr+"/metrics")
	m := regexp.MustCompile(`(?m)^rls_config_reloads_total\{result="failure"\} (\d+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no failure count in /metrics")
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestServeReloadGuards: with the limits wired, an oversized file is refused
// by its size and an emptied directory keeps the last good
// config; both count as failures and /rlconfig keeps the domain.
func TestServeReloadGuards(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "d.yaml")
	if err := os.WriteFile(good, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := &testkit.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	cfg := testConfig(t, "--config-dir", dir)
	cfg.ConfigPoll, cfg.ConfigMaxBytes = 50*time.Millisecond, 4096 // fixed settings, shortened
	go func() { done <- serve(ctx, cfg, log) }()
	waitListening(t, "serving", cfg.DebugAddr)
	httpAddr, debugAddr := cfg.HTTPAddr, cfg.DebugAddr
	domainKept := func() bool {
		_, body := httpGet(t, "http://"+debugAddr+"/rlconfig")
		return strings.Contains(body, "domains [d]")
	}

	big := filepath.Join(dir, "big.yaml")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Truncate(big, 50<<20); err != nil {
		t.Fatal(err)
	}
	want := "file is 52428800 bytes, more than the 4096 bytes of the size limit; not read"
	testkit.WaitFor(t, "the big file refused", 5*time.Second, func() bool { return strings.Contains(log.String(), want) })
	testkit.WaitFor(t, "failures counted", 5*time.Second, func() bool { return failures(t, httpAddr) >= 2 })
	if !domainKept() {
		t.Fatal("the last good config is gone after the big file")
	}
	if err := os.Remove(big); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(good); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the empty directory refused", 5*time.Second, func() bool {
		return strings.Contains(log.String(), "has no domain left")
	})
	before := failures(t, httpAddr)
	testkit.WaitFor(t, "more failures counted", 5*time.Second, func() bool { return failures(t, httpAddr) > before })
	if !domainKept() {
		t.Fatal("the last good config is gone after emptying the directory")
	}
	if n := strings.Count(log.String(), "has no domain left"); n != 1 {
		t.Errorf("the empty directory logged %d times, want once", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
}
