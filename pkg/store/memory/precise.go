package memory

import (
	"math"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// The sliding window of precision n >= 2 (package store's doc): n
// sub-windows per window, the oldest weighted by the share still inside
// (strict: counted whole until it has left the window).

// preciseWindow applies a sliding-window check of precision n of h hits;
// a paced one (see store.Check.Paced) against the current window's
// sub-windows alone.
func (st *state) preciseWindow(c *store.Check, now, wus int64, h uint64, o op) store.Result {
	limit, n, strict := c.Limit, int64(c.Precision), c.Strict
	curWin := store.FloorDiv(now, wus)
	into := now - curWin*wus
	sub := curWin*n + into*n/wus
	if st.alg != store.SlidingWindow || st.old == nil || int64(len(*st.old)) != n {
		old := make([]int64, n)
		*st = state{alg: store.SlidingWindow, win: sub, old: &old}
	} else if st.win != sub {
		st.shift(sub)
	}
	old := *st.old
	rstUS := wus - into
	rst := time.Duration(rstUS) * time.Microsecond
	switch o {
	case opRefund:
		st.cur -= int64(h)
		if st.cur < 0 {
			deficit := -st.cur
			st.cur = 0
			for i := range old {
				take := min(deficit, old[i])
				old[i] -= take
				deficit -= take
			}
		}
		return store.Result{Allowed: true, Remaining: st.preciseBudget(limit, into, wus, n, strict), Reset: rst}
	case opForce:
		st.cur = addHits(st.cur, h)
		return store.Result{Allowed: true, Remaining: st.preciseBudget(limit, into, wus, n, strict), Reset: rst}
	}
	if c.Paced {
		aligned := st.cur // the current window's sub-windows: sub and the j before it
		for _, x := range old[:sub-curWin*n] {
			aligned += x
		}
		return st.windowCount(aligned, limit, h, 0, rst)
	}
	r := st.preciseBudget(limit, into, wus, n, strict)
	if allowed(h, r) {
		l := min(want(c, o), r-h)
		st.cur += int64(h + l)
		return store.Result{Allowed: true, Remaining: r - h - l, Reset: rst, Lease: store.Lease{Hits: l, Now: l}}
	}
	return store.Result{Remaining: r, RetryAfter: st.preciseRetry(limit, max(h, 1), now, wus, n, strict, rstUS), Reset: rst}
}

// clone returns st with its own copy of the sub-window counts, so that a
// batch's tentative state never changes the stored one.
func (st state) clone() state {
	if st.old != nil {
		old := append([]int64(nil), (*st.old)...)
		st.old = &old
	}
	return st
}

// extraBytes is what st costs beyond EntryOverhead: its sub-window counts
// and their slice.
func (st *state) extraBytes() int64 {
	if st.old == nil {
		return 0
	}
	return 8*int64(len(*st.old)) + 32
}

// shift moves the counts to sub-window sub: each moves sub - st.win places
// older, those beyond old[n] drop; an earlier sub clears them all.
func (st *state) shift(sub int64) {
	old := *st.old
	n := int64(len(old))
	d := sub - st.win
	switch {
	case d < 0 || d > n:
		clear(old)
	default:
		for i := n; i >= 1; i-- {
			switch src := i - d; {
			case src == 0:
				old[i-1] = st.cur
			case src > 0:
				old[i-1] = old[src-1]
			default:
				old[i-1] = 0
			}
		}
	}
	st.cur, st.win = 0, sub
}

// subBounds returns the bounds of sub-window j of a window: ceil(j*wus/n)
// and ceil((j+1)*wus/n) microseconds into it.
func subBounds(j, wus, n int64) (b0, b1 int64) {
	return ceilDiv(j*wus, n), ceilDiv((j+1)*wus, n)
}

// preciseBudget returns R = ceil(L - rate) when rate < L, else 0.
func (st *state) preciseBudget(limit uint64, into, wus, n int64, strict bool) uint64 {
	old := *st.old
	frac := oldestShare(into, wus, n, strict)
	full := st.cur
	for _, c := range old[:n-1] {
		full += c
	}
	rate := float64(float64(old[n-1])*frac) + float64(full)
	if l := float64(limit); rate < l {
		return uint64(math.Ceil(l - rate))
	}
	return 0
}

// oldestShare is the share of the oldest sub-window counted at into
// microseconds into its window: what of it is still inside, or all of it when strict.
func oldestShare(into, wus, n int64, strict bool) float64 {
	if strict {
		return 1
	}
	b0, b1 := subBounds(into*n/wus, wus, n)
	return float64(b1-into) / float64(b1-b0)
}

// count returns the count of absolute sub-window x with no traffic after
// now: cur for st.win, old[] for the n before it, 0 otherwise.
func (st *state) count(x int64) int64 {
	old := *st.old
	switch d := st.win - x; {
	case d == 0:
		return st.cur
	case d >= 1 && d <= int64(len(old)):
		return old[d-1]
	}
	return 0
}

// preciseRetry returns the RetryAfter of h >= 1 hits (package store's doc).
func (st *state) preciseRetry(limit, h uint64, now, wus, n int64, strict bool, rst int64) time.Duration {
	a := float64(limit) - float64(h) + 1
	if a <= 0 {
		return time.Duration(rst) * time.Microsecond
	}
	sub := st.win
	full := int64(0) // counts of sub-windows sub+m-n+1 .. sub+m
	for x := sub - n + 1; x <= sub; x++ {
		full += st.count(x)
	}
	var x float64
	for m := int64(0); ; m++ {
		s := sub + m
		if m > 0 {
			full += st.count(s) - st.count(s-n)
		}
		if f := float64(full); f < a {
			k, j := store.FloorDiv(s, n), s-store.FloorDiv(s, n)*n
			b0, b1 := subBounds(j, wus, n)
			c := st.count(s - n)
			if strict && f+float64(c) >= a {
				continue // the oldest counts whole: wait for it to leave
			}
			q := (a - f) / float64(c)
			switch {
			case strict || c == 0 || q > 1:
				if m == 0 {
					x = -1
				} else {
					x = float64(k*wus+b0-now) - 1
				}
			default:
				x = float64(k*wus+b1-now) - float64(q*float64(b1-b0))
			}
			break
		}
	}
	l, hf := float64(limit), float64(h)
	ra := store.Settle(int64(math.Floor(x))+1, func(ra int64) bool { return st.precisePassesAt(l, hf, now+ra, wus, n, strict) })
	return time.Duration(ra) * time.Microsecond
}

// precisePassesAt reports whether hf hits would pass at t (not before the
// state's sub-window) with no other traffic.
func (st *state) precisePassesAt(l, hf float64, t, wus, n int64, strict bool) bool {
	k := store.FloorDiv(t, wus)
	into := t - k*wus
	j := into * n / wus
	s := k*n + j
	frac := oldestShare(into, wus, n, strict)
	full := int64(0)
	for x := s - n + 1; x <= s; x++ {
		full += st.count(x)
	}
	rate := float64(float64(st.count(s-n))*frac) + float64(full)
	if rate >= l {
		return false
	}
	return hf <= math.Ceil(l-rate)
}
