package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/lua"
	"github.com/rls-project/rls/pkg/store"
)

// day is the window of the differential tests: long enough that no run
// crosses a boundary, except at midnight (they skip then).
const day = 24 * time.Hour

// skipNearMidnight skips a test that must not see a day's window turn.
func skipNearMidnight(t *testing.T) {
	t.Helper()
	if now := time.Now().UTC(); now.Add(2*time.Minute).Day() != now.Day() {
		t.Skip("a day's window turns within two minutes")
	}
}

// pair returns two stores on one Redis: one with counter calls, one
// deciding everything by script.
func pair(t *testing.T) (counted, scripted *Store, rc *redis.Client) {
	t.Helper()
	srv := redistest.StartServer(t)
	rc = srv.Client()
	t.Cleanup(func() { rc.Close() })
	counted = mustNew(t, Options{Client: rc, Timeout: 5 * time.Second})
	scripted = mustNew(t, Options{Client: rc, Timeout: 5 * time.Second, NoCounters: true})
	return counted, scripted, rc
}

// TestCountersMatchScript drives random requests (one or two checks of
// both windows, of 1-3 hits, with refunds, write-backs and shadow checks
// among them) through a store with counter calls and one without, on keys
// of their own in one Redis, and requires the same answers and the same
// stored counts after every request: a counter call decides exactly as the
// script does.
func TestCountersMatchScript(t *testing.T) {
	skipNearMidnight(t)
	counted, scripted, rc := pair(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	algs := []store.Algorithm{store.SlidingWindow, store.FixedWindow}
	for step := range 3000 {
		n := 1 + rng.IntN(2)
		var a, b []store.Check
		for range n {
			c := store.Check{
				Key:       fmt.Sprintf("k%d", rng.IntN(6)),
				Algorithm: algs[rng.IntN(2)],
				Limit:     uint64(5 + rng.IntN(20)),
				Window:    day,
				Hits:      uint64(1 + rng.IntN(3)),
				Scarce:    rng.IntN(3) == 0, // a request of one such check is probed first
			}
			switch rng.IntN(20) {
			case 0:
				c.Refund = true
			case 1:
				c.Force = true
			case 2:
				c.Shadow = true
			}
			c.Key += c.Algorithm.String() // one algorithm per key
			ca, cb := c, c
			ca.Key, cb.Key = "a:"+c.Key, "b:"+c.Key
			a, b = append(a, ca), append(b, cb)
		}
		ra, rb := make([]store.Result, n), make([]store.Result, n)
		if err := counted.Decide(ctx, a, ra); err != nil {
			t.Fatalf("step %d: counted: %v", step, err)
		}
		if err := scripted.Decide(ctx, b, rb); err != nil {
			t.Fatalf("step %d: scripted: %v", step, err)
		}
		for j := range ra {
			x, y := ra[j], rb[j]
			x.Reset, y.Reset, x.RetryAfter, y.RetryAfter = 0, 0, 0, 0
			x.NextHit, y.NextHit = min(x.NextHit, 1), min(y.NextHit, 1) // both or neither (times differ)
			if x != y {
				t.Fatalf("step %d, check %d %+v: counter call %+v, script %+v", step, j, a[j], ra[j], rb[j])
			}
			if ca, cb := storedCount(t, rc, a[j].Key), storedCount(t, rc, b[j].Key); ca != cb {
				t.Fatalf("step %d, check %d %+v: stored count %v, script's %v", step, j, a[j], ca, cb)
			}
		}
		if step%40 == 39 { // a fresh budget now and then, so that most requests fit
			rc.FlushAll(ctx)
		}
	}
	decided, scriptedAfter := counted.CounterCalls()
	denied, passed := counted.Probes()
	t.Logf("counter calls: %d decided alone, %d went on to the script; probes: %d denied, %d went on", decided, scriptedAfter, denied, passed)
	if decided < 1000 || scriptedAfter < 300 || denied < 20 || passed < 100 {
		t.Errorf("counter calls decided %d requests and sent %d to the script, probes denied %d and sent %d on; want every path taken often",
			decided, scriptedAfter, denied, passed)
	}
}

// storedCount is the current window's count in key's compact value (0
// when absent).
func storedCount(t *testing.T, rc *redis.Client, key string) float64 {
	t.Helper()
	v, err := rc.Get(context.Background(), key).Result()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	st, err := lua.ParseState(v)
	if err != nil {
		t.Fatalf("GET %s = %q: %v", key, v, err)
	}
	return st.Count
}

// TestCountersExactUnderRace races 400 requests of one hit on a fresh key
// of each window type with a limit of 150: exactly 150 are allowed, and
// the stored count is 150 once every request has answered (the script took
// back every INCRBY it denied).
func TestCountersExactUnderRace(t *testing.T) {
	skipNearMidnight(t)
	counted, _, rc := pair(t)
	for _, alg := range []store.Algorithm{store.SlidingWindow, store.FixedWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			const limit, n = 150, 400
			key := "race:" + alg.String()
			var allowed atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for range n {
				wg.Go(func() {
					r := make([]store.Result, 1)
					err := counted.Decide(context.Background(), []store.Check{{Key: key, Algorithm: alg, Limit: limit, Window: day, Hits: 1}}, r)
					if err != nil {
						errs <- err
					} else if r[0].Allowed {
						allowed.Add(1)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("Decide: %v", err)
			}
			if got := allowed.Load(); got != limit {
				t.Errorf("allowed %d of %d, want exactly %d", got, n, limit)
			}
			if c := storedCount(t, rc, key); c != limit {
				t.Errorf("stored count %v, want %d", c, limit)
			}
			if ttl := rc.PTTL(context.Background(), key).Val(); ttl <= 0 {
				t.Errorf("PTTL %v: the key must expire", ttl)
			}
		})
	}
}

// TestCountersTakeBack prepares values a counter call must not trust and
// checks that the request is decided as the script decides it, from the
// same value, and leaves the same value: the previous window's count (a
// sliding window rolls it; a fixed one starts fresh), another algorithm's
// value, the binary form, a value without TTL, and the limit reached.
func TestCountersTakeBack(t *testing.T) {
	skipNearMidnight(t)
	counted, scripted, rc := pair(t)
	ctx := context.Background()
	tm, err := rc.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	win := tm.UnixMicro() / int64(day/time.Microsecond)
	sliding := func(cur, prev, w int64) string {
		return strconv.FormatInt((cur*lua.CompactCounts+prev)*8+w%4, 10)
	}
	fixed := func(count, w int64) string { return strconv.FormatInt(count*8+4+w%4, 10) }
	for _, tc := range []struct {
		name  string
		alg   store.Algorithm
		value string
		ttl   time.Duration
		limit uint64
	}{
		{"sliding, previous window", store.SlidingWindow, sliding(7, 2, win-1), 2 * day, 10},
		{"sliding, two windows back", store.SlidingWindow, sliding(7, 2, win-2), 2 * day, 10},
		{"sliding, at the limit", store.SlidingWindow, sliding(10, 0, win), 2 * day, 10},
		{"sliding, one left", store.SlidingWindow, sliding(9, 0, win), 2 * day, 10},
		{"sliding, a fixed value", store.SlidingWindow, fixed(3, win), day, 10},
		{"sliding, no TTL", store.SlidingWindow, sliding(4, 0, win), 0, 10},
		{"sliding, binary", store.SlidingWindow, lua.State{Algorithm: store.SlidingWindow, Window: float64(win), Count: 3}.Encode(), 2 * day, 10},
		{"fixed, previous window", store.FixedWindow, fixed(7, win-1), day, 10},
		{"fixed, at the limit", store.FixedWindow, fixed(10, win), day, 10},
		{"fixed, a sliding value", store.FixedWindow, sliding(3, 1, win), 2 * day, 10},
		{"fixed, absent", store.FixedWindow, "", 0, 10},
		{"sliding, absent", store.SlidingWindow, "", 0, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ka, kb := "a:"+tc.name, "b:"+tc.name
			if tc.value != "" {
				rc.Set(ctx, ka, tc.value, tc.ttl)
				rc.Set(ctx, kb, tc.value, tc.ttl)
			}
			for i := range 3 {
				ca := store.Check{Key: ka, Algorithm: tc.alg, Limit: tc.limit, Window: day, Hits: 1}
				cb := ca
				cb.Key = kb
				ra, rb := decide(t, counted, ca)[0], decide(t, scripted, cb)[0]
				ra.Reset, rb.Reset, ra.RetryAfter, rb.RetryAfter = 0, 0, 0, 0
				ra.NextHit, rb.NextHit = min(ra.NextHit, 1), min(rb.NextHit, 1) // both or neither (times differ)
				if ra != rb {
					t.Errorf("request %d: counter call %+v, script %+v", i, ra, rb)
				}
				va, vb := rc.Get(ctx, ka).Val(), rc.Get(ctx, kb).Val()
				if va != vb {
					t.Errorf("request %d: value %q, script's %q", i, va, vb)
				}
				// A value of this window without a TTL (written by something
				// else) is trusted by counter calls; the window's roll, which
				// the script writes, gives it one.
				if tc.ttl > 0 || tc.value == "" {
					if ttl := rc.PTTL(ctx, ka).Val(); ttl <= 0 && rb.Consumed {
						t.Errorf("request %d: PTTL %v after a write", i, ttl)
					}
				}
			}
		})
	}
}

// storeWithout returns a Redis and a store on it whose user (name) may run
// every command but the one rule takes away.
func storeWithout(t *testing.T, name, rule string) (*redistest.Server, *Store) {
	t.Helper()
	srv := redistest.StartServer(t)
	admin := srv.Client()
	defer admin.Close()
	if err := admin.Do(context.Background(), "ACL", "SETUSER", name, "on", ">secret", "~*", "+@all", rule).Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: name, Password: "secret"})
	t.Cleanup(func() { c.Close() })
	return srv, mustNew(t, Options{Client: c, Timeout: 5 * time.Second})
}

