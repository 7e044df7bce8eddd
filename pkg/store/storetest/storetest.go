// Package storetest is the conformance suite of store.Store: one table of
// test vectors with exact expectations that every implementation (the memory
// store, the Redis store) must pass, bit for bit.
//
// Run drives each vector with a fake clock that only the suite advances, at
// microsecond precision, starting on T0, a Unix time that is a whole number
// of hours. A store under test must take all its time from the clock it is
// given. Keys share one Redis Cluster hash tag per vector run, so a Redis
// store decides each batch in one hash slot, together, and carry a per-run nonce, so
// state left by an earlier run of the suite never interferes.
package storetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/testkit"
)

// T0 is the clock reading every vector starts from: 2025-07-03T11:00:00Z,
// a multiple of every window of a second, a minute and an hour.
var T0 = time.Unix(1_751_540_400, 0)

// step sets the clock to T0+at, decides checks in one Decide call and
// expects want.
type step struct {
	at     time.Duration
	checks []store.Check
	want   []store.Result
}

// vector is a named sequence of steps against a fresh store.
type vector struct {
	name  string
	steps []step
}

const (
	us = time.Microsecond
	ms = time.Millisecond
	s  = time.Second
)

func sliding(key string, limit uint64, window time.Duration, hits uint64) store.Check {
	return store.Check{Key: key, Algorithm: store.SlidingWindow, Limit: limit, Window: window, Hits: hits}
}

func fixed(key string, limit uint64, window time.Duration, hits uint64) store.Check {
	return store.Check{Key: key, Algorithm: store.FixedWindow, Limit: limit, Window: window, Hits: hits}
}

func bucket(key string, limit, burst uint64, window time.Duration, hits uint64) store.Check {
	return store.Check{Key: key, Algorithm: store.TokenBucket, Limit: limit, Window: window, Burst: burst, Hits: hits}
}

func refund(c store.Check) store.Check { c.Refund = true; return c }

func shadow(c store.Check) store.Check { c.Shadow = true; return c }

func force(c store.Check) store.Check { c.Force = true; return c }

func paced(c store.Check) store.Check { c.Paced = true; return c }

func precise(c store.Check, n uint8) store.Check { c.Precision = n; return c }

func lease(c store.Check, want uint64, horizon time.Duration) store.Check {
	c.Want, c.Horizon = want, horizon
	return c
}

// leased is an allowed result with a lease.
func leased(remaining uint64, reset time.Duration, l store.Lease) store.Result {
	return store.Result{Allowed: true, Remaining: remaining, Reset: reset, Lease: l}
}

// ok is an allowed result.
func ok(remaining uint64, reset time.Duration) store.Result {
	return store.Result{Allowed: true, Remaining: remaining, Reset: reset}
}

// deny is a denied result.
func deny(remaining uint64, retryAfter, reset time.Duration) store.Result {
	return store.Result{Remaining: remaining, RetryAfter: retryAfter, Reset: reset}
}

// one is a step of a single check.
func one(at time.Duration, c store.Check, want store.Result) step {
	return step{at: at, checks: []store.Check{c}, want: []store.Result{want}}
}

// batch is a step of several checks.
func batch(at time.Duration, checks []store.Check, want ...store.Result) step {
	return step{at: at, checks: checks, want: want}
}

func cs(checks ...store.Check) []store.Check { return checks }

