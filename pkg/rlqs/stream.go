package rlqs

import (
	"context"
	"errors"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
)

// stream is one StreamRateLimitQuotas stream: one Envoy and one domain. Its
// state belongs to run's goroutine (invariant 12 of docs/rlqs.md); a
// receiving goroutine decodes reports, a sending goroutine writes the
// responses queued and cuts a client that reads nothing for SendWait.
type stream struct {
	srv    *Server
	ss     grpc.ServerStream
	ctx    context.Context // of the store calls: ends with the stream, or at Shutdown
	cancel context.CancelFunc
	unhook func() bool // stops Shutdown's cancel of ctx

	// The actor's (run's goroutine).
	domain   string
	bound    bool
	buckets  map[string]*bucket
	cfg      *descriptors.Config // the config the buckets were resolved in
	pending  []*rlqsv3.RateLimitQuotaResponse_BucketAction
	lastRecv time.Time
	timer    *time.Timer
	eof      bool // the client sends no more reports

	reports  chan *report  // from the receiving goroutine
	recvErr  chan error    // the receiving goroutine's end (cap 1)
	wake     chan struct{} // the config changed (cap 1)
	quit     chan struct{} // Shutdown
	quitOnce sync.Once
	done     chan struct{} // closed when run returns

	held    atomic.Int64 // bytes of the Server's budget this stream holds
	qmu     sync.Mutex
	queue   [][]byte      // encoded responses not yet sent
	sending bool          // the sender holds a message
	queued  chan struct{} // a message was queued (cap 1)
	emptied chan struct{} // the sender found the queue empty (cap 1)
	sendErr chan error    // the sender's end (cap 1)
	cut     chan struct{} // closed when the client read nothing for SendWait
	cutOnce sync.Once
}

// defaultInterval is the reporting interval assumed of a bucket before its
// second report: three of Envoy's (5 s), as gRPC's clients report at their
// buckets' configured intervals. A stream that subscribes buckets and falls
// silent costs their boundary pushes until it is ended, twice this.
const defaultInterval = 15 * time.Second

// drainWait bounds how long a stream ending at Shutdown waits for its
// client to read the expiry (TTL 0) queued for it.
const drainWait = time.Second

func (s *Server) newStream(ss grpc.ServerStream) *stream {
	st := &stream{srv: s, ss: ss, buckets: map[string]*bucket{}, cfg: s.o.Resolver.Config(),
		reports: make(chan *report), recvErr: make(chan error, 1), wake: make(chan struct{}, 1),
		quit: make(chan struct{}), done: make(chan struct{}), queued: make(chan struct{}, 1),
		emptied: make(chan struct{}, 1), sendErr: make(chan error, 1), cut: make(chan struct{})}
	st.ctx, st.cancel = context.WithCancel(ss.Context())
	st.unhook = context.AfterFunc(s.work, st.cancel) // Shutdown ends the stream's store calls
	st.lastRecv = s.o.Now()
	st.timer = time.NewTimer(time.Hour)
	return st
}

// run is the stream's actor (see stream); it returns the stream's status.
func (st *stream) run() error {
	defer st.end()
	for {
		if err := st.flush(); err != nil {
			return err
		}
		st.arm()
		select {
		case r := <-st.reports:
			err := st.handle(r)
			r.release()
			if err != nil {
				return err
			}
		case err := <-st.recvErr:
			if !errors.Is(err, io.EOF) {
				return err
			}
			// The client sends no more reports but may still read: its
			// buckets keep their pushes until it goes away or falls silent.
			st.eof = true
		case <-st.timer.C:
			if err := st.tick(); err != nil {
				return err
			}
		case <-st.wake: // the config changed: what it changed goes out at once
			if err := st.tick(); err != nil {
				return err
			}
		case <-st.quit:
			return st.quitNow()
		case err := <-st.sendErr:
			return err
		case <-st.cut:
			st.srv.o.Metrics.refuse("slow_reader")
			return status.Errorf(codes.ResourceExhausted, "the client has not read its stream for %v: rls ended it", st.srv.o.SendWait)
		case <-st.ss.Context().Done():
			return st.ss.Context().Err()
		}
	}
}

