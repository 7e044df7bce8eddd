package lua

import (
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
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
		"MODE_PEEK":        ModePeek,
		"MARGIN_US":        strconv.Itoa(MarginUS),
		"ALG_SLIDING":      strconv.Itoa(algSliding),
		"ALG_TOKEN_BUCKET": strconv.Itoa(algTokenBucket),
		"ALG_FIXED":        strconv.Itoa(algFixed),
		"FLAG_REFUND":      strconv.Itoa(flagRefund),
		"FLAG_SHADOW":      strconv.Itoa(flagShadow),
		"FLAG_FORCE":       strconv.Itoa(flagForce),
		"FLAG_PACED":       strconv.Itoa(flagPaced),
		"FLAG_STRICT":      strconv.Itoa(flagStrict),
		"MAX_PRECISION":    strconv.Itoa(store.MaxPrecision),
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
		fmt.Sprintf(`ARGV[2] "%s" decide; "%s" peek`, ModeDecide, ModePeek),
		fmt.Sprintf("ARGV[%d] the checks, CHECK_BYTES each: algorithm (byte: %d sliding window, %d token bucket, %d fixed window", HeaderArgs+1, algSliding, algTokenBucket, algFixed),
		fmt.Sprintf("flags (byte: %d refund, %d shadow, %d force, %d paced, %d strict)", flagRefund, flagShadow, flagForce, flagPaced, flagStrict),
		"precision (byte: a sliding window's sub-windows, 0 or 1 for the two-counter window), then doubles: limit, window seconds, burst (token bucket: capacity, 0 = limit), hits, want, horizon in microseconds, the window's start in seconds",
		"the previous window's count (two-counter sliding window; -1: read its key;",
		"Reply: RESULT_BYTES per check: allowed (byte), then doubles: remaining, retry_us, reset_us, lease hits, lease now, lease from_us, lease every_us",
		"its window's and, unless the check gives its count, the previous window's (lua.WindowKey: its key, ':', the window's start in seconds",
	} {
		if !strings.Contains(strings.Join(strings.Fields(strings.ReplaceAll(header, "--", "")), " "), want) {
			t.Errorf("decide.lua's header does not say %q", want)
		}
	}
	if got := string(WindowKey(nil, "rl:{a}:s1", 1751540400)); got != "rl:{a}:s1:1751540400" {
		t.Errorf("WindowKey = %q", got)
	}
	sw := store.Check{Key: "k", Window: 2 * time.Second}
	fw := store.Check{Key: "f", Algorithm: store.FixedWindow, Window: time.Second}
	tb := store.Check{Key: "t", Algorithm: store.TokenBucket, Window: time.Second}
	pw := store.Check{Key: "p", Window: time.Second, Precision: 4}
	if got := Keys(nil, &sw, 10, false); !reflect.DeepEqual(got, []string{"k:10", "k:8"}) {
		t.Errorf("sliding window keys %v", got)
	}
	if got := Keys(nil, &sw, 10, true); !reflect.DeepEqual(got, []string{"k:10"}) {
		t.Errorf("sliding window keys, its previous count given: %v", got)
	}
	if got := Keys(Keys(Keys(nil, &fw, 10, true), &tb, 10, true), &pw, 10, true); !reflect.DeepEqual(got, []string{"f:10", "t", "p"}) {
		t.Errorf("fixed, bucket, precision keys %v", got)
	}
	if now, ok := WrongWindow("W" + string(binary.LittleEndian.AppendUint64(nil, math.Float64bits(123)))); !ok || now != 123 {
		t.Errorf("WrongWindow = %d, %v", now, ok)
	}

	// The code uses the names, not the numbers.
	if m := regexp.MustCompile(`alg [~=]= [0-9]|flags / [0-9]|flags % [0-9]`).FindString(DecideSource); m != "" {
		t.Errorf("decide.lua compares with a bare number (%q) instead of a named constant", m)
	}
}

// TestAppendCheck checks the one mapping of a store.Check to the script's
// check bytes: the algorithm code, the flag bits, the precision and the
// burst.
func TestAppendCheck(t *testing.T) {
	for _, tc := range []struct {
		name        string
		check       store.Check
		alg, flags  byte
		precision   byte
		burst       float64
		limit, hits float64
	}{
		{"lease", store.Check{Algorithm: store.SlidingWindow, Limit: 10, Window: time.Minute, Hits: 2, Want: 5, Horizon: 30 * time.Millisecond}, algSliding, 0, 0, 0, 10, 2},
		{"sliding", store.Check{Algorithm: store.SlidingWindow, Limit: 10, Window: time.Minute, Burst: 7, Hits: 2}, algSliding, 0, 0, 0, 10, 2},
		{"sliding precision 1", store.Check{Algorithm: store.SlidingWindow, Limit: 10, Window: time.Minute, Precision: 1}, algSliding, 0, 1, 0, 10, 0},
		{"sliding precision 12", store.Check{Algorithm: store.SlidingWindow, Limit: 10, Window: time.Minute, Precision: 12}, algSliding, 0, 12, 0, 10, 0},
		{"sliding precision 12 strict", store.Check{Algorithm: store.SlidingWindow, Limit: 10, Window: time.Minute, Precision: 12, Strict: true}, algSliding, flagStrict, 12, 0, 10, 0},
		{"token bucket", store.Check{Algorithm: store.TokenBucket, Limit: 5, Window: time.Minute, Burst: 9, Hits: 1, Precision: 12}, algTokenBucket, 0, 0, 9, 5, 1},
		{"fixed", store.Check{Algorithm: store.FixedWindow, Limit: 3, Window: time.Minute, Burst: 9, Precision: 12}, algFixed, 0, 0, 0, 3, 0},
		{"unknown acts as sliding", store.Check{Algorithm: 9, Limit: 3, Window: time.Minute, Precision: 4}, algSliding, 0, 4, 0, 3, 0},
		{"refund", store.Check{Window: time.Minute, Refund: true}, algSliding, flagRefund, 0, 0, 0, 0},
		{"shadow force", store.Check{Window: time.Minute, Shadow: true, Force: true}, algSliding, flagShadow | flagForce, 0, 0, 0, 0},
		{"all flags", store.Check{Window: time.Minute, Refund: true, Shadow: true, Force: true, Paced: true, Strict: true}, algSliding, flagRefund | flagShadow | flagForce | flagPaced | flagStrict, 0, 0, 0, 0},
		{"paced", store.Check{Window: time.Minute, Paced: true}, algSliding, flagPaced, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := AppendCheck([]byte("x"), &tc.check, 1751540400, 17)
			if len(b) != 1+CheckBytes || b[0] != 'x' {
				t.Fatalf("AppendCheck appended %d bytes after %q, want %d", len(b)-1, b[:1], CheckBytes)
			}
			b = b[1:]
			if b[0] != tc.alg || b[1] != tc.flags || b[2] != tc.precision {
				t.Errorf("algorithm, flags, precision = %d, %d, %d; want %d, %d, %d", b[0], b[1], b[2], tc.alg, tc.flags, tc.precision)
			}
			var got [8]float64
			for i := range got {
				got[i] = double(string(b[3+8*i:]))
			}
			want := [8]float64{tc.limit, 60, tc.burst, tc.hits, float64(tc.check.Want), float64(tc.check.Horizon / time.Microsecond), 1751540400, 17}
			if got != want {
				t.Errorf("limit, window, burst, hits, want, horizon, start, previous count = %v; want %v", got, want)
			}
		})
	}
}
