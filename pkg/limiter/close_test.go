package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// holdStore holds the calls that match (a write-back, a refund) until the
// test releases them or their context ends, and counts the calls it gets
// once the test marks the limiter closed.
type holdStore struct {
	store.Store
	match   func(checks []store.Check) bool
	entered chan struct{} // one send per held call
	release chan struct{}
	closed  atomic.Bool
	late    atomic.Int64
}

func newHoldStore(s store.Store, match func([]store.Check) bool) *holdStore {
	return &holdStore{Store: s, match: match, entered: make(chan struct{}, 16), release: make(chan struct{})}
}

func (s *holdStore) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	if s.closed.Load() {
		s.late.Add(1)
	}
	if s.match != nil && s.match(checks) {
		s.entered <- struct{}{}
		select {
		case <-s.release:
		case <-ctx.Done():
			return fmt.Errorf("held: %w: %w", store.ErrUnavailable, ctx.Err())
		}
	}
	return s.Store.Decide(ctx, checks, results)
}

// onlyForce matches a background write-back: Force checks alone (a
// write-back riding along with a request comes with its checks).
func onlyForce(checks []store.Check) bool {
	for _, c := range checks {
		if !c.Force {
			return false
		}
	}
	return len(checks) > 0
}

func anyRefund(checks []store.Check) bool {
	for _, c := range checks {
		if c.Refund {
			return true
		}
	}
	return false
}

// noLeak waits until no more goroutines run than base: what the limiter
// started has returned.
func noLeak(t *testing.T, base int) {
	t.Helper()
	testkit.WaitFor(t, fmt.Sprintf("goroutines back to %d", base), 5*time.Second, func() bool {
		return runtime.NumGoroutine() <= base
	})
}

// Close waits for a write-back in flight: once it returns, the hits are
// written and counted.
func TestCloseWaitsForWriteBack(t *testing.T) {
	base := runtime.NumGoroutine()
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	cs := &countingStore{Store: memory.New(memory.Options{Now: clk.Now})}
	hs := newHoldStore(cs, onlyForce)
	l := New(hs, Options{Now: clk.Now, After: clk.After})
	a, b := chk("rl:{d|k=a}:m1", 100, time.Minute), chk("rl:{d|k=b}:m1", 100, time.Minute)
	cs.down.Store(true)
	for range 3 {
		decide(t, l, false, a) // admitted locally, queued for write-back
	}
	cs.down.Store(false)
	decide(t, l, false, b) // the store answers: the write-back starts
	<-hs.entered

	closed := make(chan error, 1)
	go func() { closed <- l.Close(context.Background()) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a write-back was in flight", err)
	default:
	}
	close(hs.release)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if c := l.Counters(); c.WrittenBack != 3 || c.WriteBackLost != 0 {
		t.Fatalf("after Close: written %d lost %d, want 3 and 0", c.WrittenBack, c.WriteBackLost)
	}
	noLeak(t, base)
}

// A refund retry waiting for its backoff at Close makes one last try: it
// is written if the store takes it, else counted lost and logged.
func TestClosePendingRefundRetry(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int64 // refund calls that fail: the first try, then the retries
		want     uint64
		lost     uint64
	}{
		{"store back at close: written", 1, 100, 0},
		{"store still down: lost", 1000, 99, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := runtime.NumGoroutine()
			clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
			mem := memory.New(memory.Options{Now: clk.Now})
			ss := &slotStore{Store: mem}
			var logs testkit.Buffer
			l := New(ss, Options{Now: clk.Now, After: clk.After, DisableOverLimitCache: true,
				Log: slog.New(slog.NewTextHandler(&logs, nil))})
			a, b := hourly("a|k=1", 0), hourly("b|k=1", 100)
			ss.refundsFail.Store(tc.failures)
			if err := l.Decide(context.Background(), []Item{{Check: a}, {Check: b}}); err != nil {
				t.Fatal(err)
			}
			testkit.WaitFor(t, "a retry waiting for its backoff", 5*time.Second, func() bool { return clk.Waiters() == 1 })
			if err := l.Close(context.Background()); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if got := remaining(t, mem, b); got != tc.want {
				t.Errorf("remaining %d after Close, want %d", got, tc.want)
			}
			c := l.Counters()
			if c.UndoRetried != 1 || c.UndoLost != tc.lost {
				t.Errorf("counters %+v, want 1 retried, %d lost", c, tc.lost)
			}
			if logged := strings.Contains(logs.String(), "refunds_lost=1"); logged != (tc.lost > 0) {
				t.Errorf("log %q: refunds_lost=1 logged %v, want %v", logs.String(), logged, tc.lost > 0)
			}
			noLeak(t, base)
		})
	}
}

