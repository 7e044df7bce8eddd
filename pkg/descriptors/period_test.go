package descriptors

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

const periodsYAML = `domain: api
descriptors:
  - key: two_minutes
    rate_limit: {unit: minute, unit_multiplier: 2, requests_per_unit: 3}
  - key: one_minute
    rate_limit: {unit: minute, unit_multiplier: 1, requests_per_unit: 3}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: year
    rate_limit: {unit: year, unit_multiplier: 1, requests_per_unit: 3}
  - key: weeks
    rate_limit: {unit: week, unit_multiplier: 52, requests_per_unit: 3}
  - key: seconds
    rate_limit: {unit: second, unit_multiplier: 31536000, requests_per_unit: 3, algorithm: token_bucket}
  - key: precise
    rate_limit: {unit: hour, unit_multiplier: 2, requests_per_unit: 3, precision: 4}
`

// TestUnitMultiplierWindow: the window is the unit times unit_multiplier,
// up to a year exactly; the store key carries the whole window, so a rule
// of one unit keeps its key and two periods never share a counter.
func TestUnitMultiplierWindow(t *testing.T) {
	cfg := mustParse(t, "p.yaml", periodsYAML)
	for _, tt := range []struct {
		key    string
		window time.Duration
		store  string
	}{
		{"two_minutes", 2 * time.Minute, "rl:{api|two_minutes=v}:s120"},
		{"one_minute", time.Minute, "rl:{api|one_minute=v}:s60"},
		{"plain", time.Minute, "rl:{api|plain=v}:s60"},
		{"year", MaxWindow, "rl:{api|year=v}:s31536000"},
		{"weeks", 364 * 24 * time.Hour, "rl:{api|weeks=v}:s31449600"},
		{"seconds", MaxWindow, "tb:{api|seconds=v}:t31536000"},
		{"precise", 2 * time.Hour, "rl:{api|precise=v}:s7200p4"},
	} {
		r := cfg.Match("api", entries(tt.key, "v"))
		if r == nil {
			t.Fatalf("%s: no rule", tt.key)
		}
		if r.Window() != tt.window {
			t.Errorf("%s: window %v, want %v", tt.key, r.Window(), tt.window)
		}
		if k := string(AppendKey(nil, "api", entries(tt.key, "v"), r)); k != tt.store {
			t.Errorf("%s: key %s, want %s", tt.key, k, tt.store)
		}
	}
	var dump strings.Builder
	if err := cfg.Dump(&dump); err != nil || !strings.Contains(dump.String(), "api: two_minutes 3/2 minute sliding_window") {
		t.Errorf("dump does not show the period (%v):\n%s", err, dump.String())
	}
}

// TestUnitMultiplierBounds: a window one second over a year is refused,
// naming the field and the line; so is any multiplier of an invalid unit
// only once (for the unit).
func TestUnitMultiplierBounds(t *testing.T) {
	for _, tt := range []struct {
		name, rl, msg string
		errs          int
	}{
		{"a year and a second", "{unit: second, unit_multiplier: 31536001, requests_per_unit: 1}", "unit_multiplier: 31536001 with unit second is a window of 31536001s (about 365 days), longer than one year", 1},
		{"two years", "{unit: year, unit_multiplier: 2, requests_per_unit: 1}", "unit_multiplier: 2 with unit year is a window of 730 days", 1},
		{"largest uint32", "{unit: year, unit_multiplier: 4294967295, requests_per_unit: 1}", "longer than one year", 1},
		{"too large for uint32", "{unit: second, unit_multiplier: 4294967296, requests_per_unit: 1}", "unit_multiplier: too large", 1},
		{"a fraction", "{unit: second, unit_multiplier: 1.5, requests_per_unit: 1}", "unit_multiplier: must be an integer", 1},
		{"bad unit", "{unit: fortnight, unit_multiplier: 2, requests_per_unit: 1}", `unit: invalid unit "fortnight"`, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(map[string][]byte{"p.yaml": []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + tt.rl + "\n")})
			var errs Errors
			if !errors.As(err, &errs) || len(errs) != tt.errs {
				t.Fatalf("got %v, want %d error(s)", err, tt.errs)
			}
			if got := errs[0].Error(); !strings.HasPrefix(got, "p.yaml:4: ") || !strings.Contains(got, tt.msg) {
				t.Errorf("got %q, want p.yaml:4 and %q", got, tt.msg)
			}
		})
	}
}

