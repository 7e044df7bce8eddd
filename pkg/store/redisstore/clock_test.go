package redisstore

import (
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
