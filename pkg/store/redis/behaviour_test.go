package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/lua"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/testkit"
)

// TestVectors checks hand-computed values from store.go's formulas and the
// seed design's worked example, and the stored fields.
func TestVectors(t *testing.T) {
	clk := testkit.NewClock(time.UnixMicro(t0))
	s, srv := newStore(t, clk.Now)
	ctx := context.Background()
	rc := srv.Client()
	defer rc.Close()

	t.Run("seed example", func(t *testing.T) {
		// prev 82, cur 30, 400 ms into a 1 s window, limit 100:
		// rate = 82*0.6 + 30 = 79.2, R = ceil(20.8) = 21, one hit leaves 20.
		key := "rl:{seed}:route"
		win := t0/1_000_000 + 5
		rc.Set(ctx, key, lua.State{Algorithm: store.SlidingWindow, Window: float64(win), Count: 30, Prev: 82}.Encode(), 0)
		clk.Set(time.UnixMicro(win*1_000_000 + 400_000))
		r := decide(t, s, store.Check{Key: key, Limit: 100, Window: time.Second, Hits: 1})[0]
		if want := (store.Result{Allowed: true, Remaining: 20, Reset: 600 * time.Millisecond, Consumed: true}); r != want {
			t.Errorf("got %+v, want %+v", r, want)
		}
		if st := stateOf(t, rc, key); !reflect.DeepEqual(st, lua.State{Algorithm: store.SlidingWindow, Window: float64(win), Count: 31, Prev: 82}) {
			t.Errorf("state %+v, want window %d, count 31, prev 82", st, win)
		}
	})

	t.Run("another type or layout starts fresh", func(t *testing.T) {
		// A key holding something else (here the hash of rls before the
		// one-string layout) counts from zero and is replaced.
		key := "rl:{vec}:old"
		rc.HSet(ctx, key, "cur_window", t0/1_000_000, "cur_count", 30, "prev_count", 82)
		clk.Set(time.UnixMicro(t0))
		r := decide(t, s, store.Check{Key: key, Limit: 100, Window: time.Second, Hits: 1})[0]
		if !r.Allowed || r.Remaining != 99 {
			t.Errorf("got %+v, want allowed with 99 remaining", r)
		}
		if st := stateOf(t, rc, key); st.Count != 1 {
			t.Errorf("state %+v, want count 1", st)
		}
	})

	t.Run("sliding retry", func(t *testing.T) {
		// Limit 10, previous window 10, at the start of the window: rate 10,
		// R 0. 5 hits: A = 10-0-5+1 = 6, x = (1-6/10)*1e6 - 0 = 400000,
		// RetryAfter = 400001 µs.
		key := "rl:{vec}:retry"
		win := t0/1_000_000 + 20
		rc.Set(ctx, key, lua.State{Algorithm: store.SlidingWindow, Window: float64(win - 1), Count: 10}.Encode(), 0)
		clk.Set(time.UnixMicro(win * 1_000_000))
		r := decide(t, s, store.Check{Key: key, Limit: 10, Window: time.Second, Hits: 5})[0]
		if want := (store.Result{RetryAfter: 400_001 * time.Microsecond, Reset: time.Second}); r != want {
			t.Errorf("got %+v, want %+v", r, want)
		}
		// 11 hits can never pass: RetryAfter = Reset.
		r = decide(t, s, store.Check{Key: key, Limit: 10, Window: time.Second, Hits: 11})[0]
		if want := (store.Result{RetryAfter: time.Second, Reset: time.Second}); r != want {
			t.Errorf("11 hits: got %+v, want %+v", r, want)
		}
	})

	t.Run("token bucket", func(t *testing.T) {
		// 10 per second, burst 5: starts full, take 5. r = 10/1e6 is not
		// exact in binary: one token takes 1/r = 99999.99999999999 µs, so
		// RetryAfter = floor(..)+1 = 100000 µs, and full in 500000 µs.
		c := store.Check{Key: "tb:{vec}:tb", Algorithm: store.TokenBucket, Limit: 10, Burst: 5, Window: time.Second, Hits: 5}
		clk.Set(time.UnixMicro(t0 + 123))
		r := decide(t, s, c)[0]
		// It took the last token: NextHit is the next one's 100000 µs.
		if want := (store.Result{Allowed: true, Reset: 500 * time.Millisecond, NextHit: 100 * time.Millisecond, Consumed: true}); r != want {
			t.Errorf("take 5: got %+v, want %+v", r, want)
		}
		c.Hits = 1
		r = decide(t, s, c)[0]
		if want := (store.Result{RetryAfter: 100 * time.Millisecond, Reset: 500 * time.Millisecond}); r != want {
			t.Errorf("take 1: got %+v, want %+v", r, want)
		}
		clk.Advance(250 * time.Millisecond) // 2.5 tokens
		r = decide(t, s, c)[0]
		if !r.Allowed || r.Remaining != 1 {
			t.Errorf("after 250ms: got %+v, want allowed with 1 remaining", r)
		}
		if st := stateOf(t, rc, c.Key); st.Tokens != 1.5 || st.LastRefill != 1751538000250123 {
			t.Errorf("state %+v, want 1.5 tokens, last refill 1751538000250123", st)
		}
	})

	t.Run("fixed window batches", func(t *testing.T) {
		clk.Set(time.UnixMicro(t0 + 100*1_000_000 + 250_000))
		a := store.Check{Key: "rl:{vec}:a", Algorithm: store.FixedWindow, Limit: 3, Window: time.Second, Hits: 2}
		b := store.Check{Key: "rl:{vec}:b", Algorithm: store.FixedWindow, Limit: 1, Window: time.Second, Hits: 2}
		res := decide(t, s, a, b)
		if !res[0].Allowed || res[0].Remaining != 1 || res[1].Allowed || res[1].RetryAfter != 750*time.Millisecond {
			t.Errorf("got %+v", res)
		}
		if n, _ := rc.Exists(ctx, a.Key, b.Key).Result(); n != 0 {
			t.Errorf("a denied batch wrote %d keys", n)
		}
		// b in shadow mode does not veto: a consumes, b does not.
		b.Shadow = true
		res = decide(t, s, a, b)
		if !res[0].Allowed || res[1].Allowed {
			t.Errorf("shadow: got %+v", res)
		}
		if st := stateOf(t, rc, a.Key); st.Count != 2 {
			t.Errorf("a count = %v, want 2", st.Count)
		}
		if n, _ := rc.Exists(ctx, b.Key).Result(); n != 0 {
			t.Error("a denied shadow check wrote its key")
		}
		// Duplicates count twice: 1 left, so the second of two 1-hit checks
		// is denied and neither consumes.
		a.Hits = 1
		res = decide(t, s, a, a)
		if !res[0].Allowed || res[1].Allowed {
			t.Errorf("duplicates: got %+v", res)
		}
		// A refund is applied first and written even in a denied batch.
		refund := a
		refund.Refund = true
		c := store.Check{Key: "rl:{vec}:c", Algorithm: store.FixedWindow, Limit: 1, Window: time.Second, Hits: 5}
		res = decide(t, s, a, refund, c)
		if !res[0].Allowed || res[0].Remaining != 1 || !res[1].Allowed || res[1].Remaining != 2 || res[2].Allowed {
			t.Errorf("refund: got %+v", res)
		}
		if st := stateOf(t, rc, a.Key); st.Count != 1 {
			t.Errorf("after refund a count = %v, want 1", st.Count)
		}
	})
}

