// Replay of envoyproxy/ratelimit's config tests against rls, so a config
// upstream accepts (or rejects) means the same to rls.
//
// Source: test/config/config_test.go of envoyproxy/ratelimit at commit
// f2fb15770f7fd1c88ca6c3a1b58ee513917ace96 (2026-07-05). The YAML files it
// loads are copied to testdata/upstream (see the README there); the tests
// that build their configuration as Go structs are replayed with the same
// configuration written as YAML (upstreamInline). Each replayed call names
// the line of its GetLimit in config_test.go.
//
// How upstream's assertions map to rls:
//   - Files: every file upstream loads without panic loads here (alone, and
//     the merge pair with MergeDomains); every expectConfigPanic case is
//     refused with file:line and the field at fault.
//   - GetLimit(domain, descriptor) is Config.Match (MatchOverride when the
//     descriptor has a limit override). nil or not, requests_per_unit, unit,
//     unlimited, shadow_mode, detailed_metric, name, metadata (proto.Equal)
//     and "the same RateLimit" (the same *Rule) are checked on the Rule.
//   - Stats.Key, and the statsd counters named after it, is how upstream
//     names a request's metrics. rls names them by rule in
//     rls_decisions_total (Rule.Path; Name when set) and, for detailed_metric
//     and value_to_metric rules, by value in rls_detailed_decisions_total
//     (pkg/service): the request's entries for detailed_metric, which wins,
//     else Rule.MetricValue. rlsStatsName renders that in upstream's format,
//     which must equal Stats.Key; one check stands for a Stats.Key assertion
//     and the counter assertions of the same request.
//   - ShareThresholdKeyPattern: rls shares a counter in its store key
//     (AppendKey writes "%*pattern" for a shared level), so pattern p at
//     level i is checked as AppendKey's entry i; values that share give the
//     same store key and values that do not give different ones (added
//     checks, marked "rls:", standing for upstream's cache-key tests).
//
// Upstream's 309 assertion calls in Test functions (counted by call site:
// loops and the TestDetailedMetric table run some several times, and every
// run is replayed), plus its 14 expectConfigPanic cases (all replayed):
//
//	test                                        calls  direct  mapped  not
//	TestBasicConfig                               64     27      34      3
//	TestDomainMerge                                6      6       -      -
//	TestConfigLimitOverride                       19      4       -     15
//	TestShadowModeConfig                          28     12      16      -
//	TestWildcardConfig                            30     18       7      5
//	TestDetailedMetric (7 table rows)              2      1       1      -
//	TestValueToMetric_UsesRuntimeValuesInStats     4      1       3      -
//	TestValueToMetric_DefaultKeyIncludes...        2      1       1      -
//	TestValueToMetric_MidLevelOnly                 2      1       1      -
//	TestValueToMetric_NoFlag_Unchanged             2      1       1      -
//	TestValueToMetric_DoesNotOverrideDetailed...   3      1       2      -
//	TestValueToMetric_WithConfiguredValues         7      4       3      -
//	TestValueToMetric_WithWildcard                 6      3       3      -
//	TestValueToMetric_WithEmptyValue               8      3       5      -
//	TestValueToMetric_FullKeyMatchesStatsKey       8      3       1      4
//	TestShareThreshold                            76     24      41     11
//	TestWildcardStatsBehavior                     21      8       8      5
//	TestMetadata                                  21     12       8      1
//	total                                        309    130     135     44
//
// direct: the same assertion on the rls Rule or Config. mapped: through the
// rls equivalent above (Stats.Key and counters: rlsStatsName; share
// patterns: AppendKey). One mapped assertion is a known difference (see
// below) and is reported as skipped.
//
// Not replayed (44), for want of an rls equivalent:
//   - 27 FullKey assertions (24 "FullKey equals Stats.Key" or the same
//     literal as a Stats.Key assertion, 3 of overrides): FullKey is
//     upstream's copy of the stats key for its debug logs; rls has no
//     second name.
//   - 16 counters: 12 of overrides (TestConfigLimitOverride) and 4
//     domain_not_found (TestBasicConfig 3, TestMetadata 1). Upstream counts
//     an override under the request's key_value path and an unknown domain
//     under "<domain>.domain_not_found"; rls counts overrides under
//     rule="_override" and unknown domains under domain="_unknown"
//     (pkg/service), with no per-request name to compare.
//   - 1 len(ShareThresholdKeyPattern) == 1: the slice's length is the
//     request's entry count, which no rls value holds.
//
// Known differences, each a check that is reported as skipped while rls
// differs and fails once it no longer does (so the mark gets removed):
//   - TestUpstreamDifferences: behaviour of upstream's config_impl.go that
//     its tests do not assert and rls does not share: overrides keep the
//     matched rule's shadow_mode and name here; upstream's wildcards match
//     across the key ("foo*" as a key, "a" "b_c*" for key "a_b"); rls
//     refuses three kinds of file upstream loads. Each was checked by
//     running upstream's loader at the commit above.

package descriptors

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// upstreamDir holds the copies of upstream's test/config files.
var upstreamDir = filepath.Join("testdata", "upstream", "test_config")

// upstreamPositive are the files of upstream's test/config that upstream
// loads without panic, alone.
var upstreamPositive = []string{
	"basic_config.yaml",
	"duplicate_domain.yaml", // alone it is a valid domain without descriptors
	"merge_domain_key1.yaml",
	"merge_domain_key2.yaml",
	"metadata.yaml",
	"shadowmode_config.yaml",
	"share_threshold.yaml",
	"wildcard.yaml",
}

// upstreamMerged is the pair TestDomainMerge loads with merging on.
var upstreamMerged = []string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"}

