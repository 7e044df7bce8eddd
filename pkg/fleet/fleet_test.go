package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/testkit"

	"github.com/rls-project/rls/pkg/store"
)

func TestFleetKeepsLastSizeOnError(t *testing.T) {
	n, fail := 3, false
	f := New(Options{Beat: func(context.Context) (int, error) {
		if fail {
			return 0, store.ErrUnavailable
		}
		return n, nil
	}, Interval: time.Second})
	if f.Size() != 1 || known(f) {
		t.Fatalf("initial size %d, known %v", f.Size(), known(f))
	}
	if err := f.Beat(context.Background()); err != nil || f.Size() != 3 || !known(f) {
		t.Fatalf("size %d, err %v", f.Size(), err)
	}
	fail = true
	if err := f.Beat(context.Background()); err == nil || f.Size() != 3 {
		t.Fatalf("size %d after a failed beat, want 3 kept", f.Size())
	}
	if Fixed(4).Size() != 4 || !known(Fixed(4)) {
		t.Fatal("fixed size not kept")
	}
}

// A smaller count (a Redis that restarted empty, a replica that left) is
// believed only once the larger one has not been seen for the hold time.
func TestFleetShrinksOnlyAfterHold(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	n := 3
	f := New(Options{Beat: func(context.Context) (int, error) { return n, nil },
		Interval: 2 * time.Second, Hold: 6 * time.Second, Now: clk.Now})
	ctx := context.Background()
	_ = f.Beat(ctx)
	n = 1 // Redis restarted: only this replica's beat so far
	for range 2 {
		clk.Advance(2 * time.Second)
		_ = f.Beat(ctx)
		if f.Size() != 3 {
			t.Fatalf("size %d within the hold time, want 3", f.Size())
		}
	}
	n = 3 // the others beat again
	clk.Advance(2 * time.Second)
	_ = f.Beat(ctx)
	n = 2 // one left for good
	for range 2 {
		clk.Advance(2 * time.Second)
		_ = f.Beat(ctx)
	}
	if f.Size() != 3 {
		t.Fatalf("size %d 4 s after the drop, want 3", f.Size())
	}
	clk.Advance(2 * time.Second)
	_ = f.Beat(ctx)
	if f.Size() != 2 {
		t.Fatalf("size %d 6 s after the drop, want 2", f.Size())
	}
	n = 5
	_ = f.Beat(ctx)
	if f.Size() != 5 {
		t.Fatalf("size %d, a larger count is taken at once", f.Size())
	}
}

// Min floors a learned size and stands until the first beat succeeds.
func TestFleetMin(t *testing.T) {
	n := 1
	f := New(Options{Beat: func(context.Context) (int, error) { return n, nil }, Min: 2})
	if f.Size() != 2 {
		t.Fatalf("size before a beat %d, want the minimum 2", f.Size())
	}
	_ = f.Beat(context.Background())
	if f.Size() != 2 {
		t.Fatalf("one heartbeat counted: size %d, want the minimum 2", f.Size())
	}
	n = 4
	_ = f.Beat(context.Background())
	if f.Size() != 4 {
		t.Fatalf("size %d, want 4", f.Size())
	}
}

// known reports whether f's size is fixed or has been learned at least once.
func known(f *Fleet) bool {
	if f.beat == nil {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.known
}

// An outage longer than the hold does not count toward it: the first
// beats into a Redis that restarted empty see fewer replicas, and the size
// holds for the hold time after the store answers again (the integration
// test TestFaultFleetSizeFromHeartbeats saw it shrink when Redis took
// longer than the hold to come back).
func TestFleetHoldRestartsAfterOutage(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	n, fail := 3, false
	f := New(Options{Beat: func(context.Context) (int, error) {
		if fail {
			return 0, store.ErrUnavailable
		}
		return n, nil
	}, Interval: 2 * time.Second, Hold: 6 * time.Second, Now: clk.Now})
	ctx := context.Background()
	_ = f.Beat(ctx)
	fail = true
	for range 5 { // 10 s down, longer than the hold
		clk.Advance(2 * time.Second)
		_ = f.Beat(ctx)
	}
	fail, n = false, 1 // back, empty: only this replica's beat so far
	for range 2 {
		clk.Advance(2 * time.Second)
		if _ = f.Beat(ctx); f.Size() != 3 {
			t.Fatalf("size %d within the hold after the outage, want 3", f.Size())
		}
	}
	clk.Advance(6 * time.Second) // the others never came back
	if _ = f.Beat(ctx); f.Size() != 1 {
		t.Fatalf("size %d a hold after the outage without the others, want 1", f.Size())
	}
}
