package descriptors

import (
	"strings"
	"testing"
)

func TestPrecision(t *testing.T) {
	cfg, err := Parse(map[string][]byte{"p.yaml": []byte(`
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: one
    rate_limit: {unit: minute, requests_per_unit: 5, precision: 1}
  - key: ten
    rate_limit: {unit: second, requests_per_unit: 50, algorithm: sliding_window, precision: 10}
`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key       string
		precision uint32
		rest      string
	}{{"plain", 0, "}:s60"}, {"one", 1, "}:s60"}, {"ten", 10, "}:s1p10"}} {
		r := cfg.Match("d", entries(c.key, "x"))
		if r == nil || r.Precision != c.precision {
			t.Fatalf("%s: rule %+v, want precision %d", c.key, r, c.precision)
		}
		// Without precision (or with 1) the key is the two-counter
		// window's, as before precision existed.
		if k := string(AppendKey(nil, "d", entries(c.key, "x"), r)); !strings.HasSuffix(k, c.rest) {
			t.Errorf("%s: key %q, want it to end in %q", c.key, k, c.rest)
		}
	}

	for yaml, want := range map[string]string{
		`{unit: second, requests_per_unit: 5, algorithm: token_bucket, precision: 10}`: "p.yaml:4: precision: only valid with algorithm: sliding_window",
		`{unit: second, requests_per_unit: 5, algorithm: fixed_window, precision: 10}`: "p.yaml:4: precision: only valid with algorithm: sliding_window",
		`{unit: second, requests_per_unit: 5, precision: 0}`:                           "p.yaml:4: precision: must be 1 to 60 sub-windows per window, got 0",
		`{unit: second, requests_per_unit: 5, precision: 61}`:                          "p.yaml:4: precision: must be 1 to 60 sub-windows per window, got 61",
		`{unit: second, requests_per_unit: 5, precision: 2.5}`:                         "p.yaml:4: precision: must be an integer",
	} {
		_, err := Parse(map[string][]byte{"p.yaml": []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + yaml + "\n")})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", yaml, err, want)
		}
	}
}
