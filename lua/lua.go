// Package lua embeds the Redis scripts, the single source of truth for the
// Redis store's arithmetic (see pkg/store for the contract they implement).
package lua

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/store"
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

// Decide's ARGV header, per-check layout and modes: the one list shared by
// Go and decide.lua, which names each value in a `local` line that
// lua_test.go checks against these (as it does the codes below and
// store.MaxPrecision, decide.lua's MAX_PRECISION).
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
)

// The algorithm codes and flag bits of a check (ALG_* and FLAG_* in
// decide.lua). AppendCheck is the one place a store.Check becomes them.
const (
	algSliding     = 0 // the script treats unknown codes as algSliding
	algTokenBucket = 1
	algFixed       = 2

	flagRefund = 1   // store.Check.Refund
	flagShadow = 2   // store.Check.Shadow
	flagForce  = 4   // store.Check.Force
	flagUndo   = 8   // take back a counter call's hits (AppendUndo)
	flagPaced  = 128 // store.Check.Paced
)

// FleetSource is the text of fleet.lua.
//
//go:embed fleet.lua
var FleetSource string

// Fleet refreshes one replica's heartbeat in the fleet's sorted set and
// returns the number of live replicas (see fleet.lua).
var Fleet = redis.NewScript(FleetSource)

// DemandSource is the text of demand.lua.
//
//go:embed demand.lua
var DemandSource string

// Demand shares one replica's RLQS demand for a counter with the fleet and
// returns the fleet's (see demand.lua).
var Demand = redis.NewScript(DemandSource)

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
	Algorithm store.Algorithm
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
		return compactState(x), nil
	}
	if st, ok := taggedState(v); ok {
		return st, nil
	}
	return State{}, fmt.Errorf("not a decide.lua state: %q", v)
}

// compactState decodes the compact form x: the window index modulo 4,
// then a fixed-window flag, then the counts.
func compactState(x uint64) State {
	st := State{Compact: true, Window: float64(x % 4)}
	if x%8 >= 4 {
		st.Algorithm, st.Count = store.FixedWindow, float64(x/8)
	} else {
		st.Algorithm, st.Count, st.Prev = store.SlidingWindow, float64(x/8/CompactCounts), float64(x/8%CompactCounts)
	}
	return st
}

// taggedState decodes the tagged form v: a tag byte and doubles; ok is
// false when v is none of the tagged layouts.
func taggedState(v string) (st State, ok bool) {
	f := func(i int) float64 { return double(v[1+8*i:]) }
	switch {
	case len(v) == 25 && v[0] == TagSliding:
		return State{Algorithm: store.SlidingWindow, Window: f(0), Count: f(1), Prev: f(2)}, true
	case len(v) == 17 && v[0] == TagTokenBucket:
		return State{Algorithm: store.TokenBucket, Tokens: f(0), LastRefill: f(1)}, true
	case len(v) == 17 && v[0] == TagFixed:
		return State{Algorithm: store.FixedWindow, Window: f(0), Count: f(1)}, true
	case len(v) >= 25 && (len(v)-25)%8 == 0 && v[0] == TagPrecise && f(0) == float64((len(v)-25)/8):
		st := State{Algorithm: store.SlidingWindow, Window: f(1), Count: f(2)}
		for i := range (len(v) - 25) / 8 {
			st.Old = append(st.Old, f(3+i))
		}
		return st, true
	}
	return State{}, false
}

// Encode returns s as decide.lua stores it.
func (s State) Encode() string {
	var tag byte
	var fs []float64
	switch s.Algorithm {
	case store.TokenBucket:
		tag, fs = TagTokenBucket, []float64{s.Tokens, s.LastRefill}
	case store.FixedWindow:
		tag, fs = TagFixed, []float64{s.Window, s.Count}
	case store.SlidingWindow:
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

// AppendCheck appends c, as decide.lua reads one check from a request's
// ARGV value, to b: its algorithm's code (an unknown algorithm acts as the
// default, sliding window, as in the memory store), its flags, then limit,
// window seconds, burst field and hits as little-endian doubles. The burst
// field is a token bucket's capacity or a sliding window's precision (0 or
// 1: the two-counter window). Numbers above 2^53 round to the nearest
// double, as they did when the script read them as decimal strings.
func AppendCheck(b []byte, c *store.Check) []byte {
	b = append(b, algorithmCode(c.Algorithm), flags(c))
	for _, v := range [...]float64{float64(c.Limit), float64(c.Window / time.Second), burstField(c), float64(c.Hits)} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return b
}

// CounterStep returns what one hit adds to the compact value of a check
// of algorithm a: the count field of a fixed window's compact form
// (count * 8 + 4 + window mod 4), or of a sliding window's ((count * 2^24
// + previous) * 8 + window mod 4). A counter call (see decide.lua's
// header) sends INCRBY of the key by Hits times it.
func CounterStep(a store.Algorithm) int64 {
	if a == store.FixedWindow {
		return 8
	}
	return 8 * CompactCounts
}

// Counter is a counter call's reply decoded: the value's form (mod 8) and,
// when it is the compact form of a's algorithm, the state it holds.
type Counter struct {
	Form       byte   // the value mod 8: 0-3 sliding window, 4-7 fixed window; the window index mod 4 is Form % 4
	OK         bool   // the value is the compact form of the check's algorithm
	Count      uint64 // the current window's count, the INCRBY's hits included
	Prev       uint64 // sliding window: the previous window's count
	WindowMod4 int64
}

// DecodeCounter decodes v, the reply of INCRBY by CounterStep(a) * hits.
func DecodeCounter(a store.Algorithm, v int64) Counter {
	if v < 0 {
		return Counter{}
	}
	c := Counter{Form: byte(v % 8), WindowMod4: v % 4}
	x := uint64(v) / 8
	if a == store.FixedWindow {
		c.OK, c.Count = c.Form >= 4, x
		return c
	}
	c.OK, c.Count, c.Prev = c.Form < 4, x/CompactCounts, x%CompactCounts
	return c
}

// AppendUndo appends c as AppendCheck does, marked for decide.lua to take
// back the Hits that a counter call added to the key's value before it
// decides c; reply is that call's reply (see decide.lua's header).
func AppendUndo(b []byte, c *store.Check, reply int64) []byte {
	n := len(b)
	b = AppendCheck(b, c)
	b[n+1] |= flagUndo | byte(reply%8)<<4
	return b
}

// algorithmCode is a's code in the script.
func algorithmCode(a store.Algorithm) byte {
	switch a {
	case store.TokenBucket:
		return algTokenBucket
	case store.FixedWindow:
		return algFixed
	}
	return algSliding
}

// flags is c's flags byte in the script.
func flags(c *store.Check) byte {
	var f byte
	if c.Refund {
		f |= flagRefund
	}
	if c.Shadow {
		f |= flagShadow
	}
	if c.Force {
		f |= flagForce
	}
	if c.Paced {
		f |= flagPaced
	}
	return f
}

// burstField is c's burst field in the script: a token bucket's capacity,
// a sliding window's precision (0 or 1: two counters; negated when strict),
// 0 for a fixed window.
func burstField(c *store.Check) float64 {
	switch c.Algorithm {
	case store.TokenBucket:
		return float64(c.Burst)
	case store.FixedWindow:
		return 0
	}
	switch { // sliding window, and unknown algorithms acting as it
	case c.Precision >= 2 && c.Strict:
		return -float64(c.Precision) // the oldest sub-window counts whole
	case c.Precision >= 2:
		return float64(c.Precision)
	}
	return 0
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
