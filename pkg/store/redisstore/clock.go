package redisstore

import (
	"context"
	"sync"
	"time"
)

// clock holds one node's Redis clock against this process's monotonic one,
// so that plain commands name a window before they are sent (docs/redis.md,
// invariant 4): Redis's time at local l lies in [l+lo, l+hi], widened by
// 1/maxSlew of the time since. It is safe for concurrent use.
type clock struct {
	mu     sync.Mutex
	lo, hi int64 // Redis µs minus local µs, bounds
	at     int64 // local µs of the measurement; 0: none
	fake   func() time.Time
}

// A measurement is renewed after clockAge/2, by a TIME on the node's next
// round trip, and used for 10 × clockAge while its bounds are at most
// clockWidth apart. Plain commands stay boundaryMargin from a window's end.
const (
	clockAge       = time.Second
	clockWidth     = 20 * time.Millisecond
	boundaryMargin = 2 * time.Millisecond
	maxSlew        = 1000 // Redis's clock may run 1/maxSlew faster or slower than this one
)

// epoch is the origin of local time: time.Since reads the monotonic clock.
var epoch = time.Now()

func localUS() int64 { return time.Since(epoch).Microseconds() }

// bounds returns Redis's time at local time l as [lo, hi], in Unix µs, and
// whether the clock is fresh enough to use.
func (c *clock) bounds(l int64) (lo, hi int64, ok bool) {
	if c.fake != nil {
		t := c.fake().UnixMicro()
		return t, t, true
	}
	c.mu.Lock()
	lo, hi, at := c.lo, c.hi, c.at
	c.mu.Unlock()
	age := l - at
	if at == 0 || age > 10*clockAge.Microseconds() || hi-lo > clockWidth.Microseconds() {
		return 0, 0, false
	}
	slew := age/maxSlew + 1
	return l + lo - slew, l + hi + slew, true
}

// stale reports whether a call should bring a new TIME measurement.
func (c *clock) stale(l int64) bool {
	if c.fake != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at == 0 || l-c.at > (clockAge/2).Microseconds() || c.hi-c.lo > clockWidth.Microseconds()
}

// observe records TIME's reply t (Unix µs) to a round trip sent at local s
// and answered at local r. A narrower measurement replaces the held one,
// and so does any that the held one's bounds do not admit (Redis's clock
// stepped).
func (c *clock) observe(t, s, r int64) {
	lo, hi := t-r, t-s
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at != 0 {
		slew := (r-c.at)/maxSlew + 1
		if plo, phi := c.lo-slew, c.hi+slew; lo <= phi && hi >= plo {
			lo, hi = max(lo, plo), min(hi, phi) // both hold: so does their overlap
		}
	}
	c.lo, c.hi, c.at = lo, hi, r
}

// CountSpan returns when key's node may count a hit sent now in a call
// bounded by deadline (zero: the store's timeout), in its Unix time as
// measured (a later answer is an error and admits nothing); ok is false
// while its clock is unmeasured, stale or too wide.
func (s *Store) CountSpan(key string, deadline time.Time) (from, to time.Time, ok bool) {
	n, err := s.node(context.Background(), key)
	l := localUS()
	until := l + s.timeout.Microseconds()
	if !deadline.IsZero() {
		until = l + max(time.Until(deadline).Microseconds(), 0)
	}
	if err != nil {
		return from, to, false
	}
	lo, _, ok := n.clock.bounds(l)
	_, hi, ok2 := n.clock.bounds(until)
	return time.UnixMicro(lo), time.UnixMicro(hi), ok && ok2
}
