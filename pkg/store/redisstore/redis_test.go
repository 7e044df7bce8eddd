//go:build redis

package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// t0 is a realistic "now" (2025-07-03T10:20:00Z) in microseconds, on a
// boundary of every window up to an hour.
const t0 = int64(1751538000) * 1_000_000

// newStore starts a redis-server and returns a store on it using the test
// clock (nil: Redis TIME), with a generous timeout so -race runs do not flake.
func newStore(t *testing.T, now func() time.Time) (*Store, *redistest.Server) {
	t.Helper()
	srv := redistest.StartServer(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	return mustNew(t, Options{Client: c, Timeout: time.Second, Clock: now}), srv
}

// mustNew returns New(o), closed when the test ends.
func mustNew(t testing.TB, o Options) *Store {
	t.Helper()
	s, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func decide(t *testing.T, s store.Store, checks ...store.Check) []store.Result {
	t.Helper()
	res := make([]store.Result, len(checks))
	if err := s.Decide(context.Background(), checks, res); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return res
}

// TestMatchesMemory runs random batches against the Redis store and the
// memory store with one shared clock and requires identical results: the
// Lua script and memory.go implement store.go's arithmetic bit for bit.
func TestMatchesMemory(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 42))
			clk := testkit.NewClock(time.UnixMicro(t0 + rng.Int64N(10_000_000)))
			rs, _ := newStore(t, clk.Now)
			ms := memory.New(memory.Options{Now: clk.Now})

			// Each key keeps one algorithm, limit and window (a changed
			// one is a different key in rls).
			type cfg struct {
				alg                  store.Algorithm
				limit, burst, window uint64
			}
			keys := make([]string, 6)
			cfgs := make([]cfg, len(keys))
			for i := range keys {
				c := cfg{
					alg:    store.Algorithm(rng.IntN(3)),
					limit:  []uint64{1, 2, 3, 5, 10, 100, 7919}[rng.IntN(7)],
					window: []uint64{1, 1, 2, 3, 60}[rng.IntN(5)],
				}
				if c.alg == store.TokenBucket {
					c.burst = []uint64{0, 0, 1, 4, 50}[rng.IntN(5)]
					if rng.IntN(20) == 0 {
						c.limit = 0
					}
				}
				prefix := "rl"
				if c.alg == store.TokenBucket {
					prefix = "tb"
				}
				keys[i], cfgs[i] = fmt.Sprintf("%s:{tenant%d}:k%d", prefix, seed, i), c
			}
			ctx := context.Background()
			for step := 0; step < 1500; step++ {
				switch rng.IntN(10) {
				case 0: // a big jump, possibly past TTLs
					clk.Advance(time.Duration(rng.Int64N(200_000_000)) * time.Microsecond)
				case 1: // to just before or exactly at the next second
					now := clk.Now().UnixMicro()
					clk.Set(time.UnixMicro((now/1_000_000+1)*1_000_000 - rng.Int64N(2)))
				default:
					clk.Advance(time.Duration(rng.Int64N(300_000)) * time.Microsecond)
				}
				n := 1 + rng.IntN(4)
				checks := make([]store.Check, n)
				for i := range checks {
					k := rng.IntN(len(keys))
					c := cfgs[k]
					checks[i] = store.Check{
						Key: keys[k], Algorithm: c.alg, Limit: c.limit, Burst: c.burst,
						Window: time.Duration(c.window) * time.Second,
						Hits:   uint64(rng.IntN(4)),
						Refund: rng.IntN(8) == 0,
						Shadow: rng.IntN(8) == 0,
					}
					if rng.IntN(10) == 0 {
						checks[i].Hits = c.limit + uint64(rng.IntN(3))
					}
					if rng.IntN(3) == 0 { // a lease
						checks[i].Want = uint64(rng.IntN(int(c.limit) + 2))
						checks[i].Horizon = time.Duration(rng.IntN(3)) * time.Duration(rng.Int64N(int64(c.window)*1e6)) * time.Microsecond
					}
					checks[i].Exact = rng.IntN(4) == 0
				}
				peek := rng.IntN(10) == 0
				got := make([]store.Result, n)
				want := make([]store.Result, n)
				var gerr, werr error
				if peek {
					gerr, werr = rs.Peek(ctx, checks, got), ms.Peek(ctx, checks, want)
				} else {
					gerr, werr = rs.Decide(ctx, checks, got), ms.Decide(ctx, checks, want)
				}
				if gerr != nil || werr != nil {
					t.Fatalf("step %d: redis err %v, memory err %v", step, gerr, werr)
				}
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("step %d (peek %v, now %d) check %d %+v:\nredis  %+v\nmemory %+v\nbatch %+v",
							step, peek, clk.Now().UnixMicro(), i, checks[i], got[i], want[i], checks)
					}
				}
			}
			// Every route was taken: plain commands, plain commands then
			// the script, and the script alone.
			if r := rs.Routes(); r[RoutePlain] == 0 || r[RoutePlainScript] == 0 || r[RouteScript] == 0 {
				t.Errorf("routes taken %v: want each of plain, plain then script, script", r)
			}
		})
	}
}
