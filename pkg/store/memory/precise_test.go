package memory_test

import (
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// TestPreciseWindow follows one key of precision 10 (10 a second) by hand:
// the oldest sub-window's weight runs down over its tenth of a second, and
// RetryAfter is when it has run down far enough.
func TestPreciseWindow(t *testing.T) {
	t0 := time.Unix(1_751_540_400, 0) // a whole second
	clk := testkit.NewClock(t0.Add(50 * time.Millisecond))
	m := memory.New(clockOpts(clk, 100))
	c := store.Check{Key: "rl:{p}:s1p10", Limit: 10, Window: time.Second, Precision: 10, Hits: 10}
	if r := decide(t, m, c)[0]; !r.Allowed || r.Remaining != 0 {
		t.Fatalf("10 hits at 0.05 s: %+v", r)
	}
	c.Hits = 1
	clk.Set(t0.Add(950 * time.Millisecond))
	// At 1.0 s the 10 hits of sub-window 0 weigh 1 (rate 10); a microsecond
	// later a little less, and one hit passes: 50.001 ms from 0.95 s.
	if r := decide(t, m, c)[0]; r.Allowed || r.RetryAfter != 50001*time.Microsecond || r.Reset != 50*time.Millisecond {
		t.Fatalf("at 0.95 s: %+v, want denied, RetryAfter 50.001ms, Reset 50ms", r)
	}
	clk.Set(t0.Add(time.Second + 50*time.Millisecond))
	// Half of sub-window 0 is still inside the trailing second: rate 5.
	c.Hits = 0
	if r := decide(t, m, c)[0]; !r.Allowed || r.Remaining != 5 {
		t.Fatalf("at 1.05 s: %+v, want 5 remaining", r)
	}
	// From 1.1 s on, the trailing second holds none of them.
	clk.Set(t0.Add(time.Second + 100*time.Millisecond))
	if r := decide(t, m, c)[0]; !r.Allowed || r.Remaining != 10 {
		t.Fatalf("at 1.1 s: %+v, want 10 remaining", r)
	}

	// A refund larger than the newest sub-window's count takes the rest
	// from the ones before it, newest first, and is never owed.
	k := store.Check{Key: "rl:{p}:s1p10|b", Limit: 10, Window: time.Second, Precision: 10, Hits: 3}
	clk.Set(t0.Add(2 * time.Second))
	decide(t, m, k)
	clk.Set(t0.Add(2*time.Second + 150*time.Millisecond))
	decide(t, m, k)
	k.Refund, k.Hits = true, 5
	if r := decide(t, m, k)[0]; !r.Allowed || r.Remaining != 9 {
		t.Fatalf("refund of 5 after 3 + 3: %+v, want 9 remaining", r)
	}
	k.Hits = 100
	if r := decide(t, m, k)[0]; r.Remaining != 10 {
		t.Fatalf("huge refund: %+v, want 10 remaining", r)
	}
}