// vectors are the suite's test vectors. In comments, R is the budget, rate
// the sliding window's weighted count, and x the RetryAfter formula's value
// before floor(x)+1; times are relative to T0.
var vectors = []vector{
	{
		// The worked example of the sliding window: 100/s; the previous window counted 82, the
		// current one 30, and a request arrives 400 ms into the window.
		name: "sliding/seed worked example",
		steps: []step{
			// Previous window [-1s, 0): 82 hits; R = 100.
			one(-500*ms, sliding("k", 100, s, 82), ok(18, 500*ms)),
			// rate = 82*(1-0.4) + 0 = 49.2; R = ceil(50.8) = 51.
			one(400*ms, sliding("k", 100, s, 30), ok(21, 600*ms)),
			// rate = 82*0.6 + 30 = 79.2; R = ceil(20.8) = 21; Remaining 20.
			one(400*ms, sliding("k", 100, s, 1), ok(20, 600*ms)),
			// cur 31: rate = 82*0.55 + 31 = 76.1; R = ceil(23.9) = 24: cur -> 55.
			one(450*ms, sliding("k", 100, s, 24), ok(0, 550*ms)),
			// rate = 82*0.55 + 55 = 100.1 >= 100: R = 0, denied.
			// A = 100-55-1+1 = 45 > 0; x = (1 - 45/82)*1e6 - 450000
			// = 451219.512... - 450000 = 1219.512; RetryAfter = 1220 µs.
			one(450*ms, sliding("k", 100, s, 1), deny(0, 1220*us, 550*ms)),
			// 1 µs short: rate = 82*(1-0.451219) + 55 = 100.000042, denied;
			// x = 451219.512 - 451219 = 0.512 -> 1 µs.
			one(451219*us, sliding("k", 100, s, 1), deny(0, 1*us, 548781*us)),
			// At RetryAfter: rate = 99.99996; R = 1.
			one(451220*us, sliding("k", 100, s, 1), ok(0, 548780*us)),
		},
	},
	{
		name: "sliding/window roll-over",
		steps: []step{
			one(0, sliding("k", 10, s, 4), ok(6, s)),
			// Next window at its start: prev 4 weighs fully; rate 4, R 6.
			one(s, sliding("k", 10, s, 0), ok(6, s)),
			// rate = 4*0.5 = 2; R = 8.
			one(1500*ms, sliding("k", 10, s, 3), ok(5, 500*ms)),
			// Window 2: prev = 3 (window 1's cur); rate = 3*0.75 = 2.25; R = ceil(7.75) = 8.
			one(2250*ms, sliding("k", 10, s, 0), ok(8, 750*ms)),
			// Window 3, last written in window 1: the gap zeroes prev; R = 10.
			one(3500*ms, sliding("k", 10, s, 0), ok(10, 500*ms)),
		},
	},
	{
		name: "sliding/gap of more than one window zeroes prev",
		steps: []step{
			one(0, sliding("k", 10, s, 10), ok(0, s)),
			// Window 1 start: rate = 10*(1-0) = 10, denied. A = 10 > 0;
			// x = (1 - 10/10)*1e6 - 0 = 0 -> 1 µs.
			one(s, sliding("k", 10, s, 1), deny(0, us, s)),
			// Window 2: window 0's 10 no longer count.
			one(2*s, sliding("k", 10, s, 1), ok(9, s)),
		},
	},
	{
		// 10/s spent late in a second leaves only 2 early in the next.
		name: "sliding/late burst leaves two early in the next window",
		steps: []step{
			one(900*ms, sliding("k", 10, s, 10), ok(0, 100*ms)),
			// rate 10: A = 0, A2 = 10, cur 10 >= A2: x = Reset + (1 - 10/10)*1e6
			// = 50000 -> 50001 µs (1 µs into the next window).
			one(950*ms, sliding("k", 10, s, 1), deny(0, 50001*us, 50*ms)),
			// 1.15 s: rate = 10*0.85 = 8.5; R = ceil(1.5) = 2.
			one(1150*ms, sliding("k", 10, s, 1), ok(1, 850*ms)),
			// rate 9.5; R = 1.
			one(1150*ms, sliding("k", 10, s, 1), ok(0, 850*ms)),
			// rate 10.5: denied. A = 10-2-1+1 = 8; x = (1 - 8/10)*1e6 - 150000,
			// 50000 in reals, but float64 1 - 0.8 is 0.19999999999999996, so
			// x = 49999.99999999994 and floor(x)+1 = 50000 µs. At 1.2 s the
			// rate is exactly 10 (still denied), so the settling step of
			// store.go moves RetryAfter to 50001 µs, the first passing time.
			one(1150*ms, sliding("k", 10, s, 1), deny(0, 50001*us, 850*ms)),
			// 1 µs before it: still denied, with 1 µs to wait.
			one(1200*ms, sliding("k", 10, s, 1), deny(0, us, 800*ms)),
			// 1 µs past 1.2 s the rate is just under 10: R = 1.
			one(1200*ms+us, sliding("k", 10, s, 1), ok(0, 799999*us)),
		},
	},
	{
		name: "sliding/hits above the limit never pass",
		steps: []step{
			// A2 = 10-11+1 = 0: RetryAfter = Reset; Remaining is the budget.
			one(300*ms, sliding("k", 10, s, 11), deny(10, 700*ms, 700*ms)),
			one(300*ms, sliding("k", 10, s, 10), ok(0, 700*ms)),
			// rate = 10*0.7 = 7; R = 3; still never.
			one(1300*ms, sliding("k", 10, s, 11), deny(3, 700*ms, 700*ms)),
		},
	},
	{
		name: "sliding/refunds",
		steps: []step{
			one(0, sliding("k", 10, s, 5), ok(5, s)),
			// cur 5 -> 3; R = 7.
			one(500*ms, refund(sliding("k", 10, s, 2)), ok(7, 500*ms)),
			// Window 1: prev 3, cur 0; refund 1 drains into prev: cur -1 ->
			// prev 2, cur 0; rate = 2*0.9 = 1.8; R = ceil(8.2) = 9.
			one(1100*ms, refund(sliding("k", 10, s, 1)), ok(9, 900*ms)),
			// prev = max(0, 2-5) = 0, never below zero (else R would be 13).
			one(1100*ms, refund(sliding("k", 10, s, 5)), ok(10, 900*ms)),
			one(1100*ms, sliding("k", 10, s, 10), ok(0, 900*ms)),
			// A = 0, A2 = 10, cur 10: x = 900000 + 0 -> 900001 µs.
			one(1100*ms, sliding("k", 10, s, 1), deny(0, 900001*us, 900*ms)),
			// A refund of a fresh key reports the full budget.
			one(1100*ms, refund(sliding("fresh", 10, s, 3)), ok(10, 900*ms)),
		},
	},
	{
		name: "sliding/check-only",
		steps: []step{
			one(0, sliding("k", 3, s, 0), ok(3, s)),
			one(0, sliding("k", 3, s, 0), ok(3, s)), // consumed nothing
			one(0, sliding("k", 3, s, 3), ok(0, s)),
			// Budget 0: denied, RetryAfter as for h = 1: A = 0, A2 = 3,
			// cur 3: x = 1e6 + (1 - 3/3)*1e6 -> 1000001 µs.
			one(0, sliding("k", 3, s, 0), deny(0, 1000001*us, s)),
		},
	},
	{
		// A paced check (an RLQS grant's reservation) counts against the
		// current window alone; every check sees what it reserved.
		name: "sliding/paced",
		steps: []step{
			one(0, sliding("k", 10, s, 10), ok(0, s)),
			// Next window at its start: prev 10 weighs fully (R 0), but
			// the paced budget is L - cur = 10.
			one(s, paced(sliding("k", 10, s, 6)), ok(4, s)),
			// Paced R = 4: denied until the window ends.
			one(1100*ms, paced(sliding("k", 10, s, 5)), deny(4, 900*ms, 900*ms)),
			// A plain check sees the reservation: rate = 10*0.9 + 6 = 15, R 0;
			// A = 10-6-1+1 = 4: x = (1 - 4/10)*1e6 - 100000 = 500000 -> 500001 µs.
			one(1100*ms, sliding("k", 10, s, 1), deny(0, 500001*us, 900*ms)),
			one(1100*ms, paced(sliding("k", 10, s, 4)), ok(0, 900*ms)),
			one(1500*ms, paced(sliding("k", 10, s, 0)), deny(0, 500*ms, 500*ms)),
			// The window after: paced R = 10 again. A refund reports the plain
			// budget: cur -3 is taken from prev (10 -> 7), rate 7, R 3.
			one(2*s, paced(sliding("k", 10, s, 0)), ok(10, s)),
			one(2*s, paced(refund(sliding("k", 10, s, 3))), ok(3, s)),
		},
	},
	{
		// Precision 4: the paced budget counts the sub-windows of the
		// current window only.
		name: "sliding/paced precision",
		steps: []step{
			one(900*ms, precise(sliding("k", 10, s, 10), 4), ok(0, 100*ms)),
			// Next window: its sub-window 0 (0-250 ms) gets 3, its
			// sub-window 1 then has the window's 3 before it.
			one(1100*ms, paced(precise(sliding("k", 10, s, 3), 4)), ok(7, 900*ms)),
			one(1300*ms, paced(precise(sliding("k", 10, s, 2), 4)), ok(5, 700*ms)),
			// A plain check counts last window's sub-window 3 (10) whole:
			// rate = 10 + 3 + 2 = 15, R 0. Sub-window 3 leaves the window
			// as sub-window 7 (1750-2000 ms) runs: the counts since are 5,
			// A = 10, q = (10-5)/10 = 0.5: x = 700 ms - 0.5*250 ms -> 575001 µs.
			one(1300*ms, precise(sliding("k", 10, s, 1), 4), deny(0, 575001*us, 700*ms)),
			one(1300*ms, paced(precise(sliding("k", 10, s, 6), 4)), deny(5, 700*ms, 700*ms)),
			one(1900*ms, paced(precise(sliding("k", 10, s, 5), 4)), ok(0, 100*ms)),
		},
	},
	{
		name: "fixed/count to the limit, deny, reset at the boundary",
		steps: []step{
			one(10*s, fixed("k", 3, time.Minute, 1), ok(2, 50*s)),
			one(10*s, fixed("k", 3, time.Minute, 1), ok(1, 50*s)),
			one(10*s, fixed("k", 3, time.Minute, 1), ok(0, 50*s)),
			one(10*s, fixed("k", 3, time.Minute, 1), deny(0, 50*s, 50*s)),
			one(10*s, fixed("k", 3, time.Minute, 0), deny(0, 50*s, 50*s)),
			one(time.Minute-us, fixed("k", 3, time.Minute, 1), deny(0, us, us)),
			one(time.Minute, fixed("k", 3, time.Minute, 1), ok(2, time.Minute)),
			one(time.Minute, fixed("k", 3, time.Minute, 4), deny(2, time.Minute, time.Minute)),
			// count = max(0, 1-5) = 0.
			one(time.Minute, refund(fixed("k", 3, time.Minute, 5)), ok(3, time.Minute)),
			one(time.Minute, fixed("k", 3, time.Minute, 3), ok(0, time.Minute)),
		},
	},
	{
		// Windows are aligned to epoch multiples of W, not to a key's first
		// request. T0 is 1751540400 s: T0 mod 7 s = 1 s; T0 mod 1 day = 39600 s.
		name: "alignment/windows start at epoch multiples",
		steps: []step{
			one(0, fixed("w7", 5, 7*s, 1), ok(4, 6*s)),
			one(0, fixed("day", 5, 24*time.Hour, 1), ok(4, 46800*s)),
			one(7*s, sliding("hour", 5, time.Hour, 1), ok(4, 3593*s)),
			// A minute limit resets at hh:mm:00.
			one(59*s, sliding("min", 5, time.Minute, 5), ok(0, s)),
			// At hh:01:00 prev 5 weighs fully: A = 5 > 0; x = (1 - 5/5)*6e7 - 0 -> 1 µs.
			one(60*s, sliding("min", 5, time.Minute, 1), deny(0, us, time.Minute)),
			one(59*s, fixed("fmin", 5, time.Minute, 5), ok(0, s)),
			one(60*s, fixed("fmin", 5, time.Minute, 5), ok(0, time.Minute)),
		},
	},
	{
		// r = 10/1e6 tokens per µs; float64 10/r = 999999.9999999999, so a
		// refill from empty is floor(...)+1 = 1000000 µs.
		name: "bucket/starts full, fractional refill",
		steps: []step{
			one(0, bucket("k", 10, 0, s, 0), ok(10, 0)),
			one(0, bucket("k", 10, 0, s, 10), ok(0, 1000000*us)),
			// floor((1-0)/r)+1; 1/r = 99999.99999999999.
			one(0, bucket("k", 10, 0, s, 1), deny(0, 100000*us, 1000000*us)),
			one(0, bucket("k", 10, 0, s, 0), deny(0, 100000*us, 1000000*us)),
			// 150 ms: tokens = 150000*r = 1.5000000000000002; R = 1;
			// Reset = floor((10-1.5000000000000002)/r)+1 = 850000 µs.
			one(150*ms, bucket("k", 10, 0, s, 0), ok(1, 850000*us)),
			one(150*ms, bucket("k", 10, 0, s, 1), ok(0, 950000*us)),
			// tokens 0.5000000000000002: x = 49999.99999999997 -> 50000 µs.
			one(150*ms, bucket("k", 10, 0, s, 1), deny(0, 50000*us, 950000*us)),
			// tokens = 0.5000000000000002 + 50000*r = 1.0000000000000002,
			// 2.2e-16 after the hit: Reset = floor(999999.9999999999)+1.
			one(200*ms, bucket("k", 10, 0, s, 1), ok(0, 1000000*us)),
		},
	},
	{
		// L = 1/s, B = 5: r = 1e-6; 5/r = 5e6 exactly, 1/r = 1e6.
		name: "bucket/burst above limit",
		steps: []step{
			one(0, bucket("k", 1, 5, s, 5), ok(0, 5000001*us)),
			one(0, bucket("k", 1, 5, s, 1), deny(0, 1000001*us, 5000001*us)),
			// h > B: RetryAfter is the Reset of an empty bucket.
			one(0, bucket("k", 1, 5, s, 6), deny(0, 5000001*us, 5000001*us)),
			// 2.5 s: tokens 2.5; R = 2; Reset = floor(2.5/r)+1.
			one(2500*ms, bucket("k", 1, 5, s, 0), ok(2, 2500001*us)),
		},
	},
	{
		name: "bucket/refund capped at capacity",
		steps: []step{
			// tokens 7: Reset = floor(3/r)+1 = 300001 µs.
			one(0, bucket("k", 10, 0, s, 3), ok(7, 300001*us)),
			// min(10, 7+5) = 10: full, Reset 0.
			one(0, refund(bucket("k", 10, 0, s, 5)), ok(10, 0)),
			one(0, bucket("k", 10, 0, s, 10), ok(0, 1000000*us)),
		},
	},
	{
		name: "bucket/hits above burst",
		steps: []step{
			// Remaining is the budget (10); RetryAfter that of an empty bucket.
			one(0, bucket("k", 10, 0, s, 11), deny(10, 1000000*us, 0)),
			one(0, bucket("k", 10, 0, s, 10), ok(0, 1000000*us)),
		},
	},
	{
		name: "batch/all or nothing",
		steps: []step{
			// a's hit fits, b's do not: a reports the budget it found (5),
			// since nothing was consumed.
			batch(0, cs(sliding("a", 5, s, 1), sliding("b", 2, s, 3)),
				ok(5, s), deny(2, s, s)),
			// a's hit was not written.
			batch(0, cs(sliding("a", 5, s, 0)), ok(5, s)),
			// Across algorithms: tokens 6, Reset floor(4/r)+1 = 400000 µs.
			batch(0, cs(bucket("c", 10, 0, s, 4), fixed("d", 1, s, 2)),
				ok(10, 400000*us), deny(1, s, s)),
			batch(0, cs(bucket("c", 10, 0, s, 0), fixed("d", 1, s, 0)),
				ok(10, 0), ok(1, s)),
			// All allowed: all written.
			batch(0, cs(sliding("a", 5, s, 1), sliding("b", 2, s, 2)),
				ok(4, s), ok(0, s)),
			batch(0, cs(sliding("a", 5, s, 0), sliding("b", 2, s, 0)),
				ok(4, s), deny(0, 1000001*us, s)),
		},
	},
	{
		name: "batch/duplicate keys count twice",
		steps: []step{
			// The third sees cur 4: A = 5-4-2+1 = 0, A2 = 4, cur 4:
			// x = 1e6 + (1 - 4/4)*1e6 -> 1000001 µs.
			batch(0, cs(sliding("a", 5, s, 2), sliding("a", 5, s, 2), sliding("a", 5, s, 2)),
				ok(5, s), ok(3, s), deny(1, 1000001*us, s)),
			batch(0, cs(sliding("a", 5, s, 0)), ok(5, s)),
			batch(0, cs(sliding("a", 5, s, 2), sliding("a", 5, s, 2)), ok(3, s), ok(1, s)),
			batch(0, cs(sliding("a", 5, s, 0)), ok(1, s)),
			batch(0, cs(bucket("t", 3, 0, s, 2), bucket("t", 3, 0, s, 2)),
				ok(3, 666667*us), deny(1, 333334*us, 666667*us)),
			batch(0, cs(fixed("f", 3, s, 2), fixed("f", 3, s, 1)), ok(1, s), ok(0, s)),
			batch(0, cs(fixed("f", 3, s, 0)), deny(0, s, s)),
		},
	},
	{
		name: "batch/refunds first and kept when the batch is denied",
		steps: []step{
			one(0, sliding("a", 5, s, 4), ok(1, s)),
			// The refund (listed last) is applied first: cur 4 -> 1, R 4;
			// then a's 2 hits fit, b is over: nothing consumed, a reports 4.
			batch(0, cs(sliding("a", 5, s, 2), sliding("b", 2, s, 3), refund(sliding("a", 5, s, 3))),
				ok(4, s), deny(2, s, s), ok(4, s)),
			batch(0, cs(sliding("a", 5, s, 0)), ok(4, s)),
		},
	},
	{
		name: "batch/shadow denial does not veto",
		steps: []step{
			batch(0, cs(sliding("a", 5, s, 1), shadow(sliding("b", 2, s, 3))),
				ok(4, s), deny(2, s, s)),
			batch(0, cs(sliding("a", 5, s, 0), sliding("b", 2, s, 0)), ok(4, s), ok(2, s)),
			// An allowed shadow check consumes.
			batch(0, cs(sliding("a", 5, s, 1), shadow(sliding("b", 2, s, 2))), ok(3, s), ok(0, s)),
			batch(0, cs(sliding("a", 5, s, 0), sliding("b", 2, s, 0)), ok(3, s), deny(0, 1000001*us, s)),
			// A denied non-shadow check still vetoes, the shadow's hits too.
			batch(0, cs(shadow(sliding("a", 5, s, 1)), sliding("b", 2, s, 1)),
				ok(3, s), deny(0, 1000001*us, s)),
			batch(0, cs(sliding("a", 5, s, 0)), ok(3, s)),
		},
	},
	{
		// Forced hits (write-backs) count whatever the budget.
		name: "force/sliding past the limit, then denied",
		steps: []step{
			// A missing key: cur 3; R = 2.
			one(0, force(sliding("k", 5, s, 3)), ok(2, s)),
			// cur 7 > L: allowed all the same, budget 0.
			one(0, force(sliding("k", 5, s, 4)), ok(0, s)),
			// A = 5-7-1+1 = -2, A2 = 5, cur 7 >= A2:
			// x = 1e6 + (1 - 5/7)*1e6 = 1285714.28... -> 1285715 µs.
			one(0, sliding("k", 5, s, 1), deny(0, 1285715*us, s)),
			one(0, sliding("k", 5, s, 0), deny(0, 1285715*us, s)),
			// Window 1: the forced 7 are prev; rate = 7*0.5 = 3.5; R = 2.
			one(1500*ms, sliding("k", 5, s, 1), ok(1, 500*ms)),
		},
	},
	{
		name: "force/fixed past the limit, then denied",
		steps: []step{
			one(10*s, force(fixed("k", 3, time.Minute, 5)), ok(0, 50*s)),
			one(10*s, fixed("k", 3, time.Minute, 1), deny(0, 50*s, 50*s)),
			one(10*s, fixed("k", 3, time.Minute, 0), deny(0, 50*s, 50*s)),
			// count 5 -> 4: still over; 4 -> 2: R = 1.
			one(10*s, refund(fixed("k", 3, time.Minute, 1)), ok(0, 50*s)),
			one(10*s, refund(fixed("k", 3, time.Minute, 2)), ok(1, 50*s)),
			one(time.Minute, fixed("k", 3, time.Minute, 1), ok(2, time.Minute)),
		},
	},
	{
		// r = 10/1e6 tokens per µs, as in "bucket/starts full".
		name: "force/bucket empties but never owes",
		steps: []step{
			// A missing key starts full: tokens 10 -> 6; Reset floor(4/r)+1.
			one(0, force(bucket("k", 10, 0, s, 4)), ok(6, 400000*us)),
			// tokens = max(0, 6-20) = 0; Reset floor(10/r)+1.
			one(0, force(bucket("k", 10, 0, s, 20)), ok(0, 1000000*us)),
			one(0, bucket("k", 10, 0, s, 1), deny(0, 100000*us, 1000000*us)),
			// 150 ms refill 1.5000000000000002 tokens from 0, not from -14.
			one(150*ms, bucket("k", 10, 0, s, 1), ok(0, 950000*us)),
			// A bucket with limit 0 neither reads nor writes: allowed, 0, 0.
			one(0, force(bucket("z", 0, 0, s, 3)), ok(0, 0)),
			one(0, bucket("z", 0, 0, s, 1), deny(0, s, 0)),
		},
	},
	{
		name: "force/with refund is a refund",
		steps: []step{
			one(0, sliding("s", 5, s, 4), ok(1, s)),
			one(0, force(refund(sliding("s", 5, s, 3))), ok(4, s)),
			one(0, fixed("f", 5, s, 4), ok(1, s)),
			one(0, force(refund(fixed("f", 5, s, 3))), ok(4, s)),
			// tokens 4: Reset floor(6/r)+1; refund: 7, Reset floor(3/r)+1.
			one(0, bucket("b", 10, 0, s, 6), ok(4, 600001*us)),
			one(0, force(refund(bucket("b", 10, 0, s, 3))), ok(7, 300001*us)),
		},
	},
	{
		name: "force/written when the batch is denied",
		steps: []step{
			// The force (listed second) is applied first: cur 2, R 3; a's
			// hit fits, b's 3 > L = 2 can never pass (A2 = 0: RetryAfter =
			// Reset): a's hit is not written (it reports R 3), the force is.
			batch(0, cs(sliding("a", 5, s, 1), force(sliding("a", 5, s, 2)), sliding("b", 2, s, 3)),
				ok(3, s), ok(3, s), deny(2, s, s)),
			batch(0, cs(sliding("a", 5, s, 0), sliding("b", 2, s, 0)), ok(3, s), ok(2, s)),
			// Across algorithms: d vetoes t's consumption; f's and u's
			// forced hits are written.
			batch(0, cs(force(fixed("f", 3, s, 2)), bucket("t", 10, 0, s, 4), fixed("d", 1, s, 2), force(bucket("u", 10, 0, s, 4))),
				ok(1, s), ok(10, 400000*us), deny(1, s, s), ok(6, 400000*us)),
			batch(0, cs(fixed("f", 3, s, 0), bucket("t", 10, 0, s, 0), fixed("d", 1, s, 0), bucket("u", 10, 0, s, 0)),
				ok(1, s), ok(10, 0), ok(1, s), ok(6, 400000*us)),
		},
	},
	{
		// Leases: Want more hits counted with the check's own.
		name: "lease/at once",
		steps: []step{
			// Fixed: R' = 9, a lease of 4, 5 left.
			one(0, lease(fixed("f", 10, s, 1), 4, 0), leased(5, s, store.Lease{Hits: 4, Now: 4})),
			one(0, fixed("f", 10, s, 0), ok(5, s)),
			// At most what is left after the hits.
			one(0, lease(fixed("f", 10, s, 2), 9, 0), leased(0, s, store.Lease{Hits: 3, Now: 3})),
			// Sliding, no previous window: R' = 7, a lease of 3.
			one(0, lease(sliding("s", 10, s, 3), 3, 50*ms), leased(4, s, store.Lease{Hits: 3, Now: 3})),
			// Token bucket: tokens 10 - 2 - 5.
			one(0, lease(bucket("b", 10, 0, s, 2), 5, 0), leased(3, 700001*us, store.Lease{Hits: 5, Now: 5})),
			// A shadow or paced check, a refund and a check-only check get none.
			one(0, lease(shadow(fixed("g", 10, s, 1)), 4, 0), ok(9, s)),
			one(0, lease(paced(sliding("p", 10, s, 1)), 4, 0), ok(9, s)),
			one(0, lease(refund(fixed("g", 10, s, 1)), 4, 0), ok(10, s)),
			one(0, lease(fixed("g", 10, s, 0), 4, 0), ok(10, s)),
			// A vetoed batch grants nothing.
			batch(0, cs(lease(fixed("h", 10, s, 1), 4, 0), fixed("i", 1, s, 2)), ok(10, s), deny(1, s, s)),
			one(0, fixed("h", 10, s, 0), ok(10, s)),
		},
	},
	{
		// A sliding window's lease with a horizon takes the hits that pass
		// as the previous window fades, on a schedule no earlier than the
		// exact one.
		name: "lease/paced sliding",
		steps: []step{
			one(0, sliding("k", 10, s, 10), ok(0, s)),
			// Next window, 100 ms in: rate 10*0.9 = 9, R 1, the hit takes
			// it. The 2nd hit would pass 1 µs later (10*(1-0.100001) + 1 <
			// 10), each next one 1e6/10 µs later: those within 300 ms are 3.
			one(1100*ms, lease(sliding("k", 10, s, 1), 5, 300*ms),
				leased(0, 900*ms, store.Lease{Hits: 3, From: us, Every: 100 * ms})),
			// Every other check sees them spent: cur 4, rate 13.
			one(1100*ms, sliding("k", 10, s, 0), deny(0, 300001*us, 900*ms)),
			// Near the window's end the lease stops at the window's own
			// budget: cur 4, prev fades, R at 950 ms = ceil(10 - 0.5 - 4) = 6.
			one(1950*ms, lease(sliding("k", 10, s, 1), 20, time.Second),
				leased(0, 50*ms, store.Lease{Hits: 5, Now: 5})),
		},
	},
	{
		name: "expiry/state past its TTL starts fresh",
		steps: []step{
			one(500*ms, sliding("sw", 5, s, 5), ok(0, 500*ms)),
			one(500*ms, fixed("fw", 5, s, 5), ok(0, 500*ms)),
			one(0, bucket("tb", 10, 0, s, 10), ok(0, 1000000*us)),
			// Sliding TTL 2 s; fixed TTL the 500 ms left; bucket TTL
			// ceil(10/r) µs + 1 s = 2 s.
			one(2500*ms, sliding("sw", 5, s, 0), ok(5, 500*ms)),
			one(2500*ms, fixed("fw", 5, s, 0), ok(5, 500*ms)),
			one(2*s, bucket("tb", 10, 0, s, 0), ok(10, 0)),
		},
	},
}

