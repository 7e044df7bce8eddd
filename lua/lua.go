// Package lua embeds the Redis scripts, the single source of truth for the
// Redis store's arithmetic (see pkg/store for the contract they implement).
package lua

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// DecideSource is the text of decide.lua. Its header documents KEYS, ARGV
// and the reply.
//
//go:embed decide.lua
var DecideSource string

// Decide decides one hash slot's requests, each atomically and in order:
// a request's refunds and forced write-backs first, then its other checks
// in order against the tentative state, all of its consumption or none;
// then every changed key is written once. Call it by its Hash (EVALSHA,
// then EVAL on NOSCRIPT). A *redis.Script is safe for concurrent use.
var Decide = redis.NewScript(DecideSource)

// Decide's ARGV header, per-check layout, codes and flag bits: the one list
// shared by Go and decide.lua, which names each value in a `local` line
// that lua_test.go checks against these.
const (
	// HeaderArgs is the number of ARGV values before the first request: the
	// test clock ("" = redis TIME) and the mode (HEADER in decide.lua).
	HeaderArgs = 2
	// CheckBytes is the size of one check in a request's ARGV value:
	// algorithm and flags bytes, then limit, window seconds, burst and hits
	// as little-endian doubles (CHECK_BYTES).
	CheckBytes = 34
	// ResultBytes is the size of one check's result in the reply: allowed
	// byte, then remaining, retry_after_us and reset_us as little-endian
	// doubles (RESULT_BYTES).
	ResultBytes = 25

	// ModeDecide is the mode that decides and writes (MODE_DECIDE).
	ModeDecide = "0"
	// ModePeek is the mode that treats every check as check-only (Hits 0,
	// no refund, no force) and writes nothing (MODE_PEEK).
	ModePeek = "1"

	// AlgSliding is the algorithm value of a sliding-window check
	// (ALG_SLIDING); the script treats unknown values as AlgSliding.
	AlgSliding = 0
	// AlgTokenBucket is the algorithm value of a token bucket check
	// (ALG_TOKEN_BUCKET).
	AlgTokenBucket = 1
	// AlgFixed is the algorithm value of a fixed-window check (ALG_FIXED).
	AlgFixed = 2

	// FlagRefund is the flags bit of store.Check.Refund (FLAG_REFUND).
	FlagRefund = 1
	// FlagShadow is the flags bit of store.Check.Shadow (FLAG_SHADOW).
	FlagShadow = 2
	// FlagForce is the flags bit of store.Check.Force (FLAG_FORCE).
	FlagForce = 4

	// MaxPrecision is the most sub-windows of a sliding window, carried in
	// a sliding-window check's burst field (MAX_PRECISION; store.MaxPrecision).
	MaxPrecision = 60
)

// FleetSource is the text of fleet.lua.
//
//go:embed fleet.lua
var FleetSource string

// Fleet refreshes one replica's heartbeat in the fleet's sorted set and
// returns the number of live replicas (see fleet.lua).
var Fleet = redis.NewScript(FleetSource)

// The tag bytes of decide.lua's stored state (TAG_* in decide.lua).
const (
	TagSliding     = 's'
	TagTokenBucket = 't'
	TagFixed       = 'f'
	TagPrecise     = 'p'
)

// State is one key's counter state as decide.lua stores it: a tag byte and
// little-endian IEEE-754 doubles (see decide.lua's header). Tests and
// tools read and write it with ParseState and Encode.
type State struct {
	Algorithm int // AlgSliding, AlgTokenBucket or AlgFixed
	// Sliding window: Window (the window's index, now / window), Count and
	// Prev (the previous window's count). Fixed window: Window and Count.
	Window, Count, Prev float64
	// Token bucket: Tokens, and LastRefill in Unix microseconds.
	Tokens, LastRefill float64
	// Sliding window of precision len(Old) >= 2: Window is the sub-window
	// index, Count its count, Old the counts of the sub-windows before it,
	// newest first.
	Old []float64
	// Compact: the value was in the compact form, whose Window is the
	// window's index modulo 4 (Encode writes the tagged form).
	Compact bool
}

