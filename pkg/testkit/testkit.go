// Package testkit holds what the tests of every package share: polling for a
// state instead of sleeping for a time, a buffer safe for a writer and a
// reader at once, and a clock that only the test moves. It is for tests
// only; no package of rls imports it outside a _test.go file, an
// integration/ helper or a test double.
package testkit

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"
)

// PollEvery is how often Eventually and WaitFor evaluate their condition.
const PollEvery = 5 * time.Millisecond

// Eventually evaluates cond every PollEvery until it returns true or within
// has passed, and reports whether it returned true. cond runs on the
// caller's goroutine. A test polls with it for a state to change rather than
// sleeping for a fixed time, so a busy machine makes it slower, not wrong.
func Eventually(within time.Duration, cond func() bool) bool {
	return EventuallyEvery(within, PollEvery, cond)
}

// EventuallyEvery is Eventually with its own polling interval, for a cond
// that is costly (a scrape, a process listing).
func EventuallyEvery(within, every time.Duration, cond func() bool) bool {
	if cond() {
		return true
	}
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-deadline.C:
			return cond()
		case <-tick.C:
			if cond() {
				return true
			}
		}
	}
}

// TB is the part of testing.TB that WaitFor uses.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// WaitFor polls cond as Eventually does and fails the test, naming what it
// waited for, when cond does not hold within the deadline.
func WaitFor(t TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	if !Eventually(within, cond) {
		t.Fatalf("%s: not within %v", what, within)
	}
}

// WaitForEvery is WaitFor with its own polling interval, for a cond that
// is costly (a scrape, a process listing).
func WaitForEvery(t TB, what string, within, every time.Duration, cond func() bool) {
	t.Helper()
	if !EventuallyEvery(within, every, cond) {
		t.Fatalf("%s: not within %v", what, within)
	}
}

// Buffer is a bytes.Buffer safe for concurrent writers and readers: the
// log sink of a server under test that the test reads while it runs. The
// zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Len returns the number of bytes written so far.
func (b *Buffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Len()
}

// Reset discards everything written so far.
func (b *Buffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.Reset()
}

// Clock is a clock that only the test moves, safe for concurrent use. The
// zero value reads the Unix epoch; NewClock starts it elsewhere. Its After
// is a timer on that clock, for code that waits (a retry's backoff): the
// test moves the clock past the wait instead of sleeping through it.
type Clock struct {
	ns     atomic.Int64
	stall  atomic.Pointer[clockStall] // StallNext's, until a Now takes it
	mu     sync.Mutex
	timers []clockTimer // After's channels not fired yet
}

type clockStall struct{ read, release chan struct{} }

type clockTimer struct {
	at int64 // unix nanoseconds
	ch chan time.Time
}

// NewClock returns a Clock reading start.
func NewClock(start time.Time) *Clock {
	c := &Clock{}
	c.Set(start)
	return c
}

// Now returns the clock's reading. It has the signature of time.Now, so
// c.Now is what an Options.Now or a now field takes.
func (c *Clock) Now() time.Time {
	t := time.Unix(0, c.ns.Load())
	if s := c.stall.Load(); s != nil && c.stall.CompareAndSwap(s, nil) {
		close(s.read)
		<-s.release
	}
	return t
}

// StallNext makes the next call of Now stall, as a goroutine descheduled
// between reading the clock and using it: that call reads the clock,
// closes read, and returns its reading only once release is called.
func (c *Clock) StallNext() (read <-chan struct{}, release func()) {
	s := &clockStall{read: make(chan struct{}), release: make(chan struct{})}
	c.stall.Store(s)
	return s.read, func() { close(s.release) }
}

// Advance moves the clock d forward (backward when d is negative), fires
// the After channels that are due, and returns the new reading.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.ns.Add(int64(d))
	c.fire(now)
	return time.Unix(0, now)
}

// Set moves the clock to t and fires the After channels that are due.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ns.Store(t.UnixNano())
	c.fire(t.UnixNano())
}

// After returns a channel that receives the clock's reading once Advance or
// Set moves it d or more past its reading now (at once when d <= 0). It has
// the signature of time.After.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.timers = append(c.timers, clockTimer{at: c.ns.Load() + int64(d), ch: ch})
	c.fire(c.ns.Load())
	return ch
}

// Waiters returns how many After channels have not fired yet: a test
// polls it to know that the code under test is waiting before it moves
// the clock.
func (c *Clock) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// fire sends now on every timer due at now and forgets them. c.mu is held.
func (c *Clock) fire(now int64) {
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at <= now {
			t.ch <- time.Unix(0, now)
			continue
		}
		kept = append(kept, t)
	}
	clear(c.timers[len(kept):])
	c.timers = kept
}
