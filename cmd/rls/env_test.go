package main

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// envOf returns a getenv reading m.
func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestEnvReadInParseConfig: the variables rls reads besides the flags'
// twins come through parseConfig's getenv into Config; a bad one is an
// error naming the variable, whether tracing is on or not, in one line
// without a password.
func TestEnvReadInParseConfig(t *testing.T) {
	c, err := parseConfig([]string{"--config-dir", "../../config"}, envOf(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		"OTEL_BSP_MAX_QUEUE_SIZE": "64", "GOGC": "200", "GOMEMLIMIT": "1GiB", "RLS_STORE": "redis", "RLS_REDIS_PASSWORD": "pw"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.OTLP.Settings()
	if err != nil || !s.On || s.Endpoint != "http://collector:4318/v1/traces" || s.QueueSize != 64 {
		t.Errorf("tracing settings %+v %v", s, err)
	}
	if c.GOGC != "200" || c.GOMEMLIMIT != "1GiB" || c.RedisPassword != "pw" {
		t.Errorf("GOGC %q GOMEMLIMIT %q password %q", c.GOGC, c.GOMEMLIMIT, c.RedisPassword)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "bogus"}, `OTEL_EXPORTER_OTLP_PROTOCOL "bogus" is invalid; choices are [grpc http/protobuf]`},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL "http/json" is invalid`},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "lots"}, `OTEL_BSP_MAX_QUEUE_SIZE "lots" is invalid`},
		{map[string]string{"OTEL_SDK_DISABLED": "maybe"}, `OTEL_SDK_DISABLED "maybe" is invalid`},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}, `OTEL_EXPORTER_OTLP_ENDPOINT "collector:4317" is invalid`},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://u:hunter2@c:4318"}, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT https://u:xxxxx@c:4318 holds credentials`},
		{map[string]string{"GOGC": "lots"}, `GOGC "lots" is invalid`},
		{map[string]string{"GOMEMLIMIT": "1GB"}, `GOMEMLIMIT "1GB" is invalid`},
		{map[string]string{"RLS_TRACE_DESCRIPTOR_VALUES": "yes"}, `RLS_TRACE_DESCRIPTOR_VALUES="yes": want true or false`},
	} {
		_, err := parseConfig([]string{"--config-dir", "../../config"}, envOf(tc.env), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error containing %q", tc.env, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%v: %q: want one line without the password", tc.env, err)
		}
	}
}

// TestDryRunRefusesBadEnv: rls serve --dry-run exits non-zero naming a bad
// variable that serve would refuse, tracing on or not.
func TestDryRunRefusesBadEnv(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "not-here")
	for env, want := range map[string]string{
		"OTEL_EXPORTER_OTLP_PROTOCOL": "bogus",
		"OTEL_BSP_MAX_QUEUE_SIZE":     "-3",
		"GOGC":                        "fast",
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"serve", "--dry-run", "--config-dir", missing}, envOf(map[string]string{env: want}), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), env) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s=%s rls serve --dry-run: %v (printed %q), want an error naming %s", env, want, err, out.String(), env)
		}
	}
}

// TestBuildTracing: tracing is off by default; OpenTelemetry's endpoint
// variable turns it on; OTEL_SDK_DISABLED turns it off.
func TestBuildTracing(t *testing.T) {
	build := func(env map[string]string) *app {
		env["GOGC"] = "100"
		cfg, err := parseConfig([]string{"--config-dir", "../../config"}, envOf(env), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		a := &app{cfg: cfg, log: slog.New(slog.DiscardHandler), reg: prometheus.NewRegistry()}
		if err := a.buildTracing(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.stopTracing)
		return a
	}
	if a := build(map[string]string{}); a.tracing != nil || a.tracing.Service() != nil {
		t.Error("tracing on without an endpoint")
	}
	if a := build(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}); a.tracing == nil || a.tracing.Service() == nil {
		t.Error("tracing off with OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if a := build(map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}); a.tracing != nil {
		t.Error("tracing on with OTEL_SDK_DISABLED=true")
	}
}
