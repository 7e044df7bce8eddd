package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/redisclient"
)

func TestEnvTwins(t *testing.T) {
	env := map[string]string{"RLS_GRPC_ADDR": "127.0.0.1:9", "RLS_STORE": "redis", "RLS_REDIS_TIMEOUT": "25ms", "RLS_OVER_LIMIT_CACHE": "false"}
	c, err := parseConfig([]string{"--config-dir", "../../config", "--grpc-addr", "127.0.0.1:1"}, func(k string) string { return env[k] }, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.GRPCAddr != "127.0.0.1:1" {
		t.Errorf("the flag must win over its env twin: %q", c.GRPCAddr)
	}
	if c.RedisTimeout != 25*time.Millisecond || c.OverLimitCache {
		t.Errorf("env twins not applied: %v %v", c.RedisTimeout, c.OverLimitCache)
	}
}

func TestInvalidSettingsNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--store", "etcd"}, nil, `--store (RLS_STORE) "etcd" is invalid; choices are [memory redis redis-cluster redis-sentinel]`},
		{nil, map[string]string{"RLS_LOG_FORMAT": "xml"}, `--log-format (RLS_LOG_FORMAT) "xml" is invalid`},
		{nil, map[string]string{"RLS_REDIS_TIMEOUT": "soon"}, `RLS_REDIS_TIMEOUT="soon"`},
		{[]string{"--on-store-error", "maybe"}, nil, `--on-store-error (RLS_ON_STORE_ERROR) "maybe" is invalid`},
		{[]string{"--default-algorithm", "leaky_bucket"}, nil, `--default-algorithm (RLS_DEFAULT_ALGORITHM) "leaky_bucket" is invalid; choices are [sliding_window fixed_window token_bucket]`},
		{nil, map[string]string{"RLS_DEFAULT_ALGORITHM": "fixed"}, `--default-algorithm (RLS_DEFAULT_ALGORITHM) "fixed" is invalid`},
		{[]string{"--grpc-addr", "8081"}, nil, `--grpc-addr (RLS_GRPC_ADDR) "8081" is invalid: want host:port`},
		{[]string{"--config-dir", "/does/not/exist"}, nil, `--config-dir (RLS_CONFIG_DIR)`},
		{[]string{"--store", "redis-ring"}, nil, `--store (RLS_STORE) "redis-ring" is invalid`},
		{[]string{"--store", "redis-sentinel"}, nil, `--redis-url (RLS_REDIS_URL): the Sentinel master name is required in sentinel mode (master_name in the URL)`},
		{[]string{"--store", "redis", "--redis-url", "redis://127.0.0.1:1?pool_size=x"}, nil, `--redis-url (RLS_REDIS_URL): redis://127.0.0.1:1?pool_size=x is invalid in single mode`},
		{[]string{"--fleet-size", "-1"}, nil, `--fleet-size (RLS_FLEET_SIZE) is negative`},
		{[]string{"--redis-timeout", "0"}, nil, `--redis-timeout (RLS_REDIS_TIMEOUT) must be positive`},
		{nil, map[string]string{"RLS_REDIS_TIMEOUT": "-5ms"}, `--redis-timeout (RLS_REDIS_TIMEOUT) must be positive`},
		{[]string{"--local-max-bytes", "1000"}, nil, `--local-max-bytes (RLS_LOCAL_MAX_BYTES) must be at least 1 MiB`},
		{nil, map[string]string{"RLS_MEMORY_MAX_BYTES": "0"}, `--memory-max-bytes (RLS_MEMORY_MAX_BYTES) must be at least 1 MiB`},
		{[]string{"--redis-url", "redis://redis:6379"}, nil, `--redis-url (RLS_REDIS_URL) is set but --store (RLS_STORE) is memory`},
		{nil, map[string]string{"RLS_REDIS_URL": "redis://redis:6379"}, `--redis-url (RLS_REDIS_URL) is set but --store (RLS_STORE) is memory`},
		{nil, map[string]string{"RLS_REDIS_TLS_CA": "ca.pem"}, `--redis-tls-ca (RLS_REDIS_TLS_CA) is set but --store (RLS_STORE) is memory`},
		{nil, map[string]string{"RLS_REDIS_PASSWORD": "pw"}, `RLS_REDIS_PASSWORD is set but --store (RLS_STORE) is memory`},
		{[]string{"--rlqs-unmatched", "reject"}, nil, `--rlqs-unmatched (RLS_RLQS_UNMATCHED) "reject" is invalid; choices are [allow deny abandon]`},
		{[]string{"--rlqs=false", "--rlqs-unmatched", "deny"}, nil, `--rlqs-unmatched (RLS_RLQS_UNMATCHED) is set but --rlqs (RLS_RLQS) is false`},
		{[]string{"--rlqs-unmatched", "deny"}, map[string]string{"RLS_RLQS": "false"}, `--rlqs-unmatched (RLS_RLQS_UNMATCHED) is set but --rlqs (RLS_RLQS) is false`},
	} {
		args := append([]string{"--config-dir", "../../config"}, tc.args...)
		_, err := parseConfig(args, func(k string) string { return tc.env[k] }, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: got %v, want an error containing %q", tc.args, tc.env, err, tc.want)
		}
	}
}

