package compat

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// Upstream's defaults alone: a Redis behind a Unix socket, statsd on
// localhost, the config under /srv/runtime_data/current/config.
func TestDefaults(t *testing.T) {
	s, err := FromEnv(envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"RLS_HTTP_ADDR":         "0.0.0.0:8080",
		"RLS_DEBUG_ADDR":        "127.0.0.1:6070", // pprof: loopback unless DEBUG_HOST says otherwise
		"RLS_GRPC_ADDR":         "0.0.0.0:8081",
		"RLS_LOG_LEVEL":         "warn",
		"RLS_LOG_FORMAT":        "text",
		"RLS_CONFIG_SOURCE":     "file",
		"RLS_CONFIG_DIR":        "/srv/runtime_data/current/config",
		"RLS_STORE":             "redis",
		"RLS_REDIS_URL":         "unix:///var/run/nutcracker/ratelimit.sock",
		"RLS_STATSD_ADDR":       "tcp://localhost:8125?flush_interval=10s", // gostats's default protocol
		"RLS_OVER_LIMIT_CACHE":  "false",
		"RLS_RESPONSE_HEADERS":  "false",
		"RLS_SHADOW_MODE":       "false",
		"OTEL_SDK_DISABLED":     "true",
		"RLS_DEFAULT_ALGORITHM": "fixed_window",
	}
	for k, v := range want {
		if s.Env[k] != v {
			t.Errorf("%s = %q, want %q", k, s.Env[k], v)
		}
	}
	for k := range s.Env {
		if _, ok := Sources[k]; !ok && !strings.HasPrefix(k, "OTEL_") {
			t.Errorf("%s has no upstream source in Sources", k)
		}
	}
	if s.NearLimitRatio != 0.8 || s.HeaderLimit != "RateLimit-Limit" || s.UpstreamPrometheus || len(s.Warnings) != 0 ||
		s.IgnoreDotFiles || s.TracingSampleRatio != nil {
		t.Errorf("settings %+v", s)
	}
}

