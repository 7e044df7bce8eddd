package rlqs

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/testkit"
)

// gatedStore holds every Decide until open is closed; with ignoreCtx it then
// decides as a Redis that ran the script although its caller gave up.
type gatedStore struct {
	store.Store
	open      chan struct{}
	ignoreCtx bool
	mu        sync.Mutex
	entered   int
}

func (g *gatedStore) Decide(ctx context.Context, checks []store.Check, res []store.Result) error {
	g.mu.Lock()
	g.entered++
	g.mu.Unlock()
	if g.ignoreCtx {
		<-g.open
	} else {
		select {
		case <-g.open:
		case <-ctx.Done():
			return fmt.Errorf("%w: %v", store.ErrUnavailable, ctx.Err())
		}
	}
	return g.Store.Decide(context.Background(), checks, res)
}

func (g *gatedStore) calls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.entered
}

// streamsGone waits until h's server holds no stream, bucket, share group
// or byte of its budget, and its gauges say so.
func streamsGone(t *testing.T, h *harness) {
	t.Helper()
	testkit.WaitFor(t, "every stream's state released", 5*time.Second, func() bool {
		h.srv.mu.Lock()
		n, g := len(h.srv.streams), len(h.srv.groups)
		h.srv.mu.Unlock()
		return n == 0 && g == 0 && h.srv.budget.used.Load() == 0 &&
			testutil.ToFloat64(h.m.streams) == 0 && testutil.ToFloat64(h.m.buckets) == 0
	})
}

// TestReportAfterEndReservesNothing: a stream whose client goes away while
// its report's reservation is in the store (which runs it anyway, as Redis
// runs a script whose caller gave up) gives the reservation back, sends
// nothing, and leaves no member in the share group; the gauges and the
// memory budget return to zero.
func TestReportAfterEndReservesNothing(t *testing.T) {
	h := newHarness(t, Options{})
	gate := &gatedStore{Store: h.st, open: make(chan struct{}), ignoreCtx: true}
	h.srv.o.Store = gate
	ctx, cancel := context.WithCancel(context.Background())
	cs := rawStreamCtx(t, ctx, h.conn)
	id := map[string]string{"api_key": "k", "route": "r"} // 600 a minute
	if err := cs.SendMsg(&raw{encodeReport("d", 0, 0, 600, id)}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the reservation in the store", 5*time.Second, func() bool { return gate.calls() == 1 })
	cancel() // the client goes away while the store reserves
	testkit.WaitFor(t, "the stream's end seen", 5*time.Second, func() bool {
		h.srv.mu.Lock()
		defer h.srv.mu.Unlock()
		for st := range h.srv.streams {
			if st.ctx.Err() == nil {
				return false
			}
		}
		return true
	})
	close(gate.open)
	streamsGone(t, h)
	if left := h.remaining(t, id); left != 600 {
		t.Errorf("the key has %d of 600 left after a stream that ended before its grant was sent, want all: the reservation was kept", left)
	}
}

// TestShutdownBoundedWhileStoreStalls: Shutdown ends the store calls in
// flight and returns within its context, although the store never
// answers; the stream ends Unavailable after its TTL 0.
func TestShutdownBoundedWhileStoreStalls(t *testing.T) {
	h := newHarness(t, Options{StoreTimeout: time.Hour})
	gate := &gatedStore{Store: h.st, open: make(chan struct{})}
	defer close(gate.open)
	h.srv.o.Store = gate
	cs := h.rawStream(t)
	if err := cs.SendMsg(&raw{encodeReport("d", 0, 0, 10, map[string]string{"open": "x"}, map[string]string{"api_key": "k"})}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "a store call stalled", 5*time.Second, func() bool { return gate.calls() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h.srv.Shutdown(ctx)
	if ctx.Err() != nil {
		t.Errorf("Shutdown returned only when its context ended: the stalled store call held it")
	}
	for {
		var m raw
		err := cs.RecvMsg(&m)
		if err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Errorf("stream ended %v, want Unavailable", err)
			}
			break
		}
	}
	streamsGone(t, h)
}

// TestSilentStreamEnded: a stream that sends nothing for two reporting
// intervals (15 s each before a bucket's second report) is ended
// Unavailable.
func TestSilentStreamEnded(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1_800_000_000, 0))
	h := newHarness(t, Options{Now: clk.Now, SilentMin: time.Second})
	cs := h.rawStream(t)
	if err := cs.SendMsg(&raw{encodeReport("d", 0, 1, 0, map[string]string{"open": "x"})}); err != nil {
		t.Fatal(err)
	}
	recv(t, cs)
	clk.Advance(2*defaultInterval + time.Second)
	h.srv.Reconfigure() // wakes the stream, which finds it silent
	err := drainUntilEnd(cs)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no report on this stream") {
		t.Fatalf("a silent stream: %v, want Unavailable saying it was silent", err)
	}
	if got := testutil.ToFloat64(h.m.refused.WithLabelValues("silent")); got != 1 {
		t.Errorf("rls_rlqs_refused_total{reason=silent} = %v, want 1", got)
	}
	streamsGone(t, h)
}

