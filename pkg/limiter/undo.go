package limiter

import (
	"context"
	"errors"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// A request is all-or-nothing beyond one store call: what the store
// consumed (store.Result.Consumed, leases included) for a request denied
// after all is refunded before the answer leaves, and retried in the
// background when refused (docs/redis.md, invariant 10).

// vetoes reports whether a request of items is denied when denied(i) says
// which items' checks were: a consuming check that is neither shadow nor
// quota is denied, or the request has consuming quota checks and every one
// of them is denied.
func vetoes(items []Item, denied func(i int) bool) bool {
	quotas, quotasDenied := 0, 0
	for i := range items {
		c := &items[i].Check
		if !c.Consuming() || c.Shadow {
			continue
		}
		if !items[i].Quota {
			if denied(i) {
				return true
			}
			continue
		}
		quotas++
		if denied(i) {
			quotasDenied++
		}
	}
	return quotas > 0 && quotasDenied == quotas
}

// undoRetries bounds the refunds being retried in the background at once;
// beyond it a refund that failed is counted lost at once.
const undoRetries = 256

// defaultUndoBackoff is the wait before each background retry of a refund
// (Limiter.undoBackoff), on the clock of Options.After.
var defaultUndoBackoff = []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}

// undo refunds the consumption the store wrote for items, a request that
// is denied after all, within ctx's deadline (less the answer's margin).
// What the store cannot take now is retried in the background.
func (l *Limiter) undo(ctx context.Context, items []Item) {
	var refunds []store.Check
	for i := range items {
		if !items[i].Result.Consumed {
			continue
		}
		r := &items[i].Result
		c := items[i].Check
		c.Hits += r.Lease.Hits // a lease granted to a request denied after all goes back with it
		c.Refund, c.Shadow, c.Force, c.Want, c.Exact = true, false, false, 0, false
		refunds = append(refunds, c)
		r.Consumed, r.Remaining, r.Lease = false, r.Remaining+items[i].Check.Hits, store.Lease{}
	}
	if len(refunds) == 0 {
		return
	}
	l.undone.Add(uint64(len(refunds)))
	results := make([]store.Result, len(refunds))
	err := l.callStoreWith(ctx, l.opts.Now(), refunds, results)
	if l.res != nil {
		for j := range refunds { // what is left now the refund landed, for leases' remaining
			if !results[j].Undecided && (err == nil || errors.Is(err, store.ErrUnavailable)) {
				l.res.observe(&refunds[j], results[j].Remaining)
			}
		}
	}
	if failed, maybeRan := failedRefunds(refunds, results, err); maybeRan {
		l.undoUnknown.Add(uint64(len(failed)))
	} else if len(failed) > 0 {
		l.retryUndo(failed)
	}
}

// failedRefunds returns the refunds the store did not take: all of them
// when it failed as a whole, else those it could not decide. maybeRan
// reports that a call timed out after it may have been sent: Redis may
// still run it, so retrying could refund twice (and admit beyond a limit).
func failedRefunds(refunds []store.Check, results []store.Result, err error) (failed []store.Check, maybeRan bool) {
	if err == nil {
		return nil, false
	}
	maybeRan = maybeSent(err)
	if !errors.Is(err, store.ErrUnavailable) {
		return refunds, maybeRan
	}
	for j := range results {
		if results[j].Undecided {
			failed = append(failed, refunds[j])
		}
	}
	if len(failed) == 0 {
		return refunds, maybeRan
	}
	return failed, maybeRan
}

// retryUndo retries refunds in the background, a few times over a few
// seconds, and counts what never lands as lost: at once when too many are
// being retried already or the limiter is closed.
func (l *Limiter) retryUndo(refunds []store.Check) {
	l.undoRetried.Add(uint64(len(refunds)))
	if l.undoInFlight.Add(1) > undoRetries {
		l.undoInFlight.Add(-1)
		l.loseRefunds(refunds)
		return
	}
	started := l.bg.start(func() {
		defer l.undoInFlight.Add(-1)
		l.retryRefunds(refunds)
	})
	if !started {
		l.undoInFlight.Add(-1)
		l.loseRefunds(refunds)
	}
}

// retryRefunds tries refunds after each backoff wait until the store takes
// them. Close ends the wait at once: the refunds then get one last try.
func (l *Limiter) retryRefunds(refunds []store.Check) {
	for _, wait := range l.undoBackoff {
		closing := !l.waitBackoff(wait)
		var done bool
		if refunds, done = l.tryRefunds(refunds); done {
			return
		}
		if closing {
			break
		}
	}
	l.loseRefunds(refunds)
}

// waitBackoff waits d on the limiter's clock, and reports false when Close
// ended the wait first.
func (l *Limiter) waitBackoff(d time.Duration) bool {
	select {
	case <-l.bg.stop.Done():
		return false
	case <-l.opts.After(d):
		return true
	}
}

// tryRefunds sends refunds to the store once and returns those it did not
// take; done reports that nothing is left to retry: all landed, or the call
// timed out after it may have been sent (counted unknown, never retried).
func (l *Limiter) tryRefunds(refunds []store.Check) (left []store.Check, done bool) {
	ctx, cancel := context.WithTimeout(l.bg.work, time.Second)
	defer cancel()
	results := make([]store.Result, len(refunds))
	err := l.st.Decide(ctx, refunds, results)
	failed, maybeRan := failedRefunds(refunds, results, err)
	switch {
	case len(failed) == 0 || err == nil:
		return nil, true
	case maybeRan:
		l.undoUnknown.Add(uint64(len(failed)))
		return nil, true
	}
	return failed, false
}

// loseRefunds counts refunds the store never took as lost, and logs it at
// most once per logthrottle.Every.
func (l *Limiter) loseRefunds(refunds []store.Check) {
	l.undoLost.Add(uint64(len(refunds)))
	if held, ok := l.refundLog.AllowN(uint64(len(refunds))); ok {
		l.opts.Log.Warn("refunds the store could not take are lost: their counters keep the hits until their window passes",
			"refunds_lost", uint64(len(refunds))+held, "key", refunds[0].Key)
	}
}
