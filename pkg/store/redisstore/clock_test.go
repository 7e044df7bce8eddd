package redisstore

import (
	"context"
	"github.com/redis/go-redis/v9"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// TestClockBounds holds docs/redis.md's invariant 4: a TIME reply bounds
// Redis's clock between its round trip's ends, widened by 0.1 % of the time
// since; an old or wide measurement is not used, a stepped clock replaces
// the held one, and plain commands are not planned within boundaryMargin
// of a window's end.
func TestClockBounds(t *testing.T) {
	var c clock
	if _, _, ok := c.bounds(1); ok || !c.stale(1) {
		t.Fatal("an unmeasured clock is used")
	}
	const redis = int64(1_765_000_000_000_000) // Redis's time at local 150
	c.observe(redis, 100, 150)
	if lo, hi, ok := c.bounds(150); !ok || lo != redis-1 || hi != redis+51 {
		t.Errorf("bounds at the measurement = %d, %d, %v; want %d, %d", lo-redis, hi-redis, ok, -1, 51)
	}
	if c.stale(150 + (clockAge / 2).Microseconds()) {
		t.Error("stale within half clockAge")
	}
	if !c.stale(151 + (clockAge / 2).Microseconds()) {
		t.Error("not stale after half clockAge")
	}
	l := int64(150 + 1_000_000) // a second later: widened by 1 ms (and 1 µs)
	if lo, hi, ok := c.bounds(l); !ok || lo != redis+1_000_000-1_001 || hi != redis+1_000_000+50+1_001 {
		t.Errorf("bounds a second later = %d, %d, %v", lo-redis-1_000_000, hi-redis-1_000_000, ok)
	}
	if _, _, ok := c.bounds(151 + 10*clockAge.Microseconds()); ok {
		t.Error("a measurement older than 10 clockAge is used")
	}
	c.observe(redis+5_000_000, 200, 210) // the clock stepped 5 s ahead
	if lo, _, ok := c.bounds(210); !ok || lo < redis+5_000_000-11 {
		t.Errorf("a stepped clock kept the old bounds: lo %d", lo-redis)
	}
	var w clock
	w.observe(redis, 0, clockWidth.Microseconds()+1)
	if _, _, ok := w.bounds(clockWidth.Microseconds() + 1); ok {
		t.Error("a measurement wider than clockWidth is used")
	}

	var s Store
	checks := []store.Check{{Key: "k", Algorithm: store.FixedWindow, Window: time.Second, Limit: 1, Hits: 1}}
	end := int64(1_765_000_001_000_000) // a window's end, µs
	if _, ok := s.planPlain(checks, end-3_000, end-boundaryMargin.Microseconds()-1); !ok {
		t.Error("plain commands refused before the margin")
	}
	if _, ok := s.planPlain(checks, end-3_000, end-boundaryMargin.Microseconds()); ok {
		t.Error("plain commands planned within boundaryMargin of the window's end")
	}
}

// TestCountSpan: a global rule's span (pkg/global's RegionClock) runs from
// the key's node's clock's low bound now to its high bound at the call's
// deadline, else at the store's timeout; there is none while the node's
// clock is unmeasured.
func TestCountSpan(t *testing.T) {
	s, err := New(Options{Client: redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), CloseClient: true, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, _, ok := s.CountSpan("k", time.Time{}); ok {
		t.Fatal("a span from an unmeasured clock")
	}
	n, err := s.node(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	const ahead = 3 * time.Second // Redis's clock, against this one
	sent := localUS()
	n.clock.observe(time.Now().Add(ahead).UnixMicro(), sent, sent+1000) // a 1 ms round trip
	redisNow := func() time.Time { return time.Now().Add(ahead) }
	for _, c := range []struct {
		deadline time.Time
		width    time.Duration
	}{{time.Now().Add(20 * time.Millisecond), 20 * time.Millisecond}, {time.Time{}, 50 * time.Millisecond}} {
		before := redisNow()
		from, to, ok := s.CountSpan("k", c.deadline)
		if !ok {
			t.Fatalf("deadline %v: no span from a measured clock", c.deadline)
		}
		// The span starts at Redis's time now (within the 1 ms round trip
		// and this test's own delay) and is the call's bound wide.
		if from.After(redisNow()) || from.Before(before.Add(-time.Second)) {
			t.Errorf("deadline %v: span from %v, want Redis's time now, about %v", c.deadline, from, before)
		}
		least := c.width // no deadline: the store's timeout, exactly
		if !c.deadline.IsZero() {
			least = time.Until(c.deadline) // less than when CountSpan read it
		}
		if w := to.Sub(from); w < least || w > c.width+2*time.Millisecond {
			t.Errorf("deadline %v: span %v wide, want about %v (the call's bound and the 1 ms round trip)", c.deadline, w, c.width)
		}
	}
}
