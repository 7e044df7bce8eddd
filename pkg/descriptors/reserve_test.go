package descriptors

import (
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// TestReserveField: reserve: false keeps a rule off reservations; true (and
// no field) leaves them on; anything else is an error with file:line.
func TestReserveField(t *testing.T) {
	cfg, err := Parse(map[string][]byte{"d.yaml": []byte(`domain: d
descriptors:
  - key: off
    rate_limit: {unit: second, requests_per_unit: 5, reserve: false}
  - key: on
    rate_limit: {unit: second, requests_per_unit: 5, reserve: true}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 5}
`)})
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{"off": true, "on": false, "plain": false} {
		r := cfg.Match("d", []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: "x"}})
		if r == nil || r.NoReserve != want {
			t.Errorf("%s: rule %+v, want NoReserve %v", key, r, want)
		}
	}
	var b strings.Builder
	if err := cfg.Dump(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "d: off 5/second sliding_window reserve=false (d.yaml:4)") {
		t.Errorf("Dump does not show reserve=false:\n%s", b.String())
	}
	_, err = Parse(map[string][]byte{"d.yaml": []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, reserve: maybe}\n")})
	if err == nil || !strings.Contains(err.Error(), "d.yaml:4") || !strings.Contains(err.Error(), "reserve") {
		t.Errorf("reserve: maybe: %v, want an error naming d.yaml:4 and reserve", err)
	}
}
