package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/testkit"
	"github.com/rls-project/rls/pkg/xds/xdstest"
)

// TestDefaultAlgorithmFiles: --default-algorithm applies to the rules of
// the config files that name no algorithm, and to nothing else; without
// the flag they are sliding windows.
func TestDefaultAlgorithmFiles(t *testing.T) {
	dir := t.TempDir()
	y := "domain: api\ndescriptors:\n" +
		"  - key: none\n    rate_limit: {unit: minute, unit_multiplier: 2, requests_per_unit: 3}\n" +
		"  - key: named\n    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: token_bucket}\n"
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want store.Algorithm
	}{
		{nil, store.SlidingWindow},
		{[]string{"--default-algorithm", "fixed_window"}, store.FixedWindow},
		{[]string{"--default-algorithm", "FIXED_WINDOW"}, store.FixedWindow},
		{[]string{"--default-algorithm", "token_bucket"}, store.TokenBucket},
	} {
		cfg := testConfig(t, append([]string{"--config-dir", dir}, tc.args...)...)
		rules, err := loadRules(cfg, func(string) {})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]store.Algorithm{}
		for _, r := range rules.Rules() {
			got[r.Path] = r.Algorithm
		}
		if got["none"] != tc.want || got["named"] != store.TokenBucket {
			t.Errorf("%v: rules %v, want none %s and named token_bucket", tc.args, got, tc.want)
		}
	}
}

// TestDefaultAlgorithmXDS: over xDS, whose RateLimitPolicy has no
// algorithm field, every rule has the --default-algorithm.
func TestDefaultAlgorithmXDS(t *testing.T) {
	cp := xdstest.Start(t, "127.0.0.1:0")
	_, cfg := xdsServe(t, cp.Addr, "--default-algorithm", "fixed_window")
	testkit.WaitFor(t, "stream open", 5*time.Second, func() bool { return cp.Streams() > 0 })
	cp.Set(t, "test", "1", xdstest.Limit("api", "api", "k", 4, rlsconf.RateLimitUnit_MINUTE))
	if _, ack := cp.AnswerTo(t, "1", 5*time.Second); ack.GetErrorDetail() != nil {
		t.Fatalf("NACKed: %v", ack.GetErrorDetail())
	}
	testkit.WaitFor(t, "the xDS rule in force", 5*time.Second, func() bool {
		_, body := httpGet(t, "http://"+cfg.DebugAddr+"/rlconfig")
		return strings.Contains(body, "api: k 4/minute fixed_window (xds:api)")
	})
}

// TestSimulateTwoMinuteRule: rls simulate takes a rule of unit_multiplier
// 2 as a two-minute window: the fixed window admits 3 at 0-2 s and again
// at 121-122 s, none at 61-62 s (a one-minute window would admit 7), as
// the exact sliding log over two minutes does. It refuses a multiplier of
// 0 with file:line, as rls validate does.
func simulateCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(context.Background(), append([]string{"simulate"}, args...), func(string) string { return "" }, &out, &out)
	return out.String(), err
}

func TestSimulateTwoMinuteRule(t *testing.T) {
	dir := t.TempDir()
	rule := "domain: periods\ndescriptors:\n  - key: two_minutes\n" +
		"    rate_limit: {unit: minute, unit_multiplier: 2, requests_per_unit: 3, algorithm: fixed_window}\n"
	trace := "timestamp,descriptor\n"
	for _, at := range []int{0, 1, 2, 3, 4, 61, 62, 121, 122} {
		trace += strconv.Itoa(at) + ",two_minutes=a\n"
	}
	csv := filepath.Join(dir, "t.csv")
	if err := os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(csv, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := simulateCmd(t, "--config", dir, "--rule", "periods:two_minutes=a", "--trace", csv)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	admitted := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 4 && f[0] == "fixed_window" && f[1] == "*":
			admitted["fixed"] = f[4]
		case len(f) > 5 && strings.Join(f[:3], " ") == "exact sliding log":
			admitted["exact"] = f[5]
		}
	}
	if !strings.Contains(out, "9 requests over 122.0s, limit 3 per 2m0s") || admitted["fixed"] != "5" || admitted["exact"] != "5" {
		t.Errorf("admitted %v, want fixed_window 5 and the exact log 5 of a 2m0s limit:\n%s", admitted, out)
	}

	bad := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(bad, []byte(strings.Replace(rule, "unit_multiplier: 2", "unit_multiplier: 0", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = simulateCmd(t, "--config", filepath.Dir(bad), "--trace", csv)
	if err == nil || !strings.Contains(err.Error(), bad+":4: unit_multiplier: must be at least 1") {
		t.Errorf("multiplier 0: %v\n%s", err, out)
	}
	var vout bytes.Buffer
	if err := run(context.Background(), []string{"validate", filepath.Dir(bad)}, func(string) string { return "" }, &vout, &vout); err == nil ||
		!strings.Contains(vout.String(), bad+":4: unit_multiplier: must be at least 1") {
		t.Errorf("rls validate, multiplier 0: %v\n%s", err, vout.String())
	}
}
