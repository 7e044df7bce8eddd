package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const refundConfig = `domain: refunds
descriptors:
  - key: api_key
    rate_limit: {name: per-key, unit: hour, requests_per_unit: 2}
`

// TestAllowNegativeHits: with --allow-negative-hits=true (Envoy's
// charge-after-response setups, reached only by the user's gateways) a
// refund gives a spent key its hits back and is counted in
// rls_refunded_hits_total; by default the same request is InvalidArgument
// naming the descriptor, and the key stays spent.
func TestAllowNegativeHits(t *testing.T) {
	light(t)
	dir := writeConfig(t, map[string]string{"refunds.yaml": refundConfig})
	spend := func(p *rlsProc) {
		t.Helper()
		for range 2 {
			should(t, p.client(), "refunds", desc("api_key", "k"))
		}
		if r := should(t, p.client(), "refunds", desc("api_key", "k")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("third call of 2/hour: %v, want OVER_LIMIT", r.OverallCode)
		}
	}
	refund := func(p *rlsProc) error {
		d := desc("api_key", "k")
		d.IsNegativeHits, d.HitsAddend = true, wrapperspb.UInt64(2)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "refunds", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		return err
	}
	for _, tc := range []struct {
		name  string
		flags []string
	}{{"on", []string{"--allow-negative-hits=true"}}, {"default", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			p := startRLS(t, dir, append(tc.flags, "--over-limit-cache=false")...)
			spend(p)
			err := refund(p)
			after := should(t, p.client(), "refunds", desc("api_key", "k")).OverallCode
			refunded := regexpValue(t, scrapeAddr(t, p.HTTPAddr), `rls_refunded_hits_total{domain="refunds",rule="per-key"}`)
			if tc.flags != nil {
				if err != nil || after != rlsv3.RateLimitResponse_OK || refunded != "2" {
					t.Errorf("refund: %v; then %v; refunded %q; want OK, OK, 2", err, after, refunded)
				}
				return
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptors[0] (api_key)") {
				t.Errorf("refund: %v, want InvalidArgument naming descriptors[0] (api_key)", err)
			}
			if after != rlsv3.RateLimitResponse_OVER_LIMIT || refunded != "" {
				t.Errorf("after the refused refund: %v, refunded %q; want OVER_LIMIT and no series", after, refunded)
			}
		})
	}
}

// regexpValue returns the value of the series named exactly (with its
// labels) in a scrape, or "" when it is not there.
func regexpValue(t *testing.T, scrape, series string) string {
	t.Helper()
	for _, line := range strings.Split(scrape, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}