func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want map[string]string // Env entries; "" means absent
	}{
		{"upstream example deployment", map[string]string{
			"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit",
			"USE_STATSD": "false", "LOG_LEVEL": "debug", "PORT": "8090", "GRPC_PORT": "8091"},
			map[string]string{"RLS_REDIS_URL": "redis://redis:6379", "RLS_CONFIG_DIR": "/data/ratelimit/config",
				"RLS_STATSD_ADDR": "", "RLS_LOG_LEVEL": "debug", "RLS_HTTP_ADDR": "0.0.0.0:8090", "RLS_GRPC_ADDR": "0.0.0.0:8091"}},
		{"cluster", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": "a:7000,b:7000,c:7000"},
			map[string]string{"RLS_STORE": "redis-cluster", "RLS_REDIS_URL": "redis://a:7000?addr=b%3A7000&addr=c%3A7000"}},
		{"sentinel with auth", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379",
			"REDIS_AUTH": "s3cret", "REDIS_SENTINEL_AUTH": "su:sp"},
			map[string]string{"RLS_STORE": "redis-sentinel", "RLS_REDIS_PASSWORD": "s3cret",
				"RLS_REDIS_URL": "redis://su:sp@s1:26379?addr=s2%3A26379&master_name=mymaster"}},
		{"auth user and TLS", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6380", "REDIS_AUTH": "u:p", "REDIS_TLS": "true",
			"REDIS_TLS_CACERT": "/ca.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true", "REDIS_POOL_SIZE": "4"},
			map[string]string{"RLS_REDIS_URL": "rediss://u@r:6380?pool_size=4&skip_verify=true", "RLS_REDIS_PASSWORD": "p", "RLS_REDIS_TLS_CA": "/ca.pem"}},
		{"statsd with tags", map[string]string{"STATSD_HOST": "agent", "STATSD_PORT": "9125", "EXTRA_TAGS": "env:prod,team:a", "STATS_FLUSH_INTERVAL": "2s"},
			map[string]string{"RLS_STATSD_ADDR": "tcp://agent:9125?flush_interval=2s&tags=env%3Aprod%2Cteam%3Aa"}},
		{"statsd over udp", map[string]string{"STATSD_PROTOCOL": "udp"}, map[string]string{"RLS_STATSD_ADDR": "udp://localhost:8125?flush_interval=10s"}},
		{"stats disabled", map[string]string{"DISABLE_STATS": "true"}, map[string]string{"RLS_STATSD_ADDR": ""}},
		{"local cache", map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "33554432"},
			map[string]string{"RLS_OVER_LIMIT_CACHE": "true", "RLS_LOCAL_MAX_BYTES": "67108864"}},
		{"small local cache", map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "1000"}, map[string]string{"RLS_LOCAL_MAX_BYTES": "1048576"}},
		{"tls, client SAN, uds, prefix", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k",
			"GRPC_CLIENT_TLS_CACERT": "/ca", "GRPC_CLIENT_TLS_SAN": "envoy.example", "GRPC_UDS": "/tmp/rl.sock", "CACHE_KEY_PREFIX": "team-a:"},
			map[string]string{"RLS_GRPC_TLS_CERT": "/c", "RLS_GRPC_TLS_KEY": "/k", "RLS_GRPC_TLS_CLIENT_CA": "/ca",
				"RLS_GRPC_TLS_CLIENT_SAN": "envoy.example", "RLS_GRPC_UDS": "/tmp/rl.sock", "RLS_KEY_PREFIX": "team-a:"}},
		{"xds", map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true"},
			map[string]string{"RLS_CONFIG_SOURCE": "xds", "RLS_XDS_SERVER": "localhost:18000", "RLS_XDS_NODE_ID": "default", "RLS_ALLOW_EMPTY_CONFIG": "true"}},
		{"tracing on", map[string]string{"TRACING_ENABLED": "true"},
			map[string]string{"OTEL_SDK_DISABLED": "", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318"}},
		{"log level trace", map[string]string{"LOG_LEVEL": "TRACE"}, map[string]string{"RLS_LOG_LEVEL": "debug"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := FromEnv(envOf(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if got, ok := s.Env[k]; got != v || (v == "" && ok) {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		varName string
	}{
		{map[string]string{"BACKEND_TYPE": "memcache"}, "BACKEND_TYPE"},
		{map[string]string{"REDIS_PERSECOND": "true"}, "REDIS_PERSECOND"},
		{map[string]string{"USE_DOG_STATSD": "true"}, "USE_DOG_STATSD"},
		{map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_MAPPER_YAML": "/m.yaml"}, "PROMETHEUS_MAPPER_YAML"},
		{map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "a:b"}, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"},
		{map[string]string{"REDIS_SOCKET_TYPE": "pipe"}, "REDIS_SOCKET_TYPE"},
		{map[string]string{"REDIS_URL": "relative.sock"}, "REDIS_URL"},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "nohost"}, "REDIS_URL"},
		{map[string]string{"NEAR_LIMIT_RATIO": "1.5"}, "NEAR_LIMIT_RATIO"},
		{map[string]string{"SHADOW_MODE": "yes"}, "SHADOW_MODE"},
		{map[string]string{"GRPC_SERVER_USE_TLS": "true"}, "GRPC_SERVER_USE_TLS"},
	} {
		_, err := FromEnv(envOf(tc.env))
		var e *Error
		if !errors.As(err, &e) || e.Var != tc.varName {
			t.Errorf("%v: err %v, want one naming %s", tc.env, err, tc.varName)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %q is more than one line", tc.env, err)
		}
	}
}

func TestWarnings(t *testing.T) {
	s, err := FromEnv(envOf(map[string]string{"RUNTIME_WATCH_ROOT": "false", "MEMCACHE_MAX_IDLE_CONNS": "2", "GRPC_CLIENT_TLS_SAN": "x"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Warnings) != 3 {
		t.Fatalf("warnings %q, want 3", s.Warnings)
	}
	for i, name := range []string{"RUNTIME_WATCH_ROOT", "MEMCACHE_MAX_IDLE_CONNS", "GRPC_CLIENT_TLS_SAN"} {
		if !strings.HasPrefix(s.Warnings[i], name) {
			t.Errorf("warning %d %q does not name %s", i, s.Warnings[i], name)
		}
	}
}

// Every Warned variable says why, and no other.
func TestWarnWhy(t *testing.T) {
	for _, v := range Vars {
		if (v.Kind == Warned) != (v.Why != "") {
			t.Errorf("%s: kind %d, reason %q", v.Name, v.Kind, v.Why)
		}
	}
}

// TestTracingSampleRatio: TRACING_SAMPLING_RATE is read when tracing is on
// and OpenTelemetry's own sampler variable is not set.
func TestTracingSampleRatio(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"TRACING_ENABLED": "true", "TRACING_SAMPLING_RATE": "0.25"}, "0.25"},
		{map[string]string{"TRACING_ENABLED": "true"}, "none"},
		{map[string]string{"TRACING_SAMPLING_RATE": "0.25"}, "none"},
		{map[string]string{"TRACING_ENABLED": "true", "TRACING_SAMPLING_RATE": "0.25", "OTEL_TRACES_SAMPLER": "always_on"}, "none"},
	} {
		s, err := FromEnv(envOf(tc.env))
		if err != nil {
			t.Fatal(err)
		}
		got := "none"
		if s.TracingSampleRatio != nil {
			got = strconv.FormatFloat(*s.TracingSampleRatio, 'g', -1, 64)
		}
		if got != tc.want {
			t.Errorf("%v: ratio %s, want %s", tc.env, got, tc.want)
		}
	}
	if _, err := FromEnv(envOf(map[string]string{"TRACING_ENABLED": "true", "TRACING_SAMPLING_RATE": "half"})); err == nil ||
		!strings.Contains(err.Error(), "TRACING_SAMPLING_RATE") {
		t.Errorf("a bad rate: %v, want an error naming TRACING_SAMPLING_RATE", err)
	}
}

// TestStray: the upstream variables set are named, in Vars' order.
func TestStray(t *testing.T) {
	got := Stray(envOf(map[string]string{"REDIS_URL": "r:6379", "USE_STATSD": "true", "RLS_STORE": "redis"}))
	if strings.Join(got, ",") != "USE_STATSD,REDIS_URL" {
		t.Errorf("Stray = %v, want USE_STATSD, REDIS_URL", got)
	}
}
