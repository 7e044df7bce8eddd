package simulate

import (
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
)

// RedisCost returns what candidate c costs Redis per decision when the
// Redis store decides trace tr as allowed says, one request of one
// descriptor at a time, as rls sends it when the node is idle (under load,
// concurrent decisions of one node share a pipeline and its TIME: fewer):
// calls is script calls (FCALL or EVALSHA) per decision; commands is the
// Redis commands per decision.
//
// A token bucket or a sliding window of precision 2 or more is one script
// call per decision, which runs TIME and MGET always and a SET (with its
// TTL) when the request was admitted. A fixed window or a two-counter
// sliding window is first sent as a counter call, INCRBY and TIME (see
// pkg/store/redis's counter calls); it goes on to the script (TIME, MGET
// and a SET, as it writes the key back after taking the INCRBY back) when
// it was denied, or when no script call has written the key in the
// event's window yet (the key's value is of another window, or new).
// In the service, near a key's limit, the limiter's over-limit cache
// answers many denials without a call (the last hit's NextHit), and a
// one-check request is probed first (GET and TIME, no script call when
// denied): the model leaves these out, and so counts such a key's
// denials at their dearest.
func RedisCost(tr Trace, l Limit, c Candidate, allowed []bool) (calls, commands float64) {
	n := min(len(tr.Events), len(allowed))
	if n == 0 {
		return 0, 0
	}
	countable := c.Algorithm == store.FixedWindow || (c.Algorithm == store.SlidingWindow && c.Precision < 2)
	if !countable {
		admitted := 0
		for _, ok := range allowed[:n] {
			if ok {
				admitted++
			}
		}
		return 1, 2 + float64(admitted)/float64(n)
	}
	w := int64(l.Window / time.Microsecond)
	written := map[string]int64{} // key: the window its last script call wrote it in
	scripts := 0
	for i, e := range tr.Events[:n] {
		win := floorDiv(e.At, w)
		if last, ok := written[e.Key]; allowed[i] && ok && last == win {
			continue
		}
		scripts++
		written[e.Key] = win
	}
	return float64(scripts) / float64(n), 2 + 3*float64(scripts)/float64(n)
}

// RedisBytes returns what one key of candidate c holds in Redis: bytes
// is MEMORY USAGE of the key (SAMPLES 0), from the table below; value is
// the length of the stored string (0 for the compact forms, an integer
// Redis keeps in the key's object itself).
func RedisBytes(c Candidate) (bytes, value int) {
	switch {
	case c.Algorithm == store.TokenBucket:
		return redisBytesTokenBucket, 17 // 't', tokens, last
	case c.Algorithm == store.FixedWindow:
		return redisBytesFixed, 0
	case c.Precision >= 2 && c.Precision <= store.MaxPrecision:
		return redisBytesPrecise[c.Precision-2], 1 + 8*int(c.Precision+3) // 'p', N, sub, cur, N counts
	}
	return redisBytesSliding, 0
}

// RedisExampleKey is the key whose MEMORY USAGE the table holds for c:
// descriptors.AppendKey for domain "sim", descriptor (key=value) and a
// rule of 1 second, e.g. "rl:{sim|key=value}:s1p10" (20 to 24 bytes). A
// longer key costs about one byte more per byte, in steps of the
// allocator's size classes.
func RedisExampleKey(c Candidate) string {
	r := &descriptors.Rule{Unit: descriptors.UnitSecond, RequestsPerUnit: 50, Algorithm: c.Algorithm, Precision: uint32(c.Precision), Burst: uint32(c.Burst)}
	return string(descriptors.AppendKey(nil, "sim", []*rlcommon.RateLimitDescriptor_Entry{{Key: "key", Value: "value"}}, r))
}

// Redis memory per key: MEMORY USAGE <key> SAMPLES 0 after one admitted
// request, with rls's own Lua script on Redis's TIME (so the compact
// forms), for the key RedisExampleKey names. Measured on Redis 7.0.15
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
	redisBytesSliding     = 72  // two counters, compact: an integer
	redisBytesFixed       = 72  // fixed window, compact: an integer
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
