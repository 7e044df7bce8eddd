// Package fleet knows how many rls replicas share the limits: a fixed
// number, or the live heartbeats in the store (the fail-open share of a
// limit is the limit over the fleet's size).
package fleet

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Fleet knows how many rls replicas share the limits: a fixed number, or
// the number of live heartbeats in the store.
//
// A learned size grows at once and shrinks only after the larger count has
// not been seen for Hold (the heartbeat TTL): a Redis that restarted empty,
// or a beat that raced another replica's, reports fewer replicas than there
// are for up to one heartbeat interval, and a smaller fleet means a larger
// fail-open share each. While heartbeats fail it keeps the last size it
// learned, and the hold runs again from the last failed beat. It is safe
// for concurrent use.
type Fleet struct {
	size     atomic.Int64
	beat     func(context.Context) (int, error)
	leave    func(context.Context) error
	interval time.Duration
	hold     time.Duration
	min      int
	now      func() time.Time
	log      *slog.Logger

	mu     sync.Mutex
	highAt time.Time // when a count of at least size was last seen
	known  bool      // a beat has succeeded
}

// Options configure a learning Fleet. Zero fields take the defaults in
// brackets.
type Options struct {
	// Beat refreshes this replica's heartbeat and counts the live ones.
	Beat func(context.Context) (int, error)
	// Leave removes this replica's heartbeat [none].
	Leave func(context.Context) error
	// Interval is the time between beats [2s].
	Interval time.Duration
	// Hold is how long a larger count is kept after it was last seen [3 × Interval].
	Hold time.Duration
	// Min is the least size, and the size before the first beat succeeds [1].
	Min int
	// Now is the clock [time.Now].
	Now func() time.Time
	// Log receives size changes and beat failures [discard].
	Log *slog.Logger
}

// Fixed returns a Fleet of size n (at least 1) that never changes.
func Fixed(n int) *Fleet {
	f := &Fleet{}
	f.size.Store(int64(max(n, 1)))
	return f
}

// New returns a Fleet that learns its size from o.Beat (see Learn and
// Run). Until the first beat succeeds its size is o.Min.
func New(o Options) *Fleet {
	if o.Interval <= 0 {
		o.Interval = 2 * time.Second
	}
	if o.Hold <= 0 {
		o.Hold = 3 * o.Interval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	o.Min = max(o.Min, 1)
	f := &Fleet{beat: o.Beat, leave: o.Leave, interval: o.Interval, hold: o.Hold, min: o.Min, now: o.Now, log: o.Log}
	f.size.Store(int64(o.Min))
	return f
}

// Size returns the current fleet size, at least 1.
func (f *Fleet) Size() int { return int(f.size.Load()) }

// Beat runs one heartbeat and updates the size; on error the last size stays.
func (f *Fleet) Beat(ctx context.Context) error {
	if f.beat == nil {
		return nil
	}
	n, err := f.beat(ctx)
	if err != nil {
		f.unanswered()
		return err
	}
	f.observe(max(n, f.min))
	return nil
}

// unanswered restarts the hold: while the store cannot be asked, the
// larger count is unseen, not gone, and a Redis that comes back empty
// counts fewer replicas until each has beaten again (an outage longer
// than the hold shrank the size at the first beat after it).
func (f *Fleet) unanswered() {
	f.mu.Lock()
	if f.known {
		f.highAt = f.now()
	}
	f.mu.Unlock()
}

// observe applies one counted size: a larger or equal count is taken at once
// (and remembered as seen now); a smaller one only once the current size has
// not been seen for the hold time.
func (f *Fleet) observe(n int) {
	now := f.now()
	f.mu.Lock()
	old := int(f.size.Load())
	switch {
	case !f.known || n >= old:
		f.size.Store(int64(n))
		f.highAt = now
	case now.Sub(f.highAt) >= f.hold:
		f.size.Store(int64(n))
		f.highAt = now
	}
	f.known = true
	cur := int(f.size.Load())
	f.mu.Unlock()
	if cur != old {
		f.log.Info("fleet size changed", "from", old, "to", cur)
	}
}

// Learn beats once, so a replica knows its fleet before it serves (bounded
// by ctx). On failure the size stays unknown (1) and it is logged; Run
// keeps trying. It does nothing for a fixed size.
func (f *Fleet) Learn(ctx context.Context) {
	if err := f.Beat(ctx); err != nil {
		f.log.Warn("fleet heartbeat failed at start: the fail-open share assumes the minimum fleet size until a beat succeeds",
			"size", f.Size(), "err", err)
	}
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

// Leave removes this replica's heartbeat, so the others' share grows once
// their hold time passes rather than after the heartbeat expires too. It
// waits at most a second.
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
