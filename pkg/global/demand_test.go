package global

import (
	"testing"
	"time"
)

// TestDemandRate: a steady demand is measured over the whole interval; a
// quarter far from its share of the interval (a shift, up or down) is
// followed at once.
func TestDemandRate(t *testing.T) {
	for _, c := range []struct {
		name         string
		hits, recent uint64
		want         uint64
	}{
		{"steady 150/s, a quarter at its mean", 150, 37, 150},
		{"steady 150/s, a quarter 2 sd high", 150, 49, 150},
		{"steady 150/s, a quarter 2 sd low", 150, 25, 150},
		{"600/s fell to 150/s at the boundary", 488, 38, 152},
		{"150/s rose to 600/s at the boundary", 262, 150, 600},
		{"a new key: every hit in the quarter", 40, 40, 160},
		{"no hits", 0, 0, 0},
		{"one hit, in the quarter", 1, 1, 1},
	} {
		if got := demandRate(c.hits, c.recent, time.Second, time.Second); got != c.want {
			t.Errorf("%s: demandRate(%d, %d) = %d, want %d", c.name, c.hits, c.recent, got, c.want)
		}
	}
	// A minute's window: the rate per window, not per second.
	if got := demandRate(100, 25, time.Second, time.Minute); got != 6000 {
		t.Errorf("100 hits a second, a minute's window: %d, want 6000", got)
	}
}