// quitNow expires every bucket (Shutdown), waits at most drainWait for the
// client to read it, and returns the stream's status.
func (st *stream) quitNow() error {
	st.expireAll()
	if err := st.flush(); err != nil {
		return err
	}
	st.drain()
	return errShutdown
}

// arm sets the timer to the earliest of the buckets' pushes and top-ups
// and the time the stream counts as silent.
func (st *stream) arm() {
	now := st.srv.o.Now()
	at := st.lastRecv.Add(st.silentAfter())
	for _, b := range st.buckets {
		if !b.next.IsZero() && b.next.Before(at) {
			at = b.next
		}
		if !b.topUpAt.IsZero() && b.topUpAt.Before(at) {
			at = b.topUpAt
		}
	}
	st.timer.Stop()
	st.timer.Reset(max(0, at.Sub(now)))
}

// silentAfter is how long the stream may send nothing: two of its
// reporting intervals (its buckets' longest; defaultInterval for one not
// reported twice yet), and at least SilentMin.
func (st *stream) silentAfter() time.Duration {
	iv := time.Duration(0)
	for _, b := range st.buckets {
		iv = max(iv, b.reportInterval())
	}
	if iv == 0 {
		iv = defaultInterval
	}
	return max(2*iv, st.srv.o.SilentMin)
}

// tickCoalesce is how early a tick runs a window's boundary push or a
// top-up: pushes of one window are due a few microseconds apart (each at
// the Reset its own reservation reported), and one tick sends them all in
// one response. It is well within boundarySlack, so no push runs before
// its window has ended.
const tickCoalesce = 2 * time.Millisecond

// early is how early a tick may run b's push: a renewal (a blanket answer,
// a token-bucket rule's grant) an eighth of Period, so that the renewals
// of buckets subscribed at about the same time share a response; a
// window's push tickCoalesce.
func (st *stream) early(b *bucket) time.Duration {
	if b.static != nil || b.check.Algorithm == store.TokenBucket {
		return st.srv.o.Period / 8
	}
	return tickCoalesce
}

// tick runs what is due: the pushes (one store round trip for all of
// them), then the top-ups; or ends a stream that fell silent.
func (st *stream) tick() error {
	o := &st.srv.o
	now := o.Now()
	if silent := now.Sub(st.lastRecv); silent >= st.silentAfter() {
		o.Metrics.refuse("silent")
		return status.Errorf(codes.Unavailable, "no report on this stream for %v, two of its reporting intervals: rls ended it (Envoy opens a new one at its next report)", silent.Round(time.Millisecond))
	}
	st.checkConfig(now)
	var grants []ask
	for _, b := range st.sortedBuckets() {
		if b.next.IsZero() || b.next.After(now.Add(st.early(b))) {
			continue
		}
		b.next = time.Time{}
		if b.static != nil {
			st.act(st.staticAction(b, now))
			continue
		}
		grants = append(grants, ask{b: b, boundary: b.hasGrant, slot: st.slot()})
	}
	if _, err := st.grant(grants, nil, now); err != nil {
		return err
	}
	var ups []*bucket
	for _, b := range st.sortedBuckets() {
		if !b.topUpAt.IsZero() && !b.topUpAt.After(now.Add(tickCoalesce)) {
			b.topUpAt = time.Time{}
			ups = append(ups, b)
		}
	}
	_, err := st.topUps(ups, now)
	return err
}

// end stops the stream: its buckets leave their share groups (and the
// budget), and a shrink sent within the last 2 x Overlap, which may not
// have landed (the replaced grant then runs on in Envoy until its TTL),
// has its refund charged back while its window lasts.
func (st *stream) end() {
	close(st.done)
	st.unhook()
	st.cancel()
	st.timer.Stop()
	now := st.srv.o.Now()
	var back []store.Check
	for _, b := range st.buckets {
		if b.shrunk > 0 && now.Sub(b.shrunkAt) < 2*st.srv.o.Overlap && now.Before(b.g.windowEnd) {
			back = append(back, st.force(b, b.shrunk))
			st.srv.o.Metrics.addReserved(b.shrunk)
		}
		st.drop(b)
	}
	if len(back) > 0 {
		_ = st.srv.decideAfter(back) // a failure is logged
	}
}