// TestEveryWriteHasTTL checks that every key a decision writes expires with
// the TTL store.go specifies, and that reads write nothing.
func TestEveryWriteHasTTL(t *testing.T) {
	clk := testkit.NewClock(time.UnixMicro(t0 + 300_500)) // 300.5 ms into a second
	s, srv := newStore(t, clk.Now)
	ctx := context.Background()
	rc := srv.Client()
	defer rc.Close()
	checks := []store.Check{
		{Key: "rl:{ttl}:sliding", Limit: 10, Window: 3 * time.Second, Hits: 1},
		{Key: "tb:{ttl}:bucket", Algorithm: store.TokenBucket, Limit: 10, Burst: 20, Window: time.Second, Hits: 1},
		{Key: "rl:{ttl}:fixed", Algorithm: store.FixedWindow, Limit: 10, Window: time.Second, Hits: 1},
		{Key: "rl:{ttl}:refunded", Limit: 10, Window: time.Second, Hits: 1, Refund: true},
		{Key: "rl:{ttl}:forced", Algorithm: store.FixedWindow, Limit: 1, Window: 2 * time.Second, Hits: 5, Force: true},
	}
	decide(t, s, checks...)
	want := map[string]time.Duration{
		checks[0].Key: 6 * time.Second,        // 2 windows
		checks[1].Key: 3 * time.Second,        // ceil(20/(10/1e6)) µs + 1 s
		checks[2].Key: 700 * time.Millisecond, // ceil(699.5 ms)
		checks[3].Key: 2 * time.Second,
		checks[4].Key: 1700 * time.Millisecond, // ceil(1699.5 ms)
	}
	keys, err := rc.Keys(ctx, "*").Result()
	if err != nil || len(keys) != len(want) {
		t.Fatalf("keys = %v, %v; want %d keys", keys, err, len(want))
	}
	for _, k := range keys {
		ttl, err := rc.PTTL(ctx, k).Result()
		if err != nil || ttl <= 0 || ttl > want[k] || ttl < want[k]-time.Second/2 {
			t.Errorf("PTTL %s = %v, %v; want about %v", k, ttl, err, want[k])
		}
	}
	other := store.Check{Key: "rl:{ttl}:readonly", Limit: 10, Window: time.Second}
	decide(t, s, other) // check-only
	other.Hits, other.Refund = 3, true
	if err := s.Peek(ctx, []store.Check{other}, make([]store.Result, 1)); err != nil {
		t.Fatal(err)
	}
	other.Refund, other.Force = false, true
	if err := s.Peek(ctx, []store.Check{other}, make([]store.Result, 1)); err != nil {
		t.Fatal(err)
	}
	if n, _ := rc.Exists(ctx, other.Key).Result(); n != 0 {
		t.Error("a check-only or peek wrote its key")
	}
}