// TestCountersRefused: a node that refuses INCRBY (an ACL without it)
// decides every request by script, each correctly, after the first.
func TestCountersRefused(t *testing.T) {
	srv, s := storeWithout(t, "noincr", "-incrby")
	for i := range 5 {
		r := decide(t, s, store.Check{Key: "acl", Limit: 3, Window: day, Hits: 1})[0]
		if r.Allowed != (i < 3) {
			t.Errorf("request %d: %+v, want allowed %v", i, r, i < 3)
		}
	}
	if decided, _ := s.CounterCalls(); decided != 0 {
		t.Errorf("%d requests decided by counter calls on a node that refuses INCRBY", decided)
	}
	if n := srv.CommandStats(context.Background())["fcall"]; n != 5 {
		t.Errorf("FCALL ran %d times, want 5", n)
	}
}

// TestProbesRefused: a node that refuses GET (an ACL of before probes)
// decides Scarce requests by counter call and script, each correctly, and
// still decides the others by counter calls.
func TestProbesRefused(t *testing.T) {
	skipNearMidnight(t)
	_, s := storeWithout(t, "noget", "-get")
	for i := range 6 {
		r := decide(t, s, store.Check{Key: "acl", Limit: 4, Window: day, Hits: 1, Scarce: i >= 2})[0]
		if r.Allowed != (i < 4) {
			t.Errorf("request %d: %+v, want allowed %v", i, r, i < 4)
		}
	}
	if denied, passed := s.Probes(); denied != 0 || passed != 1 {
		t.Errorf("probes denied %d and passed %d on a node that refuses GET, want 0 and the first refused", denied, passed)
	}
	if decided, _ := s.CounterCalls(); decided < 3 {
		t.Errorf("%d requests decided by counter calls, want at least 3 (GET's refusal must not stop them)", decided)
	}
}

