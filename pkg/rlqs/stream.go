package rlqs

import (
	"context"
	"errors"
	"io"
	"math"
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

// stream is one StreamRateLimitQuotas stream: one Envoy and one domain.
//
// Its state belongs to one goroutine, serve's (run): it takes the reports
// (decoded by the receiving goroutine, which hands them over and does
// nothing else), the ticks of its one timer (every bucket due at a tick is
// answered in one response), a config change and the shutdown, in turn. So
// no lock is held across a store call, nothing is handled once serve has
// returned, and every bucket leaves its share group when serve returns. A
// sending goroutine writes the responses queued; one that a client does not
// read for SendWait cuts the stream.
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

// bucket is one subscribed BucketId of a stream, and its ledger. Only
// demand and demandUntil are read by other streams (a key's demand).
type bucket struct {
	id       map[string]string
	key      string // canonical form of id
	kept     int64  // bytes of the budget it holds
	check    store.Check
	static   *grant // blanket answer of an unmatched, unlimited or shadow bucket; nil when counted
	shadow   bool
	matched  bool  // a rule (limited, unlimited or shadow) decides it
	g        grant // the active grant
	hasGrant bool
	// demand is (allowed+denied) per second at the last report and claim
	// the bound it counts with (float64 bits: see demandOf); they count
	// until demandUntil (unix ns).
	demand      atomic.Uint64
	claim       atomic.Uint64
	pace        atomic.Uint64 // limitPace of check (float64 bits), for other streams' demandOf
	demandUntil atomic.Int64
	last        time.Time     // last report, rls's clock
	interval    time.Duration // the longest between two of its reports; 0 before its second
	idle        int
	covered     uint64    // worst case of the grants active since the last report
	used        uint64    // allowed reported under the active grant
	next        time.Time // the next push (zero: none)
	topUpAt     time.Time // the window's top-up (reserve.go; zero: none)
	gone        bool
	// pendingTopUp asks handle to top b up after its report's write-backs.
	pendingTopUp bool
	shrunk       uint64    // hits the last shrink gave back (shrink)
	shrunkAt     time.Time // when
}

// defaultInterval is the reporting interval assumed of a bucket before its
// second report: three of Envoy's (5 s), as gRPC's clients report at their
// buckets' configured intervals. A stream that subscribes buckets and falls
// silent costs their boundary pushes until it is ended, twice this.
const defaultInterval = 15 * time.Second

// drainWait bounds how long a stream ending at Shutdown waits for its
// client to read the expiry (TTL 0) queued for it.
const drainWait = time.Second

// maxResponseBytes bounds one response: the actions due at one tick are
// sent in as many responses as they need (gRPC clients refuse messages
// over 4 MiB by default).
const maxResponseBytes = 1 << 20

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
			st.expireAll()
			if err := st.flush(); err != nil {
				return err
			}
			st.drain()
			return errShutdown
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

// recvLoop decodes reports and hands them to the actor; it returns once
// RecvMsg fails (after serve returns at the latest) and handles nothing.
func (st *stream) recvLoop() {
	o := &st.srv.o
	for {
		r := &report{maxBytes: o.MaxReportBytes, budget: st.srv.budget, held: &st.held}
		err := st.ss.RecvMsg(r)
		if err == nil && r.err != nil {
			err = r.err
			switch {
			case status.Code(err) == codes.ResourceExhausted:
				o.Metrics.refuse("budget")
			case errors.Is(err, errTooBig):
				o.Metrics.refuse("too_big")
				err = status.Error(codes.ResourceExhausted, err.Error())
			default:
				o.Metrics.refuse("invalid")
				err = status.Error(codes.InvalidArgument, err.Error())
			}
		}
		if err != nil {
			r.release()
			st.recvErr <- err
			return
		}
		select {
		case st.reports <- r:
		case <-st.done:
			r.release()
			return
		}
	}
}

// sendLoop sends the queued responses in order until the stream ends. A
// message the client does not take within SendWait cuts the stream.
func (st *stream) sendLoop() {
	for {
		st.qmu.Lock()
		if len(st.queue) == 0 {
			st.sending = false
			st.qmu.Unlock()
			select {
			case st.emptied <- struct{}{}:
			default:
			}
			select {
			case <-st.queued:
				continue
			case <-st.done:
				st.dropQueue()
				return
			}
		}
		b := st.queue[0]
		st.queue[0] = nil
		st.queue = st.queue[1:]
		st.sending = true
		st.qmu.Unlock()
		slow := time.AfterFunc(st.srv.o.SendWait, func() { st.cutOnce.Do(func() { close(st.cut) }) })
		err := st.ss.SendMsg(rawResponse{b: b})
		slow.Stop()
		st.srv.budget.give(&st.held, int64(len(b)))
		if err != nil {
			st.sendErr <- err
			st.dropQueue()
			return
		}
	}
}

// dropQueue gives back the budget of the responses never sent.
func (st *stream) dropQueue() {
	st.qmu.Lock()
	q := st.queue
	st.queue = nil
	st.qmu.Unlock()
	for _, b := range q {
		st.srv.budget.give(&st.held, int64(len(b)))
	}
}

// flush queues the actions pending as responses of at most
// maxResponseBytes, each counted in the budget first.
func (st *stream) flush() error {
	var b []byte
	for i, a := range st.pending {
		if a == nil {
			continue
		}
		st.pending[i] = nil
		n := len(b)
		b = appendResponseAction(b, a)
		if n > 0 && len(b) > maxResponseBytes {
			if err := st.enqueue(b[:n:n]); err != nil {
				return err
			}
			b = append([]byte(nil), b[n:]...)
		}
	}
	st.pending = st.pending[:0]
	if len(b) == 0 {
		return nil
	}
	return st.enqueue(b)
}

// enqueue counts b in the budget and queues it for the sender.
func (st *stream) enqueue(b []byte) error {
	if err := st.srv.budget.take(&st.held, int64(len(b))); err != nil {
		st.pending = st.pending[:0]
		st.srv.o.Metrics.refuse("budget")
		return err
	}
	st.qmu.Lock()
	st.queue = append(st.queue, b)
	st.qmu.Unlock()
	select {
	case st.queued <- struct{}{}:
	default:
	}
	return nil
}

// drain waits, at most drainWait, for the sender to send what is queued.
func (st *stream) drain() {
	t := time.NewTimer(drainWait)
	defer t.Stop()
	for {
		st.qmu.Lock()
		empty := len(st.queue) == 0 && !st.sending
		st.qmu.Unlock()
		if empty {
			return
		}
		select {
		case <-st.emptied:
		case <-st.sendErr:
			return
		case <-st.cut:
			return
		case <-t.C:
			return
		}
	}
}

// act appends a to the next response.
func (st *stream) act(a *rlqsv3.RateLimitQuotaResponse_BucketAction) {
	if a != nil {
		st.pending = append(st.pending, a)
	}
}

// slot keeps a place in the next response for an action decided later
// (a grant reserved with the others of its report or tick), so that
// actions go out in the order of the report's buckets; a place left
// empty is skipped.
func (st *stream) slot() int {
	st.pending = append(st.pending, nil)
	return len(st.pending) - 1
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

// reportInterval is the longest time between two of b's reports, or
// defaultInterval before its second.
func (b *bucket) reportInterval() time.Duration {
	if b.interval <= 0 {
		return defaultInterval
	}
	return b.interval
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

// drop forgets b.
func (st *stream) drop(b *bucket) {
	if b.gone {
		return
	}
	b.gone = true
	delete(st.buckets, b.key)
	if b.static == nil {
		st.srv.leave(b)
	}
	st.srv.budget.give(&st.held, b.kept)
	st.srv.o.Metrics.addBuckets(-1)
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
// proven unused, and abandons idle buckets. Its store calls are few
// whatever its number of buckets: the write-backs and the subscriptions'
// reservations go in one round trip (store.DecideBatch), those that did not
// fit in a second, the top-ups in a third and fourth.
func (st *stream) handle(r *report) error {
	o := &st.srv.o
	if err := st.bind(r.domain); err != nil {
		o.Metrics.refuse("domain")
		return err
	}
	now := o.Now()
	st.lastRecv = now
	st.checkConfig(now)
	var writes []store.Check
	var grants []ask
	var refunds, writeBacks uint64
	shifted := map[string]*bucket{} // the rule keys whose demand this report updated
	var ups []*bucket
	for i := range r.usages {
		u := &r.usages[i]
		if len(u.bucket) == 0 {
			continue // Envoy skips an action without a bucket_id: there is nothing to answer
		}
		key := BucketKey(u.bucket)
		b := st.buckets[key]
		if b == nil {
			a, w, err := st.subscribe(key, u, now)
			if err != nil {
				return err
			}
			writes = append(writes, w...)
			writeBacks += hits(w)
			if a != nil {
				grants = append(grants, *a)
			}
			continue
		}
		c := st.usage(b, u, now)
		if b.static == nil && !b.gone {
			shifted[b.check.Key] = b
		}
		for _, ch := range c {
			if ch.Refund {
				refunds += ch.Hits
			} else {
				writeBacks += ch.Hits
			}
		}
		writes = append(writes, c...)
		if b.pendingTopUp {
			b.pendingTopUp = false
			ups = append(ups, b)
		}
	}
	var pre []store.Request
	if len(writes) > 0 { // refunds and write-backs of every bucket: one request
		pre = append(pre, store.Request{Checks: writes, Results: make([]store.Result, len(writes))})
	}
	calls, err := st.grant(grants, pre, now)
	if err != nil {
		return err
	}
	if len(pre) > 0 {
		if pre[0].Err != nil {
			refunds, writeBacks = 0, 0
		}
		o.Metrics.addRefunded(refunds)
		o.Metrics.addWrittenBack(writeBacks)
	}
	calls += st.srv.shareShifted(st.ctx, shifted, now)
	n, err := st.topUps(ups, now)
	if m := o.Metrics; m != nil {
		m.callsPerReport.Observe(float64(calls + n))
	}
	return err
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
		return status.Errorf(codes.InvalidArgument, "report for domain %q on a stream of domain %q: open a stream per domain", printable(domain), printable(st.domain))
	}
	return nil
}

// subscribe takes a bucket's first report: it answers an unmatched,
// unlimited or shadow bucket at once (with the shadow's write-back), or
// returns the reservation of its first grant (with the write-back of what
// Envoy allowed before it). A bucket that the budget cannot keep ends the
// stream.
func (st *stream) subscribe(key string, u *usage, now time.Time) (*ask, []store.Check, error) {
	o := &st.srv.o
	if len(st.buckets) >= o.MaxBuckets {
		o.Metrics.action("abandon", 1)
		st.act(abandon(u.bucket))
		return nil, nil, nil
	}
	b := &bucket{id: u.bucket, key: key, last: now}
	if !st.resolve(b, u.bucket) {
		o.Metrics.action("abandon", 1)
		st.act(abandon(u.bucket))
		return nil, nil, nil
	}
	b.kept = keptCost(u.bucket)
	if err := st.srv.budget.take(&st.held, b.kept); err != nil {
		o.Metrics.refuse("budget")
		return nil, nil, err
	}
	st.buckets[key] = b
	o.Metrics.addBuckets(1)
	if b.static != nil {
		st.act(st.staticAction(b, now))
		if b.shadow && u.allowed > 0 {
			return nil, []store.Check{st.force(b, u.allowed)}, nil
		}
		return nil, nil, nil
	}
	st.srv.join(b)
	st.setDemand(b, u, time.Second, now)
	// What Envoy allowed before this first answer came from its
	// no_assignment_behavior: it is written back with the reservation.
	var extra []store.Check
	if u.allowed > 0 {
		extra = append(extra, st.force(b, u.allowed))
		o.Metrics.addWrittenBack(u.allowed)
	}
	return &ask{b: b, extra: extra, slot: st.slot()}, nil, nil
}

// resolve finds b's rule and check, or its blanket answer, in the config
// in force; false when the bucket matches no rule and Unmatched is Abandon.
func (st *stream) resolve(b *bucket, id map[string]string) bool {
	o := &st.srv.o
	entries := st.cfg.BucketEntries(st.domain, id)
	var rule *descriptors.Rule
	unlimited := false
	b.static, b.shadow, b.check, b.matched = nil, false, store.Check{}, false
	if len(entries) > 0 {
		var err error
		if b.check, rule, unlimited, err = o.Resolver.BucketCheck(st.domain, entries); err != nil {
			rule, unlimited = nil, false
		}
	}
	b.matched = rule != nil || unlimited
	b.pace.Store(math.Float64bits(limitPace(b)))
	switch {
	case unlimited:
		b.static = &grant{allow: true}
	case rule == nil && o.Unmatched == Abandon:
		return false
	case rule == nil && o.Unmatched == Deny:
		b.static = &grant{deny: true}
	case rule == nil:
		b.static = &grant{allow: true}
	case b.check.Shadow:
		b.static, b.shadow = &grant{allow: true}, true
	}
	return true
}

// checkConfig re-resolves every bucket when the config in force is not the
// one they were resolved in (see reconfigure).
func (st *stream) checkConfig(now time.Time) {
	if st.srv.o.Resolver.Config() != st.cfg {
		st.reconfigure(now)
	}
}

// reconfigure re-resolves every bucket in the config in force: a bucket
// whose rule changed (its limit, window, algorithm, key, or whether it is
// counted at all) gets its next grant at once, reserved under the new rule,
// in the next response; a bucket whose rule is gone is abandoned (Envoy
// subscribes it again at its next request, and gets what the new config
// says). The old grant's reservation stays counted where it was made.
func (st *stream) reconfigure(now time.Time) {
	cfg := st.srv.o.Resolver.Config()
	if cfg == st.cfg {
		return
	}
	st.cfg = cfg
	for _, b := range st.sortedBuckets() {
		was := resolution{static: b.static, shadow: b.shadow, matched: b.matched, check: b.check}
		if !st.resolve(b, b.id) || (was.matched && !b.matched) {
			// The rule is gone: abandoned (it is subscribed again as new).
			b.static, b.shadow, b.check = was.static, was.shadow, was.check
			st.drop(b)
			st.srv.o.Metrics.action("abandon", 1)
			st.act(abandon(b.id))
			continue
		}
		if was.same(b) {
			continue
		}
		if was.static == nil {
			st.srv.leaveKey(b, was.check.Key)
		}
		if b.static == nil {
			st.srv.join(b)
		}
		b.hasGrant, b.g, b.used, b.shrunk = false, grant{}, 0, 0 // covered stays: the old grant's usage is still to come
		b.topUpAt, b.pendingTopUp = time.Time{}, false
		b.next = now
	}
}

// resolution is what resolve found for a bucket.
type resolution struct {
	static  *grant
	shadow  bool
	matched bool
	check   store.Check
}

// same reports whether b decides as r: the same blanket answer, or the
// same counter and rule.
func (r resolution) same(b *bucket) bool {
	if (r.static == nil) != (b.static == nil) || r.shadow != b.shadow {
		return false
	}
	if r.static != nil && (r.static.allow != b.static.allow || r.static.deny != b.static.deny) {
		return false
	}
	return r.check == b.check
}

// staticAction returns b's blanket answer for Period, renewed before it
// expires.
func (st *stream) staticAction(b *bucket, now time.Time) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	g := *b.static
	g.ttl = int64(st.srv.o.Period / time.Second)
	b.g, b.hasGrant = g, true
	if g.deny {
		st.srv.o.Metrics.action("deny_all", 1)
	} else {
		st.srv.o.Metrics.action("allow_all", 1)
	}
	b.next = now.Add(st.srv.o.Period - st.srv.o.Period/4)
	return assignment(b.id, &g)
}

// force returns a write-back of n hits to b's counter.
func (st *stream) force(b *bucket, n uint64) store.Check {
	c := b.check
	c.Hits, c.Force, c.Shadow = n, true, false
	return c
}

// giveBack returns a refund of n hits to b's counter.
func (st *stream) giveBack(b *bucket, n uint64) store.Check {
	c := b.check
	c.Hits, c.Refund, c.Shadow = n, true, false
	return c
}

// usage takes a later report of b: it queues an abandon or a shrink, and
// returns the refunds and write-backs to apply.
func (st *stream) usage(b *bucket, u *usage, now time.Time) []store.Check {
	o := &st.srv.o
	since := now.Sub(b.last)
	if m := o.Metrics; m != nil {
		m.reportInterval.Observe(since.Seconds())
	}
	grantBefore := b.hasGrant && !b.g.reservedAt.After(b.last) // the grant covers the whole interval
	b.last = now
	b.interval = max(b.interval, since)
	if u.allowed == 0 && u.denied == 0 {
		b.idle++
		if b.idle >= o.IdleReports {
			st.drop(b)
			o.Metrics.action("abandon", 1)
			st.act(abandon(b.id))
			return nil
		}
	} else {
		b.idle = 0
	}
	if b.static != nil {
		if b.shadow && u.allowed > 0 {
			return []store.Check{st.force(b, u.allowed)}
		}
		return nil
	}
	st.setDemand(b, u, since, now)
	var checks []store.Check
	// Allowed beyond every grant that was active since the last report
	// came from Envoy's own fallbacks: counted now.
	if u.allowed > b.covered {
		checks = append(checks, st.force(b, u.allowed-b.covered))
	}
	b.covered = b.g.worst()
	if u.denied > 0 {
		// Demand beyond the grant: what the window has left, at once.
		b.pendingTopUp = true
	}
	if !grantBefore {
		b.used = 0 // the report mixes grants: its usage proves nothing unused
	} else {
		b.used += u.allowed
	}
	if a, c, ok := st.shrink(b, now, grantBefore); ok {
		st.act(a)
		return append(checks, c)
	}
	if !grantBefore {
		return checks
	}
	if c, ok := st.refund(b, now); ok {
		checks = append(checks, c)
	}
	return checks
}

// shrinkMin is the least a shrink gives back, as a part of the grant's
// worst case (and at least 4 hits): below it a replaced bucket is not worth
// its churn. A stream whose demand fell a fifth below its grant right after
// a boundary frees about a sixteenth (the old bucket and its refill until
// the replacement lands stay reserved), which a threshold of 16 missed.
const shrinkMin = 32

// shrink replaces b's active windowed grant, when b's report shows a
// demand that leaves much of it unused until the window ends, by one sized
// to that demand, and returns it with the refund of what it frees. Shares
// follow the demand of the report before the boundary, so a stream whose
// demand fell since holds a reservation it will not use while another's
// top-up finds the window empty; what a shrink frees goes to those top-ups
// (the next one is at most topUpDelay away).
//
// What the active grant can admit is bounded by time: at most its bucket
// and its refill from the window's start until the replacement lands
// (within Overlap); and, where the report covers the grant's whole life
// (reported), by the report too: what it reported used, its bucket and
// its refill over 2 x Overlap (the report's way here and the
// replacement's way there). The replacement admits at most its worst case.
// A report with denials never shrinks its grant. Only a grant whose
// reservation is its own (a boundary's or a first grant, not a top-up's,
// which holds the older grants' too, nor one already shrunk) is shrunk.
// Should the replacement not land (the stream ends first), the stream's
// end charges the refund back (see end).
func (st *stream) shrink(b *bucket, now time.Time, reported bool) (*rlqsv3.RateLimitQuotaResponse_BucketAction, store.Check, bool) {
	o := &st.srv.o
	g := b.g
	if b.pendingTopUp || !b.hasGrant || g.windowEnd.IsZero() || g.deny || g.allow || g.reserved > g.worst() || b.check.Window <= 0 {
		return nil, store.Check{}, false
	}
	left := g.windowEnd.Sub(now)
	start := g.windowEnd.Add(-b.check.Window)
	if left < 4*o.Overlap || now.Before(start) {
		return nil, store.Check{}, false
	}
	ng := st.distinct(b, shape(uint64(math.Ceil(st.srv.demandOf(b, now, st.srv.groupSize(b.check.Key))*left.Seconds()))+o.MinShare, wholeSeconds(left)))
	admits := g.max + uint64(math.Ceil(g.rate()*(now.Sub(start)+o.Overlap).Seconds()))
	if reported {
		admits = min(admits, b.used+g.max+uint64(math.Ceil(g.rate()*(2*o.Overlap).Seconds())))
	}
	need := admits + ng.worst()
	if need >= g.reserved || g.reserved-need < max(4, g.worst()/shrinkMin) {
		return nil, store.Check{}, false
	}
	back := g.reserved - need
	ng.reservedAt, ng.windowEnd, ng.reserved = now, g.windowEnd, need
	b.g = ng
	if !reported {
		// Later refunds count what this report's usage did not prove:
		// all the old grant could admit.
		b.used = admits
	} // else b.used goes on: the reservation holds it and the old grant's tail
	b.covered += ng.worst()
	b.shrunk, b.shrunkAt = back, now
	o.Metrics.action("token_bucket", 1)
	return assignment(b.id, &ng), st.giveBack(b, back), true
}

// refund returns the refund of b's active grant's reservation that the
// reports prove unused: all of it but what was used and what the grant can
// still admit until it ends, and only while the window it was reserved in
// lasts.
func (st *stream) refund(b *bucket, now time.Time) (store.Check, bool) {
	o := &st.srv.o
	g := &b.g
	end := g.reservedAt.Add(time.Duration(g.ttl)*time.Second + o.Overlap)
	if !g.windowEnd.IsZero() {
		if !now.Add(o.Overlap).Before(g.windowEnd) {
			return store.Check{}, false
		}
		end = g.windowEnd.Add(o.Overlap)
	}
	left := end.Sub(now).Seconds()
	if g.deny || g.allow || left <= 0 {
		return store.Check{}, false
	}
	need := b.used + g.max + uint64(math.Ceil(float64(g.per)*left/float64(g.fill)))
	if need >= g.reserved {
		return store.Check{}, false
	}
	c := st.giveBack(b, g.reserved-need)
	g.reserved = need
	return c, true
}

// demandGrowth bounds how much one report may raise a stream's demand
// beyond its fair part: to this many times what it counted for before
// (see demandOf).
const demandGrowth = 4

// setDemand records b's demand from a report covering since: its requests
// (allowed and denied) per second, never beyond the limit's pace, and the
// bound it counts with (see demandOf): demandGrowth times what it counted
// for until now, or the rate it reports allowed, whichever is more. The
// demand counts until the next report is two of b's reporting intervals
// overdue (and a second).
func (st *stream) setDemand(b *bucket, u *usage, since time.Duration, now time.Time) {
	since = max(since, time.Second) // whole seconds: a first report says 0 s
	rate := (float64(u.allowed) + float64(u.denied)) / since.Seconds()
	prev := st.srv.demandOf(b, now, st.srv.groupSize(b.check.Key))
	b.claim.Store(math.Float64bits(max(demandGrowth*prev, float64(u.allowed)/since.Seconds())))
	b.demand.Store(math.Float64bits(min(rate, limitPace(b))))
	b.demandUntil.Store(now.Add(2*max(b.reportInterval(), time.Second) + time.Second).UnixNano())
}

// limitPace is b's limit over its window, in hits per second.
func limitPace(b *bucket) float64 {
	w := b.check.Window.Seconds()
	if w <= 0 {
		w = 1
	}
	return float64(b.check.Limit) / w
}

// demandOf is what b's demand counts for now, among the n buckets of its
// key on this replica: 0 once its report is overdue; else what it reported,
// at most the larger of its fair part (the limit's pace over n) and its
// bound (setDemand). A client reports what it likes: one stream reporting
// 10^12 denials once took nearly the whole limit from every other Envoy
// for as long as it stayed open. Held to its fair part (as the streams of
// the key are now, not when it reported), such a claim takes no more than
// an honest stream's; a stream whose demand truly grows past its fair part
// (as its grants and reported admissions show) gets there within a report
// or two. Safe for concurrent use (it reads only b's atomics).
func (s *Server) demandOf(b *bucket, now time.Time, n int) float64 {
	if now.UnixNano() >= b.demandUntil.Load() {
		return 0
	}
	fair := math.Float64frombits(b.pace.Load()) / float64(max(1, n))
	return min(math.Float64frombits(b.demand.Load()), max(fair, math.Float64frombits(b.claim.Load())))
}
