package simulate

import (
	"github.com/rls-project/rls/pkg/store"
)

// RedisCost returns what candidate c costs Redis per decision when the
// Redis store decides trace tr as allowed says, one request of one
// descriptor at a time, with the service's leases and over-limit cache
// left out (they only save calls: a key seen several times a window, or
// held at its limit, costs less): calls is script calls (FCALL or EVALSHA)
// per decision; commands is the Redis commands per decision, the script's
// own included.
//
// A token bucket or a sliding window of precision 2 or more is one script
// call per decision, which runs TIME and GET always and a SET (with its
// TTL) when the request was admitted. A fixed window or a two-counter
// sliding window is plain commands (pkg/store/redisstore's plain.go): INCRBY and
// PEXPIRE of the window's key, and for a sliding window a GET of the
// previous window's once per key and window (the count is then kept); a
// denied request adds their take-back (INCRBY and PEXPIRE) and a script
// call (TIME and a GET of the window's key) in the same round trip.
func RedisCost(tr Trace, l Limit, c Candidate, allowed []bool) (calls, commands float64) {
	n := min(len(tr.Events), len(allowed))
	if n == 0 {
		return 0, 0
	}
	admitted := 0
	for _, ok := range allowed[:n] {
		if ok {
			admitted++
		}
	}
	a, d := float64(admitted)/float64(n), float64(n-admitted)/float64(n)
	switch {
	case c.Algorithm == store.FixedWindow:
		return d, 2 + d*(2+2)
	case c.Algorithm == store.SlidingWindow && c.Precision < 2:
		type keyWindow struct {
			key    string
			window int64
		}
		seen := map[keyWindow]bool{}
		for _, e := range tr.Events[:n] {
			seen[keyWindow{e.Key, e.At / l.Window.Microseconds()}] = true
		}
		return d, 2 + float64(len(seen))/float64(n) + d*(2+2)
	}
	return 1, 2 + a
}

// RedisBytes returns what one counter of candidate c holds in Redis:
// bytes is MEMORY USAGE (SAMPLES 0) of its keys, from the table below (a
// two-counter sliding window counts in two: the current and the previous
// window's); value is the length of a stored string (0 for a window's
// count, an integer Redis keeps in the key's object itself).
func RedisBytes(c Candidate) (bytes, value int) {
	switch {
	case c.Algorithm == store.TokenBucket:
		return redisBytesTokenBucket, 17 // 't', tokens, last
	case c.Algorithm == store.FixedWindow:
		return redisBytesWindow, 0
	case c.Precision >= 2 && c.Precision <= store.MaxPrecision:
		return redisBytesPrecise[c.Precision-2], 1 + 8*int(c.Precision+3) // 'p', N, sub, cur, N counts
	}
	return 2 * redisBytesWindow, 0
}

// Redis memory per key: MEMORY USAGE <key> SAMPLES 0 after one admitted
// request, for the key redisExampleKey (redis_test.go) names (a window's key: it and
// ":<the window's start>"). Measured on Redis 7.0.15
// (jemalloc 5.3.0, 64-bit, Debian's redis-server) by
//
//	go test ./pkg/simulate -run TestRedisBytes -v
//
// which measures them again and fails when one is more than 8 bytes off
// (it prints the table to paste here). MEMORY USAGE counts the key's
// entry, its name and its value; Redis spends about 40 bytes more per key
// that it leaves out (the main and the expires tables' slots and the
// expires entry): the test also logs the growth of used_memory per key
// over 10,000 keys of each layout.
const (
	redisBytesWindow      = 88  // one window's count: an integer
	redisBytesTokenBucket = 104 // 't' + 2 doubles: 17 bytes
)

// redisBytesPrecise[N-2] is a precision-N key's MEMORY USAGE ('p' + N+3
// doubles: 1+8*(N+3) bytes of value), N from 2 to 60.
var redisBytesPrecise = [store.MaxPrecision - 1]int{
	120, 136, 136, 152, 152, 168, 168, 184, 184, // 2..10
	200, 200, 232, 232, 232, 232, 264, 264, 264, 264, // 11..20
	296, 296, 296, 296, 328, 328, 328, 328, 392, 392, // 21..30
	392, 392, 392, 392, 392, 392, 456, 456, 456, 456, // 31..40
	456, 456, 456, 456, 520, 520, 520, 520, 520, 520, // 41..50
	520, 520, 584, 584, 584, 584, 584, 584, 584, 584, // 51..60
}