// TestCountersCluster: on a 3-master Cluster, requests of keys in every
// slot are decided by counter calls on the masters that own them, exactly
// (a limit of 20 per key over 30 requests each).
func TestCountersCluster(t *testing.T) {
	skipNearMidnight(t)
	cl := redistest.StartCluster(t, 3, 0)
	s, err := New(Options{URL: cl.Seeds(), Mode: ModeCluster, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	allowed := make([]atomic.Int64, 12)
	for k := range allowed { // the first request writes the key by script
		c := store.Check{Key: fmt.Sprintf("rl:{k%d}", k), Algorithm: store.FixedWindow, Limit: 20, Window: day, Hits: 1}
		if r := decide(t, s, c)[0]; r.Allowed {
			allowed[k].Add(1)
		}
	}
	for k := range allowed {
		for range 29 {
			wg.Go(func() {
				r := make([]store.Result, 1)
				c := store.Check{Key: fmt.Sprintf("rl:{k%d}", k), Algorithm: store.FixedWindow, Limit: 20, Window: day, Hits: 1}
				if err := s.Decide(context.Background(), []store.Check{c}, r); err != nil {
					t.Errorf("key %d: %v", k, err)
				} else if r[0].Allowed {
					allowed[k].Add(1)
				}
			})
		}
	}
	wg.Wait()
	for k := range allowed {
		if got := allowed[k].Load(); got != 20 {
			t.Errorf("key %d: %d allowed, want 20", k, got)
		}
	}
	if decided, _ := s.CounterCalls(); decided < 150 {
		t.Errorf("counter calls decided %d requests, want most of the 228 allowed after the first of each key", decided)
	}
}

// TestCountersNextHit holds each NextHit the store gives (counter calls and
// script calls alike) to the store's own answer: no hit may pass before it.
// A key of 2,000 per 2 s is driven as the over-limit cache drives it: a
// hit when the last NextHit has come, a Peek before then, over three
// windows, so most admissions take the last of the budget while the
// previous window's count fades (a hit frees up about every millisecond).
// With `before` the wall clock before the decision, the NextHit's time is
// at least before + NextHit; a Peek that the store allowed ended before
// `after`. A Peek allowed with after earlier than that fails the test,
// which a slow machine cannot cause, only a NextHit later than the store's
// own next hit.
func TestCountersNextHit(t *testing.T) {
	counted, _, _ := pair(t)
	c := store.Check{Key: "rl:{nexthit}:k", Limit: 2000, Window: 2 * time.Second, Hits: 1}
	peek := c
	peek.Hits = 0
	var due time.Time
	var fading, peeks, hits int
	deadline := time.Now().Add(6 * time.Second)
	const slack = 50 * time.Microsecond // clock reads of two processes
	for n := 0; n < 60000 && time.Now().Before(deadline); n++ {
		if time.Now().Before(due) {
			// A Peek, or every fourth time a hit (a counter call, whose
			// budget is taken at the earliest time its INCRBY can have
			// run): neither may pass before the NextHit.
			p := make([]store.Result, 1)
			sent := time.Now()
			if n%4 == 0 {
				p[0] = decide(t, counted, c)[0]
				hits++
			} else if err := counted.Peek(context.Background(), []store.Check{peek}, p); err != nil {
				t.Fatal(err)
			}
			peeks++
			if after := time.Now(); p[0].Allowed && after.Add(slack).Before(due) {
				t.Fatalf("request %d: a hit passes %v before the last NextHit: %+v", n, due.Sub(after), p[0])
			}
			if p[0].NextHit > 0 {
				due = sent.Add(p[0].NextHit) // no later than the store's own
			}
			continue
		}
		before := time.Now()
		r := decide(t, counted, c)[0]
		switch {
		case r.NextHit > 0:
			due = before.Add(r.NextHit)
			if r.NextHit < r.Reset {
				fading++
			}
		case r.Allowed && r.Remaining == 0:
			t.Fatalf("request %d took the last of the budget without a NextHit: %+v", n, r)
		}
	}
	decided, scripted := counted.CounterCalls()
	t.Logf("%d NextHits within a window, %d peeks before one (%d of them hits); counter calls: %d decided alone, %d went on to the script", fading, peeks, hits, decided, scripted)
	if fading < 100 || peeks < 100 {
		t.Errorf("%d NextHits within a window and %d peeks before one: want at least 100 of each", fading, peeks)
	}
}
