package limiter

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Flights: one store call at a time for a key at its limit.
//
// A key held at its limit frees a hit now and then (a sliding window's
// previous count fades; a token bucket refills), and the requests that
// arrive while the call for one of them is in flight would each go to the
// store and, mostly, be denied there. So a request of one consuming check
// whose key the store last reported near its limit (as markScarce judges)
// and whose key has such a call in flight waits for that call's answer,
// and is then decided as if it had arrived just after it: by the
// over-limit cache where that answer was a denial that covers it, else by
// the store. A request that arrives after the cache's denial of one hit
// has run out, but before that hit surely fits (the RetryAfter counted
// from the answer's arrival: the store may say either in between), waits
// for that moment and then asks, as the call that the others wait for.
// Waiting changes no answer, only when it is given; a key away from its
// limit never waits, and no request waits longer than flightWait or past
// its deadline (a store that is slow or gone delays the others by that
// much at most: they then make their own calls, as without flights).
type flights struct {
	n       atomic.Int32        // calls in flight: no lookup while there are none
	waiting atomic.Int32        // requests waiting (for tests)
	maxWait time.Duration       // 0: flightWait
	sleepFn func(time.Duration) // nil: a timer (tests move their clock instead)
	mu      sync.Mutex
	m       map[string]chan struct{} // closed when the key's call has been learnt
}

// flightWait bounds a request's wait for another's call: a few round trips
// to a Redis that answers.
const flightWait = 2 * time.Millisecond

// wait waits for the call in flight for key, if any, for at most
// flightWait or until ctx ends.
func (f *flights) wait(ctx context.Context, key string) {
	if f.n.Load() == 0 {
		return
	}
	f.mu.Lock()
	ch := f.m[key]
	f.mu.Unlock()
	if ch == nil {
		return
	}
	d := f.maxWait
	if d <= 0 {
		d = flightWait
	}
	t := time.NewTimer(d)
	defer t.Stop()
	f.waiting.Add(1)
	defer f.waiting.Add(-1)
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
	}
}

// sleep waits d, or until ctx ends.
func (f *flights) sleep(ctx context.Context, d time.Duration) {
	if f.sleepFn != nil {
		f.sleepFn(d)
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// start registers a call in flight for key and returns the function that
// ends it, or nil when another one is in flight already.
func (f *flights) start(key string) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.m[key]; ok {
		return nil
	}
	if f.m == nil {
		f.m = make(map[string]chan struct{})
	}
	ch := make(chan struct{})
	f.m[key] = ch
	f.n.Add(1)
	return func() {
		f.mu.Lock()
		delete(f.m, key)
		f.mu.Unlock()
		f.n.Add(-1)
		close(ch)
	}
}
