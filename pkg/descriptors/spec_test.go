package descriptors

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// specYAML is the YAML file that specExample stands for.
const specYAML = `domain: api
descriptors:
  - key: api_key
    rate_limit: {name: per-key, unit: minute, requests_per_unit: 100}
    descriptors:
      - key: route
        value: /v1/*
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: per-key}]}
  - key: api_key
    value: internal
    rate_limit: {unlimited: true}
  - key: tenant
    quota_mode: true
    detailed_metric: true
    metadata: {team: payments, weight: 0.5, tags: [a, b], nested: {on: true, none: null}}
    rate_limit: {unit: DAY, requests_per_unit: 0}
`

func specExample() DomainSpec {
	meta, err := structpb.NewStruct(map[string]any{
		"team": "payments", "weight": 0.5, "tags": []any{"a", "b"},
		"nested": map[string]any{"on": true, "none": nil},
	})
	if err != nil {
		panic(err)
	}
	return DomainSpec{Name: "xds:api", Domain: "api", Descriptors: []DescriptorSpec{
		{Key: "api_key", RateLimit: &RateLimitSpec{Name: "per-key", Unit: "MINUTE", RequestsPerUnit: 100},
			Descriptors: []DescriptorSpec{{Key: "route", Value: "/v1/*", ShadowMode: true,
				RateLimit: &RateLimitSpec{Unit: "SECOND", RequestsPerUnit: 5, Replaces: []string{"per-key"}}}}},
		{Key: "api_key", Value: "internal", RateLimit: &RateLimitSpec{Unlimited: true}},
		{Key: "tenant", QuotaMode: true, DetailedMetric: true, Metadata: meta,
			RateLimit: &RateLimitSpec{Unit: "DAY"}},
	}}
}

