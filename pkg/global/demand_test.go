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
		shift        bool
	}{
		{"steady 150/s, a quarter at its mean", 150, 37, 150, false},
		{"steady 150/s, a quarter 2 sd high", 150, 49, 150, false},
		{"steady 150/s, a quarter 2 sd low", 150, 25, 150, false},
		{"600/s fell to 150/s at the boundary", 488, 38, 152, true},
		{"150/s rose to 600/s at the boundary", 262, 150, 600, true},
		{"a new key: every hit in the quarter", 40, 40, 160, true},
		{"no hits", 0, 0, 0, false},
		{"one hit, in the quarter", 1, 1, 1, false},
	} {
		if got, shift := demandRate(c.hits, c.recent, time.Second, time.Second); got != c.want || shift != c.shift {
			t.Errorf("%s: demandRate(%d, %d) = %d, shift %v; want %d, shift %v", c.name, c.hits, c.recent, got, shift, c.want, c.shift)
		}
	}
	// A minute's window: the rate per window, not per second.
	if got, _ := demandRate(100, 25, time.Second, time.Minute); got != 6000 {
		t.Errorf("100 hits a second, a minute's window: %d, want 6000", got)
	}
}