// Run runs the conformance vectors, each as a subtest against a fresh store
// from newStore, which must make the store take all its time from now.
// Subtests run in parallel; newStore may be called concurrently.
func Run(t *testing.T, newStore func(t *testing.T, now func() time.Time) store.Store) {
	t.Helper()
	nonce := fmt.Sprintf("%x", time.Now().UnixNano())
	for _, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			clk := testkit.NewClock(T0)
			st := newStore(t, clk.Now)
			t.Cleanup(func() { _ = st.Close() })
			prefix := "{storetest:" + nonce + ":" + v.name + "}:"
			for i, sp := range v.steps {
				clk.Set(T0.Add(sp.at))
				checks := make([]store.Check, len(sp.checks))
				for j, c := range sp.checks {
					c.Key = prefix + c.Key
					checks[j] = c
				}
				got := make([]store.Result, len(checks))
				if err := st.Decide(context.Background(), checks, got); err != nil {
					t.Fatalf("step %d at T0%+v: Decide: %v", i, sp.at, err)
				}
				want := withConsumed(sp.checks, sp.want)
				for j := range got {
					if got[j] != want[j] {
						t.Errorf("step %d at T0%+v, check %d (%s):\n got %s\nwant %s",
							i, sp.at, j, describe(sp.checks[j]), format(got[j]), format(want[j]))
					}
				}
			}
		})
	}
}