// TestRedisTimeoutReportedOnce: on the redis store a negative
// --redis-timeout is reported once, by Validate, not again by the store's
// own check (whose "0 means the default" would contradict it).
func TestRedisTimeoutReportedOnce(t *testing.T) {
	_, err := parseConfig([]string{"--config-dir", "../../config", "--store", "redis", "--redis-timeout", "-1s"},
		func(string) string { return "" }, &bytes.Buffer{})
	if err == nil || strings.Count(err.Error(), "--redis-timeout") != 1 {
		t.Errorf("got %v, want one error naming --redis-timeout", err)
	}
}

// TestReadmeListsEveryFlag keeps the flag table of docs/flags.md true: every
// flag is in it with its default, and it lists no flag that does not exist.
// The table of rls simulate's flags is in docs/algorithms.md (simulate_test.go).
func TestReadmeListsEveryFlag(t *testing.T) {
	readme, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	serve := string(readme)
	rows := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z-]+)` \\|([^|]*)\\|").FindAllStringSubmatch(serve, -1) {
		rows[m[1]] = strings.Trim(strings.TrimSpace(m[2]), "`")
	}
	for _, m := range regexp.MustCompile("(?m)^- `--([a-z-]+)` is replaced by `--").FindAllStringSubmatch(serve, -1) {
		delete(rows, m[1])
	}
	fs := newFlagSet(defaultConfig(), &bytes.Buffer{})
	fs.VisitAll(func(f *flag.Flag) {
		def, ok := rows[f.Name]
		if !ok {
			t.Errorf("docs/flags.md's flag table lacks --%s", f.Name)
			return
		}
		if f.DefValue != def {
			t.Errorf("docs/flags.md says --%s defaults to %q; it is %q", f.Name, def, f.DefValue)
		}
		delete(rows, f.Name)
	})
	for name := range rows {
		t.Errorf("docs/flags.md lists --%s, which does not exist", name)
	}
}

// TestCLIHelpAndErrors: help is asked for (exit 0, to stdout for `rls
// help`), a bad value is one line naming it (no list of every flag), and
// a bad environment value says what it must look like.
func TestCLIHelpAndErrors(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, args := range [][]string{{"serve", "--help"}, {"-h"}, {"help"}, {"validate", "--help"}} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), args, noEnv, &out, &errOut)
		if !errors.Is(err, flag.ErrHelp) {
			t.Errorf("rls %v: %v; want flag.ErrHelp (exit 0)", args, err)
		}
		if got := out.String() + errOut.String(); !strings.Contains(got, "usage: rls") {
			t.Errorf("rls %v printed %q; want the usage", args, got)
		}
		if args[0] == "help" && out.Len() == 0 {
			t.Error("rls help: want the usage on stdout")
		}
	}
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"--redis-timeout", "abc"}, noEnv, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), `"abc"`) || !strings.Contains(err.Error(), "redis-timeout") {
		t.Errorf("--redis-timeout abc: %v", err)
	}
	if errOut.Len()+out.Len() > 0 {
		t.Errorf("--redis-timeout abc printed %d bytes besides the error", errOut.Len()+out.Len())
	}
	for env, want := range map[string]string{
		"RLS_ALLOW_NEGATIVE_HITS": "want true or false",
		"RLS_REDIS_TIMEOUT":       "want a duration",
		"RLS_MAX_CONNS":           "want a whole number",
	} {
		getenv := func(k string) string {
			if k == env {
				return "yes"
			}
			return ""
		}
		_, err := parseConfig(nil, getenv, io.Discard)
		if err == nil || !strings.Contains(err.Error(), env+`="yes": `+want) {
			t.Errorf("%s=yes: %v; want %q", env, err, want)
		}
	}
}

// TestConnFlagsValidated: the connection guards' flags and their defaults.
func TestConnFlagsValidated(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--idle-timeout", "0"}, "--idle-timeout (RLS_IDLE_TIMEOUT) must be positive"},
		{[]string{"--idle-timeout", "-1s"}, "--idle-timeout (RLS_IDLE_TIMEOUT) must be positive"},
		{[]string{"--max-conns", "-1"}, "--max-conns (RLS_MAX_CONNS) is negative"},
	} {
		_, err := parseConfig(append([]string{"--config-dir", "../../config"}, tc.args...), func(string) string { return "" }, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %q", tc.args, err, tc.want)
		}
	}
	c, err := parseConfig([]string{"--config-dir", "../../config"}, func(string) string { return "" }, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.IdleTimeout != 5*time.Minute || c.GRPCMaxConnAge != 30*time.Minute || c.MaxConns != 1000 {
		t.Errorf("defaults: %+v", c)
	}
}

