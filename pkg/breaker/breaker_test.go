package breaker

import (
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestBreakerCycle(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	var changes []string
	b := New(Options{Threshold: 3, Cooldown: time.Second, Probes: 1, Now: clk.Now,
		OnChange: func(from, to State) { changes = append(changes, from.String()+">"+to.String()) }})

	// Failures below the threshold, interrupted by a success, keep it closed.
	for _, ok := range []bool{false, false, true, false, false} {
		if !b.Allow() {
			t.Fatal("closed breaker refused a call")
		}
		b.Done(ok)
	}
	if b.State() != Closed {
		t.Fatalf("state %v after 2 consecutive failures, want closed", b.State())
	}
	b.Allow()
	b.Done(false) // third consecutive failure
	if b.State() != Open {
		t.Fatalf("state %v, want open", b.State())
	}
	if b.Allow() {
		t.Fatal("open breaker allowed a call before its cooldown")
	}
	clk.Add(time.Second)
	if !b.Allow() {
		t.Fatal("no probe after the cooldown")
	}
	if b.Allow() {
		t.Fatal("second concurrent probe allowed with Probes 1")
	}
	b.Done(false) // the probe failed: open again for a new cooldown
	if b.State() != Open || b.Allow() {
		t.Fatalf("state %v after a failed probe, want open and refusing", b.State())
	}
	clk.Add(time.Second)
	if !b.Allow() {
		t.Fatal("no probe after the second cooldown")
	}
	b.Done(true)
	if b.State() != Closed || !b.Allow() {
		t.Fatalf("state %v after a successful probe, want closed", b.State())
	}
	b.Done(true)
	want := []string{"closed>open", "open>half_open", "half_open>open", "open>half_open", "half_open>closed"}
	if len(changes) != len(want) {
		t.Fatalf("changes %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Fatalf("changes %v, want %v", changes, want)
		}
	}
}

func TestBreakerConcurrent(t *testing.T) {
	b := New(Options{Threshold: 2, Cooldown: time.Millisecond})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 1000 {
				if b.Allow() {
					b.Done((i+j)%3 == 0)
				}
			}
		})
	}
	wg.Wait()
}