// withConsumed returns want with Consumed set as the package doc says: on
// the allowed consuming checks of a batch in which no consuming non-shadow
// check was denied.
func withConsumed(checks []store.Check, want []store.Result) []store.Result {
	out := append([]store.Result(nil), want...)
	for j := range checks {
		if checks[j].Consuming() && !want[j].Allowed && !checks[j].Shadow {
			return out
		}
	}
	for j := range checks {
		out[j].Consumed = checks[j].Consuming() && want[j].Allowed
	}
	return out
}

func describe(c store.Check) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s limit %d/%v", c.Key, c.Algorithm, c.Limit, c.Window)
	if c.Burst != 0 {
		fmt.Fprintf(&b, " burst %d", c.Burst)
	}
	fmt.Fprintf(&b, " hits %d", c.Hits)
	if c.Refund {
		b.WriteString(" refund")
	}
	if c.Shadow {
		b.WriteString(" shadow")
	}
	if c.Force {
		b.WriteString(" force")
	}
	if c.Paced {
		b.WriteString(" paced")
	}
	if c.Want > 0 {
		fmt.Fprintf(&b, " want %d horizon %v", c.Want, c.Horizon)
	}
	return b.String()
}

func format(r store.Result) string {
	return fmt.Sprintf("{Allowed:%t Remaining:%d RetryAfter:%dµs Reset:%dµs Lease:%d/%d from %dµs every %dµs Consumed:%t}",
		r.Allowed, r.Remaining, r.RetryAfter.Microseconds(), r.Reset.Microseconds(), r.Lease.Hits, r.Lease.Now,
		r.Lease.From.Microseconds(), r.Lease.Every.Microseconds(), r.Consumed)
}

