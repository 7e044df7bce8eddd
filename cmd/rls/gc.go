package main

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// gcHeadroom caps the extra heap --gc-percent may allow beyond the live
// heap; past it the target falls back toward Go's default of 100.
const gcHeadroom = 64 << 20

// gcPercentFor is the GC target to use for a live heap of live bytes:
// percent while percent% of the live heap is at most gcHeadroom, then
// whatever percentage keeps the extra heap at gcHeadroom, but never below
// min(percent, 100) (Go's default, or the operator's lower choice).
func gcPercentFor(percent int, live uint64) int {
	floor := min(percent, 100)
	if live == 0 || uint64(percent)*live/100 <= gcHeadroom {
		return percent
	}
	return max(int(gcHeadroom*100/live), floor)
}

// tuneGC applies --gc-percent until ctx ends. rls keeps a small live heap
// (a few MiB without the memory store's counters) and allocates a few KiB
// per call, mostly inside gRPC, so at Go's default target it collects tens
// of times a second under load; each cycle takes CPU from the decisions and
// adds to the tail. A larger target buys that back for a bounded amount of
// memory: the extra heap stays under gcHeadroom as the live heap grows
// (checked every second). GOGC in the environment, or --gc-percent 0,
// leaves Go's own setting alone.
func tuneGC(ctx context.Context, percent int, log *slog.Logger) {
	if percent == 0 || os.Getenv("GOGC") != "" {
		return
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	cur := -1
	apply := func() {
		metrics.Read(sample)
		var live uint64
		if sample[0].Value.Kind() == metrics.KindUint64 {
			live = sample[0].Value.Uint64()
		}
		if p := gcPercentFor(percent, live); p != cur {
			debug.SetGCPercent(p)
			if cur != -1 {
				log.Debug("gc target", "percent", p, "live_heap_bytes", live)
			}
			cur = p
		}
	}
	apply()
	t := time.NewTicker(time.Second)
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
