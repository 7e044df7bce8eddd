package testkit

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestEventually(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 3 {
			n.Add(1)
		}
	}()
	if !Eventually(10*time.Second, func() bool { return n.Load() == 3 }) {
		t.Fatalf("n = %d, want 3", n.Load())
	}
	calls := 0
	if Eventually(20*time.Millisecond, func() bool { calls++; return false }) {
		t.Fatal("a condition that never holds was reported as holding")
	}
	if calls < 2 {
		t.Fatalf("cond evaluated %d times, want the first and at least the last at the deadline", calls)
	}
}

type fakeT struct{ failed string }

func (f *fakeT) Helper()                           {}
func (f *fakeT) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

func TestWaitForNamesWhat(t *testing.T) {
	var f fakeT
	WaitFor(&f, "the thing", time.Millisecond, func() bool { return false })
	if f.failed != "the thing: not within 1ms" {
		t.Fatalf("failure = %q", f.failed)
	}
	f = fakeT{}
	WaitFor(&f, "the thing", time.Millisecond, func() bool { return true })
	if f.failed != "" {
		t.Fatalf("a condition that holds failed: %q", f.failed)
	}
}

func TestWaitForEvery(t *testing.T) {
	var f fakeT
	calls := 0
	WaitForEvery(&f, "the thing", 100*time.Millisecond, 40*time.Millisecond, func() bool { calls++; return false })
	if f.failed != "the thing: not within 100ms" {
		t.Fatalf("failure = %q", f.failed)
	}
	// Once at once, on the 40 ms ticks (twice; a late goroutine may find
	// a tick and the deadline both due), and at the deadline: far fewer
	// than the 20 or so of PollEvery.
	if calls < 2 || calls > 10 {
		t.Fatalf("cond evaluated %d times in 100 ms at a 40 ms interval, want 2 to 10", calls)
	}
	f = fakeT{}
	WaitForEvery(&f, "the thing", time.Millisecond, time.Hour, func() bool { return true })
	if f.failed != "" {
		t.Fatalf("a condition that holds failed: %q", f.failed)
	}
}

func TestBufferConcurrent(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if b.Len() != 800 {
		t.Fatalf("len = %d, want 800", b.Len())
	}
	b.Reset()
	if b.String() != "" {
		t.Fatal("reset kept data")
	}
}

func TestClock(t *testing.T) {
	start := time.Unix(1_751_540_400, 0)
	c := NewClock(start)
	if !c.Now().Equal(start) {
		t.Fatalf("now = %v", c.Now())
	}
	if got := c.Advance(1500 * time.Millisecond); !got.Equal(start.Add(1500 * time.Millisecond)) {
		t.Fatalf("advance = %v", got)
	}
	c.Set(start)
	if !c.Now().Equal(start) {
		t.Fatalf("set: now = %v", c.Now())
	}
	var z Clock
	if z.Now().UnixNano() != 0 {
		t.Fatal("zero clock is not the epoch")
	}
}

func TestClockAfter(t *testing.T) {
	c := NewClock(time.Unix(1_751_540_400, 0))
	ch := c.After(time.Second)
	if c.Waiters() != 1 {
		t.Fatalf("waiters = %d, want 1", c.Waiters())
	}
	c.Advance(999 * time.Millisecond)
	select {
	case <-ch:
		t.Fatal("fired before its time")
	default:
	}
	want := c.Advance(time.Millisecond)
	select {
	case got := <-ch:
		if !got.Equal(want) {
			t.Fatalf("fired with %v, want %v", got, want)
		}
	default:
		t.Fatal("not fired at its time")
	}
	if c.Waiters() != 0 {
		t.Fatalf("waiters = %d after firing, want 0", c.Waiters())
	}
	select {
	case <-c.After(0):
	default:
		t.Fatal("After(0) did not fire at once")
	}
}

// TestClockStallNext: the stalled call returns what it read, once
// released; other calls meanwhile, and later ones, do not stall.
func TestClockStallNext(t *testing.T) {
	start := time.Unix(1_751_540_400, 0)
	c := NewClock(start)
	read, release := c.StallNext()
	got := make(chan time.Time, 1)
	go func() { got <- c.Now() }()
	<-read
	c.Advance(time.Second)
	if now := c.Now(); !now.Equal(start.Add(time.Second)) {
		t.Fatalf("a call while one stalls read %v", now)
	}
	select {
	case <-got:
		t.Fatal("the stalled call returned before its release")
	default:
	}
	release()
	if r := <-got; !r.Equal(start) {
		t.Errorf("the stalled call returned %v, want what it read, %v", r, start)
	}
	if now := c.Now(); !now.Equal(start.Add(time.Second)) {
		t.Errorf("after the release: %v", now)
	}
}