// upstreamNegative are upstream's expectConfigPanic cases: the files loaded
// (in that order), whether merging is on, upstream's panic message, and the
// error rls must give (the file's base name, line, field and a part of the
// message).
var upstreamNegative = []struct {
	test     string
	files    []string
	merge    bool
	upstream string
	file     string
	line     int
	field    string
	msg      string
}{
	{"TestEmptyDomain", []string{"empty_domain.yaml"}, false,
		"config file cannot have empty domain",
		"empty_domain.yaml", 1, "domain", "missing"},
	{"TestDuplicateDomain", []string{"basic_config.yaml", "duplicate_domain.yaml"}, false,
		"duplicate domain 'test-domain' in config file",
		"duplicate_domain.yaml", 1, "domain", `duplicate domain "test-domain", also defined at`},
	{"TestEmptyKey", []string{"empty_key.yaml"}, false,
		"descriptor has empty key",
		"empty_key.yaml", 3, "key", "missing"},
	{"TestDuplicateKey", []string{"duplicate_key.yaml"}, false,
		"duplicate descriptor composite key 'test-domain.key1_value1'",
		"duplicate_key.yaml", 6, "value", `duplicate descriptor key "key1" with value "value1"`},
	{"TestDuplicateKeyDomainMerge", []string{"merge_domain_key1.yaml", "merge_domain_key1.yaml"}, true,
		"duplicate descriptor composite key 'test-domain.key1_value1'",
		"merge_domain_key1.yaml", 5, "key", `duplicate top-level descriptor key "key1" with value "value1" in a merged domain`},
	{"TestBadLimitUnit", []string{"bad_limit_unit.yaml"}, false,
		"invalid rate limit unit 'foo'",
		"bad_limit_unit.yaml", 6, "unit", `invalid unit "foo"`},
	{"TestReplacesSelf", []string{"replaces_self.yaml"}, false,
		"replaces should not contain name of same descriptor",
		"replaces_self.yaml", 10, "replaces", `names the rule's own name "self"`},
	{"TestReplacesEmpty", []string{"replaces_empty.yaml"}, false,
		"should not have an empty replaces entry",
		"replaces_empty.yaml", 10, "replaces", "entry has an empty name"},
	// A syntax error has no field: the message names the problem.
	{"TestBadYaml", []string{"bad_yaml.yaml"}, false,
		"error loading config file: yaml: line 2: found unexpected end of stream",
		"bad_yaml.yaml", 2, "", "YAML syntax: found unexpected end of stream"},
	{"TestMisspelledKey", []string{"misspelled_key.yaml"}, false,
		"config error, unknown key 'ratelimit'",
		"misspelled_key.yaml", 5, "ratelimit", "unknown field"},
	{"TestMisspelledKey", []string{"misspelled_key2.yaml"}, false,
		"config error, unknown key 'requestsperunit'",
		"misspelled_key2.yaml", 7, "requestsperunit", "unknown field"},
	{"TestNonStringKey", []string{"non_string_key.yaml"}, false,
		"config error, key is not of type string: 0.25",
		"non_string_key.yaml", 1, "0.25", "unknown field"},
	{"TestNonMapList", []string{"non_map_list.yaml"}, false,
		"config error, yaml file contains list of type other than map: a",
		"non_map_list.yaml", 3, "descriptors", `must be a mapping, got the scalar "a"`},
	{"TestUnlimitedWithRateLimitUnit", []string{"unlimited_with_unit.yaml"}, false,
		"should not specify rate limit unit when unlimited",
		"unlimited_with_unit.yaml", 6, "unit", "must not be set when unlimited is true"},
}

