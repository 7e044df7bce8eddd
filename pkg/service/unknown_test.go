package service

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rls-project/rls/pkg/testkit"
)

// TestUnknownDomainsCappedAndThrottled: each unknown domain is a series up
// to the cap, the rest one "_other" series; each domain warns at most once
// a minute (the ones beyond the cap share one warning).
func TestUnknownDomainsCappedAndThrottled(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1000, 0))
	u := newUnknownDomains(2, clk.Now)
	reg := prometheus.NewRegistry()
	reg.MustRegister(u)
	var logs testkit.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for range 3 {
		for _, d := range []string{"a", "b", "c", "d"} {
			u.record(d, log)
		}
	}
	want := `
# HELP rls_unknown_domain_requests_total Requests for a domain that no config defines, answered OK for every descriptor, by domain (capped; the rest under domain="_other").
# TYPE rls_unknown_domain_requests_total counter
rls_unknown_domain_requests_total{domain="_other"} 6
rls_unknown_domain_requests_total{domain="a"} 3
rls_unknown_domain_requests_total{domain="b"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "rls_unknown_domain_requests_total"); err != nil {
		t.Error(err)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 3 {
		t.Errorf("%d warnings for a, b and the rest within a minute, want 3:\n%s", n, logs.String())
	}
	clk.Advance(UnknownDomainLogEvery)
	u.record("a", log)
	if n := strings.Count(logs.String(), "domain=a"); n != 2 {
		t.Errorf("domain a warned %d times after a minute, want 2:\n%s", n, logs.String())
	}
}
