package service

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store/memory"
)

// decisionSeries gathers reg's decision series: "domain/rule/outcome"
// for rls_decisions_total and "domain/rule/value/outcome" for
// rls_detailed_decisions_total, each with its count.
func decisionSeries(t testing.TB, reg prometheus.Gatherer) (decisions, detailed map[string]float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	decisions, detailed = map[string]float64{}, map[string]float64{}
	for _, mf := range mfs {
		var into map[string]float64
		var names []string
		switch mf.GetName() {
		case "rls_decisions_total":
			into, names = decisions, []string{"domain", "rule", "outcome"}
		case "rls_detailed_decisions_total":
			into, names = detailed, []string{"domain", "rule", "value", "outcome"}
		default:
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			key := make([]string, len(names))
			for i, n := range names {
				key[i] = labels[n]
			}
			into[strings.Join(key, "/")] = m.GetCounter().GetValue()
		}
	}
	return decisions, detailed
}

func mustParse(t testing.TB, yaml string) *descriptors.Config {
	t.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"test.yaml": []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestMetricsCountOutcomesWithoutRawValues(t *testing.T) {
	cfg := mustParse(t, testConfig+`
  - key: detailed
    detailed_metric: true
    rate_limit: {name: det, unit: hour, requests_per_unit: 1000}
`)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, 3)
	s := New(cfg, limiter.New(memory.New(memory.Options{}), limiter.Options{}), Options{Metrics: m})
	if dec, det := decisionSeries(t, reg); len(dec)+len(det) != 0 {
		t.Errorf("series before any decision: %v %v", dec, det)
	}
	for i := range 1000 {
		call(t, s, 0, d("api_key", fmt.Sprint("key-", i)))
	}
	call(t, s, 0, d("small", "x"))
	call(t, s, 0, d("small", "x"))
	call(t, s, 0, d("shadow", "x"))
	call(t, s, 0, d("shadow", "x"))
	call(t, s, 0, d("free", "x"), d("nothing", "x"))
	for i := range 10 {
		call(t, s, 0, d("detailed", fmt.Sprint("v", i)))
	}
	s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*rlcommon.RateLimitDescriptor{d("a", "b")}})

	dec, det := decisionSeries(t, reg)
	want := map[string]float64{
		"test/per-key/ok":               1000,
		"test/small/near_limit":         1,
		"test/small/over_limit":         1,
		"test/shadow/near_limit":        1,
		"test/shadow/shadow_over_limit": 1,
		"test/free/unlimited":           1, // no name: labelled by its path
		"test//no_rule":                 1,
		"_unknown//no_rule":             1,
		"test/det/ok":                   10,
	}
	for k, v := range want {
		if dec[k] != v {
			t.Errorf("rls_decisions_total %s = %v, want %v", k, dec[k], v)
		}
	}
	// 1000 distinct api_key values added no series: a series per rule and
	// outcome seen.
	if len(dec) != len(want) {
		t.Errorf("%d decision series, want %d: %v", len(dec), len(want), dec)
	}
	// Detailed values are capped at 3 per rule; the rest is _other.
	if det["test/det/_other/ok"] != 7 || len(det) != 4 {
		t.Errorf("detailed series %v, want 3 values and _other at 7", det)
	}
}

// TestMetricsFollowTheConfig: a reload keeps the counts of the rules it
// keeps, drops the series of the rules and domains it removes, and keeps a
// detailed rule's values and cap.
func TestMetricsFollowTheConfig(t *testing.T) {
	conf := func(rule string, domains ...string) *descriptors.Config {
		files := map[string][]byte{}
		for _, dom := range domains {
			files[dom+".yaml"] = []byte(fmt.Sprintf(`
domain: %s
descriptors:
  - key: kept
    rate_limit: {name: kept, unit: hour, requests_per_unit: 1000}
  - key: det
    detailed_metric: true
    rate_limit: {name: det, unit: hour, requests_per_unit: 1000}
  - key: renamed
    rate_limit: {name: %s, unit: hour, requests_per_unit: 1000}
`, dom, rule))
		}
		cfg, err := descriptors.Parse(files)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, 3)
	s := New(conf("r0", "a", "b"), limiter.New(memory.New(memory.Options{}), limiter.Options{}), Options{Metrics: m})
	req := func(domain string, ds ...*rlcommon.RateLimitDescriptor) {
		t.Helper()
		if _, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		req("a", d("kept", "x"), d("renamed", "x"), d("det", fmt.Sprint("v", i)), d("none", "x"))
		req("b", d("kept", "x"))
		// Renamed at every reload; the detailed values seen stay capped.
		s.SetConfig(conf(fmt.Sprint("r", i+1), "a", "b"))
	}
	dec, det := decisionSeries(t, reg)
	want := map[string]float64{"a/kept/ok": 5, "a//no_rule": 5, "a/det/ok": 5, "b/kept/ok": 5}
	if fmt.Sprint(dec) != fmt.Sprint(want) {
		t.Errorf("after 5 renames: %v, want %v", dec, want)
	}
	if len(det) != 4 || det["a/det/_other/ok"] != 2 {
		t.Errorf("detailed after 5 reloads with a cap of 3: %v, want 3 values and _other at 2", det)
	}
	// Domain b leaves; a's det rule stops being detailed.
	s.SetConfig(mustParse(t, `
domain: a
descriptors:
  - key: kept
    rate_limit: {name: kept, unit: hour, requests_per_unit: 1000}
  - key: det
    rate_limit: {name: det, unit: hour, requests_per_unit: 1000}
`))
	dec, det = decisionSeries(t, reg)
	want = map[string]float64{"a/kept/ok": 5, "a//no_rule": 5, "a/det/ok": 5}
	if fmt.Sprint(dec) != fmt.Sprint(want) || len(det) != 0 {
		t.Errorf("after domain b left: %v %v, want %v and no detailed series", dec, det, want)
	}
}

