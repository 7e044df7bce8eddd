// Package gctune raises Go's garbage collection target while the live heap
// is small. rls keeps a small live heap (a few MiB without the memory
// store's counters) and allocates a few KiB per call, mostly inside gRPC,
// so at Go's default target it collects tens of times a second under load;
// each cycle takes CPU from the decisions and adds to the tail. A larger
// target buys that back for a bounded amount of memory: the extra heap
// stays under Headroom as the live heap grows, held between the tuner's
// steps by a soft memory limit (LimitFor). GOGC and GOMEMLIMIT are the
// operator's knobs: when either is set, Wanted says to leave Go alone.
package gctune

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// Percent is the GC target the tuner starts from (as GOGC).
const Percent = 400

// Headroom caps the extra heap the target may allow beyond the live heap;
// past it the target falls back toward Go's default of 100.
const Headroom = 64 << 20

// Every is how often Run looks at the live heap.
const Every = time.Second

// PercentFor is the GC target to use for a live heap of live bytes:
// percent while percent% of the live heap is at most Headroom, then
// whatever percentage keeps the extra heap at Headroom, but never below
// min(percent, 100) (Go's default, or a lower starting point).
func PercentFor(percent int, live uint64) int {
	floor := min(percent, 100)
	if live == 0 || uint64(percent)*live/100 <= Headroom {
		return percent
	}
	return max(int(Headroom*100/live), floor)
}

// LimitFor is the soft memory limit (as GOMEMLIMIT) that holds the heap
// to what PercentFor(percent, live) allows, at least live plus Headroom,
// with other bytes of the runtime's own memory (stacks, metadata) on top.
// The target alone is a percentage of the live heap at the last
// collection: a live heap that grows within one of Run's steps (a burst
// of large requests) would let it reach percent% of the larger heap
// before the next step lowers it. The limit caps the heap in bytes at
// once, and leaves a live heap room to grow by Headroom, or to double,
// between steps before collections come back to back.
func LimitFor(percent int, live, other uint64) int64 {
	p := uint64(PercentFor(percent, live))
	return int64(other + max(live+live*p/100, live+Headroom))
}

// Wanted reports whether to tune: neither GOGC nor GOMEMLIMIT is set
// (their values as read from the environment).
func Wanted(gogc, gomemlimit string) bool {
	return gogc == "" && gomemlimit == ""
}

// Check reports a GOGC or GOMEMLIMIT the Go runtime would not take, naming
// the variable: GOGC is off or a whole percentage; GOMEMLIMIT is off or a
// whole number of bytes with an optional unit (B, KiB, MiB, GiB, TiB).
// The runtime itself ignores a bad GOGC and refuses to start on a bad
// GOMEMLIMIT.
func Check(gogc, gomemlimit string) error {
	if gogc != "" && gogc != "off" {
		if n, err := strconv.Atoi(gogc); err != nil || n < 0 {
			return fmt.Errorf("GOGC %q is invalid: want off or a whole percentage such as 100", gogc)
		}
	}
	if gomemlimit != "" && gomemlimit != "off" && !validByteCount(gomemlimit) {
		return fmt.Errorf("GOMEMLIMIT %q is invalid: want off or bytes with an optional unit (B, KiB, MiB, GiB, TiB) such as 512MiB", gomemlimit)
	}
	return nil
}

// validByteCount reports whether s is digits and an optional unit, as the
// runtime reads GOMEMLIMIT.
func validByteCount(s string) bool {
	for _, unit := range []string{"KiB", "MiB", "GiB", "TiB", "B"} {
		if strings.HasSuffix(s, unit) {
			s = strings.TrimSuffix(s, unit)
			break
		}
	}
	_, err := strconv.ParseUint(s, 10, 63)
	return err == nil
}

// Run applies PercentFor(Percent, live heap) with debug.SetGCPercent and
// LimitFor with debug.SetMemoryLimit, at once and then every Every, until
// ctx ends. Callers run it only when Wanted.
func Run(ctx context.Context, log *slog.Logger) {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"}, {Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"}, {Name: "/memory/classes/heap/free:bytes"}}
	cur := -1
	apply := func() {
		metrics.Read(sample)
		v := make([]uint64, len(sample))
		for i, s := range sample {
			if s.Value.Kind() == metrics.KindUint64 {
				v[i] = s.Value.Uint64()
			}
		}
		live := v[0]
		// What the memory limit counts besides the heap's own spans:
		// mapped, not released, not heap objects or heap free space.
		var other uint64
		if heap := v[2] + v[3] + v[4] + v[5]; v[1] > heap {
			other = v[1] - heap
		}
		debug.SetMemoryLimit(LimitFor(Percent, live, other))
		if p := PercentFor(Percent, live); p != cur {
			debug.SetGCPercent(p)
			if cur != -1 {
				log.Debug("gc target", "percent", p, "live_heap_bytes", live)
			}
			cur = p
		}
	}
	apply()
	t := time.NewTicker(Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			apply()
		}
	}
}