// Compact state (see decide.lua's header): a decimal integer.
const (
	// CompactCounts bounds each count of a compact sliding-window state
	// (COMPACT_COUNTS).
	CompactCounts = 1 << 24
	// CompactFixed bounds the count of a compact fixed-window state
	// (COMPACT_FIXED).
	CompactFixed = 1 << 48
)

// ParseState decodes a value decide.lua stored. For the compact form,
// which keeps the window index modulo 4 only, Window is that remainder
// and Compact is set.
func ParseState(v string) (State, error) {
	if x, err := strconv.ParseUint(v, 10, 64); err == nil && len(v) > 0 && v[0] != '+' {
		st := State{Compact: true, Window: float64(x % 4)}
		if x%8 >= 4 {
			st.Algorithm, st.Count = AlgFixed, float64(x/8)
		} else {
			st.Algorithm, st.Count, st.Prev = AlgSliding, float64(x/8/CompactCounts), float64(x/8%CompactCounts)
		}
		return st, nil
	}
	f := func(i int) float64 { return double(v[1+8*i:]) }
	switch {
	case len(v) == 25 && v[0] == TagSliding:
		return State{Algorithm: AlgSliding, Window: f(0), Count: f(1), Prev: f(2)}, nil
	case len(v) == 17 && v[0] == TagTokenBucket:
		return State{Algorithm: AlgTokenBucket, Tokens: f(0), LastRefill: f(1)}, nil
	case len(v) == 17 && v[0] == TagFixed:
		return State{Algorithm: AlgFixed, Window: f(0), Count: f(1)}, nil
	case len(v) >= 25 && (len(v)-25)%8 == 0 && v[0] == TagPrecise && f(0) == float64((len(v)-25)/8):
		st := State{Algorithm: AlgSliding, Window: f(1), Count: f(2)}
		for i := range (len(v) - 25) / 8 {
			st.Old = append(st.Old, f(3+i))
		}
		return st, nil
	}
	return State{}, fmt.Errorf("not a decide.lua state: %q", v)
}

// Encode returns s as decide.lua stores it.
func (s State) Encode() string {
	var tag byte
	var fs []float64
	switch s.Algorithm {
	case AlgTokenBucket:
		tag, fs = TagTokenBucket, []float64{s.Tokens, s.LastRefill}
	case AlgFixed:
		tag, fs = TagFixed, []float64{s.Window, s.Count}
	case AlgSliding:
		if len(s.Old) >= 2 {
			tag, fs = TagPrecise, append([]float64{float64(len(s.Old)), s.Window, s.Count}, s.Old...)
			break
		}
		fallthrough
	default:
		tag, fs = TagSliding, []float64{s.Window, s.Count, s.Prev}
	}
	b := []byte{tag}
	for _, x := range fs {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	return string(b)
}

// AppendCheck appends one check, as decide.lua reads it from a request's
// ARGV value, to b. Numbers above 2^53 round to the nearest double, as
// they did when the script read them as decimal strings.
func AppendCheck(b []byte, alg, flags byte, limit, windowSeconds, burst, hits uint64) []byte {
	b = append(b, alg, flags)
	for _, v := range [...]uint64{limit, windowSeconds, burst, hits} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(v)))
	}
	return b
}

// Result is one check's result as decide.lua replies it.
type Result struct {
	Allowed                     bool
	Remaining, RetryUS, ResetUS float64
}

// ResultAt decodes the result of check i from a reply long enough to hold
// it.
func ResultAt(reply string, i int) Result {
	r := reply[i*ResultBytes : (i+1)*ResultBytes]
	return Result{Allowed: r[0] == 1, Remaining: double(r[1:]), RetryUS: double(r[9:]), ResetUS: double(r[17:])}
}

// double decodes the little-endian IEEE-754 double at the start of s.
func double(s string) float64 {
	_ = s[7]
	u := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
	return math.Float64frombits(u)
}
