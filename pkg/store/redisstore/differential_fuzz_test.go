//go:build redis

package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// diffReader hands out fuzz bytes; past the end it returns zeros.
type diffReader struct{ b []byte }

func (r *diffReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *diffReader) uint(n int) uint64 {
	var v uint64
	for i := 0; i < n; i++ {
		v = v<<8 | uint64(r.byte())
	}
	return v
}

// diffKey is one key of a differential run with its fixed configuration (a
// changed limit, window or burst is a different key in rls).
type diffKey struct {
	key                  string
	alg                  store.Algorithm
	limit, burst, window uint64
	precision            uint64 // sliding window sub-windows; 0 for two counters
	strict               bool   // precision >= 2: the oldest sub-window counts whole
}

// diffStep is one batch of a differential run, after advancing the clock.
type diffStep struct {
	advance string // what the clock did, for failure messages
	peek    bool
	checks  []store.Check
}

var (
	diffLimits  = []uint64{0, 1, 2, 3, 5, 10, 100, 7919, 1_000_000_000, 1<<32 - 1}
	diffWindows = []uint64{1, 1, 2, 3, 60, 3600, 86400, 604800, 2592000, 31536000}
	diffBursts  = []uint64{0, 0, 1, 4, 50, 1<<32 - 1}
	// By c/30 of a key's byte (0 to 7): the first four keep the
	// two-counter window the older seeds were made for.
	diffPrecisions = []uint64{0, 0, 0, 1, 2, 3, 10, 60}
)

// decodeDiff decodes the fuzz bytes into a start time (microseconds), keys
// named under one hash tag and at most 64 steps. Each step advances the
// clock (a jump, to just before or exactly at the next second, or not at
// all) and holds 1 to 4 checks over the keys: hits 0 to 3, the limit,
// limit+1, or up to 2^53; refund, shadow, force and paced flags; rarely a
// lease (Want, Horizon) or the Exact hint; sometimes a Peek instead of a
// Decide.
func decodeDiff(data []byte, tag string) (start int64, keys []diffKey, steps []diffStep, advances []func(int64) int64) {
	r := &diffReader{b: data}
	start = t0 + int64(r.uint(3))*1000
	nkeys := 1 + int(r.byte())%4
	for i := 0; i < nkeys; i++ {
		c := r.byte()
		k := diffKey{
			alg:    store.Algorithm(c % 3),
			limit:  diffLimits[int(c/3)%len(diffLimits)],
			window: diffWindows[int(r.byte())%len(diffWindows)],
		}
		if c >= 0xF0 { // an unknown algorithm acts as sliding window in both stores
			k.alg = store.Algorithm(3 + c%2)
		}
		if k.alg == store.TokenBucket {
			k.burst = diffBursts[int(r.byte())%len(diffBursts)]
		}
		if k.alg == store.SlidingWindow {
			k.precision = diffPrecisions[int(c/30)%len(diffPrecisions)]
			k.strict = k.precision >= 2 && (c/7)%2 == 1 // the oldest sub-window counts whole
		}
		prefix := "rl"
		if k.alg == store.TokenBucket {
			prefix = "tb"
		}
		k.key = fmt.Sprintf("%s:{%s}:k%d", prefix, tag, i)
		keys = append(keys, k)
	}
	for len(r.b) > 0 && len(steps) < 64 {
		a := r.byte()
		var st diffStep
		var adv func(int64) int64
		switch a % 4 {
		case 0: // a jump of up to ~4.6 hours, possibly past TTLs
			d := int64(r.uint(2)) * int64(a/4+1) * 4000
			st.advance = fmt.Sprintf("+%dus", d)
			adv = func(now int64) int64 { return now + d }
		case 1: // to just before or exactly at the next second
			back := int64(a >> 2 & 1)
			st.advance = fmt.Sprintf("next second -%dus", back)
			adv = func(now int64) int64 { return (now/1_000_000+1)*1_000_000 - back }
		case 2: // the same instant
			st.advance = "+0"
			adv = func(now int64) int64 { return now }
		default: // a small step
			d := int64(r.byte()) * int64(a/4+1) * 37
			st.advance = fmt.Sprintf("+%dus", d)
			adv = func(now int64) int64 { return now + d }
		}
		b := r.byte()
		st.peek = b&0x80 != 0
		n := 1 + int(b)%4
		for i := 0; i < n; i++ {
			c := r.byte()
			k := keys[int(c)%len(keys)]
			flags := r.byte()
			ch := store.Check{
				Key: k.key, Algorithm: k.alg, Limit: k.limit, Burst: k.burst, Precision: uint8(k.precision), Strict: k.strict,
				Window: time.Duration(k.window) * time.Second,
				Refund: flags&1 != 0,
				Shadow: flags&2 != 0,
			}
			switch h := c >> 2 & 7; h {
			case 0, 1, 2, 3:
				ch.Hits = uint64(h)
			case 4:
				ch.Hits = k.limit
			case 5:
				ch.Hits = k.limit + 1
			case 6:
				ch.Hits = uint64(r.byte())
			default:
				ch.Hits = r.uint(7) % (1 << 53) // service.MaxHitsBound
			}
			// An RLQS grant's reservation.
			ch.Paced = flags&0x30 == 0x10
			if flags&0xF0 == 0xF0 { // a lease, paced or not; or the hint that sends it to the script
				ch.Want = uint64(r.byte())
				ch.Horizon = time.Duration(flags>>2&3) * time.Duration(r.byte()) * time.Millisecond
				ch.Exact = flags&2 != 0
			} else if flags&0x4C == 0x0C { // a write-back (with Refund: a refund)
				ch.Force = true
				// Forced hits add up whatever the limit; keep a key's sum
				// below 2^53, where Lua's doubles count exactly (64 steps
				// of 4 checks of less than 2^40 each).
				ch.Hits %= 1 << 40
			}
			st.checks = append(st.checks, ch)
		}
		steps = append(steps, st)
		advances = append(advances, adv)
	}
	return start, keys, steps, advances
}

