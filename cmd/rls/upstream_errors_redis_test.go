//go:build redis

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
)

// TestUpstreamErrorsNameUpstreamVariables: as ratelimit, an error about a
// setting names the upstream variables the user set (RUNTIME_ROOT...,
// REDIS_AUTH, LOG_LEVEL), not the RLS_* twins rls read them as; an RLS_*
// variable the user set keeps its own name.
func TestUpstreamErrorsNameUpstreamVariables(t *testing.T) {
	srv := redistest.StartServer(t, "--requirepass", "right")
	base := map[string]string{"RLS_ENV_COMPAT": "upstream", "USE_STATSD": "false", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr,
		"RUNTIME_ROOT": "../..", "RUNTIME_SUBDIRECTORY": "", "RUNTIME_APPDIRECTORY": "config",
		"HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0"}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    []string
		wantNot string
	}{
		{"config dir", map[string]string{"RUNTIME_ROOT": "/nonexistent"},
			[]string{"RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY (--config-dir): stat /nonexistent/config"}, "RLS_CONFIG_DIR"},
		{"log level", map[string]string{"LOG_LEVEL": "loud"}, []string{`LOG_LEVEL (--log-level) "loud" is invalid`}, "RLS_LOG_LEVEL"},
		{"password", map[string]string{"REDIS_AUTH": "wrong"}, []string{"set the right password in REDIS_AUTH"}, "RLS_REDIS_PASSWORD"},
		{"rls's own variable", map[string]string{"RLS_CONFIG_DIR": "/nonexistent"}, []string{"--config-dir (RLS_CONFIG_DIR)"}, "RUNTIME_ROOT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tc.env {
				env[k] = v
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := run(ctx, nil, envOf(env), &bytes.Buffer{}, &bytes.Buffer{})
			if err == nil {
				t.Fatal("started")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), tc.wantNot) {
				t.Errorf("%q names %s", err, tc.wantNot)
			}
		})
	}
}
