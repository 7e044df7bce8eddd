package descriptors

import (
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/store"
)

const globalYAML = `domain: d
descriptors:
  - key: api
    rate_limit: {name: per_key, unit: second, requests_per_unit: 300, algorithm: fixed_window, scope: global}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 300, scope: global}
  - key: here
    rate_limit: {unit: second, requests_per_unit: 300, scope: region}
`

// TestScopeGlobal: scope: global marks the rule Global when the options
// allow it (a rule naming no algorithm is a sliding window whatever the
// default), shows in the dump, and leaves the key as it is.
func TestScopeGlobal(t *testing.T) {
	cfg, err := Parse(map[string][]byte{"d.yaml": []byte(globalYAML)}, ParseOptions{Global: true, DefaultAlgorithm: store.TokenBucket})
	if err != nil {
		t.Fatal(err)
	}
	e := func(k string) []*rlcommon.RateLimitDescriptor_Entry {
		return []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: "x"}}
	}
	api, plain, here := cfg.Match("d", e("api")), cfg.Match("d", e("plain")), cfg.Match("d", e("here"))
	if !api.Global || !plain.Global || here.Global {
		t.Fatalf("Global %v %v %v, want true true false", api.Global, plain.Global, here.Global)
	}
	if api.Algorithm != store.FixedWindow || plain.Algorithm != store.SlidingWindow || here.Algorithm != store.TokenBucket {
		t.Errorf("algorithms %v %v %v", api.Algorithm, plain.Algorithm, here.Algorithm)
	}
	var b strings.Builder
	if err := cfg.Dump(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "300/second fixed_window scope=global (d.yaml:4)") {
		t.Errorf("Dump does not show the scope:\n%s", b.String())
	}
	regional, err := Parse(map[string][]byte{"d.yaml": []byte(strings.ReplaceAll(globalYAML, ", scope: global", ""))})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := AppendKey(nil, "d", e("api"), api), AppendKey(nil, "d", e("api"), regional.Match("d", e("api"))); string(a) != string(b) {
		t.Errorf("global key %q, regional %q: shares change the limit, not the key", a, b)
	}
}

// TestScopeGlobalErrors: without the options a global rule is an error
// naming the rule and the flags; a token bucket, a split or an unlimited
// rule cannot be global; an unknown scope is named.
func TestScopeGlobalErrors(t *testing.T) {
	_, err := Parse(map[string][]byte{"d.yaml": []byte(globalYAML)})
	if err == nil || !strings.Contains(err.Error(), "d.yaml:4") || !strings.Contains(err.Error(), "rule per_key: scope: global needs "+GlobalFlags) {
		t.Errorf("without Global: %v", err)
	}
	for _, c := range []struct{ rl, want string }{
		{"{unit: second, requests_per_unit: 3, algorithm: token_bucket, scope: global}", "fixed_window or sliding_window"},
		{"{unit: second, requests_per_unit: 3, split: 2, scope: global}", "split do not combine"},
		{"{unlimited: true, scope: global}", "unlimited"},
		{"{unit: second, requests_per_unit: 3, scope: world}", `invalid scope "world"`},
	} {
		_, err := Parse(map[string][]byte{"d.yaml": []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + c.rl + "\n")}, ParseOptions{Global: true})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "d.yaml:4") {
			t.Errorf("%s: %v, want %q", c.rl, err, c.want)
		}
	}
}