// TestUserErrorNamesTheSetting: a package's option error becomes one
// naming the flag behind the option; other errors stay as they are.
func TestUserErrorNamesTheSetting(t *testing.T) {
	err := userError(fmt.Errorf("open: %w", &redisclient.OptionError{Option: "Timeout", Msg: "-1s is invalid"}))
	if err.Error() != "--redis-timeout (RLS_REDIS_TIMEOUT): -1s is invalid" {
		t.Errorf("got %q", err)
	}
	other := errors.New("dial tcp: refused")
	if userError(other) != other {
		t.Error("an error without an option changed")
	}
	for key := range optionNames {
		if pkg, _, ok := strings.Cut(key, "."); !ok || (pkg != "redis" && pkg != "descriptors" && pkg != "reload") {
			t.Errorf("optionNames key %q: want package.Option", key)
		}
	}
}

// TestHelp: rls serve --help shows the flags by topic, at most 39 of them
// (the flags planned next keep the total at 50 or fewer, and issue 43's
// --region and --global-redis-url take it to 52), each with a one-line
// usage of at most 80 characters.
func TestHelp(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, func(string) string { return "" }, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	help := out.String()
	for _, g := range helpGroups {
		if !strings.Contains(help, "\n"+g.title+":\n") {
			t.Errorf("no group %q in the help:\n%s", g.title, help)
		}
	}
	lines := strings.Split(help, "\n")
	flags := 0
	for i, l := range lines {
		if !strings.HasPrefix(l, "  --") && !strings.HasSuffix(l, "(environment)") {
			continue
		}
		if strings.HasPrefix(l, "  --") {
			flags++
		}
		usage := lines[i+1]
		if !strings.HasPrefix(usage, "      ") || len(usage) > 80 || (i+2 < len(lines) && strings.HasPrefix(lines[i+2], "       ")) {
			t.Errorf("%s: usage %q: want one line of at most 80 characters", strings.TrimSpace(l), usage)
		}
	}
	n := 0
	newFlagSet(defaultConfig(), io.Discard).VisitAll(func(*flag.Flag) { n++ })
	if flags != n || n > 52 {
		t.Errorf("the help shows %d flags of %d; want all, and at most 52", flags, n)
	}
}

// TestHelpGroupsEveryFlag: every flag is in exactly one help group.
func TestHelpGroupsEveryFlag(t *testing.T) {
	seen := map[string]string{}
	for _, g := range helpGroups {
		for _, name := range g.flags {
			if prev, dup := seen[name]; dup {
				t.Errorf("--%s is in %s and %s", name, prev, g.title)
			}
			seen[name] = g.title
		}
	}
	newFlagSet(defaultConfig(), io.Discard).VisitAll(func(f *flag.Flag) {
		if seen[f.Name] == "" {
			t.Errorf("--%s is in no help group", f.Name)
		}
		delete(seen, f.Name)
	})
	for name := range seen {
		t.Errorf("help group lists --%s, which does not exist", name)
	}
}

// TestAdminAddr: the admin API is off by default (no port a second rls on
// the host would clash on, nothing that can reset counters unasked), on a
// port of its own when --admin-addr names one, and a bad address is an
// error naming the flag and its twin.
func TestAdminAddr(t *testing.T) {
	noEnv := func(string) string { return "" }
	cfg, err := parseConfig([]string{"--config-dir", "../../config"}, noEnv, io.Discard)
	if err != nil || cfg.AdminAddr != "" {
		t.Fatalf("default: %q %v, want off", adminAddrOf(cfg), err)
	}
	if cfg, err := parseConfig([]string{"--config-dir", "../../config", "--admin-addr", "127.0.0.1:8082"}, noEnv, io.Discard); err != nil || cfg.AdminAddr != "127.0.0.1:8082" {
		t.Errorf("--admin-addr 127.0.0.1:8082: %v", err)
	}
	if cfg, err := parseConfig([]string{"--config-dir", "../../config", "--admin-addr", ""}, noEnv, io.Discard); err != nil || cfg.AdminAddr != "" {
		t.Errorf("--admin-addr '': %v", err)
	}
	_, err = parseConfig([]string{"--config-dir", "../../config"}, func(k string) string { return map[string]string{"RLS_ADMIN_ADDR": "8082"}[k] }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `--admin-addr (RLS_ADMIN_ADDR) "8082" is invalid: want host:port`) {
		t.Errorf("RLS_ADMIN_ADDR=8082: %v", err)
	}
}

func adminAddrOf(c *Config) string {
	if c == nil {
		return "<no config>"
	}
	return c.AdminAddr
}
