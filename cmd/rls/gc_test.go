package main

import "testing"

func TestGCPercentFor(t *testing.T) {
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
		{50, 4096 * mib, 50},   // an operator's lower target stands
		{100, 5 * mib, 100},
		{1000, 10 * mib, 640},
	} {
		if got := gcPercentFor(tc.percent, tc.live); got != tc.want {
			t.Errorf("gcPercentFor(%d, %d MiB) = %d, want %d", tc.percent, tc.live/mib, got, tc.want)
		}
	}
}
