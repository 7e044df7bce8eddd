package descriptors

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/pkg/store"
)

// entries builds request entries from key, value pairs.
func entries(kv ...string) []*rlcommon.RateLimitDescriptor_Entry {
	out := make([]*rlcommon.RateLimitDescriptor_Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// loadMatch loads testdata/match.
func loadMatch(tb testing.TB) *Config {
	tb.Helper()
	cfg, _, err := Load(filepath.Join("testdata", "match"))
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}

func TestMatch(t *testing.T) {
	cfg := loadMatch(t)
	tests := []struct {
		name    string
		domain  string
		entries []string
		want    string // rule name; "" for nil
	}{
		{"key-only default", "api", []string{"api_key", "k1"}, "per_key"},
		{"exact beats wildcard", "api", []string{"api_key", "k1", "route", "/v1/admin"}, "admin"},
		{"trailing wildcard", "api", []string{"api_key", "k1", "route", "/v1/users"}, "v1"},
		{"trailing wildcard, empty rest", "api", []string{"api_key", "k1", "route", "/v1/"}, "v1"},
		{"inner wildcards", "api", []string{"api_key", "k1", "route", "/v2/a/items/b"}, "v2_items"},
		{"inner wildcards, empty runs", "api", []string{"api_key", "k1", "route", "/v2//items/"}, "v2_items"},
		{"wildcard miss falls to default", "api", []string{"api_key", "k1", "route", "/v2/a/things/b"}, "any_route"},
		{"nested without limit", "api", []string{"api_key", "k1", "method", "GET"}, ""},
		{"three levels", "api", []string{"api_key", "k1", "method", "GET", "path", "/"}, "method_path"},
		{"deeper than config", "api", []string{"api_key", "k1", "method", "GET", "path", "/", "x", "y"}, ""},
		{"deeper than leaf", "api", []string{"api_key", "k1", "route", "/v1/a", "x", "y"}, ""},
		{"exact node without limit, no fallback", "api", []string{"api_key", "premium"}, ""},
		{"exact node child", "api", []string{"api_key", "premium", "route", "/v1/x"}, "premium_route"},
		{"unknown key at level", "api", []string{"api_key", "k1", "nope", "x"}, ""},
		{"unknown top key", "api", []string{"nope", "x"}, ""},
		{"bar*b barb", "api", []string{"w", "barb"}, "bar_b"},
		{"bar*b bar-ab", "api", []string{"w", "bar-ab"}, "bar_b"},
		{"bar*b not bar", "api", []string{"w", "bar"}, ""},
		{"bar*b not barbx", "api", []string{"w", "barbx"}, ""},
		{"foo*bar*baz", "api", []string{"w", "foo-bar-baz"}, "foo_bar_baz"},
		{"foo*bar*baz tight", "api", []string{"w", "foobarbaz"}, "foo_bar_baz"},
		{"foo*bar*baz missing bar", "api", []string{"w", "foo-baz"}, ""},
		{"foo*bar*baz wrong order", "api", []string{"w", "foo-baz-bar"}, ""},
		{"first wildcard in file order", "api", []string{"team", "eng-core"}, "eng_shared"},
		{"catch-all wildcard", "api", []string{"team", "sales"}, "any_team"},
		{"catch-all wildcard empty value", "api", []string{"team", ""}, "any_team"},
		{"shadow", "api", []string{"shadow", "x"}, "shadowed"},
		{"unlimited", "api", []string{"free", "x"}, "free"},
		{"unknown domain", "nope", []string{"api_key", "k1"}, ""},
		{"no entries", "api", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := cfg.Match(tt.domain, entries(tt.entries...))
			got := ""
			if r != nil {
				got = r.Name
			}
			if got != tt.want {
				t.Errorf("Match(%s, %v) = %q, want %q", tt.domain, tt.entries, got, tt.want)
			}
		})
	}
	if r := cfg.Match("api", entries("shadow", "x")); !r.ShadowMode || !r.DetailedMetric {
		t.Errorf("shadow rule flags = %+v", r)
	}
	if r := cfg.Match("api", entries("free", "x")); !r.Unlimited {
		t.Errorf("unlimited rule = %+v", r)
	}
	var nilCfg *Config
	if r := nilCfg.Match("api", entries("a", "b")); r != nil {
		t.Errorf("nil Config matched %+v", r)
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	cfg := loadMatch(t)
	e := entries("api_key", "k1", "route", "/v2/a/items/b")
	if n := testing.AllocsPerRun(100, func() { cfg.Match("api", e) }); n != 0 {
		t.Errorf("Match allocates %v times", n)
	}
}

func TestGlob(t *testing.T) {
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"*", "", true},
		{"*", "anything", true},
		{"foo*", "foo", true},
		{"foo*", "foobar", true},
		{"foo*", "fo", false},
		{"*foo", "barfoo", true},
		{"*foo", "foobar", false},
		{"bar*b", "barb", true},
		{"bar*b", "bar-ab", true},
		{"bar*b", "bar", false},
		{"a*a", "a", false},
		{"a*a", "aa", true},
		{"foo*bar*baz", "foobarbaz", true},
		{"foo*bar*baz", "foo bar bar baz", true},
		{"foo*bar*baz", "foobaz", false},
		{"**x**", "x", true},
		{"a*b*c", "abbc", true},
		{"a*b*c", "acb", false},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+"/"+tt.s, func(t *testing.T) {
			g := compileGlob(tt.pattern)
			if got := g.match(tt.s); got != tt.want {
				t.Errorf("glob %q match %q = %v, want %v", tt.pattern, tt.s, got, tt.want)
			}
		})
	}
}

