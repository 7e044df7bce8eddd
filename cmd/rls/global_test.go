package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// globalRuleDir writes a config directory with one scope: global rule.
func globalRuleDir(t *testing.T) string {
	dir := t.TempDir()
	yaml := "domain: d\ndescriptors:\n  - key: api_key\n    rate_limit: {name: world_300, unit: second, requests_per_unit: 300, algorithm: fixed_window, scope: global}\n"
	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestGlobalRuleRefusedWithoutRegion: a scope: global rule without
// --region and --global-redis-url is refused at start and by rls validate,
// naming the rule and the flags; with them both accept it.
func TestGlobalRuleRefusedWithoutRegion(t *testing.T) {
	dir := globalRuleDir(t)
	out, err := runValidate(dir)
	if err == nil || !strings.Contains(out, "d.yaml:4") || !strings.Contains(out, "rule world_300: scope: global needs rls serve's --region and --global-redis-url") {
		t.Errorf("validate without --region: %v\n%s", err, out)
	}
	if out, err := runValidate("--region", "eu", "--global-redis-url", "redis://127.0.0.1:1", dir); err != nil {
		t.Errorf("validate with --region: %v\n%s", err, out)
	}
	cfg, err := parseConfig([]string{"--config-dir", dir, "--store", "redis"}, func(string) string { return "" }, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loadRules(cfg, func(string) {}); err == nil || !strings.Contains(err.Error(), "rule world_300: scope: global needs") {
		t.Errorf("serve without --region loads the rule: %v", err)
	}
	cfg, err = parseConfig([]string{"--config-dir", dir, "--store", "redis", "--region", "eu", "--global-redis-url", "redis://127.0.0.1:1"}, func(string) string { return "" }, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if rules, err := loadRules(cfg, func(string) {}); err != nil || !rules.Rules()[0].Global {
		t.Errorf("serve with --region: %v", err)
	}
}

// TestGlobalFlags: --region and --global-redis-url go together, on a
// Redis store; the URL's own parameters are read, checked and taken out of
// the client's URL.
func TestGlobalFlags(t *testing.T) {
	parse := func(args ...string) (*Config, error) {
		return parseConfig(append([]string{"--config-dir", "../../config"}, args...), func(string) string { return "" }, &bytes.Buffer{})
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--store", "redis", "--region", "eu"}, "--region (RLS_REGION) needs --global-redis-url"},
		{[]string{"--store", "redis", "--global-redis-url", "redis://g:6379"}, "--global-redis-url (RLS_GLOBAL_REDIS_URL) needs --region"},
		{[]string{"--region", "eu", "--global-redis-url", "redis://g:6379"}, "needs a Redis --store"},
		{[]string{"--store", "redis", "--region", "eu west", "--global-redis-url", "redis://g:6379"}, `--region (RLS_REGION) "eu west"`},
		{[]string{"--store", "redis", "--region", "eu", "--global-redis-url", "redis://g:6379?interval=5ms"}, `interval="5ms"`},
		{[]string{"--store", "redis", "--region", "eu", "--global-redis-url", "redis://g:6379?lease=500ms"}, "at least the interval"},
		{[]string{"--store", "redis", "--region", "eu", "--global-redis-url", "redis://g:6379?floor=0.9"}, `floor="0.9"`},
		{[]string{"--store", "redis", "--region", "eu", "--global-redis-url", "redis://g:6379?max_keys=0"}, `max_keys="0"`},
		{[]string{"--store", "redis", "--region", "eu", "--global-redis-url", "redis://g:6379?mode=ring"}, `mode="ring": want single, cluster or sentinel`},
		{[]string{"--store", "redis", "--region", "eu", "--global-redis-url", "redis://g:6379?mode=sentinel"}, "master"},
	} {
		if _, err := parse(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
	cfg, err := parse("--store", "redis", "--region", "eu", "--global-redis-url", "redis://g:6379/2?interval=500ms&lease=3s&floor=0.2&max_keys=7&pool_size=4")
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.Global
	if g.Interval != 500*time.Millisecond || g.Lease != 3*time.Second || g.Floor != 0.2 || g.MaxKeys != 7 || g.ClientURL != "redis://g:6379/2?pool_size=4" {
		t.Errorf("parsed %+v", g)
	}
	if g.Mode != "single" {
		t.Errorf("mode %q, want single by default", g.Mode)
	}
	cfg, err = parse("--store", "redis", "--region", "eu", "--global-redis-url", "redis://g1:6379?mode=cluster&addr=g2:6379")
	if err != nil || cfg.Global.Mode != "cluster" || cfg.Global.ClientURL != "redis://g1:6379?addr=g2%3A6379" {
		t.Errorf("a Cluster: %v, %+v", err, cfg.Global)
	}
	if cfg, _ := parse(); cfg.Global.on() {
		t.Error("global on by default")
	}
}
