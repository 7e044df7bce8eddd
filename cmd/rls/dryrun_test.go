package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDryRun: --dry-run checks flags, environment and (when present) the
// config directory, then returns without serving: a port already taken
// does not matter, a bad value or a broken config file is the error.
func TestDryRun(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	broken := t.TempDir()
	if err := os.WriteFile(filepath.Join(broken, "d.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "not-here")
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantOut string // on stdout when it passes
		wantErr string // in the error when it fails
	}{
		{"the shipped config, a port in use", []string{"serve", "--dry-run", "--config-dir", "../../config", "--grpc-addr", taken.Addr().String()},
			nil, "config ok, 1 domain(s) [example]", ""},
		{"a config dir that is not here (a pod's volume)", []string{"--config-dir", "/config", "--dry-run", "--store=redis-cluster"},
			map[string]string{"RLS_REDIS_URL": "redis://:secret@redis-0:6379?addr=redis-1:6379"},
			"store redis (cluster, redis://:xxxxx@redis-0:6379?addr=redis-1:6379); --config-dir /config does not exist here: not checked", ""},
		{"the env twin", []string{"--config-dir", missing}, map[string]string{"RLS_DRY_RUN": "true"}, "not checked", ""},
		{"a bad flag value", []string{"--dry-run", "--config-dir", missing, "--store", "redis-ring"}, nil, "", "--store"},
		{"a bad env value", []string{"--dry-run", "--config-dir", missing}, map[string]string{"RLS_MIN_FLEET_SIZE": "0"}, "", "--min-fleet-size"},
		{"an unknown flag", []string{"--dry-run", "--config-dir", missing, "--redis-adress", "x"}, nil, "", "redis-adress"},
		{"an extra argument", []string{"serve", "--dry-run", "--config-dir", missing, "serve"}, nil, "", `unexpected argument "serve"`},
		{"a broken config file", []string{"--dry-run", "--config-dir", broken}, nil, "", "fortnight"},
		{"an empty config dir", []string{"--dry-run", "--config-dir", t.TempDir()}, nil, "", "has no domain"},
		{"a config dir that is a file", []string{"--dry-run", "--config-dir", "dryrun.go"}, nil, "", "is not a directory"},
		// What serve would refuse (or panic on) at start: --dry-run refuses it too.
		{"a negative pool size", []string{"--dry-run", "--config-dir", missing, "--store", "redis", "--redis-url", "redis://r:6379?pool_size=-1"},
			nil, "", "pool_size=-1 is invalid"},
		{"a port that is not a number", []string{"--dry-run", "--config-dir", missing, "--http-addr", ":abc"}, nil, "", `"abc" is not a port number`},
		{"upstream's PORT that is not a number", []string{"--dry-run", "--env-compat", "upstream"},
			map[string]string{"PORT": "abc", "RUNTIME_ROOT": missing}, "", `PORT="abc": want a port number`},
		{"upstream's negative REDIS_POOL_SIZE", []string{"--dry-run", "--env-compat", "upstream"},
			map[string]string{"REDIS_POOL_SIZE": "-1", "RUNTIME_ROOT": missing}, "", `REDIS_POOL_SIZE="-1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tc.args, env(tc.env), &out, &errOut)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("rls %v: err %v, want one naming %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("rls %v: %v\n%s", tc.args, err, errOut.String())
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("rls %v printed %q, want %q", tc.args, out.String(), tc.wantOut)
			}
		})
	}
}
