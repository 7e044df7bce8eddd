package service

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// The cases of envoyproxy/ratelimit's service tests (test/service/
// ratelimit_test.go at f2fb157, 2026-07-05), replayed against rls. Upstream
// mocks its cache: each test says which limit every descriptor matched (with
// its shadow_mode and quota_mode) and whether the cache found it over. Here
// each descriptor matches a real rule instead: "over" is requests_per_unit 0
// (always over), "ok" is 1000, "none" matches no rule, "unlimited" an
// unlimited one; the answer must carry upstream's statuses and overall code.

// upDesc is one descriptor of a replayed case.
type upDesc struct {
	kind          string // over | ok | none | unlimited
	shadow, quota bool
	metadata      string // YAML flow mapping, e.g. "{name: service_1}"
}

type upCase struct {
	name           string
	shadowMode     bool // SHADOW_MODE
	quotaMode      bool // QUOTA_MODE
	metadata       bool // RESPONSE_DYNAMIC_METADATA
	descs          []upDesc
	wantOverall    rlsv3.RateLimitResponse_Code
	wantCodes      []rlsv3.RateLimitResponse_Code
	wantMeta       map[string]string // response metadata "metadata" fields (string values)
	wantNoMetadata bool              // response metadata without a "metadata" field
	wantViolations []float64         // response metadata's quotaModeViolations
	wantQuotaOn    bool              // response metadata's quotaModeEnabled
}

const (
	cOK   = rlsv3.RateLimitResponse_OK
	cOver = rlsv3.RateLimitResponse_OVER_LIMIT
)

var upstreamServiceCases = []upCase{
	{name: "TestService/over", descs: []upDesc{{kind: "none"}, {kind: "over"}},
		wantOverall: cOver, wantCodes: []rlsv3.RateLimitResponse_Code{cOK, cOver}},
	{name: "TestServiceGlobalShadowMode", shadowMode: true, descs: []upDesc{{kind: "over"}, {kind: "none"}},
		wantOverall: cOK, wantCodes: []rlsv3.RateLimitResponse_Code{cOver, cOK}},
	{name: "TestRuleShadowMode", descs: []upDesc{{kind: "over", shadow: true}, {kind: "over", shadow: true}},
		wantOverall: cOK, wantCodes: []rlsv3.RateLimitResponse_Code{cOK, cOK}},
	{name: "TestMixedRuleShadowMode", descs: []upDesc{{kind: "over", shadow: true}, {kind: "over"}},
		wantOverall: cOver, wantCodes: []rlsv3.RateLimitResponse_Code{cOK, cOver}},
	{name: "TestUnlimited", descs: []upDesc{{kind: "ok"}, {kind: "none"}, {kind: "unlimited"}},
		wantOverall: cOK, wantCodes: []rlsv3.RateLimitResponse_Code{cOK, cOK, cOK}},
	{name: "TestServiceGlobalQuotaMode", quotaMode: true, descs: []upDesc{{kind: "over"}, {kind: "over"}},
		wantOverall: cOver, wantCodes: []rlsv3.RateLimitResponse_Code{cOver, cOver}},
	{name: "TestMetadataReturnedForPassedDescriptors", quotaMode: true, metadata: true,
		descs:       []upDesc{{kind: "ok", metadata: "{name: service_1}"}, {kind: "over", quota: true, metadata: "{name: service_2}"}},
		wantOverall: cOK, wantCodes: []rlsv3.RateLimitResponse_Code{cOK, cOver}, wantMeta: map[string]string{"name": "service_1"},
		wantViolations: []float64{1}, wantQuotaOn: true},
	{name: "TestMetadataReturnedForAllPassedDescriptors", quotaMode: true, metadata: true,
		descs:       []upDesc{{kind: "ok", quota: true, metadata: "{name: service_1}"}, {kind: "ok", quota: true, metadata: "{some_other_name: service_2}"}},
		wantOverall: cOK, wantCodes: []rlsv3.RateLimitResponse_Code{cOK, cOK}, wantMeta: map[string]string{"name": "service_1", "some_other_name": "service_2"},
		wantQuotaOn: true},
	{name: "TestOverlappingMetadataReturnsTheFirstValue", quotaMode: true, metadata: true,
		descs:       []upDesc{{kind: "ok", quota: true, metadata: "{name: service_1}"}, {kind: "ok", quota: true, metadata: "{name: service_2}"}},
		wantOverall: cOK, wantCodes: []rlsv3.RateLimitResponse_Code{cOK, cOK}, wantMeta: map[string]string{"name": "service_1"},
		wantQuotaOn: true},
	{name: "TestServiceQuotaModeWithMetadata", quotaMode: true, metadata: true, descs: []upDesc{{kind: "ok"}, {kind: "over", quota: true}},
		wantOverall: cOK, wantCodes: []rlsv3.RateLimitResponse_Code{cOK, cOver}, wantNoMetadata: true, wantViolations: []float64{1}, wantQuotaOn: true},
	{name: "TestServicePerDescriptorQuotaMode", descs: []upDesc{{kind: "over"}, {kind: "ok", quota: true}},
		wantOverall: cOver, wantCodes: []rlsv3.RateLimitResponse_Code{cOver, cOK}},
	{name: "TestServiceMixedPerDescriptorModes", descs: []upDesc{{kind: "ok"}, {kind: "over", quota: true}},
		wantOverall: cOver, wantCodes: []rlsv3.RateLimitResponse_Code{cOK, cOver}},
	{name: "TestServiceMixedPerDescriptorModesUnderLimit", descs: []upDesc{{kind: "ok"}, {kind: "ok", quota: true}},
		wantOverall: cOK, wantCodes: []rlsv3.RateLimitResponse_Code{cOK, cOK}},
	{name: "TestServiceQuotaModeOnlyAllOverTheLimit", descs: []upDesc{{kind: "over", quota: true}, {kind: "over", quota: true}},
		wantOverall: cOver, wantCodes: []rlsv3.RateLimitResponse_Code{cOver, cOver}},
	{name: "TestServiceQuotaModeOnlySomeOverTheLimit", descs: []upDesc{{kind: "over", quota: true}, {kind: "ok", quota: true}},
		wantOverall: cOK, wantCodes: []rlsv3.RateLimitResponse_Code{cOver, cOK}},
	{name: "TestServiceQuotaModeWithShadowMode", shadowMode: true, descs: []upDesc{{kind: "over", quota: true}, {kind: "over", quota: true}},
		wantOverall: cOK, wantCodes: []rlsv3.RateLimitResponse_Code{cOver, cOver}},
	{name: "TestServiceMixedModeWithShadowMode", shadowMode: true, descs: []upDesc{{kind: "over"}, {kind: "over", quota: true}},
		wantOverall: cOK, wantCodes: []rlsv3.RateLimitResponse_Code{cOver, cOver}},
	// Not in upstream's tests, following the same rule: metadata of a
	// descriptor that is over is left out, and none at all gives no field.
	{name: "metadata/none-passed", metadata: true,
		descs:       []upDesc{{kind: "over", metadata: "{name: a}"}},
		wantOverall: cOver, wantCodes: []rlsv3.RateLimitResponse_Code{cOver}, wantNoMetadata: true},
}