// readUpstream returns the content of a file of upstreamDir.
func readUpstream(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(upstreamDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// parseUpstream parses upstream files as upstream loads them, in order. A
// file loaded twice gets a second name in another directory (a map cannot
// hold it twice), so errors still name its base name.
func parseUpstream(t testing.TB, names []string, merge bool) (*Config, error) {
	t.Helper()
	files := make(map[string][]byte)
	for i, n := range names {
		path := filepath.Join(upstreamDir, n)
		if _, dup := files[path]; dup {
			path = filepath.Join(fmt.Sprintf("again%d", i), n)
		}
		files[path] = readUpstream(t, n)
	}
	return Parse(files, ParseOptions{MergeDomains: merge})
}

// TestUpstreamFilesClassified: every file of upstream's test/config is a
// positive file or part of a negative case, so a file added by a fixture
// update cannot be left out.
func TestUpstreamFilesClassified(t *testing.T) {
	known := map[string]bool{}
	for _, f := range upstreamPositive {
		known[f] = true
	}
	for _, c := range upstreamNegative {
		for _, f := range c.files {
			known[f] = true
		}
	}
	paths, err := filepath.Glob(filepath.Join(upstreamDir, "*"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no fixtures in %s: %v", upstreamDir, err)
	}
	for _, p := range paths {
		if !known[filepath.Base(p)] {
			t.Errorf("%s is neither a positive file nor in a negative case", p)
		}
		delete(known, filepath.Base(p))
	}
	for f := range known {
		t.Errorf("%s is listed but not in %s", f, upstreamDir)
	}
}

// TestUpstreamPositiveConfigs: every config upstream loads without panic
// loads here: its test files alone, the merge pair with MergeDomains, and
// its examples directory.
func TestUpstreamPositiveConfigs(t *testing.T) {
	for _, f := range upstreamPositive {
		cfg, err := parseUpstream(t, []string{f}, false)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if got := cfg.Domains(); !reflect.DeepEqual(got, []string{"test-domain"}) {
			t.Errorf("%s: domains %v, want [test-domain]", f, got)
		}
	}
	cfg, err := parseUpstream(t, upstreamMerged, true)
	if err != nil {
		t.Fatalf("%v merged: %v", upstreamMerged, err)
	}
	if got := len(cfg.Rules()); got != 2 {
		t.Errorf("%v merged: %d rules, want 2", upstreamMerged, got)
	}
	if _, err := parseUpstream(t, upstreamMerged, false); err == nil {
		t.Errorf("%v without MergeDomains: loaded; want a duplicate domain error", upstreamMerged)
	}

	cfg, ignored, err := Load(filepath.Join("testdata", "upstream", "examples"))
	if err != nil {
		t.Fatalf("examples: %v", err)
	}
	if len(ignored) != 0 {
		t.Errorf("examples: ignored %v", ignored)
	}
	if got := cfg.Domains(); !reflect.DeepEqual(got, []string{"mongo_cps", "rl"}) {
		t.Errorf("examples: domains %v", got)
	}
}

// TestUpstreamNegativeConfigs: every expectConfigPanic case of upstream is
// refused; every error names a file of the case and a line, and names the
// field at fault (a syntax error has none), and the case's own error is
// among them.
func TestUpstreamNegativeConfigs(t *testing.T) {
	for _, c := range upstreamNegative {
		t.Run(c.test+"/"+strings.Join(c.files, "+"), func(t *testing.T) {
			cfg, err := parseUpstream(t, c.files, c.merge)
			var list Errors
			if cfg != nil || !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("loaded (%v); upstream panics with %q", err, c.upstream)
			}
			found := false
			for _, e := range list {
				if !contains(c.files, filepath.Base(e.File)) || e.Line <= 0 {
					t.Errorf("error %q: want one of %v and a line", e, c.files)
				}
				if e.Field == "" && c.field != "" {
					t.Errorf("error %q names no field", e)
				}
				if filepath.Base(e.File) == c.file && e.Line == c.line && e.Field == c.field && strings.Contains(e.Msg, c.msg) {
					found = true
				}
			}
			if !found {
				t.Errorf("errors:\n%v\nwant %s:%d: %s: ...%s... (upstream: %q)", err, c.file, c.line, c.field, c.msg, c.upstream)
			}
		})
	}
}

// upstreamInline are the configurations upstream's tests build as Go
// structs (config.YamlRoot), written as YAML: the same fields, in the same
// order.
var upstreamInline = map[string]string{
	// TestDetailedMetric, table rows 1-4.
	"detailed/top": `
domain: nested
descriptors:
  - key: key-1
    rate_limit: {requests_per_unit: 100, unit: minute}
    descriptors:
      - key: key-2
        rate_limit: {requests_per_unit: 5, unit: minute}
    detailed_metric: true
`,
	"detailed/top-off": `
domain: nested
descriptors:
  - key: key-1
    rate_limit: {requests_per_unit: 100, unit: minute}
    descriptors:
      - key: key-2
        rate_limit: {requests_per_unit: 5, unit: minute}
    detailed_metric: false
`,
	"detailed/none": `
domain: nested
descriptors:
  - key: key-1
    rate_limit: {requests_per_unit: 100, unit: minute}
    descriptors:
      - key: key-2
        rate_limit: {requests_per_unit: 5, unit: minute}
        detailed_metric: false
    detailed_metric: false
`,
	"detailed/both": `
domain: nested
descriptors:
  - key: key-1
    rate_limit: {requests_per_unit: 100, unit: minute}
    descriptors:
      - key: key-2
        rate_limit: {requests_per_unit: 5, unit: minute}
        detailed_metric: true
    detailed_metric: true
`,
	// TestDetailedMetric's realisticExampleConfig (rows 5-7).
	"detailed/realistic": `
domain: nested
descriptors:
  - key: key_1
    rate_limit: {requests_per_unit: 500, unit: minute}
    detailed_metric: true
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {requests_per_unit: 500, unit: minute}
  - key: key_2
    rate_limit: {requests_per_unit: 5000, unit: minute}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        rate_limit: {requests_per_unit: 5, unit: minute}
        detailed_metric: true
    detailed_metric: true
  - key: key_2
    value: specific-id
    rate_limit: {requests_per_unit: 50000, unit: minute}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        rate_limit: {requests_per_unit: 100, unit: minute}
        detailed_metric: true
    detailed_metric: true
`,
	// TestValueToMetric_UsesRuntimeValuesInStats, _WithEmptyValue.
	"vtm/runtime": `
domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
`,
	// TestValueToMetric_FullKeyMatchesStatsKey, case 1.
	"vtm/fullkey1": `
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
`,
	// TestValueToMetric_FullKeyMatchesStatsKey, case 2.
	"vtm/fullkey2": `
domain: test-domain-2
descriptors:
  - key: route
    descriptors:
      - key: http_method
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
`,
	// TestValueToMetric_FullKeyMatchesStatsKey, case 3.
	"vtm/fullkey3": `
domain: test-domain-3
descriptors:
  - key: route
    descriptors:
      - key: http_method
        descriptors:
          - key: subject_id
            detailed_metric: true
            rate_limit: {requests_per_unit: 60, unit: minute}
`,
	// TestValueToMetric_DefaultKeyIncludesValueAtThatLevel.
	"vtm/default": `
domain: d
descriptors:
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {requests_per_unit: 1, unit: second}
`,
	// TestValueToMetric_MidLevelOnly.
	"vtm/mid": `
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {requests_per_unit: 1, unit: second}
`,
	// TestValueToMetric_NoFlag_Unchanged.
	"vtm/noflag": `
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        rate_limit: {requests_per_unit: 1, unit: second}
`,
	// TestValueToMetric_DoesNotOverrideDetailedMetric.
	"vtm/detailed": `
domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            detailed_metric: true
            rate_limit: {requests_per_unit: 60, unit: minute}
`,
	// TestValueToMetric_WithConfiguredValues.
	"vtm/configured": `
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 30, unit: minute}
`,
	// TestValueToMetric_WithWildcard.
	"vtm/wildcard": `
domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {requests_per_unit: 100, unit: minute}
`,
	// TestWildcardStatsBehavior, one per sub-test.
	"wsb/noflags": `
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {requests_per_unit: 20, unit: minute}
`,
	"wsb/vtm": `
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    value_to_metric: true
    rate_limit: {requests_per_unit: 20, unit: minute}
`,
	"wsb/share": `
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    share_threshold: true
    rate_limit: {requests_per_unit: 20, unit: minute}
`,
	"wsb/share-vtm": `
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    share_threshold: true
    value_to_metric: true
    rate_limit: {requests_per_unit: 20, unit: minute}
`,
	"wsb/other": `
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {requests_per_unit: 20, unit: minute}
`,
	"wsb/mid": `
domain: test-domain
descriptors:
  - {key: wild, value: "foo*bar*", rate_limit: {requests_per_unit: 20, unit: minute}}
`,
	"wsb/mid-vtm": `
domain: test-domain
descriptors:
  - {key: wild, value: "foo*bar*", value_to_metric: true, rate_limit: {requests_per_unit: 20, unit: minute}}
`,
}

// upstreamConfigs loads every configuration the replay uses: each positive
// file by name, the merged pair as "merge_domain_key1.yaml+merge_domain_key2.yaml",
// and upstreamInline by key (merged as TestDetailedMetric loads them).
func upstreamConfigs(t *testing.T) map[string]*Config {
	t.Helper()
	out := make(map[string]*Config)
	for _, f := range upstreamPositive {
		cfg, err := parseUpstream(t, []string{f}, false)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[f] = cfg
	}
	cfg, err := parseUpstream(t, upstreamMerged, true)
	if err != nil {
		t.Fatalf("%v: %v", upstreamMerged, err)
	}
	out[strings.Join(upstreamMerged, "+")] = cfg
	for name, y := range upstreamInline {
		cfg, err := Parse(map[string][]byte{name + ".yaml": []byte(y)},
			ParseOptions{MergeDomains: strings.HasPrefix(name, "detailed/")})
		if err != nil {
			t.Fatalf("inline %s: %v", name, err)
		}
		out[name] = cfg
	}
	return out
}

// upEnv is one replayed GetLimit: the config, the request and what rls
// matched for it.
type upEnv struct {
	cfg     *Config
	domain  string
	entries []*rlcommon.RateLimitDescriptor_Entry
	rule    *Rule
}

// upCheck is one assertion on a replayed GetLimit. fn returns "" when it
// holds, else what rls gives. known, when set, marks a known difference.
type upCheck struct {
	what  string
	fn    func(*upEnv) string
	known string
}

// differs marks c as a known difference, explained by why. No check has
// one now (the last, detailed metrics under share_threshold, was fixed);
// kept for the next difference found.
//
//lint:ignore U1000 the way to mark a known difference; none is open now
func (c upCheck) differs(why string) upCheck { c.known = why; return c }

// No check is a known difference at the moment; differs stays for the next.
var _ = upCheck.differs

// onRule makes a check of the matched rule; it fails when there is none.
func onRule(what string, fn func(e *upEnv, r *Rule) string) upCheck {
	return upCheck{what: what, fn: func(e *upEnv) string {
		if e.rule == nil {
			return "no rule matched"
		}
		return fn(e, e.rule)
	}}
}

func isNil() upCheck {
	return upCheck{what: "nil", fn: func(e *upEnv) string {
		if e.rule != nil {
			return fmt.Sprintf("rule %s at %s:%d", e.rule.Path, e.rule.File, e.rule.Line)
		}
		return ""
	}}
}

func notNil() upCheck { return onRule("not nil", func(*upEnv, *Rule) string { return "" }) }

// field compares one attribute of the rule with upstream's value.
func ruleField[T comparable](what string, want T, get func(*Rule) T) upCheck {
	return onRule(fmt.Sprintf("%s %v", what, want), func(_ *upEnv, r *Rule) string {
		if got := get(r); got != want {
			return fmt.Sprint(got)
		}
		return ""
	})
}

func rpu(n uint32) upCheck {
	return ruleField("requests_per_unit", n, func(r *Rule) uint32 { return r.RequestsPerUnit })
}
func unit(u Unit) upCheck { return ruleField("unit", u, func(r *Rule) Unit { return r.Unit }) }
func unlimited(b bool) upCheck {
	return ruleField("unlimited", b, func(r *Rule) bool { return r.Unlimited })
}
func shadow(b bool) upCheck {
	return ruleField("shadow_mode", b, func(r *Rule) bool { return r.ShadowMode })
}
func detailed(b bool) upCheck {
	return ruleField("detailed_metric", b, func(r *Rule) bool { return r.DetailedMetric })
}
func ruleName(s string) upCheck { return ruleField("name", s, func(r *Rule) string { return r.Name }) }

// hasDomains: upstream's IsEmptyDomains() is false.
func hasDomains() upCheck {
	return upCheck{what: "domains", fn: func(e *upEnv) string {
		if len(e.cfg.Domains()) == 0 {
			return "no domains"
		}
		return ""
	}}
}

// metadata compares the rule's metadata with want, built independently of
// rls's YAML conversion.
func metadata(want map[string]any) upCheck {
	w, err := structpb.NewStruct(want)
	if err != nil {
		panic(err)
	}
	return onRule(fmt.Sprintf("metadata %v", want), func(_ *upEnv, r *Rule) string {
		if !proto.Equal(r.Metadata, w) {
			return fmt.Sprint(r.Metadata)
		}
		return ""
	})
}

// sameRule: the request kv... matches the very rule this one does
// (upstream compares the two RateLimits).
func sameRule(kv ...string) upCheck {
	return onRule(fmt.Sprintf("same rule as %v", kv), func(e *upEnv, r *Rule) string {
		if o := e.cfg.Match(e.domain, entries(kv...)); o != r {
			return fmt.Sprintf("%v matches %+v", kv, o)
		}
		return ""
	})
}

// statsKey: upstream's Stats.Key is want; rls's metric name (rlsStatsName)
// must be the same.
func statsKey(want string) upCheck {
	return onRule("stats key "+want, func(e *upEnv, r *Rule) string {
		if got := rlsStatsName(e.domain, r, e.entries); got != want {
			return got
		}
		return ""
	})
}

// sameStats: the request kv... has the same stats key as this one.
func sameStats(kv ...string) upCheck {
	return onRule(fmt.Sprintf("same stats key as %v", kv), func(e *upEnv, r *Rule) string {
		o := e.cfg.Match(e.domain, entries(kv...))
		if o == nil {
			return fmt.Sprintf("%v matches nothing", kv)
		}
		got, other := rlsStatsName(e.domain, r, e.entries), rlsStatsName(e.domain, o, entries(kv...))
		if got != other {
			return got + " vs " + other
		}
		return ""
	})
}

// sharedAt: upstream's ShareThresholdKeyPattern[i] is pattern ("" for a
// level that does not share); in rls, AppendKey writes level i as
// key=%*pattern, or key=value when it does not share.
func sharedAt(i int, pattern string) upCheck {
	return onRule(fmt.Sprintf("ShareThresholdKeyPattern[%d] %q", i, pattern), func(e *upEnv, r *Rule) string {
		got := keyEntries(AppendKey(nil, e.domain, e.entries, r))
		want := string(appendEscaped(nil, e.entries[i].GetKey())) + "="
		if pattern != "" {
			want += "%*" + string(appendEscaped(nil, pattern))
		} else {
			want += string(appendEscaped(nil, e.entries[i].GetValue()))
		}
		if i >= len(got) || got[i] != want {
			return fmt.Sprintf("store key entries %q", got)
		}
		return ""
	})
}

// shared: upstream's ShareThresholdKeyPattern is not nil (some level shares)
// or nil (none does); in rls, some (no) store key entry is a pattern.
func shared(some bool) upCheck {
	return onRule(fmt.Sprintf("ShareThresholdKeyPattern set: %v", some), func(e *upEnv, r *Rule) string {
		key := AppendKey(nil, e.domain, e.entries, r)
		n := 0
		for _, x := range keyEntries(key) {
			if strings.Contains(x, "=%*") {
				n++
			}
		}
		if (n > 0) != some {
			return string(key)
		}
		return ""
	})
}

// sameKey and otherKey: the request kv... is counted in the same (another)
// store counter, AppendKey, as this one.
func sameKey(kv ...string) upCheck  { return keyCheck(true, kv) }
func otherKey(kv ...string) upCheck { return keyCheck(false, kv) }

func keyCheck(same bool, kv []string) upCheck {
	what := "same store key as %v"
	if !same {
		what = "another store key than %v"
	}
	return onRule(fmt.Sprintf(what, kv), func(e *upEnv, r *Rule) string {
		o := e.cfg.Match(e.domain, entries(kv...))
		if o == nil {
			return fmt.Sprintf("%v matches nothing", kv)
		}
		k1, k2 := AppendKey(nil, e.domain, e.entries, r), AppendKey(nil, e.domain, entries(kv...), o)
		if (string(k1) == string(k2)) != same {
			return fmt.Sprintf("%s vs %s", k1, k2)
		}
		return ""
	})
}

// keyEntries splits a store key made by AppendKey into its escaped
// entries: "rl:{dom|e0}:s60|e1|e2" gives [e0 e1 e2]. Escaping leaves no
// '|', '{' or '}' inside a domain, key or value.
func keyEntries(key []byte) []string {
	s := string(key)
	open, end := strings.IndexByte(s, '{'), strings.Index(s, "}:")
	tenant := s[open+1 : end]
	out := []string{tenant[strings.IndexByte(tenant, '|')+1:]}
	return append(out, strings.Split(s[end+2:], "|")[1:]...)
}

// rlsStatsName renders in upstream's stats-key format
// ("domain.key_value.key") the name rls gives the metrics of a request that
// matched r (pkg/service): the request's entries for a detailed_metric rule
// (rls_detailed_decisions_total's value, as entriesOf writes it);
// Rule.MetricValue for a value_to_metric rule (the same label); else the
// rule's place in the YAML, Rule.Path (rls_decisions_total's rule label
// when the rule has no name).
func rlsStatsName(domain string, r *Rule, es []*rlcommon.RateLimitDescriptor_Entry) string {
	var levels []string
	switch {
	case r.DetailedMetric || r.ValueToMetric():
		levels = strings.Split(r.MetricLabel(es), "|")
	default:
		keys := make([]string, len(es))
		for i, e := range es {
			keys[i] = e.GetKey()
		}
		levels = pathLevels(r.Path, keys)
	}
	for i, l := range levels {
		levels[i] = strings.Replace(l, "=", "_", 1)
	}
	return domain + "." + strings.Join(levels, ".")
}

// pathLevels splits p, a Rule.Path ("key" or "key=value" per level, joined
// by '/'), into its levels, whose keys are keys. A value may hold '/'
// ("files/*"), so a level ends at the first "/" followed by the next key
// and then '=', '/' or the end.
func pathLevels(p string, keys []string) []string {
	var out []string
	for i := 1; i < len(keys); i++ {
		end := -1
		for j := 0; j < len(p) && end < 0; j++ {
			if p[j] != '/' {
				continue
			}
			if rest, ok := strings.CutPrefix(p[j+1:], keys[i]); ok && (rest == "" || rest[0] == '=' || rest[0] == '/') {
				end = j
			}
		}
		if end < 0 {
			break
		}
		out = append(out, p[:end])
		p = p[end+1:]
	}
	return append(out, p)
}

// upOverride is a request's limit override.
type upOverride struct {
	rpu  uint32
	unit Unit
}

// upCall is one GetLimit of upstream's config_test.go, replayed.
type upCall struct {
	at     int    // line of the GetLimit call in config_test.go
	test   string // upstream's test, and sub-test
	cfg    string // key of upstreamConfigs
	domain string
	req    []string // the descriptor's entries: key, value, ...
	ovr    *upOverride
	checks []upCheck
}

// kv returns its arguments, for readable request literals.
func kv(s ...string) []string { return s }

// upstreamCalls are the GetLimit calls of config_test.go with the
// assertions upstream makes on their results, in file order.
var upstreamCalls = func() []upCall {
	const td = "test-domain"
	var calls []upCall
	add := func(c upCall) { calls = append(calls, c) }

	// TestBasicConfig (basic_config.yaml).
	basic := func(at int, domain string, req []string, checks ...upCheck) {
		add(upCall{at: at, test: "TestBasicConfig", cfg: "basic_config.yaml", domain: domain, req: req, checks: checks})
	}
	basic(35, td, nil, hasDomains()) // IsEmptyDomains() false
	basic(37, "foo_domain", nil, isNil())
	basic(39, td, nil, isNil())
	basic(42, td, kv("key1", "something"), isNil())
	basic(49, td, kv("key1", "value1"), isNil())
	basic(56, td, kv("key2", "value2", "subkey", "subvalue"), isNil())
	basic(63, td, kv("key5", "value5", "subkey5", "subvalue"), isNil())
	basic(70, td, kv("key1", "value1", "subkey1", "something"),
		rpu(5), unit(UnitSecond), statsKey("test-domain.key1_value1.subkey1"))
	basic(86, td, kv("key1", "value1", "subkey1", "subvalue1"),
		rpu(10), unit(UnitSecond), statsKey("test-domain.key1_value1.subkey1_subvalue1"))
	basic(106, td, kv("key2", "something"),
		rpu(20), unit(UnitMinute), statsKey("test-domain.key2"))
	basic(122, td, kv("key2", "value2"),
		rpu(30), unit(UnitMinute), statsKey("test-domain.key2_value2"))
	basic(138, td, kv("key2", "value3"), isNil())
	basic(145, td, kv("key3", "foo"),
		rpu(1), ruleName(""), unit(UnitHour), statsKey("test-domain.key3"))
	basic(162, td, kv("key4", "foo"),
		rpu(1), ruleName("key4_rate_limit"), unit(UnitDay), statsKey("test-domain.key4"))
	basic(179, td, kv("key6", "foo"),
		unlimited(true), statsKey("test-domain.key6"))
	basic(192, td, kv("key7", "unspecified_value"),
		rpu(70), unit(UnitMinute), statsKey("test-domain.key7_unspecified_value"))
	basic(210, td, kv("key7", "another_value"),
		rpu(70), unit(UnitMinute), statsKey("test-domain.key7_another_value"))

	// TestDomainMerge (the merged pair).
	merge := func(at int, domain string, req []string, checks ...upCheck) {
		add(upCall{at: at, test: "TestDomainMerge", cfg: strings.Join(upstreamMerged, "+"), domain: domain, req: req, checks: checks})
	}
	merge(236, "foo_domain", nil, isNil())
	merge(237, td, nil, isNil())
	merge(239, td, kv("key1", "value1"), notNil(), rpu(10))
	merge(247, td, kv("key2", "value2"), notNil(), rpu(20))

	// TestConfigLimitOverride (basic_config.yaml): the Limit proto upstream
	// compares holds requests_per_unit, unit and name.
	ovr := func(at int, domain string, req []string, o upOverride, checks ...upCheck) {
		add(upCall{at: at, test: "TestConfigLimitOverride", cfg: "basic_config.yaml", domain: domain, req: req, ovr: &o, checks: checks})
	}
	ovr(262, "foo_domain", nil, upOverride{10, UnitDay}, isNil())
	ovr(267, td, kv("key1", "value1", "subkey1", "something"), upOverride{10, UnitDay},
		rpu(10), unit(UnitDay), ruleName(""))
	ovr(290, td, kv("key1", "value1", "subkey1", "something"), upOverride{42, UnitHour},
		rpu(42), unit(UnitHour), ruleName(""))
	ovr(313, td, kv("key1", "value1", "subkey1", "something_else"), upOverride{42, UnitHour},
		rpu(42), unit(UnitHour), ruleName(""))

	// TestShadowModeConfig (shadowmode_config.yaml).
	sm := func(at int, req []string, checks ...upCheck) {
		add(upCall{at: at, test: "TestShadowModeConfig", cfg: "shadowmode_config.yaml", domain: td, req: req, checks: checks})
	}
	sm(507, kv("key1", "value1", "subkey1", "something"),
		shadow(false), rpu(5), unit(UnitSecond), statsKey("test-domain.key1_value1.subkey1"))
	sm(524, kv("key1", "value1", "subkey1", "subvalue1"),
		shadow(true), rpu(10), unit(UnitSecond), statsKey("test-domain.key1_value1.subkey1_subvalue1"))
	sm(542, kv("key2", "something"),
		shadow(true), rpu(20), unit(UnitMinute), statsKey("test-domain.key2"))
	sm(559, kv("key2", "value2"),
		shadow(false), rpu(30), unit(UnitMinute), statsKey("test-domain.key2_value2"))

	// TestWildcardConfig (wildcard.yaml).
	wc := func(at int, req []string, checks ...upCheck) {
		add(upCall{at: at, test: "TestWildcardConfig", cfg: "wildcard.yaml", domain: td, req: req, checks: checks})
	}
	wc(583, kv("noVal", "foo1"), notNil(), sameRule("noVal", "foo2"),
		statsKey("test-domain.noVal"), sameStats("noVal", "foo2"))
	wc(601, kv("wild", "foo1"), notNil(), sameRule("wild", "foo2"),
		statsKey("test-domain.wild_foo*"),
		otherKey("wild", "foo2")) // rls: without share_threshold each value has its counter
	wc(606, kv("wild", "foo2"), statsKey("test-domain.wild_foo*"))
	wc(611, kv("nestedWild", "val1", "wild", "goo2"), notNil(),
		statsKey("test-domain.nestedWild_val1.wild_goo*"))
	wc(626, kv("wild", "bar"), isNil())
	wc(634, kv("noWild", "foo1"), isNil())
	wc(642, kv("midWild", "barab"), notNil(), sameRule("midWild", "bar123b"),
		statsKey("test-domain.midWild_bar*b"))
	wc(647, kv("midWild", "bar123b"), notNil())
	wc(659, kv("midWild", "barb"), notNil())
	wc(667, kv("midWild", "bara"), isNil())
	wc(672, kv("midWild", "xbarb"), isNil())
	wc(681, kv("multiWild", "foo123bar456baz"), notNil(), sameRule("multiWild", "foobarbaz"),
		statsKey("test-domain.multiWild_foo*bar*baz"))
	wc(686, kv("multiWild", "foobarbaz"), notNil())
	wc(698, kv("multiWild", "foo123baz"), isNil())
	wc(703, kv("multiWild", "bar456baz"), isNil())

	// TestDetailedMetric: one GetLimit (line 1017) per table row.
	dm := func(row, cfg string, req []string, key string) {
		add(upCall{at: 1017, test: "TestDetailedMetric/" + row, cfg: cfg, domain: "nested", req: req,
			checks: []upCheck{notNil(), statsKey(key)}})
	}
	dm("top-level key only", "detailed/top", kv("key-1", "value-1"), "nested.key-1_value-1")
	dm("top-level key only, no detailed metric", "detailed/top-off", kv("key-1", "value-1"), "nested.key-1")
	dm("fully nested", "detailed/both", kv("key-1", "value-1", "key-2", "value-2"), "nested.key-1_value-1.key-2_value-2")
	dm("fully nested, no detailed metric", "detailed/none", kv("key-1", "value-1", "key-2", "value-2"), "nested.key-1.key-2")
	dm("simple request", "detailed/realistic", kv("key_1", "value-for-key-1"), "nested.key_1_value-for-key-1")
	dm("second descriptor not nested", "detailed/realistic", kv("key_2", "key-2-value"), "nested.key_2_key-2-value")
	dm("nested request", "detailed/realistic", kv("key_2", "key-2-value", "key_3", "requested-key3-value"),
		"nested.key_2_key-2-value.key_3_requested-key3-value")

	// TestValueToMetric_*.
	vtm := func(at int, test, cfg, domain string, req []string, checks ...upCheck) {
		add(upCall{at: at, test: "TestValueToMetric_" + test, cfg: cfg, domain: domain, req: req, checks: checks})
	}
	vtm(1063, "UsesRuntimeValuesInStats", "vtm/runtime", "domain", kv("route", "draw", "http_method", "GET", "subject_id", "123"),
		notNil(), statsKey("domain.route_draw.http_method_GET.subject_id"))
	vtm(1116, "DefaultKeyIncludesValueAtThatLevel", "vtm/default", "d", kv("k1", "A", "k2", "foo"),
		notNil(), statsKey("d.k1_A.k2"))
	vtm(1158, "MidLevelOnly", "vtm/mid", "d", kv("k1", "X", "k2", "Y", "k3", "Z"),
		notNil(), statsKey("d.k1.k2_Y.k3"))
	vtm(1196, "NoFlag_Unchanged", "vtm/noflag", "d", kv("k1", "X", "k2", "Y"),
		notNil(), statsKey("d.k1.k2"))
	vtm(1245, "DoesNotOverrideDetailedMetric", "vtm/detailed", "domain", kv("route", "draw", "http_method", "GET", "subject_id", "123"),
		notNil(), statsKey("domain.route_draw.http_method_GET.subject_id_123"))
	vtm(1317, "WithConfiguredValues", "vtm/configured", td, kv("route", "api", "http_method", "GET", "subject_id", "user123"),
		notNil(), rpu(60), statsKey("test-domain.route_api.http_method_GET.subject_id"))
	vtm(1334, "WithConfiguredValues", "vtm/configured", td, kv("route", "api", "http_method", "POST", "subject_id", "user456"),
		notNil(), rpu(30), statsKey("test-domain.route_api.http_method_POST.subject_id"))
	vtm(1392, "WithWildcard", "vtm/wildcard", "domain", kv("user", "alice", "action", "readfile", "resource", "documents"),
		notNil(), rpu(100), statsKey("domain.user_alice.action_readfile.resource"))
	vtm(1409, "WithWildcard", "vtm/wildcard", "domain", kv("user", "bob", "action", "readdata", "resource", "database"),
		notNil(), statsKey("domain.user_bob.action_readdata.resource"))
	vtm(1465, "WithEmptyValue", "vtm/runtime", "domain", kv("route", "", "http_method", "GET", "subject_id", "123"),
		notNil(), statsKey("domain.route.http_method_GET.subject_id"))
	vtm(1482, "WithEmptyValue", "vtm/runtime", "domain", kv("route", "draw", "http_method", "", "subject_id", "123"),
		notNil(), statsKey("domain.route_draw.http_method.subject_id"))
	vtm(1499, "WithEmptyValue", "vtm/runtime", "domain", kv("route", "", "http_method", "", "subject_id", "123"),
		notNil(), statsKey("domain.route.http_method.subject_id"))
	vtm(1563, "FullKeyMatchesStatsKey", "vtm/fullkey1", td, kv("route", "api", "http_method", "GET", "subject_id", "user123"),
		notNil(), statsKey("test-domain.route_api.http_method_GET.subject_id"))
	vtm(1609, "FullKeyMatchesStatsKey", "vtm/fullkey2", "test-domain-2", kv("route", "api", "http_method", "GET", "subject_id", "user123"),
		notNil())
	vtm(1653, "FullKeyMatchesStatsKey", "vtm/fullkey3", "test-domain-3", kv("route", "api", "http_method", "GET", "subject_id", "user123"),
		notNil())

	// TestShareThreshold (share_threshold.yaml).
	st := func(at int, sub string, req []string, checks ...upCheck) {
		add(upCall{at: at, test: "TestShareThreshold/" + sub, cfg: "share_threshold.yaml", domain: td, req: req, checks: checks})
	}
	for _, v := range []string{"files/a.pdf", "files/b.csv", "files/c.txt"} {
		st(1680, "Basic share_threshold", kv("files", v),
			notNil(), sharedAt(0, "files/*"), rpu(100), statsKey("test-domain.files_files/*"),
			sameStats("files", "files/a.pdf"),
			sameKey("files", "files/a.pdf")) // rls: the values share one counter
	}
	st(1707, "share_threshold with metrics", kv("route", "api/v1", "method", "GET"),
		notNil(), sharedAt(0, "api/*"), statsKey("test-domain.route_api/*.method"),
		sameKey("route", "api/v2", "method", "GET"),  // rls
		otherKey("route", "api/v1", "method", "PUT")) // rls: method does not share
	st(1722, "share_threshold with metrics", kv("service", "svc/user", "endpoint", "get"),
		notNil(), sharedAt(0, "svc/*"), detailed(true),
		statsKey("test-domain.service_svc/*.endpoint_get"),
		sameKey("service", "svc/admin", "endpoint", "get")) // rls
	st(1740, "Nested wildcards", kv("nested", "parent", "files", "nested/file1.txt"),
		notNil(), sharedAt(1, "nested/*"), rpu(200), statsKey("test-domain.nested_parent.files_nested/*"),
		sameKey("nested", "parent", "files", "nested/file2.txt")) // rls
	st(1756, "Nested wildcards", kv("files", "top/file1.txt", "files", "nested/file1.txt"),
		notNil(), sharedAt(0, "top/*"), sharedAt(1, "nested/*"), statsKey("test-domain.files_top/*.files_nested/*"),
		sameKey("files", "top/file2.txt", "files", "nested/file2.txt")) // rls
	st(1772, "Nested wildcards", kv("path", "path/foo", "file", "file/doc1", "type", "pdf"),
		notNil(), sharedAt(0, "path/*"), sharedAt(1, ""), statsKey("test-domain.path_path/*.file_file/*.type"),
		sameKey("path", "path/bar", "file", "file/doc1", "type", "pdf"),  // rls
		otherKey("path", "path/foo", "file", "file/doc2", "type", "pdf")) // rls
	st(1790, "Nested wildcards", kv("user", "user/alice", "resource", "res/file1", "action", "read"),
		notNil(), sharedAt(0, "user/*"), sharedAt(1, "res/*"), statsKey("test-domain.user_user/*.resource_res/*.action"),
		sameKey("user", "user/bob", "resource", "res/file2", "action", "read"),     // rls
		otherKey("user", "user/alice", "resource", "res/file1", "action", "write")) // rls
	st(1812, "Explicit value precedence over wildcard", kv("file", "test1"),
		notNil(), rpu(50), shared(false), statsKey("test-domain.file_test1"),
		otherKey("file", "test2")) // upstream: test1 increments its own counter
	for _, v := range []string{"test2", "test23", "test123"} {
		st(1831, "Explicit value precedence over wildcard", kv("file", v),
			notNil(), shared(true), sharedAt(0, "test*"), rpu(100), statsKey("test-domain.file_test*"),
			sameStats("file", "test2"),
			sameKey("file", "test2")) // upstream: all increment the same counter
	}
	for _, v := range []string{"/api/v1", "/api-beta-v1", "/apiXYZv1"} {
		st(1876, "share_threshold with middle wildcard", kv("midpath", v),
			notNil(), shared(true), sharedAt(0, "/api*v1"), rpu(100), statsKey("test-domain.midpath_/api*v1"),
			sameStats("midpath", "/api/v1"),
			sameKey("midpath", "/api/v1")) // rls
	}
	st(1894, "share_threshold with middle wildcard", kv("midpath", "/api/v2"), isNil())
	for _, v := range []string{"svcAepBrpc", "svcXXXepYYYrpc", "svceprpc"} {
		st(1908, "share_threshold with multi-wildcard", kv("multiroute", v),
			notNil(), shared(true), sharedAt(0, "svc*ep*rpc"), rpu(50), statsKey("test-domain.multiroute_svc*ep*rpc"),
			sameStats("multiroute", "svcAepBrpc"),
			sameKey("multiroute", "svcAepBrpc")) // rls
	}
	st(1926, "share_threshold with multi-wildcard", kv("multiroute", "svcABCrpc"), isNil())
	st(1936, "share_threshold priority over value_to_metric with middle wildcard", kv("midroute", "/api/v2"),
		notNil(), sharedAt(0, "/api*v2"), statsKey("test-domain.midroute_/api*v2"),
		sameStats("midroute", "/api-beta-v2"),
		sameKey("midroute", "/api-beta-v2")) // rls
	st(1941, "share_threshold priority over value_to_metric with middle wildcard", kv("midroute", "/api-beta-v2"), notNil())
	st(1955, "share_threshold with nested middle wildcards", kv("tenant", "t1prod", "resource", "resAv2"),
		notNil(), sharedAt(0, "t*prod"), sharedAt(1, "res*v2"), statsKey("test-domain.tenant_t*prod.resource_res*v2"),
		sameStats("tenant", "t99prod", "resource", "resBBBv2"),
		sameKey("tenant", "t99prod", "resource", "resBBBv2")) // rls
	st(1970, "share_threshold with nested middle wildcards", kv("tenant", "t99prod", "resource", "resBBBv2"), notNil())

	// TestWildcardStatsBehavior, one config per sub-test.
	wsb := func(at int, sub, cfg string, req []string, checks ...upCheck) {
		add(upCall{at: at, test: "TestWildcardStatsBehavior/" + sub, cfg: cfg, domain: td, req: req, checks: checks})
	}
	wsb(2012, "No flags", "wsb/noflags", kv("wild", "foo1"), notNil(), statsKey("test-domain.wild_foo*"))
	wsb(2043, "value_to_metric", "wsb/vtm", kv("wild", "foo1"), notNil(), statsKey("test-domain.wild_foo1"))
	wsb(2073, "share_threshold", "wsb/share", kv("wild", "foo1"), notNil(), statsKey("test-domain.wild_foo*"),
		sameKey("wild", "foo2")) // rls
	wsb(2105, "share_threshold with value_to_metric", "wsb/share-vtm", kv("wild", "foo1"), notNil(), statsKey("test-domain.wild_foo*"),
		sameKey("wild", "foo2")) // rls
	wsb(2143, "value_to_metric in other descriptor", "wsb/other", kv("wild", "foo1", "other", "bar", "limit", "X"),
		notNil(), statsKey("test-domain.wild_foo*.other_bar.limit"))
	wsb(2174, "middle+trailing wildcard, no flags", "wsb/mid", kv("wild", "foo123bar456"),
		notNil(), statsKey("test-domain.wild_foo*bar*"), sameStats("wild", "fooXbarY"))
	wsb(2178, "middle+trailing wildcard, no flags", "wsb/mid", kv("wild", "fooXbarY"), notNil())
	wsb(2200, "middle+trailing wildcard, value_to_metric", "wsb/mid-vtm", kv("wild", "foo123bar456"),
		notNil(), statsKey("test-domain.wild_foo123bar456"))

	// TestMetadata (metadata.yaml): upstream checks the fields it names;
	// the whole metadata is compared here.
	md := func(at int, req []string, checks ...upCheck) {
		add(upCall{at: at, test: "TestMetadata", cfg: "metadata.yaml", domain: td, req: req, checks: checks})
	}
	md(2214, nil, hasDomains())
	md(2215, nil, isNil())
	md(2218, kv("key1", "value1", "subkey1", "something"),
		rpu(5), unit(UnitSecond), statsKey("test-domain.key1_value1.subkey1"),
		metadata(map[string]any{"name": "service_1"}))
	md(2240, kv("key2", "something"),
		rpu(20), unit(UnitMinute), statsKey("test-domain.key2"),
		metadata(map[string]any{"service_with_quota": map[string]any{"name": "service_2"}}))
	return calls
}()

// TestUpstreamReplay replays upstreamCalls: each GetLimit becomes Match (or
// MatchOverride) of the same request, and each of upstream's assertions on
// its result must hold for rls's rule.
func TestUpstreamReplay(t *testing.T) {
	cfgs := upstreamConfigs(t)
	checks := 0
	for _, c := range upstreamCalls {
		cfg := cfgs[c.cfg]
		if cfg == nil {
			t.Fatalf("%s line %d: no config %q", c.test, c.at, c.cfg)
		}
		name := fmt.Sprintf("%s/L%d/%s", c.test, c.at, strings.Join(c.req, "="))
		t.Run(name, func(t *testing.T) {
			e := &upEnv{cfg: cfg, domain: c.domain, entries: entries(c.req...)}
			if c.ovr != nil {
				e.rule = cfg.MatchOverride(c.domain, e.entries, c.ovr.rpu, c.ovr.unit, 1)
			} else {
				e.rule = cfg.Match(c.domain, e.entries)
			}
			for _, k := range c.checks {
				checks++
				got := k.fn(e)
				switch {
				case k.known == "" && got != "":
					t.Errorf("%s: upstream asserts %s; rls: %s", c.cfg, k.what, got)
				case k.known != "" && got == "":
					t.Errorf("%s: %s now holds: drop its known-difference mark (%s)", c.cfg, k.what, k.known)
				case k.known != "":
					t.Run("known difference", func(t *testing.T) {
						t.Skipf("upstream asserts %s; rls: %s. %s", k.what, got, k.known)
					})
				}
			}
		})
	}
	t.Logf("replayed %d GetLimit calls with %d checks", len(upstreamCalls), checks)
}

// TestRLSStatsNameHelpers: the replay's renderers split what they must.
func TestRLSStatsNameHelpers(t *testing.T) {
	for _, c := range []struct {
		path string
		keys []string
		want []string
	}{
		{"a", []string{"a"}, []string{"a"}},
		{"a=x/y/b", []string{"a", "b"}, []string{"a=x/y", "b"}},
		{"files=top/*/files=nested/*", []string{"files", "files"}, []string{"files=top/*", "files=nested/*"}},
		{"path=path/*/file=file/*/type", []string{"path", "file", "type"}, []string{"path=path/*", "file=file/*", "type"}},
		{"k1/k2=v/k3", []string{"k1", "k2", "k3"}, []string{"k1", "k2=v", "k3"}},
	} {
		if got := pathLevels(c.path, c.keys); !reflect.DeepEqual(got, c.want) {
			t.Errorf("pathLevels(%q, %q) = %q, want %q", c.path, c.keys, got, c.want)
		}
	}
	key := AppendKey(nil, "d|x", entries("a", "1|2", "b", "3", "c", "4"), &Rule{Unit: UnitMinute})
	if got, want := keyEntries(key), []string{"a=1%7C2", "b=3", "c=4"}; !reflect.DeepEqual(got, want) {
		t.Errorf("keyEntries(%s) = %q, want %q", key, got, want)
	}
}

// TestUpstreamDifferences: behaviour of upstream's config_impl.go (at the
// commit the fixtures come from) that its tests do not assert and rls does
// not share. Each case asserts upstream's behaviour and is skipped, with
// the reason, while rls differs; it fails once rls agrees, so the mark can
// be removed.
func TestUpstreamDifferences(t *testing.T) {
	known := func(t *testing.T, got string, why string) {
		t.Helper()
		if got == "" {
			t.Fatalf("rls now behaves as upstream: remove this known difference (%s)", why)
		}
		t.Skipf("rls: %s. %s", got, why)
	}
	cfgs := upstreamConfigs(t)

	t.Run("override drops shadow_mode", func(t *testing.T) {
		// GetLimit builds an override's RateLimit with shadow_mode, quota_mode
		// and detailed_metric false ("we don't want to enable shadow_mode").
		r := cfgs["shadowmode_config.yaml"].MatchOverride("test-domain", entries("key2", "something"), 9, UnitDay, 1)
		got := ""
		if r == nil || r.ShadowMode {
			got = "the override rule keeps the matched rule's shadow_mode: true"
		}
		known(t, got, "OverrideRule keeps the base rule's flags by design (its doc); upstream's override answers in "+
			"shadow mode never")
	})
	t.Run("override drops name and replaces", func(t *testing.T) {
		// GetLimit builds an override's RateLimit with name "" and no replaces.
		r := cfgs["basic_config.yaml"].MatchOverride("test-domain", entries("key4", "foo"), 9, UnitDay, 1)
		got := ""
		if r == nil || r.Name != "" || len(r.Replaces) != 0 {
			got = fmt.Sprintf("the override rule keeps the matched rule's name %q", r.Name)
		}
		known(t, got, "OverrideRule keeps the base rule's name and replaces, so current_limit.name and replaces "+
			"apply to overrides; upstream's are empty")
	})

	// Upstream matches a wildcard against the request's "key_value" as one
	// string, with the pattern "key_value" of the descriptor.
	quirks, err := Parse(map[string][]byte{"quirks.yaml": []byte(`
domain: d
descriptors:
  - key: foo*
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: a
    value: b_c*
    rate_limit: {unit: second, requests_per_unit: 7}
`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		req  []string
		rpu  uint32
	}{
		{"key-only wildcard key is a key prefix", kv("foobar", "x"), 5},
		{"wildcard across key and value", kv("a_b", "c1"), 7},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := ""
			if r := quirks.Match("d", entries(c.req...)); r == nil || r.RequestsPerUnit != c.rpu {
				got = fmt.Sprintf("%v matches %v", c.req, r)
			}
			known(t, got, "keys are matched literally (see the package doc); upstream matches "+
				"the rule with requests_per_unit "+fmt.Sprint(c.rpu))
		})
	}

	// Files upstream loads (ConfigFileContentToYaml and NewRateLimitConfigImpl
	// do not panic) and rls refuses.
	for _, c := range []struct{ name, yaml, why string }{
		{"unlimited with requests_per_unit",
			"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      requests_per_unit: 5\n",
			"upstream refuses a unit with unlimited (TestUnlimitedWithRateLimitUnit) but ignores requests_per_unit; " +
				"rls refuses both"},
		{"name on a descriptor",
			"domain: d\ndescriptors:\n  - key: a\n    name: x\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
			"upstream checks field names against one list for every level (validKeys), so a known field in the " +
				"wrong place is accepted and ignored; rls checks each level's fields"},
		{"second YAML document",
			"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n---\ndomain: e\n",
			"upstream's yaml.Unmarshal reads the first document and ignores the rest; rls refuses a second one"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(map[string][]byte{"f.yaml": []byte(c.yaml)})
			got := ""
			if err != nil {
				got = err.Error()
			}
			known(t, got, c.why)
		})
	}
}