// TestMetricsConcurrentReloads: decisions, reloads and scrapes at once
// (run with -race), and a scrape during them never fails.
func TestMetricsConcurrentReloads(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, 2)
	cfgs := []*descriptors.Config{mustParse(t, testConfig), mustParse(t, testConfig+`
  - key: detailed
    detailed_metric: true
    rate_limit: {name: det, unit: hour, requests_per_unit: 1000}
`)}
	s := New(cfgs[0], limiter.New(memory.New(memory.Options{}), limiter.Options{}), Options{Metrics: m})
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				switch g {
				case 0:
					s.SetConfig(cfgs[i%2])
				case 1:
					call(t, s, 0, d("detailed", fmt.Sprint(i%5)), d("small", "x"))
				default:
					if _, err := reg.Gather(); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

// TestMetricsLabelOrder: a scrape's series come in the registry's order,
// so sorting them costs it a pass.
func TestMetricsLabelOrder(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, 10)
	var b strings.Builder
	b.WriteString("domain: test\ndescriptors:\n")
	for i := range 50 {
		fmt.Fprintf(&b, "  - key: k%02d\n    detailed_metric: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 49-i)
	}
	s := New(mustParse(t, b.String()), limiter.New(memory.New(memory.Options{}), limiter.Options{}), Options{Metrics: m})
	for i := range 50 {
		call(t, s, 0, d(fmt.Sprintf("k%02d", i), "b"), d(fmt.Sprintf("k%02d", i), "a"))
	}
	ch := make(chan prometheus.Metric, 1000)
	decisionCollector{m}.Collect(ch)
	close(ch)
	var got []string
	for metric := range ch {
		out := new(dto.Metric)
		if err := metric.Write(out); err != nil {
			t.Fatal(err)
		}
		var labels []string
		for _, lp := range out.GetLabel() {
			labels = append(labels, lp.GetValue())
		}
		got = append(got, metric.Desc().String()[:40]+strings.Join(labels, "\x00"))
	}
	if !sort.StringsAreSorted(got) || len(got) < 150 { // 50 rules, 100 values, outcomes of each
		t.Errorf("%d series, sorted %v", len(got), sort.StringsAreSorted(got))
	}
	if n, err := testutil.GatherAndCount(reg, "rls_decisions_total", "rls_detailed_decisions_total"); err != nil || n != len(got) {
		t.Errorf("gathered %d, %v", n, err)
	}
}

// BenchmarkScrapeRules: a scrape of 100,000 rules, each with one outcome
// counted, and each with three.
func BenchmarkScrapeRules(b *testing.B) {
	var y strings.Builder
	y.WriteString("domain: wide\ndescriptors:\n")
	for i := range 100_000 {
		fmt.Fprintf(&y, "  - {key: tenant, value: t%06d, rate_limit: {unit: minute, requests_per_unit: 10}}\n", i)
	}
	cfg := mustParse(b, y.String())
	for _, outcomes := range []int{1, 3} {
		b.Run(fmt.Sprintf("outcomes=%d", outcomes), func(b *testing.B) {
			reg := prometheus.NewRegistry()
			m := NewMetrics(reg, 100)
			st := m.statsFor(cfg)
			for _, r := range cfg.Rules() {
				for o := range outcomes {
					st.record("wide", r, Outcome(o), nil)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := reg.Gather(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
