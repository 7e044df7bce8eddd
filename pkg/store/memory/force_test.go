package memory_test

import (
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/store/storetest"
	"github.com/rls-project/rls/pkg/testkit"
)

// The conformance vectors (storetest's "force/...") pin Force's arithmetic
// and batch semantics; these tests cover what is the memory store's own.

func forced(c store.Check) store.Check { c.Force = true; return c }

// algChecks returns a check of key for each algorithm: limit 5 per second,
// hits hits.
func algChecks(key string, hits uint64) []store.Check {
	return []store.Check{
		{Key: key, Algorithm: store.SlidingWindow, Limit: 5, Window: time.Second, Hits: hits},
		{Key: key, Algorithm: store.FixedWindow, Limit: 5, Window: time.Second, Hits: hits},
		{Key: key, Algorithm: store.TokenBucket, Limit: 5, Window: time.Second, Hits: hits},
	}
}

// TestMemoryForcePeekWritesNothing: Peek treats a Force check as check-only.
func TestMemoryForcePeekWritesNothing(t *testing.T) {
	for _, c := range algChecks("k", 3) {
		t.Run(c.Algorithm.String(), func(t *testing.T) {
			clk := testkit.NewClock(storetest.T0)
			m := memory.New(clockOpts(clk, 0))
			checkOnly := c
			checkOnly.Hits = 0
			want := peek(t, m, checkOnly)[0]
			if got := peek(t, m, forced(c))[0]; got != want {
				t.Errorf("Peek of a force: %+v, want the check-only %+v", got, want)
			}
			if n := m.Len(); n != 0 {
				t.Errorf("Len() = %d after Peek, want 0", n)
			}
			if got := decide(t, m, checkOnly)[0]; got != want {
				t.Errorf("after Peek: %+v, want %+v", got, want)
			}
		})
	}
}

// TestMemoryForceSaturates forces more hits than an int64 counts: the count
// stays at its maximum instead of wrapping to a negative count (a huge
// budget).
func TestMemoryForceSaturates(t *testing.T) {
	for _, c := range algChecks("k", 1<<62) {
		t.Run(c.Algorithm.String(), func(t *testing.T) {
			clk := testkit.NewClock(storetest.T0)
			m := memory.New(clockOpts(clk, 0))
			for i := 0; i < 3; i++ {
				if got := decide(t, m, forced(c))[0]; !got.Allowed || got.Remaining != 0 {
					t.Fatalf("force %d: %+v, want allowed with Remaining 0", i, got)
				}
			}
			one := c
			one.Hits = 1
			if got := decide(t, m, one)[0]; got.Allowed || got.Remaining != 0 || got.RetryAfter <= 0 {
				t.Errorf("a hit after the forces: %+v, want denied", got)
			}
		})
	}
}

// TestMemoryForceExpires: forced state has its algorithm's TTL.
func TestMemoryForceExpires(t *testing.T) {
	tests := []struct {
		check store.Check
		ttl   time.Duration // the package doc's TTL of state written at T0
	}{
		{algChecks("k", 9)[0], 2 * time.Second},
		{algChecks("k", 9)[1], time.Second},
		{algChecks("k", 9)[2], 2 * time.Second}, // ceil(B/r) = 1 s, plus 1 s
	}
	for _, tt := range tests {
		t.Run(tt.check.Algorithm.String(), func(t *testing.T) {
			clk := testkit.NewClock(storetest.T0)
			m := memory.New(clockOpts(clk, 0))
			decide(t, m, forced(tt.check))
			checkOnly := tt.check
			checkOnly.Hits = 0
			clk.Set(storetest.T0.Add(tt.ttl - time.Microsecond))
			decide(t, m, checkOnly)
			if n := m.Len(); n != 1 {
				t.Errorf("1 µs before the TTL: Len() = %d, want the forced key kept", n)
			}
			clk.Set(storetest.T0.Add(tt.ttl))
			if got := decide(t, m, checkOnly)[0]; got.Remaining != 5 {
				t.Errorf("at the TTL: %+v, want a fresh key (Remaining 5)", got)
			}
			if n := m.Len(); n != 0 {
				t.Errorf("Len() = %d, want the expired key reclaimed", n)
			}
		})
	}
}

// TestMemoryForceIsAWrite: a forced key becomes the most recently written,
// so the eviction at the cap passes it over.
func TestMemoryForceIsAWrite(t *testing.T) {
	clk := testkit.NewClock(storetest.T0)
	m := memory.New(clockOpts(clk, 3)) // one shard of 3 keys
	for _, k := range []string{"a", "b", "c"} {
		decide(t, m, sliding(k, 10, 1))
	}
	decide(t, m, forced(sliding("a", 10, 1)))
	decide(t, m, sliding("d", 10, 1)) // evicts b
	want := map[string]uint64{"a": 8, "b": 10, "c": 9, "d": 9}
	for k, w := range want {
		if got := peek(t, m, sliding(k, 10, 0))[0].Remaining; got != w {
			t.Errorf("%s: Remaining %d, want %d", k, got, w)
		}
	}
}

// TestMemoryDeadBucketWriteBack: a refund or a force of a token bucket with
// limit 0 neither reads nor writes state, so the key's state (here a
// sliding window's, a key whose configuration changed) is left as it was.
func TestMemoryDeadBucketWriteBack(t *testing.T) {
	dead := store.Check{Key: "k", Algorithm: store.TokenBucket, Window: time.Second, Hits: 2}
	refund := dead
	refund.Refund = true
	for _, c := range []store.Check{forced(dead), refund} {
		clk := testkit.NewClock(storetest.T0)
		m := memory.New(clockOpts(clk, 0))
		decide(t, m, sliding("k", 10, 3))
		if got := decide(t, m, c)[0]; got != (store.Result{Allowed: true}) {
			t.Errorf("%+v: %+v, want allowed, Remaining 0, Reset 0", c, got)
		}
		if got := peek(t, m, sliding("k", 10, 0))[0].Remaining; got != 7 {
			t.Errorf("%+v: the sliding state has Remaining %d after it, want 7", c, got)
		}
	}
}
