package descriptors

import (
	"strings"
	"testing"
)

// TestDump: one line per rule with what it limits and where it comes from.
func TestDump(t *testing.T) {
	cfg, err := Parse(map[string][]byte{"d.yaml": []byte(`domain: d
descriptors:
  - key: k
    rate_limit: {name: n, unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 7, on_error: fail_closed}
  - key: free
    shadow_mode: true
    rate_limit: {unlimited: true}
`)})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := cfg.Dump(&b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{"# config " + cfg.Hash() + ", domains [d]\n",
		`d: k name="n" 5/second token_bucket burst=7 on_error=fail_closed (d.yaml:4)` + "\n",
		"d: free unlimited shadow_mode (d.yaml:7)\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("Dump lacks %q:\n%s", want, got)
		}
	}
}