// RunConcurrent races 50 goroutines issuing 200 single-hit checks in all at
// one fresh key per algorithm, with a limit of 100 per hour, and expects
// exactly 100 allowed. s must not cross an hour boundary of its clock during
// the test (give it a fixed fake clock to be sure).
func RunConcurrent(t *testing.T, s store.Store) {
	t.Helper()
	const (
		goroutines = 50
		total      = 200
		limit      = 100
	)
	nonce := fmt.Sprintf("%x", time.Now().UnixNano())
	for _, alg := range []store.Algorithm{store.SlidingWindow, store.TokenBucket, store.FixedWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			c := store.Check{
				Key:       "{storetest:" + nonce + "}:concurrent:" + alg.String(),
				Algorithm: alg,
				Limit:     limit,
				Window:    time.Hour,
				Hits:      1,
			}
			var allowed atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, goroutines)
			start := make(chan struct{})
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					checks := []store.Check{c}
					res := make([]store.Result, 1)
					for i := 0; i < total/goroutines; i++ {
						if err := s.Decide(context.Background(), checks, res); err != nil {
							errs <- err
							return
						}
						if res[0].Allowed {
							allowed.Add(1)
						}
					}
				}()
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("Decide: %v", err)
			}
			if got := allowed.Load(); got != limit {
				t.Errorf("%d of %d checks allowed, want %d", got, total, limit)
			}
		})
	}
}
