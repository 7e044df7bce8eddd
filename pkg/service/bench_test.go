package service

import (
	"context"
	"fmt"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
)

const benchConfig = `
domain: bench
descriptors:
  - key: api_key
    rate_limit: {name: per-key, unit: second, requests_per_unit: 1000000000}
    descriptors:
      - key: route
        rate_limit: {name: per-route, unit: second, requests_per_unit: 1000000000}
`

func benchCfg(b *testing.B) *descriptors.Config {
	b.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"bench.yaml": []byte(benchConfig)})
	if err != nil {
		b.Fatal(err)
	}
	return cfg
}

// BenchmarkDecision is one in-process decision on the memory store: match
// the descriptor, build its key, decide. Target: under 1 µs, at most 2
// allocations.
func BenchmarkDecision(b *testing.B) {
	cfg := benchCfg(b)
	st := memory.New(memory.Options{})
	entries := d("api_key", "customer-42").Entries
	checks := make([]store.Check, 1)
	results := make([]store.Result, 1)
	var key []byte
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		r := cfg.Match("bench", entries)
		key = descriptors.AppendKey(key[:0], "bench", entries, r)
		checks[0] = ruleCheck(r, string(key), 0)
		checks[0].Hits = 1
		if err := st.Decide(ctx, checks, results); err != nil || !results[0].Allowed {
			b.Fatal(err, results[0])
		}
	}
}

// BenchmarkHandler is the whole ShouldRateLimit handler on the memory store
// (validation, matching, keys, local layer, decision, response), with
// metrics on, for 1 and 2 descriptors and for 1 and 1,000 keys.
func BenchmarkHandler(b *testing.B) { benchHandler(b, nil) }

// benchHandler runs BenchmarkHandler's cases, with tracing when tr is set.
func benchHandler(b *testing.B, tr *Tracing) {
	for _, tc := range []struct {
		name  string
		keys  int
		descs int
	}{{"one_key", 1, 1}, {"1000_keys", 1000, 1}, {"two_descriptors", 1, 2}} {
		b.Run(tc.name, func(b *testing.B) {
			s := New(benchCfg(b), limiter.New(memory.New(memory.Options{}), limiter.Options{}),
				Options{Metrics: NewMetrics(prometheus.NewRegistry(), 100), Tracing: tr})
			reqs := make([]*rlsv3.RateLimitRequest, tc.keys)
			for i := range reqs {
				k := fmt.Sprint("customer-", i)
				ds := []*rlcommon.RateLimitDescriptor{d("api_key", k)}
				if tc.descs == 2 {
					ds = append(ds, d("api_key", k, "route", "/v1/search"))
				}
				reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: ds}
			}
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := s.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
