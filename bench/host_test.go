package main

import (
	"math"
	"testing"
)

func TestParseProcStatCPU(t *testing.T) {
	stat := "cpu  100 5 50 1000 20 1 2 3 7 0\ncpu0 50 2 25 500 10 0 1 1 0 0\nintr 1\n"
	h, err := parseProcStatCPU(stat)
	if err != nil || h.busy != 161 || h.total != 1181 {
		t.Fatalf("%+v %v", h, err)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2 3\n", "cpu 1 2 3 4 5 6 7 x\n"} {
		if _, err := parseProcStatCPU(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
	if _, err := readHostTicks(); err != nil {
		t.Skipf("no /proc/stat here: %v", err)
	}
}

func TestNewHostCPU(t *testing.T) {
	// 300 busy ticks (3 CPU-s) over 2 s: 1.5 cores, of which ours 1.2.
	h := newHostCPU(hostTicks{busy: 1000}, hostTicks{busy: 1300}, 2, 1.2)
	if h == nil || h.BusyCores != 1.5 || math.Abs(h.OtherCores-0.3) > 1e-9 {
		t.Fatalf("%+v", h)
	}
	if newHostCPU(hostTicks{busy: 5}, hostTicks{busy: 4}, 2, 0) != nil || newHostCPU(hostTicks{}, hostTicks{}, 0, 0) != nil {
		t.Fatal("want nil")
	}
}
