package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// HostCPU is the whole machine's CPU over the measured phase, from
// /proc/stat: on a shared machine it tells whether other work took CPU from
// the server, Redis and the generator during the run.
type HostCPU struct {
	BusyCores float64 `json:"busy_cores"` // non-idle CPU seconds per elapsed second, every process
	// BusyCores minus the cores of the generator, the -server-pid processes
	// and Redis (when measured): what everything else used.
	OtherCores float64 `json:"other_cores"`
}

// hostTicks is the first line of /proc/stat: busy and total clock ticks.
type hostTicks struct{ busy, total uint64 }

// parseProcStatCPU reads the aggregate "cpu" line of /proc/stat: user nice
// system idle iowait irq softirq steal [guest guest_nice]; idle and iowait
// are not busy, guest time is already in user and nice.
func parseProcStatCPU(s string) (hostTicks, error) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return hostTicks{}, errors.New("/proc/stat: no aggregate cpu line")
	}
	var t hostTicks
	for i, v := range f[1:9] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return hostTicks{}, fmt.Errorf("/proc/stat: %v", err)
		}
		t.total += n
		if i != 3 && i != 4 { // idle, iowait
			t.busy += n
		}
	}
	return t, nil
}

func readHostTicks() (hostTicks, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostTicks{}, err
	}
	return parseProcStatCPU(string(b))
}

// newHostCPU turns two /proc/stat samples and the measured processes' cores
// into the machine's figures.
func newHostCPU(before, after hostTicks, elapsed float64, ours float64) *HostCPU {
	if elapsed <= 0 || after.busy < before.busy {
		return nil
	}
	busy := float64(after.busy-before.busy) / clockTicks / elapsed
	return &HostCPU{BusyCores: busy, OtherCores: busy - ours}
}
