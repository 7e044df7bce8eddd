package gctune

import (
	"context"
	"log/slog"
	"runtime/debug"
	"strings"
	"testing"
)

func TestPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		percent int
		live    uint64
		want    int
	}{
		{400, 0, 400},          // nothing measured yet
		{400, 5 * mib, 400},    // 20 MiB extra: under the headroom
		{400, 16 * mib, 400},   // exactly 64 MiB extra
		{400, 32 * mib, 200},   // capped at 64 MiB extra
		{400, 128 * mib, 100},  // 50% would be under Go's default: floor
		{400, 4096 * mib, 100}, // large memory store: Go's default
		{50, 4096 * mib, 50},   // a lower starting point stands
		{100, 5 * mib, 100},
		{1000, 10 * mib, 640},
	} {
		if got := PercentFor(tc.percent, tc.live); got != tc.want {
			t.Errorf("PercentFor(%d, %d MiB) = %d, want %d", tc.percent, tc.live/mib, got, tc.want)
		}
	}
}

func TestWantedAndCheck(t *testing.T) {
	if !Wanted("", "") || Wanted("100", "") || Wanted("", "1GiB") {
		t.Error("Wanted: want true only with neither variable set")
	}
	for _, ok := range [][2]string{{"", ""}, {"off", "off"}, {"100", "512MiB"}, {"50", "1073741824"}, {"0", "2GiB"}, {"", "10B"}} {
		if err := Check(ok[0], ok[1]); err != nil {
			t.Errorf("Check(%q, %q): %v", ok[0], ok[1], err)
		}
	}
	for _, bad := range []struct{ gogc, limit, want string }{
		{"lots", "", `GOGC "lots" is invalid`},
		{"-5", "", `GOGC "-5" is invalid`},
		{"", "1GB", `GOMEMLIMIT "1GB" is invalid`},
		{"", "MiB", `GOMEMLIMIT "MiB" is invalid`},
		{"", "1.5GiB", `GOMEMLIMIT "1.5GiB" is invalid`},
	} {
		if err := Check(bad.gogc, bad.limit); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Check(%q, %q): %v, want %q", bad.gogc, bad.limit, err, bad.want)
		}
	}
}

// TestRunSetsTheTarget: Run sets the target at once and returns when its
// context ends.
func TestRunSetsTheTarget(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Run(ctx, slog.New(slog.DiscardHandler))
	if got := debug.SetGCPercent(100); got < 100 || got > Percent {
		t.Errorf("GC target %d after Run, want between 100 and %d", got, Percent)
	}
}