func TestApplyReplaces(t *testing.T) {
	a := &Rule{Name: "a"}
	b := &Rule{Name: "b", Replaces: []string{"a"}}
	c := &Rule{Name: "c", Replaces: []string{"b"}}
	anon := &Rule{Replaces: []string{"a"}}
	x := &Rule{Name: "x", Replaces: []string{"y"}}
	y := &Rule{Name: "y", Replaces: []string{"x"}}
	tests := []struct {
		name string
		in   []*Rule
		want []*Rule
	}{
		{"none", []*Rule{a, nil}, []*Rule{a, nil}},
		{"b replaces a", []*Rule{a, b}, []*Rule{nil, b}},
		{"order does not matter", []*Rule{b, a}, []*Rule{b, nil}},
		{"chain uses every matched rule", []*Rule{a, b, c}, []*Rule{nil, nil, c}},
		{"mutual", []*Rule{x, y}, []*Rule{nil, nil}},
		{"unnamed replacer", []*Rule{anon, a}, []*Rule{anon, nil}},
		{"absent target", []*Rule{b, nil}, []*Rule{b, nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := append([]*Rule(nil), tt.in...)
			ApplyReplaces(got)
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("index %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
	rules := []*Rule{a, b, c}
	if n := testing.AllocsPerRun(100, func() { ApplyReplaces(append(rules[:0:0], rules...)[:3:3]) }); n > 1 {
		t.Errorf("ApplyReplaces allocates %v times", n-1)
	}
	big := make([]*Rule, 100)
	big[0], big[99] = a, b
	ApplyReplaces(big)
	if big[0] != nil || big[99] != b {
		t.Error("ApplyReplaces with more than 64 rules")
	}
}

func TestOverrideRule(t *testing.T) {
	cfg := loadMatch(t)
	base := cfg.Match("api", entries("api_key", "k1", "route", "/v1/x"))
	tests := []struct {
		name string
		base *Rule
		want Rule
	}{
		{"from base", base, Rule{Name: "v1", Unit: UnitHour, RequestsPerUnit: 42, Algorithm: store.TokenBucket,
			OnError: OnErrorFailClosed, Domain: "api", Path: base.Path, File: base.File, Line: base.Line, Override: true}},
		{"no base", nil, Rule{Unit: UnitHour, RequestsPerUnit: 42, Domain: "api", Override: true}},
		{"unlimited base", cfg.Match("api", entries("free", "x")), Rule{Name: "free", Unit: UnitHour, RequestsPerUnit: 42,
			QuotaMode: true, Domain: "api", Path: "free", File: base.File, Line: 45, Override: true}},
		{"shadow base", cfg.Match("api", entries("shadow", "x")), Rule{Name: "shadowed", Unit: UnitHour, RequestsPerUnit: 42,
			ShadowMode: true, DetailedMetric: true, Domain: "api", Path: "shadow", File: base.File, Line: 42, Override: true}},
		{"share base", cfg.Match("api", entries("team", "eng-a")), Rule{Name: "eng_shared", Unit: UnitHour, RequestsPerUnit: 42,
			Domain: "api", Path: "team=eng-*", File: base.File, Line: 50, Override: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := OverrideRule(tt.base, "api", 42, UnitHour, 1)
			if got.Burst != 0 || got == tt.base {
				t.Errorf("override shares state with its base: %+v", got)
			}
			if got.Name != tt.want.Name || got.Unit != tt.want.Unit || got.RequestsPerUnit != tt.want.RequestsPerUnit ||
				got.Algorithm != tt.want.Algorithm || got.OnError != tt.want.OnError || got.ShadowMode != tt.want.ShadowMode ||
				got.Unlimited || !got.Override || got.Domain != "api" || got.Path != tt.want.Path || got.share != nil {
				t.Errorf("OverrideRule =\n%+v\nwant\n%+v", *got, tt.want)
			}
		})
	}
	if base.Override || base.RequestsPerUnit != 10 {
		t.Errorf("OverrideRule modified its base: %+v", base)
	}
	if r := cfg.MatchOverride("nope", entries("a", "b"), 1, UnitSecond, 1); r != nil {
		t.Errorf("MatchOverride on unknown domain = %+v", r)
	}
	if r := cfg.MatchOverride("api", entries("nope", "b"), 5, UnitSecond, 1); r == nil || !r.Override || r.RequestsPerUnit != 5 {
		t.Errorf("MatchOverride without configured rule = %+v", r)
	}
}

func TestUnit(t *testing.T) {
	tests := []struct {
		unit    Unit
		name    string
		seconds int64
	}{
		{UnitSecond, "second", 1},
		{UnitMinute, "minute", 60},
		{UnitHour, "hour", 3600},
		{UnitDay, "day", 86400},
		{UnitWeek, "week", 604800},
		{UnitMonth, "month", 2592000},
		{UnitYear, "year", 31536000},
		{0, "unknown", 0},
		{8, "unknown", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.unit.String(); got != tt.name {
				t.Errorf("String() = %q, want %q", got, tt.name)
			}
			if got := tt.unit.Seconds(); got != tt.seconds {
				t.Errorf("Seconds() = %d, want %d", got, tt.seconds)
			}
			if got := (&Rule{Unit: tt.unit}).Window(); got != time.Duration(tt.seconds)*time.Second {
				t.Errorf("Window() = %v", got)
			}
			if tt.seconds == 0 {
				if tt.unit.Valid() {
					t.Error("Valid() = true")
				}
				return
			}
			if !tt.unit.Valid() {
				t.Error("Valid() = false")
			}
			for _, s := range []string{tt.name, strings.ToUpper(tt.name)} {
				if u, ok := ParseUnit(s); !ok || u != tt.unit {
					t.Errorf("ParseUnit(%q) = %v, %v", s, u, ok)
				}
			}
		})
	}
	// The values are Envoy's enum numbers.
	for u, want := range map[Unit]int32{
		UnitSecond: int32(rlv3.RateLimitResponse_RateLimit_SECOND),
		UnitMinute: int32(rlv3.RateLimitResponse_RateLimit_MINUTE),
		UnitHour:   int32(rlv3.RateLimitResponse_RateLimit_HOUR),
		UnitDay:    int32(rlv3.RateLimitResponse_RateLimit_DAY),
		UnitMonth:  int32(rlv3.RateLimitResponse_RateLimit_MONTH),
		UnitYear:   int32(rlv3.RateLimitResponse_RateLimit_YEAR),
		UnitWeek:   int32(rlv3.RateLimitResponse_RateLimit_WEEK),
	} {
		if int32(u) != want {
			t.Errorf("%s = %d, Envoy's is %d", u, int32(u), want)
		}
	}
}

func TestOnErrorString(t *testing.T) {
	tests := []struct {
		o    OnError
		want string
	}{
		{OnErrorDefault, "default"},
		{OnErrorFailOpen, "fail_open"},
		{OnErrorFailClosed, "fail_closed"},
	}
	for _, tt := range tests {
		if got := tt.o.String(); got != tt.want {
			t.Errorf("%d.String() = %q, want %q", tt.o, got, tt.want)
		}
	}
}

func BenchmarkMatch(b *testing.B) {
	cfg := loadMatch(b)
	cases := []struct {
		name    string
		entries []*rlcommon.RateLimitDescriptor_Entry
	}{
		{"exact", entries("api_key", "k1", "route", "/v1/admin")},
		{"wildcard", entries("api_key", "k1", "route", "/v2/a/items/b")},
		{"default", entries("api_key", "k1", "route", "/v3")},
		{"three_levels", entries("api_key", "k1", "method", "GET", "path", "/")},
		{"miss", entries("nope", "x")},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				cfg.Match("api", c.entries)
			}
		})
	}
}
