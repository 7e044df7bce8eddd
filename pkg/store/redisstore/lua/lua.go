// Package lua embeds the Redis scripts, the single source of truth for the
// Redis store's arithmetic (see pkg/store for the contract they implement).
package lua

import (
	_ "embed"
	"encoding/binary"
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

// Decide is decide.lua as a script: call it by its Hash (EVALSHA, then EVAL
// on NOSCRIPT).
var Decide = redis.NewScript(DecideSource)

// decide.lua's wire: it names each value in a `local` line that
// TestDecideConstants holds to these.
const (
	// HeaderArgs is the number of ARGV values before the checks: the test
	// clock ("" = redis TIME) and the mode (HEADER).
	HeaderArgs = 2
	// CheckBytes is the size of one check in ARGV: algorithm, flags and
	// precision bytes, then limit, window seconds, burst, hits, want,
	// horizon (µs), the window's start (seconds) and the previous window's
	// count (-1: read its key) as little-endian doubles (CHECK_BYTES).
	CheckBytes = 67
	// ResultBytes is the size of one check's result in the reply: allowed
	// byte, then remaining, retry_after_us, reset_us and the lease's hits,
	// now, from_us and every_us as little-endian doubles (RESULT_BYTES).
	ResultBytes = 57

	// ModeDecide is the mode that decides and writes.
	ModeDecide = "0"
	// ModePeek is the mode that treats every check as check-only (Hits 0,
	// no refund, no force) and writes nothing (MODE_PEEK).
	ModePeek = "1"
	// MarginUS is how long a window key outlives the windows that read it,
	// in microseconds (MARGIN_US).
	MarginUS = 1_000_000
)

// A check's algorithm codes and flag bits (ALG_* and FLAG_*), set only by
// AppendCheck.
const (
	algSliding     = 0 // the script treats unknown codes as algSliding
	algTokenBucket = 1
	algFixed       = 2

	flagRefund = 1  // store.Check.Refund
	flagShadow = 2  // store.Check.Shadow
	flagForce  = 4  // store.Check.Force
	flagPaced  = 8  // store.Check.Paced
	flagStrict = 16 // store.Check.Strict (read for a precision window only)
)

// Windowed reports whether c counts in one key per window (WindowKey): a
// fixed window, or a sliding window of precision 0 or 1.
func Windowed(c *store.Check) bool {
	return c.Algorithm == store.FixedWindow || (c.Algorithm != store.TokenBucket && c.Precision < 2)
}

// WindowKey appends to dst the name of key's counter for the window that
// starts at start (Unix seconds): key ":" start.
func WindowKey(dst []byte, key string, start int64) []byte {
	dst = append(dst, key...)
	dst = append(dst, ':')
	return strconv.AppendInt(dst, start, 10)
}

// Keys appends c's KEYS for a window starting at start (Unix seconds): its
// window key and, for a sliding window whose previous count is not given,
// the previous one; or c.Key for a check that is not Windowed.
func Keys(keys []string, c *store.Check, start int64, prevGiven bool) []string {
	if !Windowed(c) {
		return append(keys, c.Key)
	}
	keys = append(keys, string(WindowKey(nil, c.Key, start)))
	if c.Algorithm != store.FixedWindow && !prevGiven {
		keys = append(keys, string(WindowKey(nil, c.Key, start-int64(c.Window/time.Second))))
	}
	return keys
}

// WrongWindow reports whether reply is decide.lua's answer to a call that
// named another window than now's, and returns now (Unix microseconds).
func WrongWindow(reply string) (now int64, ok bool) {
	if len(reply) != 9 || reply[0] != 'W' {
		return 0, false
	}
	return int64(double(reply[1:])), true
}

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

// AppendCheck appends c, as decide.lua reads one check, to b: its
// algorithm's code (an unknown algorithm acts as the default, sliding
// window, as in the memory store), its flags, its precision (a sliding
// window's sub-windows, else 0), then limit, window seconds, burst (a token
// bucket's capacity, else 0), hits, want, horizon (µs), the start of the
// window its keys name (seconds; see Keys) and the previous window's count
// as little-endian doubles. prev is a two-counter sliding window's previous
// count when the caller knows it (that window has ended, so it only falls),
// else -1: the script reads its key. Numbers above 2^53 round to the
// nearest double.
func AppendCheck(b []byte, c *store.Check, start, prev int64) []byte {
	var precision uint8
	var burst float64
	switch c.Algorithm {
	case store.TokenBucket:
		burst = float64(c.Burst)
	case store.FixedWindow:
	default:
		precision = c.Precision
	}
	b = append(b, algorithmCode(c.Algorithm), flags(c), precision)
	for _, v := range [...]float64{float64(c.Limit), float64(c.Window / time.Second), burst, float64(c.Hits),
		float64(c.Want), float64(c.Horizon / time.Microsecond), float64(start), float64(prev)} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
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
	for _, b := range [...]struct {
		on  bool
		bit byte
	}{{c.Refund, flagRefund}, {c.Shadow, flagShadow}, {c.Force, flagForce}, {c.Paced, flagPaced}, {c.Strict, flagStrict}} {
		if b.on {
			f |= b.bit
		}
	}
	return f
}

// Result is one check's result as decide.lua replies it.
type Result struct {
	Allowed                     bool
	Remaining, RetryUS, ResetUS float64
	LeaseHits, LeaseNow         float64
	LeaseFromUS, LeaseEveryUS   float64
}

// ResultAt decodes the result of check i from a reply long enough to hold
// it.
func ResultAt(reply string, i int) Result {
	r := reply[i*ResultBytes : (i+1)*ResultBytes]
	return Result{Allowed: r[0] == 1, Remaining: double(r[1:]), RetryUS: double(r[9:]), ResetUS: double(r[17:]),
		LeaseHits: double(r[25:]), LeaseNow: double(r[33:]), LeaseFromUS: double(r[41:]), LeaseEveryUS: double(r[49:])}
}

// double decodes the little-endian IEEE-754 double at the start of s.
func double(s string) float64 {
	_ = s[7]
	return math.Float64frombits(uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56)
}
