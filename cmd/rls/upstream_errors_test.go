package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/rls-project/rls/pkg/testkit"
)

// TestStrayUpstreamVariablesWarned: run as rls (not ratelimit), upstream's
// variables of a carried-over Deployment are named in one WARN at start,
// with the switch that reads them; in upstream mode there is no such line.
func TestStrayUpstreamVariablesWarned(t *testing.T) {
	env := map[string]string{"REDIS_URL": "redis:6379", "USE_STATSD": "false", "RLS_STORE": "memory"}
	for _, compatMode := range []bool{false, true} {
		if compatMode {
			env["RLS_ENV_COMPAT"], env["REDIS_SOCKET_TYPE"] = "upstream", "tcp"
			delete(env, "RLS_STORE")
		}
		cfg, err := parseConfig([]string{"--config-dir", "../../config"}, envOf(env), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		var log testkit.Buffer
		a := &app{cfg: cfg, log: slog.New(slog.NewTextHandler(&log, nil))}
		a.logStart()
		warned := strings.Count(log.String(), "level=WARN msg=\"envoyproxy/ratelimit's variables are set but rls serve does not read them")
		switch {
		case !compatMode && (warned != 1 || !strings.Contains(log.String(), "variables=USE_STATSD,REDIS_URL") || !strings.Contains(log.String(), "--env-compat")):
			t.Errorf("as rls: want one WARN naming USE_STATSD,REDIS_URL and --env-compat:\n%s", log.String())
		case compatMode && warned != 0:
			t.Errorf("as ratelimit: the variables are read, yet warned:\n%s", log.String())
		}
	}
}
