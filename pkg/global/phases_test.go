package global

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestTableRoundPhases: a round's phases (the mark at the interval's
// boundary, the publish a quarter into it, the grant half into it) fall on
// the global store's clock, and a phase that just ran (its timer a little
// early) is not run again in the same interval.
func TestTableRoundPhases(t *testing.T) {
	tb := NewTable(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), Settings{Region: "eu", Replica: "p1"}, nil)
	defer tb.client.Close()
	base := time.Unix(1_800_000_000, 0)
	const ms = time.Millisecond
	for _, c := range []struct {
		name        string
		now, off    time.Duration // local time into the second; the global clock's lead
		phase, want time.Duration
	}{
		{"the boundary, from it", 0, 0, 0, 1000 * ms},
		{"the publish, from the boundary", 0, 0, 250 * ms, 250 * ms},
		{"the grant, from the boundary", 0, 0, 500 * ms, 500 * ms},
		{"the grant, from the publish", 250 * ms, 0, 500 * ms, 250 * ms},
		{"the boundary, from the grant", 500 * ms, 0, 0, 500 * ms},
		{"the publish, its timer 1 ms early", 249 * ms, 0, 250 * ms, 1001 * ms},
		{"the publish, its timer 1 ms late", 251 * ms, 0, 250 * ms, 999 * ms},
		{"the publish, the global clock 100 ms ahead", 0, 100 * ms, 250 * ms, 150 * ms},
		{"the boundary, the global clock 100 ms behind", 200 * ms, -100 * ms, 0, 900 * ms},
		{"the boundary 50 ms away (a start): the next one", 50 * ms, -100 * ms, 0, 1050 * ms},
	} {
		tb.now = func() time.Time { return base.Add(c.now) }
		tb.clock.Store(&clockFix{off: c.off.Microseconds(), err: 1000})
		if got := tb.until(c.phase); got != c.want {
			t.Errorf("%s: until(%v) at %v = %v, want %v", c.name, c.phase, c.now, got, c.want)
		}
	}
}