// When Close's context ends before a retry's store call returns, the call
// is cancelled, Close waits for it and returns the context's error, and the
// refund is counted lost.
func TestCloseBoundedByContext(t *testing.T) {
	base := runtime.NumGoroutine()
	l, ss, mem, clk := newSlottedClock(t)
	hs := newHoldStore(ss, anyRefund)
	l.st = hs
	a, b := hourly("a|k=1", 0), hourly("b|k=1", 100)
	ss.refundsFail.Store(1)
	go func() {
		<-hs.entered // the first try: it fails in slotStore once released
		hs.release <- struct{}{}
	}()
	if err := l.Decide(context.Background(), []Item{{Check: a}, {Check: b}}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "a retry waiting for its backoff", 5*time.Second, func() bool { return clk.Waiters() == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	closed := make(chan error, 1)
	go func() { closed <- l.Close(ctx) }()
	<-hs.entered // the last try, held until its context ends
	cancel()
	if err := <-closed; !errors.Is(err, context.Canceled) {
		t.Fatalf("Close: %v, want context.Canceled", err)
	}
	if c := l.Counters(); c.UndoLost != 1 {
		t.Errorf("counters %+v, want 1 lost", c)
	}
	if got := remaining(t, mem, b); got != 99 {
		t.Errorf("remaining %d, want 99 (the refund was lost, as counted)", got)
	}
	noLeak(t, base)
}

// After Close nothing runs in the background: a refund the store cannot
// take is counted lost at once, no write-back starts by itself, and a
// WriteBack call counts what it cannot write as lost.
func TestNothingRunsAfterClose(t *testing.T) {
	base := runtime.NumGoroutine()
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	cs := &countingStore{Store: memory.New(memory.Options{Now: clk.Now})}
	hs := newHoldStore(cs, nil)
	var logs testkit.Buffer
	l := New(hs, Options{Now: clk.Now, After: clk.After, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	hs.closed.Store(true)
	a, b := chk("rl:{d|k=a}:m1", 100, time.Minute), chk("rl:{d|k=b}:m1", 100, time.Minute)
	refund := a
	refund.Refund = true

	cs.down.Store(true)
	decide(t, l, false, refund)     // the store never saw it: lost at once, not retried
	decide(t, l, false, hits(a, 2)) // admitted locally, queued for write-back
	cs.down.Store(false)
	decide(t, l, false, b) // an answered call, which would start a write-back
	if got := hs.late.Load(); got != 3 {
		t.Fatalf("store calls after Close: %d, want the 3 decisions' own", got)
	}
	c := l.Counters()
	if c.UndoRetried != 1 || c.UndoLost != 1 {
		t.Errorf("counters %+v, want the refund retried and lost at once", c)
	}
	if tb := l.Tables(); tb[2].Entries != 1 {
		t.Errorf("write-backs pending %d, want 1: none may start after Close", tb[2].Entries)
	}
	cs.down.Store(true)
	if err := l.WriteBack(context.Background()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("WriteBack: %v", err)
	}
	if c := l.Counters(); c.WriteBackLost != 2 {
		t.Errorf("write-back lost %d, want 2", c.WriteBackLost)
	}
	if !strings.Contains(logs.String(), "hits_lost=2") {
		t.Errorf("log %q does not report the 2 hits lost", logs.String())
	}
	noLeak(t, base)
}

// timeoutRefunds fails every refund call with a socket read timeout: the
// call was sent, and Redis may still run it.
type timeoutRefunds struct{ store.Store }

func (s timeoutRefunds) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	if anyRefund(checks) {
		return fmt.Errorf("redis decide: %w: read tcp 127.0.0.1:1: %w", store.ErrUnavailable, os.ErrDeadlineExceeded)
	}
	return s.Store.Decide(ctx, checks, results)
}

// A refund whose call timed out on the socket may have run: it is counted
// unknown and never retried (a retry could refund twice).
func TestSocketTimeoutRefundNotRetried(t *testing.T) {
	l, ss, _ := newSlotted(t)
	l.st = timeoutRefunds{ss}
	if err := l.Decide(context.Background(), []Item{{Check: hourly("a|k=1", 0)}, {Check: hourly("b|k=1", 100)}}); err != nil {
		t.Fatal(err)
	}
	if c := l.Counters(); c.UndoUnknown != 1 || c.UndoRetried != 0 {
		t.Fatalf("counters %+v, want 1 unknown, 0 retried", c)
	}
}
