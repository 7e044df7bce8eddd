//go:build redis

package redisstore

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// TestBadStateIsFresh writes values rls would never write (negative, NaN
// or infinite counts and tokens, text, without a TTL) and requires each
// check to decide as on a missing key, as the memory store does with no
// state, on plain commands, the Function and the script path, for
// one-check calls and for a request of two checks. The key is then
// written with its TTL.
func TestBadStateIsFresh(t *testing.T) {
	now := t0 + 5_000_000
	sub := float64(now/60_000_000*10 + (now%60_000_000)*10/60_000_000)
	minute := strconv.FormatInt(now/60_000_000*60, 10) // the window key's suffix
	cases := []struct {
		name  string
		key   string // "": the check's own key; else this suffix is appended
		value string
		check store.Check
	}{
		{"sliding negative count", ":" + minute, "-80", store.Check{Limit: 3, Window: time.Minute, Hits: 1}},
		{"sliding not a number", ":" + minute, "-inf", store.Check{Limit: 3, Window: time.Minute, Hits: 1}},
		{"sliding text", ":" + minute, "abc", store.Check{Limit: 3, Window: time.Minute, Hits: 1}},
		{"precision 10 negative sub-window", "", state{Algorithm: store.SlidingWindow, Window: sub, Count: 0, Old: []float64{0, -50, 0, 0, 0, 0, 0, 0, 0, 0}}.encode(),
			store.Check{Limit: 3, Window: time.Minute, Hits: 1, Precision: 10}},
		{"precision 10 infinite window", "", state{Algorithm: store.SlidingWindow, Window: math.Inf(1), Count: 0, Old: make([]float64, 10)}.encode(),
			store.Check{Limit: 3, Window: time.Minute, Hits: 1, Precision: 10}},
		{"fixed negative count", ":" + minute, "-4", store.Check{Algorithm: store.FixedWindow, Limit: 3, Window: time.Minute, Hits: 1}},
		{"fixed infinite count", ":" + minute, "inf", store.Check{Algorithm: store.FixedWindow, Limit: 3, Window: time.Minute, Hits: 1}},
		{"bucket -inf tokens", "", state{Algorithm: store.TokenBucket, Tokens: math.Inf(-1), LastRefill: float64(now)}.encode(), store.Check{Algorithm: store.TokenBucket, Limit: 3, Window: time.Minute, Hits: 1}},
		{"bucket NaN tokens", "", state{Algorithm: store.TokenBucket, Tokens: math.NaN(), LastRefill: float64(now)}.encode(), store.Check{Algorithm: store.TokenBucket, Limit: 3, Window: time.Minute, Hits: 1}},
		{"bucket negative tokens", "", state{Algorithm: store.TokenBucket, Tokens: -1e12, LastRefill: float64(now)}.encode(), store.Check{Algorithm: store.TokenBucket, Limit: 3, Window: time.Minute, Hits: 1}},
		{"bucket NaN refill time", "", state{Algorithm: store.TokenBucket, Tokens: 0, LastRefill: math.NaN()}.encode(), store.Check{Algorithm: store.TokenBucket, Limit: 3, Window: time.Minute, Hits: 1}},
	}
	for _, srv := range []struct {
		mode string
		srv  *redistest.Server
	}{{ScriptFunction, redistest.StartServer(t)}, {ScriptEval, startNoFunctions(t)}} {
		c := srv.srv.Client()
		t.Cleanup(func() { c.Close() })
		clk := testkit.NewClock(time.UnixMicro(now))
		s := mustNew(t, Options{Client: c, Clock: clk.Now, Timeout: time.Second})
		ctx := context.Background()
		for i, tc := range cases {
			for _, pair := range []bool{false, true} {
				name := srv.mode + "/" + tc.name
				check := tc.check
				check.Key = "rl:{bad}:" + strconv.Itoa(i) + strconv.FormatBool(pair)
				checks := []store.Check{check}
				if pair { // the request path: two checks
					checks = append(checks, store.Check{Key: check.Key + ":other", Limit: 5, Window: time.Second, Hits: 1})
					name += " (two checks)"
				}
				key := check.Key + tc.key
				if err := c.Set(ctx, key, tc.value, 0).Err(); err != nil {
					t.Fatal(err)
				}
				got, want := make([]store.Result, len(checks)), make([]store.Result, len(checks))
				if err := s.Decide(ctx, checks, got); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if err := memory.New(memory.Options{Now: clk.Now}).Decide(ctx, checks, want); err != nil {
					t.Fatal(err)
				}
				for j := range got {
					if got[j] != want[j] {
						t.Errorf("%s: check %d %+v, want %+v (a fresh key)", name, j, got[j], want[j])
					}
				}
				if ttl, err := c.PTTL(ctx, key).Result(); err != nil || ttl <= 0 {
					t.Errorf("%s: PTTL %v, %v after the write; want a TTL", name, ttl, err)
				}
			}
		}
	}
}

// TestDenialRestoresTTL: a state that denies for long, written without a TTL
// (which would deny the key for ever, since denials never write) gets the
// TTL a write would set when a check is denied on it, on one-check calls
// and requests of two checks; a peek writes nothing and leaves it.
func TestDenialRestoresTTL(t *testing.T) {
	for _, srv := range []struct {
		mode string
		srv  *redistest.Server
	}{{ScriptFunction, redistest.StartServer(t)}, {ScriptEval, startNoFunctions(t)}} {
		c := srv.srv.Client()
		t.Cleanup(func() { c.Close() })
		s := mustNew(t, Options{Client: c, Timeout: time.Second})
		ctx := context.Background()
		// A bucket last refilled far in the future: empty until then, a
		// value this script never writes but one that parses.
		huge := state{Algorithm: store.TokenBucket, Tokens: 0, LastRefill: 1e18}.encode()
		bucket := func(key string, hits uint64) store.Check {
			return store.Check{Key: key, Algorithm: store.TokenBucket, Limit: 3, Window: time.Minute, Hits: hits}
		}
		for _, tc := range []struct {
			name   string
			checks []store.Check
			peek   bool
		}{
			{"one check", []store.Check{bucket("tb:{ttl}:a", 1)}, false},
			{"check-only", []store.Check{bucket("tb:{ttl}:b", 0)}, false},
			{"two checks", []store.Check{bucket("tb:{ttl}:c", 1), bucket("tb:{ttl}:c2", 1)}, false},
			{"peek", []store.Check{bucket("tb:{ttl}:d", 1)}, true},
		} {
			name := srv.mode + "/" + tc.name
			key := tc.checks[0].Key
			if err := c.Set(ctx, key, huge, 0).Err(); err != nil {
				t.Fatal(err)
			}
			res := make([]store.Result, len(tc.checks))
			var err error
			if tc.peek {
				err = s.Peek(ctx, tc.checks, res)
			} else {
				err = s.Decide(ctx, tc.checks, res)
			}
			if err != nil || res[0].Allowed {
				t.Fatalf("%s: %+v, %v; want denied", name, res[0], err)
			}
			ttl, err := c.PTTL(ctx, key).Result()
			switch {
			case err != nil:
				t.Fatal(err)
			case tc.peek && ttl != -1:
				t.Errorf("%s: PTTL %v, want none: a peek writes nothing", name, ttl)
			case !tc.peek && (ttl <= 0 || ttl > 2*time.Minute):
				t.Errorf("%s: PTTL %v, want the bucket's (61 s)", name, ttl)
			}
			if v, _ := c.Get(ctx, key).Result(); v != huge {
				t.Errorf("%s: value %q changed; a denial writes no count", name, v)
			}
		}
	}
}
