package simulate

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
)

const setupYAML = `domain: shop
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: route
        value: /search
        rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 10}
  - key: api_key
    value: batch
    rate_limit: {unlimited: true}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 20, precision: 10}
`

func setupConfig(t *testing.T, yaml string) *descriptors.Config {
	t.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"shop.yaml": []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func entry(k, v string) *rlcommon.RateLimitDescriptor_Entry {
	return &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v}
}

// ownCandidate returns the candidate marked Own, or fails.
func ownCandidate(t *testing.T, su *Setup) Candidate {
	t.Helper()
	for _, c := range su.Candidates {
		if c.Own {
			return c
		}
	}
	t.Fatalf("no candidate is the rule's own: %+v", su.Candidates)
	return Candidate{}
}

func TestNewSetup(t *testing.T) {
	cfg := setupConfig(t, setupYAML)
	searchKey := string(descriptors.AppendKey(nil, "shop", []*rlcommon.RateLimitDescriptor_Entry{entry("api_key", "k1"), entry("route", "/search")},
		cfg.Match("shop", []*rlcommon.RateLimitDescriptor_Entry{entry("api_key", "k1"), entry("route", "/search")})))
	for _, tc := range []struct {
		name    string
		src     Source
		limit   Limit
		own     string // the own candidate's name; "" for none
		genKey  string
		rows    map[string]string // CSV entries joined with ',' -> key; "-" for skipped
		nCands  int
		wantErr bool
	}{
		{
			name:   "bare limit",
			src:    Source{Limit: Limit{Requests: 50, Window: 2 * time.Second}},
			limit:  Limit{Requests: 50, Window: 2 * time.Second},
			genKey: "sim",
			rows:   map[string]string{"": "sim", "a=1": "a=1", "a=1,b=2": "a=1|b=2"},
			nCands: 8, // two precisions, each also strict // two counters, 2 precisions, fixed, token buckets of burst L and L/10
		},
		{
			name:   "rule by descriptor",
			src:    Source{Config: cfg, Domain: "shop", Entries: []*rlcommon.RateLimitDescriptor_Entry{entry("api_key", "k1"), entry("route", "/search")}},
			limit:  Limit{Requests: 5, Window: time.Second},
			own:    "token_bucket burst=10",
			genKey: searchKey,
			rows: map[string]string{
				"":                         searchKey,
				"api_key=k1,route=/search": searchKey,
				"api_key=k1":               "-", // the per-api-key rule
				"ip=1.2.3.4":               "-",
			},
			nCands: 8, // two precisions, each also strict // no burst L/10 (0); burst=10 added as the own
		},
		{
			name:   "first limited rule",
			src:    Source{Config: cfg},
			limit:  Limit{Requests: 100, Window: time.Minute},
			own:    "sliding_window",
			genKey: cfg.Rules()[0].Path,
			rows:   map[string]string{"api_key=k2": string(descriptors.AppendKey(nil, "shop", []*rlcommon.RateLimitDescriptor_Entry{entry("api_key", "k2")}, cfg.Rules()[0]))},
			nCands: 8, // two precisions, each also strict
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			su, err := NewSetup(tc.src, []uint64{2, 10})
			if err != nil {
				t.Fatal(err)
			}
			if su.Limit != tc.limit || su.GenKey != tc.genKey {
				t.Errorf("limit %+v, gen key %q; want %+v, %q", su.Limit, su.GenKey, tc.limit, tc.genKey)
			}
			if len(su.Candidates) != tc.nCands {
				t.Errorf("%d candidates, want %d: %+v", len(su.Candidates), tc.nCands, su.Candidates)
			}
			if tc.own != "" {
				if got := ownCandidate(t, su).Name(su.Limit); got != tc.own {
					t.Errorf("own candidate %q, want %q", got, tc.own)
				}
			}
			for row, want := range tc.rows {
				var fields []string
				if row != "" {
					fields = strings.Split(row, ",")
				}
				key, ok := su.Key(fields)
				if want == "-" {
					if ok {
						t.Errorf("row %q counts on %q, want it skipped", row, key)
					}
				} else if !ok || key != want {
					t.Errorf("row %q: key %q, %v; want %q", row, key, ok, want)
				}
			}
		})
	}
}

