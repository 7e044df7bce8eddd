package descriptors

import (
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// TestStrictField: strict: true on a sliding window of precision 2 or more
// counts apart (its own key) and shows in the dump; anywhere else it is an
// error with file:line.
func TestStrictField(t *testing.T) {
	cfg, err := Parse(map[string][]byte{"d.yaml": []byte(`domain: d
descriptors:
  - key: hard
    rate_limit: {unit: second, requests_per_unit: 50, precision: 10, strict: true}
  - key: soft
    rate_limit: {unit: second, requests_per_unit: 50, precision: 10}
`)})
	if err != nil {
		t.Fatal(err)
	}
	entries := func(k string) []*rlcommon.RateLimitDescriptor_Entry {
		return []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: "x"}}
	}
	hard, soft := cfg.Match("d", entries("hard")), cfg.Match("d", entries("soft"))
	if hard == nil || !hard.Strict || soft == nil || soft.Strict {
		t.Fatalf("rules %+v and %+v, want only the first strict", hard, soft)
	}
	if k := string(AppendKey(nil, "d", entries("hard"), hard)); !strings.HasSuffix(k, ":s1p10x") {
		t.Errorf("strict key %q, want the precision's suffix and x", k)
	}
	var b strings.Builder
	if err := cfg.Dump(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "d: hard 50/second sliding_window precision=10 strict (d.yaml:4)") {
		t.Errorf("Dump does not show strict:\n%s", b.String())
	}
	for _, bad := range []string{
		"{unit: second, requests_per_unit: 5, strict: true}",
		"{unit: second, requests_per_unit: 5, precision: 1, strict: true}",
		"{unit: second, requests_per_unit: 5, algorithm: fixed_window, strict: true}",
	} {
		_, err := Parse(map[string][]byte{"d.yaml": []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + bad + "\n")})
		if err == nil || !strings.Contains(err.Error(), "d.yaml:4") || !strings.Contains(err.Error(), "strict") {
			t.Errorf("%s: %v, want an error naming d.yaml:4 and strict", bad, err)
		}
	}
}