// upstreamConfig is the YAML of a case: descriptor i has key d<i>.
func upstreamConfig(c upCase) string {
	var b strings.Builder
	b.WriteString("domain: up\ndescriptors:\n")
	for i, d := range c.descs {
		if d.kind == "none" {
			continue
		}
		fmt.Fprintf(&b, "  - key: d%d\n    shadow_mode: %t\n    quota_mode: %t\n", i, d.shadow, d.quota)
		if d.metadata != "" {
			fmt.Fprintf(&b, "    metadata: %s\n", d.metadata)
		}
		switch d.kind {
		case "unlimited":
			b.WriteString("    rate_limit: {unlimited: true}\n")
		case "over":
			fmt.Fprintf(&b, "    rate_limit: {name: r%d, unit: minute, requests_per_unit: 0}\n", i)
		default:
			fmt.Fprintf(&b, "    rate_limit: {name: r%d, unit: minute, requests_per_unit: 1000}\n", i)
		}
	}
	return b.String()
}

func TestUpstreamServiceCases(t *testing.T) {
	for _, c := range upstreamServiceCases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := descriptors.Parse(map[string][]byte{"up.yaml": []byte(upstreamConfig(c))})
			if err != nil {
				t.Fatal(err)
			}
			clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
			svc := New(cfg, limiter.New(memory.New(memory.Options{Now: clk.Now}), limiter.Options{Now: clk.Now}),
				Options{ShadowMode: c.shadowMode, QuotaMode: c.quotaMode, ResponseMetadata: c.metadata})
			var ds []*rlcommon.RateLimitDescriptor
			for i := range c.descs {
				ds = append(ds, d(fmt.Sprintf("d%d", i), "v"))
			}
			resp, err := svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "up", Descriptors: ds})
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode != c.wantOverall {
				t.Errorf("overall %v, want %v", resp.OverallCode, c.wantOverall)
			}
			for i, st := range resp.Statuses {
				if st.Code != c.wantCodes[i] {
					t.Errorf("status %d: %v, want %v", i, st.Code, c.wantCodes[i])
				}
			}
			if !c.metadata {
				if resp.DynamicMetadata != nil {
					t.Errorf("dynamic metadata without --response-metadata: %v", resp.DynamicMetadata)
				}
				return
			}
			md := resp.DynamicMetadata.GetFields()
			if md["domain"].GetStringValue() != "up" || len(md["descriptors"].GetListValue().GetValues()) != len(ds) {
				t.Errorf("dynamic metadata lacks the request: %v", resp.DynamicMetadata)
			}
			got := md["metadata"].GetStructValue().GetFields()
			if c.wantNoMetadata && md["metadata"] != nil {
				t.Errorf("metadata field %v, want none", md["metadata"])
			}
			if len(got) != len(c.wantMeta) {
				t.Errorf("metadata %v, want %v", got, c.wantMeta)
			}
			for k, v := range c.wantMeta {
				if got[k].GetStringValue() != v {
					t.Errorf("metadata %s = %v, want %q", k, got[k], v)
				}
			}
			var violations []float64
			for _, v := range md["quotaModeViolations"].GetListValue().GetValues() {
				violations = append(violations, v.GetNumberValue())
			}
			if fmt.Sprint(violations) != fmt.Sprint(c.wantViolations) || md["quotaModeEnabled"] == nil ||
				md["quotaModeEnabled"].GetBoolValue() != c.wantQuotaOn {
				t.Errorf("quotaModeViolations %v, quotaModeEnabled %v; want %v, %v", violations, md["quotaModeEnabled"], c.wantViolations, c.wantQuotaOn)
			}
		})
	}
}

