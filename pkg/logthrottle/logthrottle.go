// Package logthrottle lets a repeated log line through at most once per
// interval and counts the ones it held back, so a flood of one failure (a
// Redis that is down, a peer that misbehaves, a collector that refuses
// spans) costs one line every few seconds, with the count of the rest.
package logthrottle

import (
	"sync"
	"time"
)

// Every is the interval of the log lines that rls throttles unless a line
// states its own.
const Every = 10 * time.Second

// Throttle lets one event through per interval. The zero value is not
// usable; make one with New. It is safe for concurrent use; a call holds
// its lock for a comparison and two assignments, so every held event is
// counted in exactly one line.
type Throttle struct {
	every time.Duration
	now   func() time.Time
	mu    sync.Mutex
	last  int64  // unix nanoseconds of the last event let through; 0 before the first
	held  uint64 // events held back since then
}

// New returns a Throttle letting one event through per every, on the clock
// now (time.Now when nil).
func New(every time.Duration, now func() time.Time) *Throttle {
	if now == nil {
		now = time.Now
	}
	return &Throttle{every: every, now: now}
}

// Allow records one event and reports whether it may be logged: the first
// event, and then the first one at least the interval after the last one
// let through. When it may, held is the number of events held back since
// that one, which the caller logs with it. Two callers racing for the same
// slot get one true between them.
func (t *Throttle) Allow() (held uint64, ok bool) {
	return t.AllowN(1)
}

// AllowN is Allow for n events at once (a batch decided by one fallback):
// when it reports false, all n are held back; when true, held counts the
// events held back before these n.
func (t *Throttle) AllowN(n uint64) (held uint64, ok bool) {
	now := t.now().UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last != 0 && now-t.last < int64(t.every) {
		t.held += n
		return 0, false
	}
	held = t.held
	t.last, t.held = now, 0
	return held, true
}

// Interval returns the throttle's interval, for the "suppressed for" note
// of a log line.
func (t *Throttle) Interval() time.Duration { return t.every }
