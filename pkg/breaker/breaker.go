// Package breaker is a small circuit breaker for calls to one backend (one
// Redis node): after Threshold consecutive failures it opens and fails calls
// at once for Cooldown, then lets Probes calls through at a time; the first
// success closes it, a failure opens it again.
package breaker

import (
	"sync"
	"time"
)

// State is a breaker's state.
type State int

// The states, in the order a failing backend goes through them.
const (
	Closed State = iota
	Open
	HalfOpen
)

// String returns the state's name as used in metrics and logs.
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "unknown"
}

// Options configure a Breaker. Zero fields take the defaults in brackets.
type Options struct {
	Threshold int              // consecutive failures that open it [5]
	Cooldown  time.Duration    // how long it stays open before probing [1s]
	Probes    int              // calls let through at once while half-open [1]
	Now       func() time.Time // clock [time.Now]
	// OnChange, if set, is called (outside the lock) after every state change.
	OnChange func(from, to State)
}

// Breaker is safe for concurrent use. The zero value is not usable; use New.
type Breaker struct {
	opts     Options
	mu       sync.Mutex
	state    State
	fails    int
	openedAt time.Time
	probing  int
}

// New returns a closed breaker.
func New(opts Options) *Breaker {
	if opts.Threshold <= 0 {
		opts.Threshold = 5
	}
	if opts.Cooldown <= 0 {
		opts.Cooldown = time.Second
	}
	if opts.Probes <= 0 {
		opts.Probes = 1
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Breaker{opts: opts}
}

// Allow reports whether a call may go to the backend now. Every call it
// allows must be followed by exactly one Done.
func (b *Breaker) Allow() bool {
	b.mu.Lock()
	from := b.state
	switch b.state {
	case Closed:
		b.mu.Unlock()
		return true
	case Open:
		if b.opts.Now().Sub(b.openedAt) < b.opts.Cooldown {
			b.mu.Unlock()
			return false
		}
		b.state = HalfOpen
		b.probing = 0
	}
	ok := b.probing < b.opts.Probes
	if ok {
		b.probing++
	}
	to := b.state
	b.mu.Unlock()
	b.changed(from, to)
	return ok
}

// Done records the outcome of a call that Allow let through. Failures are
// backend trouble only (errors that wrap store.ErrUnavailable), not a
// caller's cancellation.
func (b *Breaker) Done(success bool) {
	b.mu.Lock()
	from := b.state
	switch b.state {
	case Closed:
		if success {
			b.fails = 0
		} else if b.fails++; b.fails >= b.opts.Threshold {
			b.state, b.openedAt = Open, b.opts.Now()
		}
	case HalfOpen:
		if b.probing > 0 {
			b.probing--
		}
		if success {
			b.state, b.fails = Closed, 0
		} else {
			b.state, b.openedAt = Open, b.opts.Now()
		}
	case Open:
		// A call allowed before the breaker opened finished late: its outcome
		// changes nothing.
	}
	to := b.state
	b.mu.Unlock()
	b.changed(from, to)
}

// State returns the current state.
func (b *Breaker) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

func (b *Breaker) changed(from, to State) {
	if from != to && b.opts.OnChange != nil {
		b.opts.OnChange(from, to)
	}
}