// TestSpecLoadsAsItsYAML: a spec and the YAML file it stands for make the
// same rules and the same matches.
func TestSpecLoadsAsItsYAML(t *testing.T) {
	fromSpec, err := ParseSpecs([]DomainSpec{specExample()}, ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fromYAML := mustParse(t, "api.yaml", specYAML)
	a, b := fromSpec.Rules(), fromYAML.Rules()
	if len(a) != len(b) || len(a) != 4 {
		t.Fatalf("spec has %d rules, YAML %d, want 4", len(a), len(b))
	}
	for i := range a {
		if a[i].File != "xds:api" || a[i].Line != 0 {
			t.Errorf("spec rule %s at %s:%d, want xds:api:0", a[i].Path, a[i].File, a[i].Line)
		}
		x, y := *a[i], *b[i]
		x.File, x.Line, y.File, y.Line = "", 0, "", 0
		mx, my := x.Metadata, y.Metadata
		x.Metadata, y.Metadata = nil, nil
		if !reflect.DeepEqual(x, y) {
			t.Errorf("rule %d:\n spec %+v\n YAML %+v", i, x, y)
		}
		if !proto.Equal(mx, my) {
			t.Errorf("rule %d: metadata spec %v, YAML %v", i, mx, my)
		}
	}
	for _, req := range [][]string{{"api_key", "k"}, {"api_key", "internal"}, {"api_key", "k", "route", "/v1/x"},
		{"api_key", "k", "route", "/v2"}, {"tenant", "t"}, {"other", "x"}} {
		var es []*rlcommon.RateLimitDescriptor_Entry
		for i := 0; i < len(req); i += 2 {
			es = append(es, &rlcommon.RateLimitDescriptor_Entry{Key: req[i], Value: req[i+1]})
		}
		ra, rb := fromSpec.Match("api", es), fromYAML.Match("api", es)
		if (ra == nil) != (rb == nil) || ra != nil && ra.Path != rb.Path {
			t.Errorf("%v: spec matches %v, YAML %v", req, ra, rb)
		}
	}
}

// TestSpecErrors: a spec is refused with the YAML's rules, and each error
// names the spec and the field path.
func TestSpecErrors(t *testing.T) {
	rl := func(unit string, rpu uint32) *RateLimitSpec { return &RateLimitSpec{Unit: unit, RequestsPerUnit: rpu} }
	one := func(ds ...DescriptorSpec) []DomainSpec {
		return []DomainSpec{{Name: "xds:r", Domain: "d", Descriptors: ds}}
	}
	deep := DescriptorSpec{Key: "k", RateLimit: rl("minute", 1)}
	for range maxDepth + 1 {
		deep = DescriptorSpec{Key: "k", Descriptors: []DescriptorSpec{deep}}
	}
	nested := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for range maxMetaDepth + 1 {
		nested = &structpb.Struct{Fields: map[string]*structpb.Value{"x y": structpb.NewStructValue(nested)}}
	}
	tests := []struct {
		name  string
		specs []DomainSpec
		opts  ParseOptions
		want  []string // every error, in order
	}{
		{"unknown unit", one(DescriptorSpec{Key: "a", RateLimit: rl("minute", 1)}, DescriptorSpec{Key: "b", RateLimit: rl("UNKNOWN", 1)}),
			ParseOptions{}, []string{`xds:r: descriptors[1].rate_limit.unit: invalid unit "UNKNOWN"; choices are second, minute, hour, day, week, month, year`}},
		{"no unit", one(DescriptorSpec{Key: "a", RateLimit: rl("", 1)}),
			ParseOptions{}, []string{`xds:r: descriptors[0].rate_limit.unit: missing; required unless unlimited is true`}},
		{"unlimited with a unit and a limit", one(DescriptorSpec{Key: "a", RateLimit: &RateLimitSpec{Unlimited: true, Unit: "SECOND", RequestsPerUnit: 3}}),
			ParseOptions{}, []string{
				`xds:r: descriptors[0].rate_limit.unit: must not be set when unlimited is true`,
				`xds:r: descriptors[0].rate_limit.requests_per_unit: must not be set when unlimited is true`}},
		{"duplicate descriptor", one(DescriptorSpec{Key: "a", Value: "v"}, DescriptorSpec{Key: "b"}, DescriptorSpec{Key: "a", Value: "v"}),
			ParseOptions{}, []string{`xds:r: descriptors[2].value: duplicate descriptor key "a" with value "v" at this level (first at descriptors[0])`}},
		{"duplicate nested key", one(DescriptorSpec{Key: "a", Descriptors: []DescriptorSpec{{Key: "b"}, {Key: "b"}}}),
			ParseOptions{}, []string{`xds:r: descriptors[0].descriptors[1].key: duplicate descriptor key "b" at this level (first at descriptors[0].descriptors[0])`}},
		{"empty key", one(DescriptorSpec{Key: "", Value: "x"}),
			ParseOptions{}, []string{`xds:r: descriptors[0].key: must not be empty`}},
		{"empty domain", []DomainSpec{{Name: "xds:r"}},
			ParseOptions{}, []string{`xds:r: domain: must not be empty`}},
		{"replaces itself and nothing", one(DescriptorSpec{Key: "a", RateLimit: &RateLimitSpec{Unit: "second", Name: "n", Replaces: []string{"m", "n", ""}}}),
			ParseOptions{}, []string{
				`xds:r: descriptors[0].rate_limit.replaces[1].name: names the rule's own name "n"`,
				`xds:r: descriptors[0].rate_limit.replaces[2].name: entry has an empty name`}},
		{"too deep", one(deep), ParseOptions{},
			[]string{`xds:r: descriptors[0]` + strings.Repeat(`.descriptors[0]`, maxDepth-1) + `.descriptors: nested deeper than 64 levels`}},
		{"metadata too deep", one(DescriptorSpec{Key: "a", Metadata: nested, RateLimit: rl("second", 1)}), ParseOptions{},
			[]string{`xds:r: descriptors[0].metadata` + strings.Repeat(`["x y"]`, maxMetaDepth+1) + `: nested deeper than 32 levels`}},
		{"duplicate domain", []DomainSpec{{Name: "xds:b", Domain: "d"}, {Name: "xds:a", Domain: "d"}}, ParseOptions{MergeDomainsName: "--merge-domains"},
			[]string{`xds:b: domain: duplicate domain "d", also defined at xds:a: domain (--merge-domains combines them)`}},
		{"duplicate domain, the option unnamed", []DomainSpec{{Name: "xds:b", Domain: "d"}, {Name: "xds:a", Domain: "d"}}, ParseOptions{},
			[]string{`xds:b: domain: duplicate domain "d", also defined at xds:a: domain`}},
		{"merged duplicate", []DomainSpec{
			{Name: "xds:a", Domain: "d", Descriptors: []DescriptorSpec{{Key: "k", Value: "v"}}},
			{Name: "xds:b", Domain: "d", Descriptors: []DescriptorSpec{{Key: "j"}, {Key: "k", Value: "v"}}}}, ParseOptions{MergeDomains: true},
			[]string{`xds:b: descriptors[1].key: duplicate top-level descriptor key "k" with value "v" in a merged domain (first at xds:a: descriptors[0])`}},
		{"two resources with one name", []DomainSpec{{Name: "xds:a", Domain: "d"}, {Name: "xds:a", Domain: "e"}}, ParseOptions{},
			[]string{`xds:a: a second resource with this name`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseSpecs(tc.specs, tc.opts)
			if err == nil {
				t.Fatalf("accepted: %v", cfg.Rules())
			}
			var list Errors
			if !errors.As(err, &list) {
				t.Fatalf("error %T %v, want Errors", err, err)
			}
			var got []string
			for _, e := range list {
				got = append(got, e.Error())
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("errors\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestSpecMergedDomain: with MergeDomains two specs of one domain combine,
// as two files do.
func TestSpecMergedDomain(t *testing.T) {
	cfg, err := ParseSpecs([]DomainSpec{
		{Name: "xds:b", Domain: "d", Descriptors: []DescriptorSpec{{Key: "b", RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 2}}}},
		{Name: "xds:a", Domain: "d", Descriptors: []DescriptorSpec{{Key: "a", RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 1}}}},
	}, ParseOptions{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	for k, rpu := range map[string]uint32{"a": 1, "b": 2} {
		r := cfg.Match("d", []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: "x"}})
		if r == nil || r.RequestsPerUnit != rpu {
			t.Errorf("%s: rule %+v, want %d/s", k, r, rpu)
		}
	}
}

// TestSpecHash: the hash follows the content and names, not the order of
// metadata fields or of the specs.
func TestSpecHash(t *testing.T) {
	hash := func(specs ...DomainSpec) string {
		t.Helper()
		cfg, err := ParseSpecs(specs, ParseOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Hash()
	}
	a := specExample()
	b := DomainSpec{Name: "xds:other", Domain: "other"}
	h := hash(a, b)
	for range 20 { // map order varies from run to run
		if got := hash(specExample(), b); got != h {
			t.Fatalf("hash changed between identical specs: %s, %s", got, h)
		}
	}
	if got := hash(b, a); got != h {
		t.Errorf("hash depends on the specs' order")
	}
	c := specExample()
	c.Descriptors[0].RateLimit.RequestsPerUnit++
	if hash(c, b) == h {
		t.Error("hash unchanged by a new limit")
	}
	d := specExample()
	d.Name = "xds:renamed"
	if hash(d, b) == h {
		t.Error("hash unchanged by a new resource name")
	}
}

// TestSpecMetadataValues: every kind of protobuf value survives the trip
// through the YAML tree, including floats YAML spells differently.
func TestSpecMetadataValues(t *testing.T) {
	in := &structpb.Struct{Fields: map[string]*structpb.Value{
		"s": structpb.NewStringValue("true"), "q": structpb.NewStringValue("line\nbreak: 'x'"),
		"n": structpb.NewNumberValue(1e6), "f": structpb.NewNumberValue(-0.125), "big": structpb.NewNumberValue(math.MaxFloat64),
		"inf": structpb.NewNumberValue(math.Inf(1)), "ninf": structpb.NewNumberValue(math.Inf(-1)),
		"b": structpb.NewBoolValue(false), "null": structpb.NewNullValue(), "unset": {},
		"l":   structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewNumberValue(1), structpb.NewStringValue("2")}}),
		"a.b": structpb.NewStringValue("dotted"),
	}}
	cfg, err := ParseSpecs([]DomainSpec{{Name: "xds:m", Domain: "m", Descriptors: []DescriptorSpec{
		{Key: "k", Metadata: in, RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 1}}}}}, ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := proto.Clone(in).(*structpb.Struct)
	want.Fields["unset"] = structpb.NewNullValue()
	if got := cfg.Rules()[0].Metadata; !proto.Equal(got, want) {
		t.Errorf("metadata\n got %v\nwant %v", got, want)
	}
	nan, err := ParseSpecs([]DomainSpec{{Name: "xds:m", Domain: "m", Descriptors: []DescriptorSpec{
		{Key: "k", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"x": structpb.NewNumberValue(math.NaN())}},
			RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 1}}}}}, ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := nan.Rules()[0].Metadata.Fields["x"].GetNumberValue(); !math.IsNaN(v) {
		t.Errorf("NaN came back as %v", v)
	}
}

// TestSpecStringsStayStrings: values that YAML would read as other types or
// that hold YAML syntax are taken as the strings they are.
func TestSpecStringsStayStrings(t *testing.T) {
	odd := []string{"true", "null", "~", "123", "0x1F", "- a", "a: b", "*", "&anchor", "!!int", "#", "'", "\"", "é", "\t", " lead"}
	var ds []DescriptorSpec
	for _, v := range odd {
		ds = append(ds, DescriptorSpec{Key: v, Value: v, RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 1, Name: v}})
	}
	cfg, err := ParseSpecs([]DomainSpec{{Name: "xds:o", Domain: "yes", Descriptors: ds}}, ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cfg.Domains(); len(d) != 1 || d[0] != "yes" {
		t.Errorf("domains %q", d)
	}
	for _, v := range odd {
		r := cfg.Match("yes", []*rlcommon.RateLimitDescriptor_Entry{{Key: v, Value: v}})
		if r == nil || r.Name != v {
			t.Errorf("%q: matched %+v", v, r)
		}
	}
}