// diffRun counts iterations, to name each one's keys uniquely.
var diffRun atomic.Uint64

// FuzzDifferential drives the memory store and the Lua script on a real
// Redis with the same fuzzed sequences of batches and one fake clock, and
// requires identical Results: both implement store.go's arithmetic bit for
// bit. Redis keys are made persistent after every step so that only the
// fake clock expires state (an expired state must act as absent state: the
// memory store drops it, Redis keeps it).
func FuzzDifferential(f *testing.F) {
	seeds := [][]byte{
		// one sliding-window key (limit 3, 1s): four single hits at one instant
		{0, 0, 0, 0, 9, 0, 2, 0, 4, 0, 2, 0, 4, 0, 2, 0, 4, 0, 2, 0, 4, 0},
		// a token bucket (limit 2/s, burst 4) drained, then refilled by small steps
		{0, 0, 0, 0, 7, 0, 3, 2, 0, 24, 0, 4, 203, 255, 0, 4, 0, 203, 255, 0, 4, 0, 203, 255, 0, 4, 0},
		// a fixed window (limit 3): used up just before the second, again exactly at it
		{0, 0, 0, 0, 11, 0, 5, 0, 16, 0, 1, 0, 16, 0, 2, 0, 4, 0},
		// two keys in one batch, one denied: no consumption; then a shadow denial
		{0, 0, 0, 1, 6, 0, 5, 4, 2, 1, 4, 0, 21, 0, 2, 1, 4, 0, 21, 2, 2, 0, 4, 0, 2, 0, 4, 0},
		// a refund of 3, a huge refund, a check-only peek
		{0, 0, 0, 0, 9, 0, 2, 0, 12, 0, 2, 0, 12, 1, 2, 0, 28, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0x80, 0, 0},
		// a 60s window used up, a jump of 4.6 hours past every TTL, a peek, a hit
		{0, 0, 0, 0, 9, 4, 2, 0, 16, 0, 252, 0xff, 0xff, 0x80, 4, 0, 2, 0, 4, 0},
		// a bucket with limit 0 (never refills); leases asked of it
		{0, 0, 0, 0, 1, 0, 0, 2, 0, 4, 0, 2, 0, 4, 0xF8, 5, 9, 2, 0, 4, 0xF4, 3, 3},
		// a sliding window (limit 10) used up, then 100 ms into the next
		// window a hit with a paced lease of 20 hits within 40 ms, a denied
		// hit that queues for one, and an Exact hit
		{0, 0, 0, 0, 18, 0, 2, 0, 16, 0, 1, 0, 4, 0xF4, 20, 40, 3, 0, 255, 4, 0xFC, 20, 40, 2, 0, 4, 0xF6, 0, 0},
		// an unknown algorithm (acts as sliding window), limit 1
		{0, 0, 0, 0, 0xF3, 0, 2, 0, 4, 0, 2, 0, 4, 0},
		// forced write-backs past the limit of a sliding window (limit 3),
		// a fixed window (limit 3) and a bucket (limit 2/s, burst 4), each
		// then denied; a forced refund; a peek
		{0, 0, 0, 2, 9, 0, 11, 0, 7, 0, 3,
			2, 0, 21, 0x0C, 2, 0, 22, 0x0C, 2, 0, 20, 0x0C,
			2, 2, 4, 0, 5, 0, 6, 0,
			2, 0, 12, 0x0D, 2, 0x80, 0, 0},
		// a sliding window (limit 3) used up, then paced hits at the next
		// second (its current window's budget), a paced peek, a hit, and a
		// request of a paced and a plain check of the key
		{0, 0, 0, 0, 9, 0, 2, 0, 12, 0, 1, 0, 12, 0x10, 3, 100, 0x80, 4, 0x10, 2, 0, 4, 0, 2, 1, 4, 0x10, 4, 0},
		// a sliding window of precision 2 (limit 3) used up, 3 paced hits
		// at the next second, then 604 ms on (its second sub-window) a
		// paced hit and a peek that count them, and a plain hit
		{0, 0, 0, 0, 129, 0, 2, 0, 12, 0, 1, 0, 12, 0x10, 0xFF, 255, 0, 4, 0x10, 2, 0x80, 4, 0x10, 2, 0, 4, 0},
	}
	seeds = append(seeds,
		// precision 10 (limit 3, 1s): used up, denied, then small steps and
		// the next second while the oldest sub-window's weight runs down
		[]byte{0, 0, 0, 0, 189, 0, 2, 0, 12, 0, 2, 0, 4, 0, 3, 0, 255, 4, 0, 3, 0, 255, 4, 0,
			1, 0, 4, 0, 3, 0, 255, 4, 0, 7, 0, 200, 4, 0, 7, 0, 200, 4, 0},
		// precision 60 and 2 (limit 3, 1s and 2s): hits, a refund larger
		// than the newest sub-window, a forced write-back, a peek
		[]byte{0, 0, 0, 1, 219, 0, 129, 1, 2, 1, 8, 9, 3, 0, 255, 12, 0, 3, 1, 99, 12, 1, 5, 0,
			2, 0, 20, 0x0C, 1, 0, 4, 0, 2, 0x80, 0, 0, 3, 1, 50, 8, 0, 5, 0},
	)
	for _, s := range seeds {
		f.Add(s)
	}

	// Both ways the store runs decide.lua: as a Function library, and as a
	// script where FUNCTION is refused.
	fnClient, evalClient := redistest.StartServer(f).Client(), startNoFunctions(f).Client()
	f.Cleanup(func() { fnClient.Close(); evalClient.Close() })
	var nonce [6]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		f.Fatal(err)
	}
	prefix := "fz" + hex.EncodeToString(nonce[:])

	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range []struct {
			mode   string
			client *redis.Client
		}{{ScriptFunction, fnClient}, {ScriptEval, evalClient}} {
			diffOnce(t, data, prefix, m.mode, m.client)
		}
	})
}

