package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/store/storetest"
	"github.com/rls-project/rls/pkg/testkit"
)

// TestMemoryStalledClockNeverRewindsWindow stalls one request between its
// clock reading, 1 µs before a window boundary, and its locking of the key;
// meanwhile the key's limit is used up just past the boundary. The stalled
// request must be decided at the key's later time: denied, with the window
// not moved back (moving it back restarted the counters from zero and let
// about twice the limit through).
func TestMemoryStalledClockNeverRewindsWindow(t *testing.T) {
	const limit = 50
	tests := []struct {
		alg  store.Algorithm
		want uint64 // Remaining reported to the stalled request
	}{
		{store.SlidingWindow, 0},
		{store.FixedWindow, 0},
		{store.TokenBucket, 0},
	}
	for _, tt := range tests {
		t.Run(tt.alg.String(), func(t *testing.T) {
			before := storetest.T0.Add(time.Second - time.Microsecond)
			after := storetest.T0.Add(time.Second + time.Microsecond)
			clk := testkit.NewClock(before)
			m := memory.New(memory.Options{Now: clk.Now})
			check := []store.Check{{Key: "k", Algorithm: tt.alg, Limit: limit, Window: time.Second, Hits: 1}}

			read, release := clk.StallNext()
			stalled := make(chan store.Result, 1)
			go func() {
				res := make([]store.Result, 1)
				if err := m.Decide(context.Background(), check, res); err != nil {
					t.Error(err)
				}
				stalled <- res[0]
			}()
			<-read // the stalled request read "before" and holds no lock

			clk.Set(after)
			allowed := 0
			for i := 0; i < 2*limit; i++ {
				if decide(t, m, check...)[0].Allowed {
					allowed++
				}
			}
			release()
			r := <-stalled
			if r.Allowed {
				allowed++
			}
			if r.Allowed || r.Remaining != tt.want {
				t.Errorf("stalled request: %+v, want denied with Remaining %d", r, tt.want)
			} else if r.Reset <= time.Microsecond {
				t.Errorf("stalled request: Reset %v: decided in the earlier window", r.Reset)
			}
			for i := 0; i < 2*limit; i++ {
				if decide(t, m, check...)[0].Allowed {
					allowed++
				}
			}
			if allowed != limit {
				t.Errorf("%d allowed around the boundary, want %d", allowed, limit)
			}
		})
	}
}

// TestMemoryClockStepsBack steps the clock back across a window boundary
// (a wall clock corrected by NTP): a key is decided at the time of its last
// write, so its window is not rewound, while a key without state takes the
// clock as it is.
func TestMemoryClockStepsBack(t *testing.T) {
	clk := testkit.NewClock(storetest.T0.Add(time.Second + 200*time.Millisecond))
	m := memory.New(clockOpts(clk, 0))
	fixed := func(key string, hits uint64) store.Check {
		return store.Check{Key: key, Algorithm: store.FixedWindow, Limit: 3, Window: time.Second, Hits: hits}
	}
	decide(t, m, fixed("k", 3))
	clk.Set(storetest.T0.Add(900 * time.Millisecond)) // back into the previous window
	want := store.Result{Remaining: 0, RetryAfter: 800 * time.Millisecond, Reset: 800 * time.Millisecond}
	if got := decide(t, m, fixed("k", 1))[0]; got != want {
		t.Errorf("after the step back: %+v, want %+v", got, want)
	}
	if got := peek(t, m, fixed("k", 0))[0]; got != want {
		t.Errorf("Peek after the step back: %+v, want %+v", got, want)
	}
	fresh := store.Result{Allowed: true, Remaining: 2, Reset: 100 * time.Millisecond, Consumed: true}
	if got := decide(t, m, fixed("other", 1))[0]; got != fresh {
		t.Errorf("a fresh key: %+v, want %+v", got, fresh)
	}
}
