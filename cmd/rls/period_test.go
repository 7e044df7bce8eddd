package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
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
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		args []string
		want descriptors.Algorithm
	}{
		{nil, descriptors.SlidingWindow},
		{[]string{"--default-algorithm", "fixed_window"}, descriptors.FixedWindow},
		{[]string{"--default-algorithm", "FIXED_WINDOW"}, descriptors.FixedWindow},
		{[]string{"--default-algorithm", "token_bucket"}, descriptors.TokenBucket},
	} {
		cfg := testConfig(t, append([]string{"--config-dir", dir}, tc.args...)...)
		rules, err := loadRules(cfg, log)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]descriptors.Algorithm{}
		for _, r := range rules.Rules() {
			got[r.Path] = r.Algorithm
		}
		if got["none"] != tc.want || got["named"] != descriptors.TokenBucket {
			t.Errorf("%v: rules %v, want none %s and named token_bucket", tc.args, got, tc.want)
		}
	}
}

// TestDefaultAlgorithmXDS: over xDS, whose RateLimitPolicy has no
// algorithm field, every rule has the --default-algorithm.
func TestDefaultAlgorithmXDS(t *testing.T) {
	cp := xdstest.Start(t, "127.0.0.1:0")
	_, _, log := xdsServe(t, cp.Addr, "--default-algorithm", "fixed_window")
	testkit.WaitFor(t, "stream open", 5*time.Second, func() bool { return cp.Streams() > 0 })
	cp.Set(t, "test", "1", xdstest.Limit("api", "api", "k", 4, rlsconf.RateLimitUnit_MINUTE))
	if _, ack := cp.AnswerTo(t, "1", 5*time.Second); ack.GetErrorDetail() != nil {
		t.Fatalf("NACKed: %v", ack.GetErrorDetail())
	}
	testkit.WaitFor(t, "the xDS rule in force", 5*time.Second, func() bool {
		_, body := httpGet(t, "http://"+listening(log.String(), "debug-addr")+"/rlconfig")
		return strings.Contains(body, "api: k 4/minute fixed_window (xds:api)")
	})
}