// TestOneCallPerBatch checks, where FUNCTION is refused, that a
// same-tenant batch is one EVALSHA, that the script text is not re-sent
// while cached, and that SCRIPT FLUSH and a restart to an empty server cost
// no failed decision. (TestScriptModeFunction and TestScriptModeReload
// check the same with Functions.)
func TestOneCallPerBatch(t *testing.T) {
	srv := startNoFunctions(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	s := mustNew(t, Options{Client: c, Timeout: time.Second})
	ctx := context.Background()
	batch := []store.Check{
		{Key: "rl:{acme}:a", Limit: 100, Window: time.Second, Hits: 1},
		{Key: "tb:{acme}:b", Algorithm: store.TokenBucket, Limit: 100, Window: time.Second, Hits: 1},
		{Key: "rl:{acme}:c", Algorithm: store.FixedWindow, Limit: 100, Window: time.Second, Hits: 1},
	}
	decide(t, s, batch...) // the first call may get NOSCRIPT and EVAL
	before := srv.CommandStats(ctx)
	for i := 0; i < 5; i++ {
		decide(t, s, batch...)
	}
	after := srv.CommandStats(ctx)
	if d := after["evalsha"] - before["evalsha"]; d != 5 {
		t.Errorf("5 batches made %d EVALSHA calls, want 5", d)
	}
	if d := after["eval"] - before["eval"]; d != 0 {
		t.Errorf("5 batches made %d EVAL calls, want 0", d)
	}

	rc := srv.Client()
	defer rc.Close()
	if err := rc.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if res := decide(t, s, batch...); !res[0].Allowed {
		t.Errorf("after SCRIPT FLUSH: %+v", res)
	}
	if d := srv.CommandStats(ctx)["eval"] - after["eval"]; d != 1 {
		t.Errorf("after SCRIPT FLUSH: %d EVAL calls, want 1", d)
	}

	// A fresh server (as after a failover) has no script cached.
	srv.Restart(t)
	for i := 0; i < 3; i++ {
		if err := s.Decide(ctx, batch, make([]store.Result, len(batch))); err != nil {
			t.Errorf("decision %d after restart: %v", i, err)
		}
	}
}

// TestUnavailable checks that a dead or hung Redis fails fast with
// store.ErrUnavailable, and that New never connects.
func TestUnavailable(t *testing.T) {
	const timeout = 15 * time.Millisecond
	check := []store.Check{{Key: "rl:{down}:x", Limit: 10, Window: time.Second, Hits: 1}}

	t.Run("never up", func(t *testing.T) {
		srv := redistest.StartServer(t)
		srv.Stop()
		s, err := New(Options{URL: srv.URL(), Timeout: timeout})
		if err != nil {
			t.Fatalf("New with Redis down: %v", err)
		}
		defer s.Close()
		for i := 0; i < 3; i++ {
			expectUnavailable(t, s, check, timeout)
		}
		if err := s.Ping(context.Background()); !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("Ping = %v, want ErrUnavailable", err)
		}
	})

	for _, tc := range []struct {
		name  string
		fault func(*redistest.Server)
	}{
		{"killed", (*redistest.Server).Stop},
		{"paused", (*redistest.Server).Pause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			s, err := New(Options{URL: srv.URL(), Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			// Warm the pool and script cache: a caller's deadline longer
			// than the store's timeout is used as it is.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Decide(ctx, check, make([]store.Result, 1)); err != nil {
				t.Fatal(err)
			}
			tc.fault(srv)
			for i := 0; i < 3; i++ {
				expectUnavailable(t, s, check, timeout)
			}
			srv.Resume()
		})
	}
}

