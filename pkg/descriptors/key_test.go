package descriptors

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/store"
)

func TestAppendKey(t *testing.T) {
	cfg := loadMatch(t)
	minute := &Rule{Unit: UnitMinute}
	tests := []struct {
		name    string
		domain  string
		entries []string
		rule    *Rule
		want    string
	}{
		{"sliding", "api", []string{"api_key", "k1", "route", "/v1/x"}, minute, "rl:{api|api_key=k1}:s60|route=/v1/x"},
		{"fixed", "api", []string{"api_key", "k1"}, &Rule{Unit: UnitHour, Algorithm: store.FixedWindow}, "rl:{api|api_key=k1}:f3600"},
		{"token bucket", "api", []string{"api_key", "k1"}, &Rule{Unit: UnitSecond, Algorithm: store.TokenBucket, Burst: 9}, "tb:{api|api_key=k1}:t1"},
		{"override", "api", []string{"api_key", "k1", "route", "r"}, OverrideRule(minute, "api", 500, UnitDay, 1), "rl:{api|api_key=k1}:s86400o500|route=r"},
		{"month and year", "d", []string{"k", "v"}, &Rule{Unit: UnitYear}, "rl:{d|k=v}:s31536000"},
		{"escaping", "a{b}", []string{"k:1", "v=|%", "k 2", "x\ny\x7f"}, minute, "rl:{a%7Bb%7D|k%3A1=v%3D%7C%25}:s60|k%202=x%0Ay%7F"},
		{"utf-8 kept", "api", []string{"name", "Zoë 日本"}, minute, "rl:{api|name=Zoë%20日本}:s60"},
		// Envoy forwards header bytes that are not UTF-8: kept exactly, escaped
		// so that the key is valid UTF-8 and never equal to a valid value's.
		{"invalid utf-8 escaped", "d\xff", []string{"k\xc3", "abc\xff", "x", "\xe6\x97é\x80"}, minute, "rl:{d%FF|k%C3=abc%FF}:s60|x=%E6%97é%80"},
		{"invalid utf-8 versus its escape", "d", []string{"k", "abc%FF"}, minute, "rl:{d|k=abc%25FF}:s60"},
		{"no entries", "api", nil, minute, "rl:{api|}:s60"},
		{"nil rule", "api", []string{"k", "v"}, nil, "rl:{api|k=v}:s0"},
		{"share threshold", "api", []string{"team", "eng-core"}, cfg.Match("api", entries("team", "eng-core")), "rl:{api|team=%*eng-*}:s60"},
		{"wildcard without share counts values", "api", []string{"team", "sales"}, cfg.Match("api", entries("team", "sales")), "rl:{api|team=sales}:s60"},
		{"override never shares", "api", []string{"team", "eng-core"}, OverrideRule(cfg.Match("api", entries("team", "eng-core")), "api", 3, UnitMinute, 1), "rl:{api|team=eng-core}:s60o3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(AppendKey([]byte("prefix"), tt.domain, entries(tt.entries...), tt.rule))
			if got != "prefix"+tt.want {
				t.Errorf("AppendKey = %q, want %q", got, "prefix"+tt.want)
			}
		})
	}
}

func TestAppendKeyDoesNotAllocate(t *testing.T) {
	e := entries("api_key", "k{1}", "route", "/v1/x y", "method", "GET")
	r := &Rule{Unit: UnitMinute, Override: true, RequestsPerUnit: 7}
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { buf = AppendKey(buf[:0], "api", e, r) }); n != 0 {
		t.Errorf("AppendKey allocates %v times", n)
	}
}

// keyInput is everything a key must tell apart; values are the effective
// ones (a shared entry's pattern, marked).
type keyInput struct {
	domain   string
	entries  string // %q of the effective key/value pairs
	alg      store.Algorithm
	seconds  int64
	override bool
	rpu      uint32 // only for overrides
}

func inputOf(domain string, es []*rlcommon.RateLimitDescriptor_Entry, r *Rule) keyInput {
	var eff []string
	for i, e := range es {
		v := "value:" + e.GetValue()
		if !r.Override && i < len(r.share) && r.share[i] != "" {
			v = "shared:" + r.share[i]
		}
		eff = append(eff, e.GetKey(), v)
	}
	in := keyInput{domain: domain, entries: fmt.Sprintf("%q", eff), alg: r.Algorithm, seconds: r.Unit.Seconds(), override: r.Override}
	if r.Override {
		in.rpu = r.RequestsPerUnit
	}
	return in
}

// checkHashTag checks that the key's hash tag is exactly the escaped tenant.
func checkHashTag(t *testing.T, key []byte, domain string, es []*rlcommon.RateLimitDescriptor_Entry, r *Rule) {
	t.Helper()
	open := bytes.IndexByte(key, '{')
	end := bytes.IndexByte(key[open+1:], '}')
	if open != 3 || end < 0 {
		t.Fatalf("key %q has no hash tag after its prefix", key)
	}
	want := appendEscaped(nil, domain)
	want = append(want, '|')
	if len(es) > 0 {
		want = appendEntry(want, es[0], r, 0)
	}
	if tag := key[open+1 : open+1+end]; !bytes.Equal(tag, want) {
		t.Fatalf("hash tag %q, want %q", tag, want)
	}
}