// drainUntilEnd reads cs until it fails and returns the error.
func drainUntilEnd(cs grpc.ClientStream) error {
	for {
		if err := cs.RecvMsg(&raw{}); err != nil {
			return err
		}
	}
}

// bigIDs returns n BucketIds of api_key values of size bytes each.
func bigIDs(prefix string, n, size int) []map[string]string {
	ids := make([]map[string]string, n)
	for i := range ids {
		ids[i] = map[string]string{"api_key": fmt.Sprintf("%s%d-%s", prefix, i, strings.Repeat("x", size))}
	}
	return ids
}

// TestMemoryBudget: the stream that would pass the streams' memory budget
// ends ResourceExhausted naming it, while a stream within it goes on; the
// budget is whole again once it ended.
func TestMemoryBudget(t *testing.T) {
	h := newHarness(t, Options{MemoryBudget: 400 << 10})
	small := h.rawStream(t)
	if err := small.SendMsg(&raw{encodeReport("d", 0, 1, 0, map[string]string{"api_key": "small"})}); err != nil {
		t.Fatal(err)
	}
	recv(t, small)
	big := h.rawStream(t)
	var err error
	for i := 0; err == nil && i < 20; i++ {
		if err = big.SendMsg(&raw{encodeReport("d", 0, 1, 0, bigIDs(fmt.Sprintf("r%d-", i), 2, 10<<10)...)}); err == nil {
			_, err = recvErr(big)
		}
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "memory budget") {
		t.Fatalf("a stream of 20 KB BucketIds over a 400 KiB budget: %v, want ResourceExhausted naming the budget", err)
	}
	if got := testutil.ToFloat64(h.m.refused.WithLabelValues("budget")); got != 1 {
		t.Errorf("rls_rlqs_refused_total{reason=budget} = %v, want 1", got)
	}
	if err := small.SendMsg(&raw{encodeReport("d", 1, 1, 0, map[string]string{"api_key": "small"})}); err != nil {
		t.Fatalf("the small stream after the big one was refused: %v", err)
	}
	testkit.WaitFor(t, "the big stream's budget given back", 5*time.Second, func() bool {
		return h.srv.budget.used.Load() < 8<<10
	})
}

func recvErr(cs grpc.ClientStream) (*raw, error) {
	var m raw
	return &m, cs.RecvMsg(&m)
}

// TestSlowReaderCut: a client that reads nothing while its responses fill
// its flow-control window is cut ResourceExhausted after SendWait, and its
// queued responses leave the budget.
func TestSlowReaderCut(t *testing.T) {
	h := newHarness(t, Options{SendWait: 300 * time.Millisecond})
	cs := h.rawStream(t)
	// 20 buckets of 10 KB ids: each answer is 200 KB, over the client's
	// 64 KiB window; the client never reads.
	for i := 0; i < 3; i++ {
		if err := cs.SendMsg(&raw{encodeReport("d", 0, 1, 0, bigIDs(fmt.Sprintf("s%d-", i), 20, 10<<10)...)}); err != nil {
			break
		}
	}
	testkit.WaitFor(t, "the reader cut", 5*time.Second, func() bool {
		return testutil.ToFloat64(h.m.refused.WithLabelValues("slow_reader")) == 1
	})
	streamsGone(t, h)
}

// TestHonestReaderNotCut: a stream with 300 counted buckets whose client
// reads everything gets one response per tick, however many buckets are
// due at it, and is never cut (each bucket's timer sending its own answer
// cut such a stream within seconds).
func TestHonestReaderNotCut(t *testing.T) {
	h := newHarness(t, Options{SendWait: 500 * time.Millisecond})
	cs := h.rawStream(t)
	ids := make([]map[string]string, 300)
	for i := range ids {
		ids[i] = map[string]string{"tb": fmt.Sprintf("t%d", i)} // token bucket: renewed every Period (2 s)
	}
	if err := cs.SendMsg(&raw{encodeReport("d", 0, 1, 0, ids...)}); err != nil {
		t.Fatal(err)
	}
	if first := recv(t, cs); len(first.BucketAction) != 300 {
		t.Fatalf("first answer has %d actions, want all 300 in one response", len(first.BucketAction))
	}
	responses, actions := 0, 0
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		r := recv(t, cs)
		responses++
		actions += len(r.BucketAction)
		if actions >= 300 {
			break
		}
	}
	if actions < 300 || responses > 3 {
		t.Errorf("the renewals of 300 buckets came as %d actions in %d responses, want all 300 in a response or two", actions, responses)
	}
	if got := testutil.ToFloat64(h.m.refused.WithLabelValues("slow_reader")); got != 0 {
		t.Errorf("an honest reader was cut as slow %v times", got)
	}
}