// TestUpstreamCustomHeaders replays TestServiceWithCustomRatelimitHeaders:
// LIMIT_*_HEADER rename the three headers.
func TestUpstreamCustomHeaders(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"up.yaml": []byte(upstreamConfig(upCase{descs: []upDesc{{kind: "over"}}}))})
	if err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	svc := New(cfg, limiter.New(memory.New(memory.Options{Now: clk.Now}), limiter.Options{Now: clk.Now}),
		Options{ResponseHeaders: true, HeaderNames: HeaderNames{Limit: "A-Ratelimit-Limit", Remaining: "A-Ratelimit-Remaining", Reset: "A-Ratelimit-Reset"}})
	resp, err := svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "up", Descriptors: []*rlcommon.RateLimitDescriptor{d("d0", "v"), d("none", "v")}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	for _, k := range []string{"A-Ratelimit-Limit", "A-Ratelimit-Remaining", "A-Ratelimit-Reset", "Retry-After"} {
		if _, ok := got[k]; !ok {
			t.Errorf("header %s missing: %v", k, got)
		}
	}
	if got["A-Ratelimit-Remaining"] != "0" || !strings.HasPrefix(got["A-Ratelimit-Limit"], "0") {
		t.Errorf("headers %v", got)
	}
}

// TestQuotaDeniedConsumesNothing: a request that only its quota descriptors
// deny leaves its other descriptors' counters where they were (the service
// refunds them), while a request that a quota lets through consumes on
// every descriptor with room.
func TestQuotaDeniedConsumesNothing(t *testing.T) {
	for _, alg := range []string{"sliding_window", "fixed_window", "token_bucket"} {
		t.Run(alg, func(t *testing.T) {
			yaml := fmt.Sprintf(`
domain: q
descriptors:
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: %s}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: %s}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: %s}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: %s}
`, alg, alg, alg, alg)
			cfg, err := descriptors.Parse(map[string][]byte{"q.yaml": []byte(yaml)})
			if err != nil {
				t.Fatal(err)
			}
			clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
			svc := New(cfg, limiter.New(memory.New(memory.Options{Now: clk.Now}), limiter.Options{Now: clk.Now, DisableOverLimitCache: true}), Options{})
			req := func(ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
				r, err := svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "q", Descriptors: ds})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			all := []*rlcommon.RateLimitDescriptor{d("regular", "x"), d("shadowed", "x"), d("quota_a", "x"), d("quota_b", "x")}
			// quota_a has 2, quota_b 3: three requests pass (the third on
			// quota_b alone), then every quota is over and requests are denied.
			for i, want := range []rlsv3.RateLimitResponse_Code{cOK, cOK, cOK, cOver, cOver} {
				if got := req(all...).OverallCode; got != want {
					t.Fatalf("request %d: %v, want %v", i+1, got, want)
				}
			}
			// The two denied requests consumed nothing: regular and shadowed
			// have 100-3 = 97 left.
			peek := req(d("regular", "x"), d("shadowed", "x"))
			for i, st := range peek.Statuses {
				if st.LimitRemaining != 96 { // 97 before this request, which takes one
					t.Errorf("descriptor %d: remaining %d after 3 admitted and 2 quota-denied requests (and this one), want 96", i, st.LimitRemaining)
				}
			}
		})
	}
}