// diffOnce runs one fuzz input against the memory store and a Redis store
// on client, which must run decide.lua in mode.
func diffOnce(t *testing.T, data []byte, prefix, mode string, client *redis.Client) {
	ctx := context.Background()
	tag := fmt.Sprintf("%s-%d", prefix, diffRun.Add(1))
	start, keys, steps, advances := decodeDiff(data, tag)
	clk := testkit.NewClock(time.UnixMicro(start))
	rs := mustNew(t, Options{Client: client, Clock: clk.Now, Timeout: 2 * time.Second})
	if err := rs.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rs.ScriptModes()[mode]; got != 1 {
		t.Fatalf("script modes %v, want one node in %s mode", rs.ScriptModes(), mode)
	}
	ms := memory.New(memory.Options{Now: clk.Now, MaxKeys: 1000})
	defer func() {
		if ks := client.Keys(ctx, "*{"+tag+"}*").Val(); len(ks) > 0 {
			client.Del(ctx, ks...)
		}
	}()

	var history strings.Builder
	for i, st := range steps {
		clk.Set(time.UnixMicro(advances[i](clk.Now().UnixMicro())))
		got := make([]store.Result, len(st.checks))
		want := make([]store.Result, len(st.checks))
		var gerr, werr error
		if st.peek {
			gerr, werr = rs.Peek(ctx, st.checks, got), ms.Peek(ctx, st.checks, want)
		} else {
			gerr, werr = rs.Decide(ctx, st.checks, got), ms.Decide(ctx, st.checks, want)
		}
		fmt.Fprintf(&history, "step %d (%s, now %d, peek %v): %+v\n  -> %+v\n", i, st.advance, clk.Now().UnixMicro(), st.peek, st.checks, want)
		if gerr != nil || werr != nil {
			t.Fatalf("%s: step %d: redis err %v, memory err %v\n%s", mode, i, gerr, werr, history.String())
		}
		for j := range got {
			if got[j] != want[j] {
				t.Fatalf("%s: step %d check %d %+v:\nredis  %+v\nmemory %+v\nkeys %+v\nhistory:\n%s",
					mode, i, j, st.checks[j], got[j], want[j], keys, history.String())
			}
		}
		// Only the fake clock expires state: Redis keeps every key.
		for _, k := range client.Keys(ctx, "*{"+tag+"}*").Val() {
			client.Persist(ctx, k)
		}
	}
}

