package limiter

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// Fleet knows how many rls replicas share the limits: a fixed number, or
// the number of live heartbeats in the store. While heartbeats fail it keeps
// the last size it learned. It is safe for concurrent use.
type Fleet struct {
	size     atomic.Int64
	beat     func(context.Context) (int, error)
	leave    func(context.Context) error
	interval time.Duration
	log      *slog.Logger
}

// NewFleet returns a Fleet of fixed size when fixed > 0; otherwise Run
// learns the size by calling beat (which refreshes this replica's heartbeat
// and counts the live ones) every interval, and Leave calls leave (which
// removes the heartbeat; it may be nil). The size starts at 1.
func NewFleet(fixed int, beat func(context.Context) (int, error), leave func(context.Context) error, interval time.Duration, log *slog.Logger) *Fleet {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &Fleet{interval: interval, log: log, leave: leave}
	f.size.Store(1)
	if fixed > 0 {
		f.size.Store(int64(fixed))
	} else {
		f.beat = beat
	}
	return f
}

// Size returns the current fleet size, at least 1.
func (f *Fleet) Size() int { return int(f.size.Load()) }

// Learning reports whether the size comes from heartbeats.
func (f *Fleet) Learning() bool { return f.beat != nil }

// Beat runs one heartbeat and updates the size; on error the last size stays.
func (f *Fleet) Beat(ctx context.Context) error {
	if f.beat == nil {
		return nil
	}
	n, err := f.beat(ctx)
	if err != nil {
		return err
	}
	n = max(n, 1)
	if old := f.size.Swap(int64(n)); old != int64(n) {
		f.log.Info("fleet size changed", "from", old, "to", n)
	}
	return nil
}

// Run beats every interval until ctx ends. It does nothing for a fixed size.
func (f *Fleet) Run(ctx context.Context) {
	if f.beat == nil {
		return
	}
	t := time.NewTicker(f.interval)
	defer t.Stop()
	failing := false
	for {
		bctx, cancel := context.WithTimeout(ctx, f.interval)
		err := f.Beat(bctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil && !failing {
			f.log.Warn("fleet heartbeat failed; keeping the last fleet size", "size", f.Size(), "err", err)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Leave removes this replica's heartbeat, so the others' share grows at
// once rather than after the heartbeat expires. It waits at most a second.
func (f *Fleet) Leave() {
	if f.beat == nil || f.leave == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := f.leave(ctx); err != nil {
		f.log.Warn("fleet leave failed; the heartbeat will expire by itself", "err", err)
	}
}
