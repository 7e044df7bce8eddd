//go:build redis

package redisstore

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/redisclient"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore/lua"
	"github.com/rls-project/rls/pkg/testkit"
)

// urlClient returns the client redisclient makes of o, as rls serve does.
func urlClient(t testing.TB, o redisclient.Options) redis.UniversalClient {
	t.Helper()
	c, err := redisclient.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// windowKey is key's counter for the window of length w that holds at.
func windowKey(key string, at time.Time, w time.Duration) string {
	secs := int64(w / time.Second)
	return string(lua.WindowKey(nil, key, at.Unix()/secs*secs))
}

// TestSeedExample: the seed design's worked example, on plain commands and
// by script: previous window 82, current 30, 400 ms into a 1 s window,
// limit 100: rate = 82*0.6 + 30 = 79.2, R = ceil(20.8) = 21, one hit
// leaves 20; the hit is counted in the current window's key.
func TestSeedExample(t *testing.T) {
	for _, noPlain := range []bool{false, true} {
		clk := testkit.NewClock(time.UnixMicro(t0 + 5_400_000))
		srv := redistest.StartServer(t)
		rc := srv.Client()
		defer rc.Close()
		s := mustNew(t, Options{Client: rc, Clock: clk.Now, Timeout: time.Second, NoPlain: noPlain})
		ctx := context.Background()
		key := "rl:{seed}:route"
		cur, prev := windowKey(key, clk.Now(), time.Second), windowKey(key, clk.Now().Add(-time.Second), time.Second)
		rc.Set(ctx, cur, 30, time.Minute)
		rc.Set(ctx, prev, 82, time.Minute)
		r := decide(t, s, store.Check{Key: key, Limit: 100, Window: time.Second, Hits: 1})[0]
		if want := (store.Result{Allowed: true, Remaining: 20, Reset: 600 * time.Millisecond, Consumed: true}); r != want {
			t.Errorf("no plain %v: got %+v, want %+v", noPlain, r, want)
		}
		if n, _ := rc.Get(ctx, cur).Int(); n != 31 {
			t.Errorf("no plain %v: the current window counts %d, want 31", noPlain, n)
		}
		if route := s.Routes(); (route[RoutePlain] == 1) == noPlain {
			t.Errorf("no plain %v: routes %v", noPlain, route)
		}
	}
}

// TestEveryWriteHasTTL: every key a decision writes expires: a window key
// when the windows that read it end (and a second more), a state key with
// the TTL store.go specifies; check-only checks and peeks write nothing.
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
		{Key: "rl:{ttl}:precise", Limit: 10, Window: time.Second, Hits: 1, Precision: 4},
	}
	decide(t, s, checks...)                                                                   // by script: several checks of two kinds
	decide(t, s, store.Check{Key: "rl:{ttl}:plain", Limit: 10, Window: time.Second, Hits: 1}) // by plain commands
	now := clk.Now()
	want := map[string]time.Duration{
		windowKey(checks[0].Key, now, 3*time.Second): 6*time.Second - 300500*time.Microsecond + time.Second, // to the next window's end
		checks[1].Key: 3 * time.Second, // ceil(20/(10/1e6)) µs + 1 s
		windowKey(checks[2].Key, now, time.Second): time.Second - 300500*time.Microsecond + time.Second,
		checks[3].Key: 2 * time.Second,
		windowKey("rl:{ttl}:plain", now, time.Second): 2*time.Second - 300500*time.Microsecond + time.Second,
	}
	keys, err := rc.Keys(ctx, "*").Result()
	if err != nil || len(keys) != len(want) {
		t.Fatalf("keys = %v, %v; want %d keys", keys, err, len(want))
	}
	for _, k := range keys {
		ttl, err := rc.PTTL(ctx, k).Result()
		if err != nil || ttl <= 0 || ttl > want[k]+time.Millisecond || ttl < want[k]-time.Second/2 {
			t.Errorf("PTTL %s = %v, %v; want about %v", k, ttl, err, want[k])
		}
	}
	other := store.Check{Key: "rl:{ttl}:readonly", Limit: 10, Window: time.Second}
	decide(t, s, other) // check-only
	other.Hits, other.Refund = 3, true
	if err := s.Peek(ctx, []store.Check{other}, make([]store.Result, 1)); err != nil {
		t.Fatal(err)
	}
	if n, _ := rc.DBSize(ctx).Result(); n != int64(len(want)) {
		t.Errorf("%d keys after a check-only check and a peek, want %d", n, len(want))
	}
}

