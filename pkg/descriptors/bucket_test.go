package descriptors

import (
	"os"
	"strings"
	"testing"
)

// parseA parses yaml as the one file a.yaml, failing the test on an error.
func parseA(t *testing.T, yaml string) *Config {
	t.Helper()
	cfg, err := Parse(map[string][]byte{"a.yaml": []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestBucketEntries(t *testing.T) {
	cfg := parseA(t, `
domain: d
descriptors:
  - key: api_key
    descriptors:
      - key: route
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: tenant
    value: t1
    rate_limit: {unit: minute, requests_per_unit: 7}
`)
	for _, tc := range []struct {
		bucket map[string]string
		want   string // key=value joined by /
		limit  uint32
	}{
		{map[string]string{"route": "r", "api_key": "k"}, "api_key=k/route=r", 5},
		{map[string]string{"route": "r", "api_key": "k", "extra": "x"}, "api_key=k/route=r", 5},
		{map[string]string{"tenant": "t1", "zzz": "x"}, "tenant=t1", 7},
		{map[string]string{"api_key": "k", "tenant": "t1"}, "api_key=k", 0}, // smallest key first
		{map[string]string{"route": "r"}, "", 0},
		{map[string]string{"api_key": "\xff"}, "api_key=\xff", 0},
	} {
		es := cfg.BucketEntries("d", tc.bucket)
		got := ""
		for i, e := range es {
			if i > 0 {
				got += "/"
			}
			got += e.Key + "=" + e.Value
		}
		if got != tc.want {
			t.Errorf("BucketEntries(%q) = %q, want %q", tc.bucket, got, tc.want)
		}
		var limit uint32
		if r := cfg.Match("d", es); r != nil {
			limit = r.RequestsPerUnit
		}
		if limit != tc.limit {
			t.Errorf("BucketEntries(%q) matched limit %d, want %d", tc.bucket, limit, tc.limit)
		}
	}
	if es := cfg.BucketEntries("nope", map[string]string{"api_key": "k"}); es != nil {
		t.Errorf("unknown domain: %v", es)
	}
}

// TestBucketEntriesExample pins docs/rlqs.md's table on config/example.yaml.
func TestBucketEntriesExample(t *testing.T) {
	y, err := os.ReadFile("../../config/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(map[string][]byte{"example.yaml": y})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		bucket map[string]string
		rule   string
	}{
		{map[string]string{"api_key": "k", "route": "/v1/search"}, "search"},
		{map[string]string{"route": "/v1/orders", "api_key": "k"}, "per-route"},
		{map[string]string{"api_key": "k", "tenant": "t"}, "per-api-key"},
		{map[string]string{"route": "/x"}, ""},
	} {
		name := ""
		if r := cfg.Match("example", cfg.BucketEntries("example", tc.bucket)); r != nil {
			name = r.Name
		}
		if name != tc.rule {
			t.Errorf("BucketId %v: rule %q, want %q", tc.bucket, name, tc.rule)
		}
	}
}

// TestBucketUnreachable: the rules BucketUnreachable lists are exactly
// those whose own BucketId (its path's keys and values) BucketEntries walks
// elsewhere.
func TestBucketUnreachable(t *testing.T) {
	cfg := parseA(t, `
domain: d
descriptors:
  - key: b
    descriptors:
      - key: a
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: x
    rate_limit: {unit: second, requests_per_unit: 2}
    descriptors:
      - key: a
        rate_limit: {unit: second, requests_per_unit: 3}
      - key: c
        rate_limit: {unit: second, requests_per_unit: 4}
  - key: z
    descriptors:
      - key: y
        rate_limit: {unit: second, requests_per_unit: 5}
`)
	got := cfg.BucketUnreachable("d")
	// a > c too: at c's level the BucketId's "a" (a sibling of c) sorts first.
	if len(got) != 3 || !strings.HasPrefix(got[0], "a.yaml:6: rule b > a: ") || !strings.Contains(got[0], `walk takes "a" first`) ||
		!strings.HasPrefix(got[1], "a.yaml:12: rule a > a: ") || !strings.Contains(got[1], "twice") ||
		!strings.HasPrefix(got[2], "a.yaml:14: rule a > c: ") {
		t.Errorf("unreachable: %q", got)
	}
	// The differential: each rule's own BucketId.
	for _, tc := range []struct {
		path      [][2]string
		reachable bool
	}{
		{[][2]string{{"b", "v"}, {"a", "v"}}, false},
		{[][2]string{{"a", "x"}}, true},
		{[][2]string{{"a", "x"}, {"c", "v"}}, false},
		{[][2]string{{"z", "v"}, {"y", "v"}}, true},
	} {
		bucket := map[string]string{}
		for _, e := range tc.path {
			bucket[e[0]] = e[1]
		}
		es := cfg.BucketEntries("d", bucket)
		same := len(es) == len(tc.path)
		for i := range es {
			same = same && es[i].Key == tc.path[i][0] && es[i].Value == tc.path[i][1]
		}
		if same != tc.reachable {
			t.Errorf("%v: BucketEntries %v, reachable %v", tc.path, es, tc.reachable)
		}
	}
	if got := cfg.BucketUnreachable("nope"); got != nil {
		t.Errorf("unknown domain: %q", got)
	}
}