func expectUnavailable(t *testing.T, s *Store, checks []store.Check, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	err := s.Decide(context.Background(), checks, make([]store.Result, len(checks)))
	took := time.Since(start)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Decide = %v, want an error wrapping store.ErrUnavailable", err)
	}
	// Bounded by the timeout, give or take what a busy machine adds.
	if took > timeout+2*time.Second {
		t.Errorf("Decide took %v with a %v timeout; want at most %v", took, timeout, timeout+2*time.Second)
	}
}

// TestConcurrentExact checks atomicity under contention: with a frozen
// clock, 20 goroutines deciding pairs of 1-hit checks of one key get exactly
// the pairs that fit in the limit.
func TestConcurrentExact(t *testing.T) {
	clk := testkit.NewClock(time.UnixMicro(t0 + 500_000))
	s, _ := newStore(t, clk.Now)
	for _, alg := range []store.Algorithm{store.SlidingWindow, store.TokenBucket, store.FixedWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			check := store.Check{Key: "k:{conc}:" + alg.String(), Algorithm: alg, Limit: 137, Window: time.Minute, Hits: 1}
			var allowed atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < 20; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res := make([]store.Result, 2)
					for i := 0; i < 10; i++ {
						if err := s.Decide(context.Background(), []store.Check{check, check}, res); err != nil {
							t.Error(err)
							return
						}
						if res[0].Allowed && res[1].Allowed {
							allowed.Add(2)
						}
					}
				}()
			}
			wg.Wait()
			if got := allowed.Load(); got != 136 {
				t.Errorf("%d hits allowed in pairs, want 136 (68 pairs fit in 137)", got)
			}
		})
	}
}

