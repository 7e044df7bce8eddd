package logthrottle

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/testkit"
)

func TestAllowOncePerInterval(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1000, 0))
	th := New(10*time.Second, clk.Now)
	if held, ok := th.Allow(); !ok || held != 0 {
		t.Fatalf("first event: held %d ok %v, want 0 true", held, ok)
	}
	for range 5 {
		clk.Advance(time.Second)
		if _, ok := th.Allow(); ok {
			t.Fatal("an event within the interval was let through")
		}
	}
	if _, ok := th.AllowN(3); ok {
		t.Fatal("a batch within the interval was let through")
	}
	clk.Advance(5 * time.Second) // 10 s after the first
	if held, ok := th.Allow(); !ok || held != 8 {
		t.Fatalf("after the interval: held %d ok %v, want 8 true", held, ok)
	}
	if th.Interval() != 10*time.Second {
		t.Fatalf("interval %v", th.Interval())
	}
}

func TestAllowRaceLetsOneThrough(t *testing.T) {
	th := New(time.Hour, nil)
	var through atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 100 {
				if _, ok := th.Allow(); ok {
					through.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if through.Load() != 1 {
		t.Fatalf("%d events through in one interval, want 1", through.Load())
	}
	th.mu.Lock()
	got := th.held
	th.mu.Unlock()
	if got != 1599 {
		t.Fatalf("held %d, want 1599", got)
	}
}
