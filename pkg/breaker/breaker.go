// Package breaker is a small circuit breaker for calls to one backend (one
// Redis node). It opens on sustained failure only, never on a burst.
//
//   - Closed: calls go through. A failed call starts a run of failures, or
//     extends the current one; a successful call ends it. The breaker opens
//     when the run holds at least Threshold failures (default 5) AND its
//     first failure is at least FailWindow old (default 250 ms): the backend
//     has answered no call for that long. Five concurrent timeouts from one
//     30 ms stall do not open it; a backend that fails every call for a
//     quarter of a second does.
//     A refused connection (nothing listens) opens it at once.
//   - Open: every call fails at once, for Cooldown (default 250 ms).
//   - HalfOpen: after the cooldown, Probes calls (default 1) at a time go
//     through as probes; the others fail at once. The first probe that
//     succeeds closes the breaker, with an empty run; a probe that fails
//     opens it for another Cooldown. A probe whose outcome is Unknown frees
//     its place for another probe.
//
// An outcome counts only in the state that let its call through: a call let
// through while the breaker was closed that returns after it opened changes
// nothing, and only the current probes decide a half-open breaker.
package breaker

import (
	"sync"
	"time"
)

// State is a breaker's state.
type State int

// The states, in the order a failing backend goes through them.
const (
	// Closed lets every call through.
	Closed State = iota
	// Open fails every call at once.
	Open
	// HalfOpen lets Options.Probes probes through at a time.
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

// The defaults of Options' zero fields.
const (
	// DefaultThreshold is the fewest failures in a run that open a breaker.
	DefaultThreshold = 5
	// DefaultFailWindow is how long a run of failures must last, with no
	// success, to open a breaker.
	DefaultFailWindow = 250 * time.Millisecond
	// DefaultCooldown is how long a breaker stays open before a probe.
	DefaultCooldown = 250 * time.Millisecond
	// DefaultProbes is how many probes a half-open breaker lets through at
	// once.
	DefaultProbes = 1
)

// Options configure a Breaker. Zero fields take the defaults in brackets.
type Options struct {
	// Threshold is the fewest failures in a run that open the breaker
	// [DefaultThreshold].
	Threshold int
	// FailWindow is how long a run must have lasted, with no success, for
	// its failures to open the breaker [DefaultFailWindow].
	FailWindow time.Duration
	// Cooldown is how long the breaker stays open before it lets a probe
	// through [DefaultCooldown].
	Cooldown time.Duration
	// Probes is how many probes may be in flight at once while the breaker
	// is half-open [DefaultProbes].
	Probes int
	// Now is the clock [time.Now].
	Now func() time.Time
	// OnChange, if set, is called (outside the lock) after every state
	// change. Calls for concurrent changes may arrive in any order.
	OnChange func(from, to State)
}

// Outcome is what a call let through by Allow tells about the backend.
type Outcome int

// The outcomes.
const (
	// Success: the backend answered.
	Success Outcome = iota
	// Failure: the backend gave no answer (a network error, no reply in
	// time, a reply saying it cannot serve).
	Failure
	// Unknown: the call ended without telling anything about the backend
	// (its caller gave up, or it was never sent).
	Unknown
	// Refused: nothing listens at the backend's address (the connection was
	// refused). Unlike a timeout it cannot be a passing stall: it opens a
	// closed breaker at once. Waiting for more refusals only adds failed
	// dials (and go-redis stops dialing for a second after PoolSize of them,
	// which would delay the recovery when the backend returns).
	Refused
)

// Ticket is what Allow gives a call it lets through; the call hands it back
// to Done with its outcome.
type Ticket struct {
	epoch uint64 // the state that let the call through
	probe bool
}

// Breaker is safe for concurrent use. The zero value is not usable; use New.
type Breaker struct {
	opts Options

	mu       sync.Mutex
	state    State
	epoch    uint64    // counts state changes; names the current state
	fails    int       // failures in the current run (closed)
	runStart time.Time // the first failure of the current run (closed)
	openedAt time.Time // when it last opened (open)
	probing  int       // probes in flight (half-open)
}

// New returns a closed breaker.
func New(opts Options) *Breaker {
	if opts.Threshold <= 0 {
		opts.Threshold = DefaultThreshold
	}
	if opts.FailWindow <= 0 {
		opts.FailWindow = DefaultFailWindow
	}
	if opts.Cooldown <= 0 {
		opts.Cooldown = DefaultCooldown
	}
	if opts.Probes <= 0 {
		opts.Probes = DefaultProbes
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Breaker{opts: opts, epoch: 1}
}

// Allow reports whether a call may go to the backend now. Every call it
// lets through must be followed by exactly one Done with the Ticket.
func (b *Breaker) Allow() (Ticket, bool) {
	b.mu.Lock()
	from := b.state
	switch b.state {
	case Closed:
		t := Ticket{epoch: b.epoch}
		b.mu.Unlock()
		return t, true
	case Open:
		if b.opts.Now().Sub(b.openedAt) < b.opts.Cooldown {
			b.mu.Unlock()
			return Ticket{}, false
		}
		b.set(HalfOpen)
		b.probing = 0
	}
	var t Ticket
	ok := b.probing < b.opts.Probes
	if ok {
		b.probing++
		t = Ticket{epoch: b.epoch, probe: true}
	}
	to := b.state
	b.mu.Unlock()
	b.changed(from, to)
	return t, ok
}

// Done records the outcome of a call that Allow let through.
func (b *Breaker) Done(t Ticket, o Outcome) {
	b.mu.Lock()
	from := b.state
	if t.epoch == b.epoch { // else the state that let it through is gone
		switch b.state {
		case Closed:
			b.closedDone(o)
		case HalfOpen:
			if t.probe {
				b.probeDone(o)
			}
		}
	}
	to := b.state
	b.mu.Unlock()
	b.changed(from, to)
}

// closedDone records an outcome while closed: it ends or extends the run of
// failures, and opens the breaker when the run is long enough.
func (b *Breaker) closedDone(o Outcome) {
	switch o {
	case Success:
		b.fails = 0
	case Refused:
		b.open(b.opts.Now())
	case Failure:
		now := b.opts.Now()
		if b.fails == 0 {
			b.runStart = now
		}
		b.fails++
		if b.fails >= b.opts.Threshold && now.Sub(b.runStart) >= b.opts.FailWindow {
			b.open(now)
		}
	}
}

// probeDone records a probe's outcome while half-open.
func (b *Breaker) probeDone(o Outcome) {
	b.probing--
	switch o {
	case Success:
		b.set(Closed)
		b.fails = 0
	case Failure, Refused:
		b.open(b.opts.Now())
	}
}

func (b *Breaker) open(now time.Time) {
	b.set(Open)
	b.openedAt = now
}

// set changes the state and starts a new epoch.
func (b *Breaker) set(s State) {
	b.state = s
	b.epoch++
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