// expireAll queues TTL 0 for every bucket (Shutdown).
func (st *stream) expireAll() {
	n := 0
	for _, b := range st.sortedBuckets() {
		g := b.g
		if !b.hasGrant {
			g = grant{allow: true}
		}
		g.ttl = 0
		st.act(assignment(b.id, &g))
		n++
	}
	st.srv.o.Metrics.action("expire", n)
}

func (st *stream) sortedBuckets() []*bucket {
	out := make([]*bucket, 0, len(st.buckets))
	for _, b := range st.buckets {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

// handle processes one report: subscriptions are answered at once; usage
// updates demand, writes back what no grant covered, refunds what is
// proven unused, and abandons idle buckets. The write-backs and first
// grants of all its buckets take one store round trip, those that did not
// fit a second, the top-ups a third and fourth.
func (st *stream) handle(r *report) error {
	o := &st.srv.o
	if err := st.bind(r.domain); err != nil {
		o.Metrics.refuse("domain")
		return err
	}
	now := o.Now()
	st.lastRecv = now
	st.checkConfig(now)
	w := reportWork{shifted: map[string]*bucket{}}
	for i := range r.usages {
		if err := st.take(&w, &r.usages[i], now); err != nil {
			return err
		}
	}
	var pre []store.Request
	if len(w.writes) > 0 { // refunds and write-backs of every bucket: one request
		pre = append(pre, store.Request{Checks: w.writes, Results: make([]store.Result, len(w.writes))})
	}
	calls, err := st.grant(w.grants, pre, now)
	if err != nil {
		return err
	}
	if len(pre) > 0 {
		if pre[0].Err != nil {
			w.refunds, w.writeBacks = 0, 0
		}
		o.Metrics.addRefunded(w.refunds)
		o.Metrics.addWrittenBack(w.writeBacks)
	}
	calls += st.srv.shareShifted(st.ctx, w.shifted, now)
	n, err := st.topUps(w.ups, now)
	if m := o.Metrics; m != nil {
		m.callsPerReport.Observe(float64(calls + n))
	}
	return err
}

// reportWork is what one report's buckets ask of the store.
type reportWork struct {
	writes              []store.Check // refunds and write-backs
	grants              []ask
	refunds, writeBacks uint64
	shifted             map[string]*bucket // the rule keys whose demand this report updated
	ups                 []*bucket          // to top up after the write-backs
}

// take adds the usage of one bucket of a report to w.
func (st *stream) take(w *reportWork, u *usage, now time.Time) error {
	if len(u.bucket) == 0 {
		return nil // Envoy skips an action without a bucket_id: there is nothing to answer
	}
	key := BucketKey(u.bucket)
	b := st.buckets[key]
	if b == nil {
		a, c, err := st.subscribe(key, u, now)
		if err != nil {
			return err
		}
		w.writes = append(w.writes, c...)
		w.writeBacks += hits(c)
		if a != nil {
			w.grants = append(w.grants, *a)
		}
		return nil
	}
	c := st.usage(b, u, now)
	if b.static == nil && !b.gone {
		w.shifted[b.check.Key] = b
	}
	for _, ch := range c {
		if ch.Refund {
			w.refunds += ch.Hits
		} else {
			w.writeBacks += ch.Hits
		}
	}
	w.writes = append(w.writes, c...)
	if b.pendingTopUp {
		b.pendingTopUp = false
		w.ups = append(w.ups, b)
	}
	return nil
}

func hits(cs []store.Check) uint64 {
	var n uint64
	for _, c := range cs {
		n += c.Hits
	}
	return n
}

// bind checks the report's domain: the first binds the stream, later ones
// may repeat it (Envoy) or omit it (gRPC's client).
func (st *stream) bind(domain string) error {
	switch {
	case !st.bound && domain == "":
		return status.Error(codes.InvalidArgument, "the first report of a stream has no domain")
	case !st.bound:
		st.domain, st.bound = domain, true
	case domain != "" && domain != st.domain:
		return status.Errorf(codes.InvalidArgument, "report for domain %q on a stream of domain %q: open a stream per domain", domain, st.domain)
	}
	return nil
}