// TestDecodeDiff pins the decoding the seeds rely on.
func TestDecodeDiff(t *testing.T) {
	_, keys, steps, _ := decodeDiff([]byte{0, 0, 0, 1, 6, 0, 5, 4, 2, 1, 4, 0, 21, 2}, "x")
	want := []diffKey{
		{key: "rl:{x}:k0", alg: store.SlidingWindow, limit: 2, window: 1},
		{key: "rl:{x}:k1", alg: store.FixedWindow, limit: 1, window: 60},
	}
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Fatalf("keys %+v, want %+v", keys, want)
	}
	if len(steps) != 1 || len(steps[0].checks) != 2 {
		t.Fatalf("steps %+v", steps)
	}
	if c := steps[0].checks[1]; c.Key != want[1].key || c.Hits != 2 || !c.Shadow || c.Refund || c.Force {
		t.Fatalf("second check %+v", c)
	}
	// Flags 0x0C force; 0x4C and a lease (0xF?) do not.
	_, _, steps, _ = decodeDiff([]byte{0, 0, 0, 0, 9, 0, 2, 3, 0x0c, 0x0C, 0x04, 0x4C, 0x04, 0xFC, 7, 30, 0x1c, 0x0D, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, "x")
	if len(steps) != 1 || len(steps[0].checks) != 4 {
		t.Fatalf("steps %+v", steps)
	}
	for i, want := range []bool{true, false, false, true} {
		if c := steps[0].checks[i]; c.Force != want {
			t.Errorf("check %d %+v: Force %v, want %v", i, c, c.Force, want)
		}
	}
	if c := steps[0].checks[3]; !c.Refund || c.Hits >= 1<<40 || c.Hits == 0 {
		t.Errorf("forced refund %+v: want Refund and fewer than 2^40 hits", c)
	}
	if c := steps[0].checks[2]; c.Want != 7 || c.Horizon != 90*time.Millisecond || c.Exact {
		t.Errorf("lease %+v: want Want 7 within 90 ms", c)
	}
}