// TestAppendKeyInjective builds keys for many random inputs drawn from a
// small alphabet full of reserved characters and checks that only equal
// inputs share a key.
func TestAppendKeyInjective(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "{", "}", ":", "=", "|", "%", "%7C", "%*", "*", " ", "\n", "é", "\x00", "\x7f",
		"\xff", "%FF", "\xc3", "\xa9", "%C3"} // invalid UTF-8, and what it is escaped to
	word := func() string {
		var b strings.Builder
		for n := rng.IntN(4); n > 0; n-- {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	rules := []*Rule{
		{Unit: UnitSecond},
		{Unit: UnitMinute},
		{Unit: UnitMinute, Algorithm: store.FixedWindow},
		{Unit: UnitMinute, Algorithm: store.TokenBucket},
		{Unit: UnitMinute, Override: true, RequestsPerUnit: 1},
		{Unit: UnitMinute, Override: true, RequestsPerUnit: 11},
		{Unit: UnitMinute, share: []string{"a*"}},
		{Unit: UnitMinute, share: []string{"", "%*"}},
	}
	seen := make(map[string]keyInput)
	for i := 0; i < 200000; i++ {
		domain := word()
		es := make([]*rlcommon.RateLimitDescriptor_Entry, rng.IntN(4))
		for j := range es {
			es[j] = &rlcommon.RateLimitDescriptor_Entry{Key: word(), Value: word()}
		}
		r := rules[rng.IntN(len(rules))]
		key := AppendKey(nil, domain, es, r)
		checkHashTag(t, key, domain, es, r)
		if !utf8.Valid(key) {
			t.Fatalf("key %q is not valid UTF-8", key)
		}
		in := inputOf(domain, es, r)
		if prev, ok := seen[string(key)]; ok && prev != in {
			t.Fatalf("key %q for both\n%+v\n%+v", key, prev, in)
		}
		seen[string(key)] = in
	}
}

// fuzzEntries decodes entries from b: each string is a length byte followed
// by that many bytes; strings pair up as key, value (at most 8 entries).
func fuzzEntries(b []byte) []*rlcommon.RateLimitDescriptor_Entry {
	var strs []string
	for len(b) > 0 && len(strs) < 16 {
		n := min(int(b[0]), len(b)-1)
		strs = append(strs, string(b[1:1+n]))
		b = b[1+n:]
	}
	var es []*rlcommon.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(strs); i += 2 {
		es = append(es, &rlcommon.RateLimitDescriptor_Entry{Key: strs[i], Value: strs[i+1]})
	}
	return es
}

// fuzzRule decodes a rule from m: algorithm, unit, override flag and
// requests_per_unit; the bits of requests_per_unit also pick, two per level,
// the share_threshold patterns of the first four levels (which an override
// ignores).
func fuzzRule(m uint32) *Rule {
	r := &Rule{
		Algorithm:       store.Algorithm(m % 3),
		Unit:            Unit(1 + (m>>2)%7),
		Override:        m>>5&1 == 1,
		RequestsPerUnit: m >> 6,
	}
	patterns := [4]string{"", "a*", "%*", "*}|{"}
	for i := 0; i < 4; i++ {
		if p := patterns[m>>(6+2*i)&3]; p != "" {
			for len(r.share) < i {
				r.share = append(r.share, "")
			}
			r.share = append(r.share, p)
		}
	}
	return r
}

// FuzzKeyInjective builds the keys of two fuzzed inputs: equal keys must
// mean equal inputs, and each key's hash tag must be its escaped tenant.
func FuzzKeyInjective(f *testing.F) {
	f.Add("api", []byte("\x07api_key\x02k1"), uint32(4), "api", []byte("\x07api_key\x02k1"), uint32(5))
	f.Add("a|b", []byte("\x01c\x01d"), uint32(0), "a", []byte("\x03b|c\x01d"), uint32(0))
	// shared (a*) versus the literal value "%*a*"; override ignores sharing
	f.Add("api", []byte("\x01t\x02ab"), uint32(1<<6), "api", []byte("\x01t\x04%*a*"), uint32(1<<6))
	f.Add("api", []byte("\x01t\x02ab"), uint32(1<<6), "api", []byte("\x01t\x02ab"), uint32(1<<6|1<<5))
	// bytes that are not UTF-8 versus their escape
	f.Add("a\xff", []byte("\x01k\x02\xc3("), uint32(0), "a%FF", []byte("\x01k\x04%C3("), uint32(0))
	f.Fuzz(func(t *testing.T, d1 string, e1 []byte, m1 uint32, d2 string, e2 []byte, m2 uint32) {
		es1, es2 := fuzzEntries(e1), fuzzEntries(e2)
		r1, r2 := fuzzRule(m1), fuzzRule(m2)
		k1 := AppendKey(nil, d1, es1, r1)
		k2 := AppendKey(nil, d2, es2, r2)
		checkHashTag(t, k1, d1, es1, r1)
		checkHashTag(t, k2, d2, es2, r2)
		if !utf8.Valid(k1) || !utf8.Valid(k2) {
			t.Fatalf("keys %q, %q: not valid UTF-8", k1, k2)
		}
		in1, in2 := inputOf(d1, es1, r1), inputOf(d2, es2, r2)
		if bytes.Equal(k1, k2) != (in1 == in2) {
			t.Fatalf("keys %q and %q for inputs\n%+v\n%+v", k1, k2, in1, in2)
		}
	})
}

func BenchmarkAppendKey(b *testing.B) {
	cases := []struct {
		name    string
		entries []*rlcommon.RateLimitDescriptor_Entry
		rule    *Rule
	}{
		{"two_entries", entries("api_key", "0123456789abcdef", "route", "/v1/users"), &Rule{Unit: UnitMinute}},
		{"escaped", entries("api_key", "{k:1}", "route", "/a b|c=d"), &Rule{Unit: UnitMinute}},
		{"override_token_bucket", entries("api_key", "k", "route", "/v1", "method", "GET"),
			&Rule{Unit: UnitSecond, Algorithm: store.TokenBucket, Override: true, RequestsPerUnit: 100}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 256)
			for b.Loop() {
				buf = AppendKey(buf[:0], "api", c.entries, c.rule)
			}
		})
	}
}