// keyRecorder is a store that records the keys it is asked to decide.
type keyRecorder struct {
	store.Store
	keys []string
}

func (k *keyRecorder) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	for _, c := range checks {
		k.keys = append(k.keys, c.Key)
	}
	return k.Store.Decide(ctx, checks, results)
}

// TestUpstreamShareThresholdKey replays upstream's TestShareThreshold
// (test/integration) on upstream's keys: a share_threshold wildcard level
// is counted under its pattern, byte for byte as upstream's cache key
// ("prefix" "domain_files_files/*_"), so files/b.csv finds the count
// files/a.pdf left; without share_threshold each value has its own key.
func TestUpstreamShareThresholdKey(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"s.yaml": []byte(`
domain: share-threshold-test
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window}
  - key: files_no_share
    value: files_no_share/*
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window}
`)})
	if err != nil {
		t.Fatal(err)
	}
	rec := &keyRecorder{Store: memory.New(memory.Options{})}
	svc := New(cfg, limiter.New(rec, limiter.Options{DisableOverLimitCache: true}), Options{UpstreamKeys: true, KeyPrefix: "p:"})
	ask := func(k, v string) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "share-threshold-test", Descriptors: []*rlcommon.RateLimitDescriptor{d(k, v)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for range 10 {
		ask("files", "files/a.pdf")
	}
	if r := ask("files", "files/b.csv"); r.OverallCode != cOver || r.Statuses[0].LimitRemaining != 0 {
		t.Errorf("files/b.csv after 10 of files/a.pdf: %v, want OVER_LIMIT, 0 left", r)
	}
	for i := range 3 {
		if r := ask("files_no_share", fmt.Sprintf("files_no_share/%d", i)); r.Statuses[0].LimitRemaining != 9 {
			t.Errorf("files_no_share/%d: %v, want 9 left, its own counter", i, r)
		}
	}
	want := map[string]bool{"p:share-threshold-test_files_files/*_": true, "p:share-threshold-test_files_no_share_files_no_share/0_": true,
		"p:share-threshold-test_files_no_share_files_no_share/1_": true, "p:share-threshold-test_files_no_share_files_no_share/2_": true}
	for _, k := range rec.keys {
		if !want[k] {
			t.Errorf("key %q, want one of %v", k, want)
		}
	}
}

// TestWholeSeconds: with WholeSeconds (compatibility mode) a status's
// duration_until_reset is whole seconds, rounded up, as upstream sends
// them; without it, the store's sub-seconds.
func TestWholeSeconds(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"w.yaml": []byte("domain: w\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}\n")})
	if err != nil {
		t.Fatal(err)
	}
	for _, whole := range []bool{false, true} {
		clk := testkit.NewClock(time.Unix(1_751_540_400, 250_000_000)) // 0.25 s into a minute
		svc := New(cfg, limiter.New(memory.New(memory.Options{Now: clk.Now}), limiter.Options{Now: clk.Now}), Options{WholeSeconds: whole})
		for i, want := range map[bool][]time.Duration{false: {59750 * time.Millisecond, 59750 * time.Millisecond}, true: {60 * time.Second, 60 * time.Second}}[whole] {
			resp, err := svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "w", Descriptors: []*rlcommon.RateLimitDescriptor{d("k", "v")}})
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != want {
				t.Errorf("whole seconds %v, call %d (%v): %v, want %v", whole, i+1, resp.Statuses[0].Code, got, want)
			}
		}
	}
}

// TestCheckUpstreamKeyed: behind twemproxy a config with a rule that needs
// scripts is refused in one line naming the first such rule and how many
// more; fixed windows of one unit and unlimited rules pass.
func TestCheckUpstreamKeyed(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"t.yaml": []byte(`
domain: d
descriptors:
  - key: ok
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: free
    rate_limit: {unlimited: true}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 5}
`)})
	if err != nil {
		t.Fatal(err)
	}
	err = CheckUpstreamKeyed(cfg, "twemproxy at redis://127.0.0.1:22121")
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("error %v, want one line", err)
	}
	for _, want := range []string{"twemproxy at redis://127.0.0.1:22121", "t.yaml:9", `domain "d"`, "tb", "a token_bucket", "and 1 more"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	ok, err := descriptors.Parse(map[string][]byte{"t.yaml": []byte(`
domain: d
descriptors:
  - key: ok
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: free
    rate_limit: {unlimited: true}
`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckUpstreamKeyed(ok, "twemproxy"); err != nil {
		t.Errorf("fixed windows of one unit and unlimited rules: %v", err)
	}
}