// reloadYAML has a fixed minute's window, whose count a lower limit reads
// as it is (a sliding window would also weigh the last window's).
const reloadYAML = `
domain: d
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 600, algorithm: fixed_window}
  - key: gone
    rate_limit: {unit: minute, requests_per_unit: 600}
`

// TestReloadReresolvesBuckets: a config reload under an open stream sends,
// in the next response, each bucket's grant under its rule's new limit
// (here lowered below what the window already reserved: DENY_ALL until the
// next window, whose grant follows the new limit), and abandons a bucket
// whose rule is gone.
func TestReloadReresolvesBuckets(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1_800_000_000, 0).Truncate(time.Minute).Add(time.Second))
	h := newHarnessYAML(t, reloadYAML, Options{Now: clk.Now})
	cs := h.rawStream(t)
	limited, gone := map[string]string{"api_key": "k"}, map[string]string{"gone": "g"}
	if err := cs.SendMsg(&raw{encodeReport("d", 0, 0, 10, limited, gone)}); err != nil {
		t.Fatal(err)
	}
	first := recv(t, cs)
	if w := worstOf(first.BucketAction[0]); w < 100 {
		t.Fatalf("first grant %d, want most of the demand (10/s over the minute)", w)
	}
	cfg, err := descriptors.Parse(map[string][]byte{"d.yaml": []byte(`
domain: d
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: fixed_window}
`)})
	if err != nil {
		t.Fatal(err)
	}
	h.svc.SetConfig(cfg)
	h.srv.Reconfigure()
	r := recv(t, cs)
	got := map[string]string{}
	for _, a := range r.BucketAction {
		switch {
		case a.GetAbandonAction() != nil:
			got[BucketKey(a.BucketId.Bucket)] = "abandon"
		case a.GetQuotaAssignmentAction() != nil:
			checkAssignment(t, a)
			got[BucketKey(a.BucketId.Bucket)] = fmt.Sprint(worstOf(a))
		}
	}
	if got[BucketKey(gone)] != "abandon" {
		t.Errorf("the bucket whose rule is gone got %q in the response after the reload, want an abandon", got[BucketKey(gone)])
	}
	if w := got[BucketKey(limited)]; w != "0" {
		t.Errorf("the bucket whose limit fell from 600 to 60 a minute got %q in the response after the reload, want DENY_ALL (0): the window already reserved more than 60", w)
	}
	// In the next window the grant follows the new limit.
	clk.Advance(time.Minute)
	if err := cs.SendMsg(&raw{encodeReport("d", 60, 0, 600, limited)}); err != nil {
		t.Fatal(err)
	}
	for {
		r := recv(t, cs)
		if len(r.BucketAction) == 0 || r.BucketAction[0].GetQuotaAssignmentAction() == nil {
			continue
		}
		if w := worstOf(r.BucketAction[0]); w == 0 || w > 60 {
			t.Errorf("the next window's grant is %d, want at most the new limit 60 and some", w)
		}
		break
	}
}

// TestDemandBounded: a stream that reports 10^12 denials cannot claim more
// than its fair part of the limit (here half: two streams of the key) nor
// more than the limit's pace: once both streams' demands are known, the
// honest stream's grant is at least half the limit.
func TestDemandBounded(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1_800_000_000, 0).Add(100 * time.Millisecond))
	h := newHarness(t, Options{Now: clk.Now})
	id := map[string]string{"api_key": "shared"} // 1000 a second, fixed window
	liar, honest := h.rawStream(t), h.rawStream(t)
	for _, cs := range []grpc.ClientStream{liar, honest} {
		if err := cs.SendMsg(&raw{encodeReport("d", 0, 0, 0, id)}); err != nil {
			t.Fatal(err)
		}
		recv(t, cs)
	}
	clk.Advance(time.Second) // the next window: the liar's report, then the honest one's
	if err := liar.SendMsg(&raw{encodeReport("d", 1, 0, 1_000_000_000_000, id)}); err != nil {
		t.Fatal(err)
	}
	waitCount(t, h.m, 3)
	if err := honest.SendMsg(&raw{encodeReport("d", 1, 0, 2000, id)}); err != nil {
		t.Fatal(err)
	}
	waitCount(t, h.m, 4)
	recv(t, honest) // this window's push, sized before the honest demand was known
	clk.Advance(time.Second)
	if err := honest.SendMsg(&raw{encodeReport("d", 1, 0, 2000, id)}); err != nil {
		t.Fatal(err)
	}
	for {
		r := recv(t, honest)
		if len(r.BucketAction) == 0 || r.BucketAction[0].GetQuotaAssignmentAction() == nil {
			continue
		}
		if w := worstOf(r.BucketAction[0]); w < 500 {
			t.Errorf("the honest stream's grant beside a stream claiming 10^12 denials: %d, want at least half the limit (500)", w)
		}
		break
	}
}