// TestPlainTakesBack: a request that plain commands cannot admit (its key
// at its limit, unknown to the caller) takes its INCRBY back and is denied
// by the script in the same round trip, leaving the count where it was; a
// lease that does not fit whole is trimmed to what fits.
func TestPlainTakesBack(t *testing.T) {
	clk := testkit.NewClock(time.UnixMicro(t0 + 100_000))
	s, srv := newStore(t, clk.Now)
	rc := srv.Client()
	defer rc.Close()
	c := store.Check{Key: "rl:{back}:f", Algorithm: store.FixedWindow, Limit: 5, Window: time.Second, Hits: 1, Want: 3}
	r := decide(t, s, c)[0]
	if !r.Allowed || r.Lease.Hits != 3 || r.Remaining != 1 {
		t.Fatalf("first: %+v, want allowed with a lease of 3 and 1 left", r)
	}
	r = decide(t, s, c)[0] // 4 counted: 1 left, a lease of 0 fits
	if !r.Allowed || r.Lease.Hits != 0 || r.Remaining != 0 {
		t.Errorf("second: %+v, want allowed, no lease, none left", r)
	}
	c.Want = 0
	r = decide(t, s, c)[0]
	if r.Allowed || r.RetryAfter != 900*time.Millisecond {
		t.Errorf("third: %+v, want denied until the window ends", r)
	}
	if n, _ := rc.Get(context.Background(), windowKey(c.Key, clk.Now(), time.Second)).Int(); n != 5 {
		t.Errorf("the window counts %d, want 5 (1+3 and 1, the denial taken back)", n)
	}
	if route := s.Routes(); route[RoutePlainScript] != 1 || route[RoutePlain] != 2 {
		t.Errorf("routes %v, want 2 plain and 1 plain then script", route)
	}
}