func TestNewSetupPrecisionRule(t *testing.T) {
	cfg := setupConfig(t, setupYAML)
	su, err := NewSetup(Source{Config: cfg, Domain: "shop", Entries: []*rlcommon.RateLimitDescriptor_Entry{entry("ip", "1.2.3.4")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if own := ownCandidate(t, su); own.Algorithm != store.SlidingWindow || own.Precision != 10 {
		t.Errorf("own candidate %+v, want the sliding window of precision 10", own)
	}
}

func TestNewSetupErrors(t *testing.T) {
	cfg := setupConfig(t, setupYAML)
	empty := setupConfig(t, "domain: none\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true}\n")
	odd := setupConfig(t, "domain: odd\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 0}\n")
	for _, tc := range []struct {
		name   string
		src    Source
		option string // "" for a plain error
		want   string
	}{
		{"zero limit", Source{Limit: Limit{Window: time.Second}}, "Limit", "limit 0"},
		{"fractional window", Source{Limit: Limit{Requests: 5, Window: 1500 * time.Millisecond}}, "Limit", "window 1.5s: want a whole number of seconds"},
		{"no match", Source{Config: cfg, Domain: "shop", Entries: []*rlcommon.RateLimitDescriptor_Entry{entry("nothing", "here")}}, "Entries", "no rule of the config matches it"},
		{"other domain", Source{Config: cfg, Domain: "elsewhere", Entries: []*rlcommon.RateLimitDescriptor_Entry{entry("api_key", "k1")}}, "Entries", "no rule of the config matches it"},
		{"unlimited", Source{Config: cfg, Domain: "shop", Entries: []*rlcommon.RateLimitDescriptor_Entry{entry("api_key", "batch")}}, "Entries", "shop.yaml:11 is unlimited: nothing to simulate"},
		{"no limited rule", Source{Config: empty}, "Config", "no limited rule in it"},
		{"rule's limit", Source{Config: odd}, "", "shop.yaml:4: limit 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewSetup(tc.src, nil)
			if err == nil {
				t.Fatal("no error")
			}
			var oe *OptionError
			if isOpt := errors.As(err, &oe); isOpt != (tc.option != "") || (isOpt && oe.Option != tc.option) {
				t.Errorf("error %#v, want an OptionError of %q", err, tc.option)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want %q in it", err, tc.want)
			}
		})
	}
}

// TestSetupGenerateAndRun: "standard" stands for the standard generators,
// generated events count on GenKey, and RunAll reports each trace.
func TestSetupGenerateAndRun(t *testing.T) {
	su, err := NewSetup(Source{Limit: Limit{Requests: 20, Window: time.Second}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	traces, err := su.Generate([]string{"standard", "poisson:duration=3s"}, 7)
	if err != nil {
		t.Fatal(err)
	}
	if len(traces) != len(StandardGenerators)+1 {
		t.Fatalf("%d traces, want %d", len(traces), len(StandardGenerators)+1)
	}
	for _, tr := range traces {
		if len(tr.Events) == 0 || tr.Events[0].Key != "sim" || tr.Seed != 7 {
			t.Errorf("trace %s: %d events, first key %q, seed %d", tr.Name, len(tr.Events), tr.Events[0].Key, tr.Seed)
		}
	}
	if _, err := su.Generate([]string{"poisson:rate=fast"}, 1); err == nil || !strings.Contains(err.Error(), "rate=fast") {
		t.Errorf("bad generator: %v", err)
	}
	reps, err := RunAll(context.Background(), traces[:2], su.Limit, su.Candidates)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 2 || reps[0].Trace != traces[0].Name || reps[1].Trace != traces[1].Name || len(reps[0].Results) != len(su.Candidates) {
		t.Errorf("reports %+v", reps)
	}
	if _, err := RunAll(context.Background(), []Trace{{Name: "bad"}}, Limit{}, nil); err == nil || !strings.HasPrefix(err.Error(), "bad: limit 0") {
		t.Errorf("RunAll of a zero limit: %v, want an error naming the trace", err)
	}
}
