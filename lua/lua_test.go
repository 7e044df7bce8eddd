package lua

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

func TestDecideEmbedded(t *testing.T) {
	if !strings.Contains(DecideSource, "redis.call('TIME')") {
		t.Fatal("decide.lua is not embedded")
	}
	sum := sha1.Sum([]byte(DecideSource))
	if got := Decide.Hash(); got != hex.EncodeToString(sum[:]) {
		t.Errorf("Decide.Hash() = %s, want the SHA1 of decide.lua", got)
	}
}

// luaLocals returns the values of decide.lua's top-level constant lines,
// `local A, B = 1, 'x'`, by name (strings without their quotes).
func luaLocals(t *testing.T, src string) map[string]string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^local ([A-Z_]+(?:, [A-Z_]+)*) = (.+)$`)
	m := map[string]string{}
	for _, line := range re.FindAllStringSubmatch(src, -1) {
		if strings.HasPrefix(line[2], "{") {
			continue // a table (TestDecideFlagTables)
		}
		names, values := strings.Split(line[1], ", "), strings.Split(line[2], ", ")
		if len(names) != len(values) {
			t.Fatalf("decide.lua: %q names %d values for %d names", line[0], len(values), len(names))
		}
		for i, n := range names {
			m[n] = strings.Trim(values[i], "'")
		}
	}
	return m
}

// TestDecideConstants checks that decide.lua names the layout, modes,
// algorithm codes and flag bits with lua.go's values, in its code and in
// its header comment.
func TestDecideConstants(t *testing.T) {
	locals := luaLocals(t, DecideSource)
	for name, want := range map[string]string{
		"HEADER":           strconv.Itoa(HeaderArgs),
		"CHECK_BYTES":      strconv.Itoa(CheckBytes),
		"RESULT_BYTES":     strconv.Itoa(ResultBytes),
		"MODE_DECIDE":      ModeDecide,
		"MODE_PEEK":        ModePeek,
		"ALG_SLIDING":      strconv.Itoa(algSliding),
		"ALG_TOKEN_BUCKET": strconv.Itoa(algTokenBucket),
		"ALG_FIXED":        strconv.Itoa(algFixed),
		"FLAG_REFUND":      strconv.Itoa(flagRefund),
		"FLAG_SHADOW":      strconv.Itoa(flagShadow),
		"FLAG_FORCE":       strconv.Itoa(flagForce),
		"FLAG_UNDO":        strconv.Itoa(flagUndo),
		"FLAG_PACED":       strconv.Itoa(flagPaced),
		"TAG_SLIDING":      string(rune(TagSliding)),
		"TAG_TOKEN_BUCKET": string(rune(TagTokenBucket)),
		"TAG_FIXED":        string(rune(TagFixed)),
		"TAG_PRECISE":      string(rune(TagPrecise)),
		"MAX_PRECISION":    strconv.Itoa(store.MaxPrecision),
		"COMPACT_COUNTS":   strconv.Itoa(CompactCounts),
		"COMPACT_FIXED":    strconv.Itoa(CompactFixed),
	} {
		got, ok := locals[name]
		if !ok {
			t.Errorf("decide.lua has no `local %s = ...` line", name)
		} else if got != want {
			t.Errorf("decide.lua: %s = %s, lua.go says %s", name, got, want)
		}
	}

	header := DecideSource[:strings.Index(DecideSource, "\nif ")]
	for _, want := range []string{
		fmt.Sprintf(`ARGV[2] mode: "%s" decide; "%s" peek`, ModeDecide, ModePeek),
		fmt.Sprintf("ARGV[%d], ARGV[%d], ...: one request each", HeaderArgs+1, HeaderArgs+2),
		fmt.Sprintf("%d bytes per check: algorithm (byte: %d sliding window, %d token bucket, %d fixed window)", CheckBytes, algSliding, algTokenBucket, algFixed),
		fmt.Sprintf("flags (byte: the sum of %d = refund, %d = shadow, %d = force, %d = undo, and 16 times a counter call's reply mod 8", flagRefund, flagShadow, flagForce, flagUndo),
		fmt.Sprintf("and %d = paced: a two-counter sliding window's budget is then its current window's own", flagPaced),
		fmt.Sprintf("Reply: one string, %d bytes per check", ResultBytes),
	} {
		if !strings.Contains(strings.Join(strings.Fields(strings.ReplaceAll(header, "--", "")), " "), want) {
			t.Errorf("decide.lua's header does not say %q", want)
		}
	}

	// The code uses the names, not the numbers.
	if m := regexp.MustCompile(`alg [~=]= [0-9]|flags / [0-9]|flags % [0-9]`).FindString(DecideSource); m != "" {
		t.Errorf("decide.lua compares with a bare number (%q) instead of a named constant", m)
	}
}

func TestStateRoundTrip(t *testing.T) {
	for _, s := range []State{
		{Algorithm: store.SlidingWindow, Window: 29408640, Count: 17, Prev: 3},
		{Algorithm: store.TokenBucket, Tokens: 1.5, LastRefill: 1751538000250123},
		{Algorithm: store.FixedWindow, Window: 1751538000, Count: 1 << 53},
		{Algorithm: store.SlidingWindow, Window: 105092280017, Count: 4, Old: []float64{1, 0, 7}},
	} {
		got, err := ParseState(s.Encode())
		if err != nil || !reflect.DeepEqual(got, s) {
			t.Errorf("ParseState(Encode(%+v)) = %+v, %v", s, got, err)
		}
	}
	for v, want := range map[string]State{
		"1210":             {Algorithm: store.SlidingWindow, Compact: true, Window: 2, Count: 0, Prev: 151},
		"1073741841":       {Algorithm: store.SlidingWindow, Compact: true, Window: 1, Count: 8, Prev: 2},
		"31":               {Algorithm: store.FixedWindow, Compact: true, Window: 3, Count: 3},
		"2251799813685247": {Algorithm: store.FixedWindow, Compact: true, Window: 3, Count: 1<<48 - 1},
	} {
		if got, err := ParseState(v); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ParseState(%q) = %+v, %v; want %+v", v, got, err, want)
		}
	}
	for _, v := range []string{"", "s", "x" + strings.Repeat("\x00", 24), "t" + strings.Repeat("\x00", 24)} {
		if _, err := ParseState(v); err == nil {
			t.Errorf("ParseState(%q) succeeded", v)
		}
	}
}

// TestDecideFlagTables checks decide.lua's literal flag tables against the
// flag bits.
func TestDecideFlagTables(t *testing.T) {
	for name, bit := range map[string]int{"IS_REFUND": flagRefund, "IS_SHADOW": flagShadow, "IS_FORCE": flagForce} {
		vals := make([]string, 8)
		for f := range 8 {
			vals[f] = strconv.FormatBool(f&bit != 0)
		}
		want := fmt.Sprintf("local %s = { [0] = %s }", name, strings.Join(vals, ", "))
		if !strings.Contains(DecideSource, want) {
			t.Errorf("decide.lua does not say %q", want)
		}
	}
}

// TestAppendCheck checks the one mapping of a store.Check to the script's
// check bytes: the algorithm code, the flag bits and the burst field.
func TestAppendCheck(t *testing.T) {
	for _, tc := range []struct {
		name        string
		check       store.Check
		alg, flags  byte
		burstField  float64
		limit, hits float64
	}{
		{"sliding", store.Check{Algorithm: store.SlidingWindow, Limit: 10, Window: time.Minute, Burst: 7, Hits: 2}, algSliding, 0, 0, 10, 2},
		{"sliding precision 1", store.Check{Algorithm: store.SlidingWindow, Limit: 10, Window: time.Minute, Precision: 1}, algSliding, 0, 0, 10, 0},
		{"sliding precision 12", store.Check{Algorithm: store.SlidingWindow, Limit: 10, Window: time.Minute, Precision: 12}, algSliding, 0, 12, 10, 0},
		{"token bucket", store.Check{Algorithm: store.TokenBucket, Limit: 5, Window: time.Minute, Burst: 9, Hits: 1, Precision: 12}, algTokenBucket, 0, 9, 5, 1},
		{"fixed", store.Check{Algorithm: store.FixedWindow, Limit: 3, Window: time.Minute, Burst: 9, Precision: 12}, algFixed, 0, 0, 3, 0},
		{"unknown acts as sliding", store.Check{Algorithm: 9, Limit: 3, Window: time.Minute, Precision: 4}, algSliding, 0, 4, 3, 0},
		{"refund", store.Check{Window: time.Minute, Refund: true}, algSliding, flagRefund, 0, 0, 0},
		{"shadow force", store.Check{Window: time.Minute, Shadow: true, Force: true}, algSliding, flagShadow | flagForce, 0, 0, 0},
		{"all flags", store.Check{Window: time.Minute, Refund: true, Shadow: true, Force: true}, algSliding, flagRefund | flagShadow | flagForce, 0, 0, 0},
		{"paced", store.Check{Window: time.Minute, Paced: true}, algSliding, flagPaced, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := AppendCheck([]byte("x"), &tc.check)
			if len(b) != 1+CheckBytes || b[0] != 'x' {
				t.Fatalf("AppendCheck appended %d bytes after %q, want %d", len(b)-1, b[:1], CheckBytes)
			}
			b = b[1:]
			if b[0] != tc.alg || b[1] != tc.flags {
				t.Errorf("algorithm, flags = %d, %d; want %d, %d", b[0], b[1], tc.alg, tc.flags)
			}
			got := [4]float64{double(string(b[2:])), double(string(b[10:])), double(string(b[18:])), double(string(b[26:]))}
			if want := [4]float64{tc.limit, 60, tc.burstField, tc.hits}; got != want {
				t.Errorf("limit, window, burst field, hits = %v; want %v", got, want)
			}
		})
	}
}
