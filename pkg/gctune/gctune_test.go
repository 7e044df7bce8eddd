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

func TestLimitFor(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		live, other uint64
		want        int64
	}{
		{0, 0, 64 * mib},                   // nothing measured yet: the headroom
		{5 * mib, 10 * mib, 79 * mib},      // small heap: room to grow by the headroom between steps
		{16 * mib, 10 * mib, 90 * mib},     // 400% is exactly the headroom
		{32 * mib, 10 * mib, 106 * mib},    // the target capped at 64 MiB extra
		{200 * mib, 10 * mib, 410 * mib},   // Go's default: room to double
		{4096 * mib, 64 * mib, 8256 * mib}, // large memory store
	} {
		if got := LimitFor(Percent, tc.live, tc.other); got != tc.want {
			t.Errorf("LimitFor(%d, %d MiB, %d MiB) = %d MiB, want %d MiB", Percent, tc.live/mib, tc.other/mib, got/mib, tc.want/mib)
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
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Run(ctx, slog.New(slog.DiscardHandler))
	if got := debug.SetGCPercent(100); got < 100 || got > Percent {
		t.Errorf("GC target %d after Run, want between 100 and %d", got, Percent)
	}
	if got := debug.SetMemoryLimit(-1); got < Headroom || got > 1<<30 {
		t.Errorf("memory limit %d after Run, want at least the headroom %d and far from unlimited", got, Headroom)
	}
}