// TestUnitWindow: Unit.Window's bound and WindowError's messages.
func TestUnitWindow(t *testing.T) {
	for _, tt := range []struct {
		u    Unit
		mult uint32
		secs int64
		ok   bool
	}{
		{UnitMinute, 0, 60, true},
		{UnitMinute, 1, 60, true},
		{UnitMinute, 30, 1800, true},
		{UnitDay, 365, 365 * 86400, true},
		{UnitDay, 366, 366 * 86400, false},
		{UnitMonth, 12, 360 * 86400, true},
		{UnitMonth, 13, 390 * 86400, false},
		{0, 2, 0, false},
	} {
		secs, ok := tt.u.Window(tt.mult)
		if secs != tt.secs || ok != tt.ok {
			t.Errorf("%s.Window(%d) = %d, %v; want %d, %v", tt.u, tt.mult, secs, ok, tt.secs, tt.ok)
		}
	}
	if got := WindowError(UnitMinute, 0); !strings.Contains(got, "at least 1") {
		t.Errorf("WindowError(minute, 0) = %q", got)
	}
}

// TestOverridePeriod: an override's period is its own, whatever the
// matched rule's.
func TestOverridePeriod(t *testing.T) {
	cfg := mustParse(t, "p.yaml", periodsYAML)
	r := cfg.MatchOverride("api", entries("two_minutes", "v"), 7, UnitMinute, 30)
	if r.Window() != 30*time.Minute || r.UnitMultiplier != 30 || r.RequestsPerUnit != 7 {
		t.Errorf("override: window %v multiplier %d rpu %d, want 30m, 30, 7", r.Window(), r.UnitMultiplier, r.RequestsPerUnit)
	}
	if k := string(AppendKey(nil, "api", entries("two_minutes", "v"), r)); k != "rl:{api|two_minutes=v}:s1800o7" {
		t.Errorf("override key %s", k)
	}
	r = cfg.MatchOverride("api", entries("two_minutes", "v"), 7, UnitMinute, 0)
	if r.Window() != time.Minute {
		t.Errorf("override without multiplier: window %v, want the unit (1m), not the rule's period", r.Window())
	}
}

// TestDefaultAlgorithm: ParseOptions.DefaultAlgorithm applies to rules
// that name no algorithm and set no precision, and to overrides matching
// no rule; it never changes what is valid.
func TestDefaultAlgorithm(t *testing.T) {
	const y = `domain: api
descriptors:
  - key: none
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: named
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}
  - key: precise
    rate_limit: {unit: minute, requests_per_unit: 3, precision: 4}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: token_bucket, burst: 5}
`
	for _, def := range []store.Algorithm{store.SlidingWindow, store.FixedWindow, store.TokenBucket} {
		cfg, err := Parse(map[string][]byte{"a.yaml": []byte(y)}, ParseOptions{DefaultAlgorithm: def})
		if err != nil {
			t.Fatalf("%s: %v", def, err)
		}
		for key, want := range map[string]store.Algorithm{"none": def, "named": store.SlidingWindow, "precise": store.SlidingWindow, "bucket": store.TokenBucket} {
			if got := cfg.Match("api", entries(key, "v")).Algorithm; got != want {
				t.Errorf("default %s: rule %s has %s, want %s", def, key, got, want)
			}
		}
		if got := cfg.MatchOverride("api", entries("nothing", "v"), 1, UnitSecond, 1).Algorithm; got != def {
			t.Errorf("default %s: override without a rule has %s", def, got)
		}
		if got := cfg.MatchOverride("api", entries("named", "v"), 1, UnitSecond, 1).Algorithm; got != store.SlidingWindow {
			t.Errorf("default %s: override of a named rule has %s, want the rule's", def, got)
		}
		// burst still needs token_bucket named, whatever the default.
		_, err = Parse(map[string][]byte{"b.yaml": []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 2}\n")},
			ParseOptions{DefaultAlgorithm: def})
		if err == nil || !strings.Contains(err.Error(), "burst: only valid with algorithm: token_bucket") {
			t.Errorf("default %s: burst without algorithm: %v", def, err)
		}
	}
}
