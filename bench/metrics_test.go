package main

import (
	"strings"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP rls_fallback_decisions_total Checks decided without the store.
# TYPE rls_fallback_decisions_total counter
rls_fallback_decisions_total{mode="fail_closed"} 5
rls_fallback_decisions_total{mode="fail_open",note="a}b"} 1.5e3
rls_local_cache_hits_total 42 1700000000000
rls_fallback_decisions_totalx 99
rls_store_duration_seconds_bucket{le="0.001"} 7
`
	m, err := parseMetrics(strings.NewReader(text), watchedMetrics)
	if err != nil {
		t.Fatal(err)
	}
	if m["rls_fallback_decisions_total"] != 1505 || m["rls_local_cache_hits_total"] != 42 || len(m) != 2 {
		t.Fatalf("%v", m)
	}
	for _, bad := range []string{"rls_local_cache_hits_total\n", "rls_local_cache_hits_total{a=\"b\" 3\n", "rls_local_cache_hits_total x\n"} {
		if _, err := parseMetrics(strings.NewReader(bad), watchedMetrics); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
	d := metricDeltas(map[string]float64{"rls_store_errors_total": 2}, m)
	if d["rls_fallback_decisions_total"] != 1505 || d["rls_store_errors_total"] != -2 {
		t.Fatalf("%v", d)
	}
}

func TestCheckMetricsURL(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:8080/metrics", "http://localhost/metrics", "https://[::1]:9/m"} {
		if err := checkMetricsURL(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"http://10.0.0.1:8080/metrics", "ftp://127.0.0.1/x", "127.0.0.1:8080", "http:///metrics", "http://example.com/metrics"} {
		if err := checkMetricsURL(bad); err == nil {
			t.Errorf("%s: want a refusal", bad)
		}
	}
}
