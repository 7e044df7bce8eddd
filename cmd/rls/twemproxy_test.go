package main

import (
	"strings"
	"testing"

	"github.com/rls-project/rls/pkg/descriptors"
)

// TestCheckTwemproxy: behind twemproxy a config with a rule that needs
// scripts is refused in one line naming the first such rule and how many
// more; fixed windows of one unit and unlimited rules pass.
func TestCheckTwemproxy(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"t.yaml": []byte(`
domain: d
descriptors:
  - key: ok
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: free
    rate_limit: {unlimited: true}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 5}
`)})
	if err != nil {
		t.Fatal(err)
	}
	a := &app{cfg: &Config{RedisURL: "redis://127.0.0.1:22121"}, twemproxy: true}
	err = a.checkTwemproxy(cfg)
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("error %v, want one line", err)
	}
	for _, want := range []string{"twemproxy at redis://127.0.0.1:22121", "t.yaml:9", `domain "d"`, "tb", "a token_bucket", "and 1 more"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	a.twemproxy = false
	if err := a.checkTwemproxy(cfg); err != nil {
		t.Errorf("without twemproxy: %v", err)
	}
}