// TestPreviousCountReadOnce: a sliding window reads its previous window's
// count once per key and window (a GET riding with the first INCRBY), then
// decides from the kept count; a refund that reads the previous key drops
// it, since it may lower it; the script, given the count, names one key.
func TestPreviousCountReadOnce(t *testing.T) {
	clk := testkit.NewClock(time.UnixMicro(t0 + 400_000))
	s, srv := newStore(t, clk.Now)
	rc := srv.Client()
	defer rc.Close()
	ctx := context.Background()
	c := store.Check{Key: "rl:{prev}:s", Limit: 100, Window: time.Second, Hits: 1}
	if err := rc.Set(ctx, windowKey(c.Key, clk.Now().Add(-time.Second), time.Second), 82, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	gets := func() int64 { return srv.CommandStats(ctx)["get"] }
	before := gets()
	for i, want := range []uint64{50, 49, 48} { // ceil(100 - 82 × 0.6 - i) - 1
		if r := decide(t, s, c)[0]; !r.Allowed || r.Remaining != want {
			t.Fatalf("call %d: %+v, want allowed with %d left", i+1, r, want)
		}
	}
	if n := gets() - before; n != 1 {
		t.Errorf("%d GETs for three calls in one window, want 1", n)
	}
	// A refund goes by the script, which reads the previous key itself.
	refund := c
	refund.Refund = true
	decide(t, s, refund)
	before = gets()
	if r := decide(t, s, c)[0]; !r.Allowed || r.Remaining != 48 {
		t.Errorf("after a refund: %+v, want allowed with 48 left", r)
	}
	if n := gets() - before; n != 1 {
		t.Errorf("%d GETs after a refund, want 1 (the kept count dropped)", n)
	}
	// Near the limit the script decides, given the count: one key.
	c.Exact = true
	evals := func() int64 { st := srv.CommandStats(ctx); return st["fcall"] + st["evalsha"] }
	before, e := gets(), evals()
	if r := decide(t, s, c)[0]; !r.Allowed || r.Remaining != 47 {
		t.Errorf("by script: %+v, want allowed with 47 left", r)
	}
	if n := gets() - before; n != 1 || evals()-e != 1 { // the script's GET of its window key only
		t.Errorf("the script call read %d keys in %d calls, want 1 key in 1 call", n, evals()-e)
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
		s, err := New(Options{Client: urlClient(t, redisclient.Options{URL: srv.URL(), Timeout: timeout}), CloseClient: true, Timeout: timeout})
		if err != nil {
			t.Fatalf("New with Redis down: %v", err)
		}
		defer s.Close()
		for range 3 {
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
			s, err := New(Options{Client: urlClient(t, redisclient.Options{URL: srv.URL(), Timeout: timeout}), CloseClient: true, Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Decide(ctx, check, make([]store.Result, 1)); err != nil {
				t.Fatal(err)
			}
			tc.fault(srv)
			for range 3 {
				expectUnavailable(t, s, check, timeout)
			}
			srv.Resume()
		})
	}
}

func expectUnavailable(t *testing.T, s *Store, checks []store.Check, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	res := make([]store.Result, len(checks))
	err := s.Decide(context.Background(), checks, res)
	took := time.Since(start)
	if !errors.Is(err, store.ErrUnavailable) || !res[0].Undecided {
		t.Errorf("Decide = %+v, %v; want Undecided and an error wrapping store.ErrUnavailable", res[0], err)
	}
	if took > timeout+2*time.Second { // the timeout, give or take a busy machine
		t.Errorf("Decide took %v with a %v timeout", took, timeout)
	}
}

// TestConcurrentExact checks atomicity under contention, by plain commands
// and by script: 20 goroutines deciding pairs of 1-hit checks of one key
// get exactly the pairs that fit in the limit, and single hits exactly the
// limit.
func TestConcurrentExact(t *testing.T) {
	s, _ := newStore(t, nil)
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, alg := range []store.Algorithm{store.SlidingWindow, store.TokenBucket, store.FixedWindow} {
		for _, size := range []int{1, 2} {
			t.Run(alg.String()+"/"+strconv.Itoa(size), func(t *testing.T) {
				check := store.Check{Key: "rl:{conc}:" + alg.String() + strconv.Itoa(size), Algorithm: alg, Limit: 137, Window: time.Hour, Hits: 1}
				batch := []store.Check{check, check}[:size]
				var allowed atomic.Int64
				var wg sync.WaitGroup
				for range 20 {
					wg.Go(func() {
						res := make([]store.Result, size)
						for range 10 {
							if err := s.Decide(context.Background(), batch, res); err != nil {
								t.Error(err)
								return
							}
							if res[0].Allowed && res[size-1].Allowed {
								allowed.Add(int64(size))
							}
						}
					})
				}
				wg.Wait()
				if got, want := allowed.Load(), int64(137/size*size); got != want {
					t.Errorf("%d hits allowed, want %d", got, want)
				}
			})
		}
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
	if err := s.Delete(ctx, c, store.Check{Key: "rl:{other}:missing", Window: time.Second}); err != nil {
		t.Fatal(err)
	}
	rc := srv.Client()
	defer rc.Close()
	if n, _ := rc.DBSize(ctx).Result(); n != 0 {
		t.Errorf("Delete left %d keys", n)
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
