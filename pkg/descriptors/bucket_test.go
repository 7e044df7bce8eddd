package descriptors

import (
	"os"
	"testing"
)

func TestBucketEntries(t *testing.T) {
	cfg, err := Parse(map[string][]byte{"a.yaml": []byte(`
domain: d
descriptors:
  - key: api_key
    descriptors:
      - key: route
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: tenant
    value: t1
    rate_limit: {unit: minute, requests_per_unit: 7}
`)})
	if err != nil {
		t.Fatal(err)
	}
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