func TestPeekAndDelete(t *testing.T) {
	clk := testkit.NewClock(time.UnixMicro(t0))
	s, srv := newStore(t, clk.Now)
	ctx := context.Background()
	c := store.Check{Key: "rl:{adm}:x", Limit: 5, Window: time.Second, Hits: 3}
	decide(t, s, c)
	res := make([]store.Result, 1)
	if err := s.Peek(ctx, []store.Check{c}, res); err != nil {
		t.Fatal(err)
	}
	if want := (store.Result{Allowed: true, Remaining: 2, Reset: time.Second}); res[0] != want {
		t.Errorf("Peek = %+v, want %+v", res[0], want)
	}
	if err := s.Delete(ctx, c.Key, "rl:{other}:missing"); err != nil {
		t.Fatal(err)
	}
	rc := srv.Client()
	defer rc.Close()
	if n, _ := rc.Exists(ctx, c.Key).Result(); n != 0 {
		t.Error("Delete left the key")
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

func TestErrors(t *testing.T) {
	s, _ := newStore(t, nil)
	ctx := context.Background()
	c := store.Check{Key: "k", Limit: 1, Window: 1500 * time.Millisecond}
	if err := s.Decide(ctx, []store.Check{c}, make([]store.Result, 1)); err == nil || errors.Is(err, store.ErrUnavailable) {
		t.Errorf("fractional window: %v, want a non-ErrUnavailable error", err)
	}
	c.Window = time.Second
	if err := s.Decide(ctx, []store.Check{c}, nil); err == nil {
		t.Error("mismatched results accepted")
	}
	if err := s.Decide(ctx, nil, nil); err != nil {
		t.Errorf("empty batch: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Decide(cctx, []store.Check{c}, make([]store.Result, 1)); !errors.Is(err, context.Canceled) || errors.Is(err, store.ErrUnavailable) {
		t.Errorf("cancelled ctx: %v, want context.Canceled and not ErrUnavailable", err)
	}
}

func TestSlot(t *testing.T) {
	for key, want := range map[string]int{
		"123456789":         0x31C3 % Slots, // the CRC16/XMODEM check value
		"foo":               12182,          // CLUSTER KEYSLOT foo
		"{user1000}.follow": Slot("user1000"),
		"foo{}{bar}":        8363, // an empty tag hashes the whole key
		"rl:{acme}:x":       Slot("acme"),
		"":                  0,
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}

// stateOf reads and decodes the counter state at key.
func stateOf(t *testing.T, rc *redis.Client, key string) lua.State {
	t.Helper()
	v, err := rc.Get(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	st, err := lua.ParseState(v)
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return st
}

// TestCompactMatchesTagged: on Redis's own clock the script stores sliding
// and fixed windows in the compact form (the window index modulo 4 only);
// a key holding the same state in the tagged form (full window index) must
// get identical results in the same call, in the window it was written,
// the next one and the one after. The differential fuzz target runs on a
// test clock, which always writes the tagged form, so this is the compact
// form's differential test.
func TestCompactMatchesTagged(t *testing.T) {
	s, srv := newStore(t, nil)
	rc := srv.Client()
	defer rc.Close()
	ctx := context.Background()
	for _, alg := range []store.Algorithm{store.SlidingWindow, store.FixedWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			a := store.Check{Key: "rl:{compact}:a" + alg.String(), Algorithm: alg, Limit: 20, Window: time.Second}
			b := a
			b.Key = "rl:{compact}:b" + alg.String()
			// copyState writes a's state to b in the tagged form, with a's TTL.
			copyState := func() {
				t.Helper()
				v, err := rc.Get(ctx, a.Key).Result()
				if err != nil {
					t.Fatalf("GET %s: %v", a.Key, err)
				}
				st, err := lua.ParseState(v)
				if err != nil || !st.Compact {
					t.Fatalf("%s holds %q (%+v, %v); want the compact form", a.Key, v, st, err)
				}
				tm, _ := rc.Time(ctx).Result()
				cur := float64(tm.UnixMicro() / 1_000_000)
				for back := 0.0; back < 4; back++ { // the window index with its remainder
					if w := cur - back; math.Mod(w, 4) == st.Window {
						st.Window = w
						break
					}
				}
				st.Compact = false
				ttl, _ := rc.PTTL(ctx, a.Key).Result()
				if err := rc.Set(ctx, b.Key, st.Encode(), ttl).Err(); err != nil {
					t.Fatal(err)
				}
			}
			same := func(step string, hits uint64) {
				t.Helper()
				a.Hits, b.Hits = hits, hits
				res := [][]store.Result{make([]store.Result, 1), make([]store.Result, 1)}
				// Two requests in one call: one clock for both.
				if err := decideMerged(ctx, s, argNoClock, [][]store.Check{{a}, {b}}, res); err != nil {
					t.Fatalf("%s: %v", step, err)
				}
				ra, rb := res[0], res[1]
				if ra[0] != rb[0] {
					t.Errorf("%s, %d hits: compact %+v, tagged %+v", step, hits, ra[0], rb[0])
				}
			}
			// secondAfter waits until Redis's clock, which the script
			// reads, is at least at in a second later than sec, and returns
			// that second.
			secondAfter := func(sec int64, at time.Duration) int64 {
				t.Helper()
				var now int64
				testkit.WaitFor(t, fmt.Sprintf("Redis TIME past second %d + %v", sec, at), 5*time.Second, func() bool {
					tm, err := rc.Time(ctx).Result()
					now = tm.Unix()
					return err == nil && now > sec && time.Duration(tm.Nanosecond()) >= at
				})
				return now
			}
			tm, err := rc.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			// Start early in a second, so the steps below stay in it.
			first := secondAfter(tm.Unix(), 20*time.Millisecond)
			decide(t, s, store.Check{Key: a.Key, Algorithm: alg, Limit: 20, Window: time.Second, Hits: 7})
			copyState()
			same("same window", 5)
			same("same window, over", 9)
			copyState()
			next := secondAfter(first, 300*time.Millisecond)
			same("next window", 1) // sliding: the previous window weighs 70%
			copyState()
			secondAfter(next, 300*time.Millisecond)
			same("the window after", 3)
		})
	}
}
