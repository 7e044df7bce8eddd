// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3, StreamRateLimitQuotas) from the same
// descriptor config and store counters as ShouldRateLimit. Every grant an
// Envoy enforces locally is carved from the store before it is sent: its
// worst case is consumed with one all-or-nothing store check, so that the
// grants of every Envoy and every rls replica sharing the store never pass
// a rule's limit (docs/rlqs.md).
package rlqs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/logthrottle"
	"github.com/rls-project/rls/pkg/store"
)

// HealthName is the gRPC health service name of the RLQS service.
const HealthName = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"

// Action is what a BucketId that matches no rule gets.
type Action uint8

// The actions for unmatched buckets.
const (
	Allow   Action = iota // ALLOW_ALL for Options.Period
	Deny                  // DENY_ALL for Options.Period
	Abandon               // AbandonAction: Envoy forgets the bucket
)

// ParseAction parses "allow", "deny" or "abandon".
func ParseAction(s string) (Action, error) {
	switch s {
	case "allow":
		return Allow, nil
	case "deny":
		return Deny, nil
	case "abandon":
		return Abandon, nil
	}
	return 0, fmt.Errorf("unmatched bucket action %q: want allow, deny or abandon", s)
}

// Resolver resolves a domain's descriptor entries to the store check
// ShouldRateLimit would make (service.Service implements it).
type Resolver interface {
	Config() *descriptors.Config
	BucketCheck(domain string, entries []*rlcommon.RateLimitDescriptor_Entry) (store.Check, *descriptors.Rule, bool, error)
}

// Options configure a Server. Zero fields take the defaults in brackets.
type Options struct {
	Store    store.Store
	Resolver Resolver
	// Unmatched is what a BucketId that maps to no rule gets [Allow].
	Unmatched Action
	// IdleReports abandons a bucket after this many reports in a row with
	// no requests [3].
	IdleReports int
	// MaxBuckets bounds the buckets of one stream; more are abandoned [1000].
	MaxBuckets int
	// StreamsPerConn bounds the open streams of one TCP connection; more
	// are refused ResourceExhausted [64: Envoy opens one per domain and
	// filter config]. Streams over other transports (a Unix socket, whose
	// peers share one address) are not counted.
	StreamsPerConn int
	// MaxReportBytes bounds one report; a bigger one ends the stream
	// ResourceExhausted [256 KiB, under the gRPC port's 1 MiB message cap].
	MaxReportBytes int
	// Period is the TTL of grants of token-bucket rules and of blanket
	// answers, a whole number of seconds [2s].
	Period time.Duration
	// Overlap bounds how long after a window's end an Envoy may still
	// apply the window's grant (the delivery of the next one); the next
	// window is charged for it [40ms].
	Overlap time.Duration
	// MinShare is the least grant, in hits per window, of a bucket with
	// demand while the rule has budget [1].
	MinShare uint64
	// Fleet returns the number of rls replicas sharing the store; without
	// Demand (or when it fails) each takes the limit over this number as
	// its part, and divides that among its own streams by their demand [1].
	Fleet func() int
	// Demand shares this replica's demand for a counter (hits per second
	// over its streams of the key) with the other replicas for ttl, and
	// returns the fleet's, this replica's included; 0 withdraws it. Each
	// replica's part of a limit then follows its share of the fleet's
	// demand [nil: the limit over Fleet].
	Demand func(ctx context.Context, key string, demand float64, ttl time.Duration) (float64, error)
	// SendQueue bounds the responses waiting to be sent on one stream; a
	// stream whose client does not read them is cut [64].
	SendQueue int
	// StoreTimeout bounds one store call [1s].
	StoreTimeout time.Duration
	// Now is the clock of grants, windows and demand [time.Now]; the
	// store's clock must agree with it (windows are the store's).
	Now     func() time.Time
	Metrics *Metrics
	Log     *slog.Logger
}

func (o *Options) defaults() {
	if o.IdleReports <= 0 {
		o.IdleReports = 3
	}
	if o.MaxBuckets <= 0 {
		o.MaxBuckets = 1000
	}
	if o.StreamsPerConn <= 0 {
		o.StreamsPerConn = 64
	}
	if o.MaxReportBytes <= 0 {
		o.MaxReportBytes = 256 << 10
	}
	if o.Period <= 0 {
		o.Period = 2 * time.Second
	}
	o.Period = time.Duration(wholeSeconds(o.Period)) * time.Second
	if o.Overlap <= 0 {
		o.Overlap = 40 * time.Millisecond
	}
	if o.MinShare == 0 {
		o.MinShare = 1
	}
	if o.Fleet == nil {
		o.Fleet = func() int { return 1 }
	}
	if o.SendQueue <= 0 {
		o.SendQueue = 64
	}
	if o.StoreTimeout <= 0 {
		o.StoreTimeout = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// Server implements StreamRateLimitQuotas.
type Server struct {
	o          Options
	mu         sync.Mutex
	streams    map[*stream]struct{}
	perConn    map[string]int                  // open streams by TCP connection (connOf)
	groups     map[string]map[*bucket]struct{} // by store key: the buckets of every stream counting on it
	closing    bool
	demands    map[string]demandSeen // by store key: the fleet's demand as last read (Options.Demand)
	demandDown atomic.Int64          // unix nanoseconds until which Demand is not called (demandBackoff)
	storeLog   *logthrottle.Throttle
	wg         sync.WaitGroup
}

// New returns a Server.
func New(o Options) *Server {
	o.defaults()
	return &Server{o: o, streams: map[*stream]struct{}{}, perConn: map[string]int{}, demands: map[string]demandSeen{}, groups: map[string]map[*bucket]struct{}{},
		storeLog: logthrottle.New(logthrottle.Every, nil)}
}

// Register registers s on r with a handler that decodes reports leniently
// (non-UTF-8 BucketId bytes are kept). The server must use service.Codec.
func (s *Server) Register(r grpc.ServiceRegistrar) {
	if s == nil {
		return
	}
	desc := rlqsv3.RateLimitQuotaService_ServiceDesc
	desc.Streams = []grpc.StreamDesc{{StreamName: "StreamRateLimitQuotas", Handler: func(_ any, ss grpc.ServerStream) error {
		return s.serve(ss)
	}, ServerStreams: true, ClientStreams: true}}
	r.RegisterService(&desc, s)
}

var errShutdown = status.Error(codes.Unavailable, "rls is shutting down: every assignment on this stream was expired (TTL 0); reconnect to another replica")

// Shutdown expires every assignment (TTL 0, so Envoys go to their
// fallbacks on purpose), sends that, and only then ends the streams; it
// returns when they have ended or ctx is done.
func (s *Server) Shutdown(ctx context.Context) {
	s.mu.Lock()
	s.closing = true
	sts := make([]*stream, 0, len(s.streams))
	for st := range s.streams {
		sts = append(sts, st)
	}
	shared := make([]string, 0, len(s.demands))
	for k := range s.demands {
		shared = append(shared, k)
	}
	s.mu.Unlock()
	for _, st := range sts {
		st.expireAll()
	}
	s.withdrawDemand(ctx, shared)
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

func (s *Server) serve(ss grpc.ServerStream) error {
	st := &stream{srv: s, ss: ss, buckets: map[string]*bucket{}, out: make(chan *rlqsv3.RateLimitQuotaResponse, s.o.SendQueue),
		quit: make(chan struct{}), cut: make(chan struct{})}
	conn := connOf(ss.Context())
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return errShutdown
	}
	if conn != "" && s.perConn[conn] >= s.o.StreamsPerConn {
		s.mu.Unlock()
		s.o.Metrics.refuse("per_connection")
		return status.Errorf(codes.ResourceExhausted, "this connection already has %d RLQS streams open, the most rls allows on one connection (Envoy opens one per domain and filter config): end one, or open another connection", s.o.StreamsPerConn)
	}
	if conn != "" {
		s.perConn[conn]++
	}
	s.streams[st] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	s.o.Metrics.addStreams(1)
	defer func() {
		st.end()
		s.mu.Lock()
		delete(s.streams, st)
		if conn != "" {
			if s.perConn[conn]--; s.perConn[conn] == 0 {
				delete(s.perConn, conn)
			}
		}
		s.mu.Unlock()
		s.o.Metrics.addStreams(-1)
		s.wg.Done()
	}()
	sent := make(chan error, 1)
	go func() { sent <- st.sendLoop() }()
	recvd := make(chan error, 1)
	go func() { recvd <- st.recvLoop() }()
	select {
	case err := <-recvd:
		if errors.Is(err, io.EOF) {
			// The client sends no more reports but may still read: its
			// buckets keep their pushes until it goes away.
			return <-sent
		}
		return err
	case err := <-sent:
		return err
	}
}

// connOf names the TCP connection a stream came on by its two addresses,
// or returns "" for any other transport (Unix-socket peers share one
// address, and one sidecar is all such a socket serves).
func connOf(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	r, ok := p.Addr.(*net.TCPAddr)
	if !ok {
		return ""
	}
	local := ""
	if p.LocalAddr != nil {
		local = p.LocalAddr.String()
	}
	return r.String() + " " + local
}

// stream is one StreamRateLimitQuotas stream: one Envoy and one domain.
type stream struct {
	srv      *Server
	ss       grpc.ServerStream
	mu       sync.Mutex
	domain   string
	bound    bool
	buckets  map[string]*bucket
	ended    bool
	out      chan *rlqsv3.RateLimitQuotaResponse
	quit     chan struct{} // closed after the shutdown's expiry is queued
	cut      chan struct{} // closed when the send queue overflowed
	cutOnce  sync.Once
	quitOnce sync.Once
}

// bucket is one subscribed BucketId of a stream, and its ledger.
type bucket struct {
	id       map[string]string
	key      string // canonical form of id
	check    store.Check
	static   *grant // blanket answer of an unmatched, unlimited or shadow bucket; nil when counted
	shadow   bool
	g        grant // the active grant
	hasGrant bool
	demand   atomic.Uint64 // float64 bits: (allowed+denied) per second at the last report
	last     time.Time     // last report, rls's clock
	idle     int
	covered  uint64 // worst case of the grants active since the last report
	used     uint64 // allowed reported under the active grant
	timer    *time.Timer
	topUp    *time.Timer // the window's top-up (reserve.go)
	gone     bool
	// pendingTopUp asks handle to top b up after its report's write-backs.
	pendingTopUp bool
	shrunk       uint64    // hits the last shrink gave back (shrink)
	shrunkAt     time.Time // when
}

func (st *stream) recvLoop() error {
	for {
		r := &report{maxBytes: st.srv.o.MaxReportBytes}
		if err := st.ss.RecvMsg(r); err != nil {
			return err
		}
		if r.err != nil {
			if errors.Is(r.err, errTooBig) {
				st.srv.o.Metrics.refuse("too_big")
				return status.Error(codes.ResourceExhausted, r.err.Error())
			}
			st.srv.o.Metrics.refuse("invalid")
			return status.Error(codes.InvalidArgument, r.err.Error())
		}
		if err := st.handle(r); err != nil {
			return err
		}
	}
}

func (st *stream) sendLoop() error {
	for {
		select {
		case m := <-st.out:
			if err := st.ss.SendMsg(rawResponse{m}); err != nil {
				return err
			}
		case <-st.ss.Context().Done():
			return st.ss.Context().Err()
		case <-st.cut:
			st.srv.o.Metrics.refuse("slow_reader")
			return status.Errorf(codes.ResourceExhausted, "send queue of %d responses full: the client does not read its stream", cap(st.out))
		case <-st.quit:
			for {
				select {
				case m := <-st.out:
					if err := st.ss.SendMsg(rawResponse{m}); err != nil {
						return err
					}
				default:
					return errShutdown
				}
			}
		}
	}
}

// send queues m; a full queue cuts the stream. Called with st.mu held.
func (st *stream) send(m *rlqsv3.RateLimitQuotaResponse) {
	if st.ended || len(m.BucketAction) == 0 { // never an empty response (min_items 1)
		return
	}
	select {
	case st.out <- m:
	default:
		st.cutOnce.Do(func() { close(st.cut) })
	}
}

// end stops the stream's timers and leaves the share groups. A shrink
// sent within the last 2 x Overlap may not have landed (the replaced grant
// then runs on in Envoy until its TTL): its refund is charged back while
// its window lasts.
func (st *stream) end() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.ended = true
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
		_ = st.srv.decide(back) // a failure is logged
	}
}

// drop forgets b. Called with st.mu held.
func (st *stream) drop(b *bucket) {
	if b.gone {
		return
	}
	b.gone = true
	if b.timer != nil {
		b.timer.Stop()
	}
	if b.topUp != nil {
		b.topUp.Stop()
	}
	delete(st.buckets, b.key)
	st.srv.leave(b)
	st.srv.o.Metrics.addBuckets(-1)
}

// expireAll sends TTL 0 for every bucket, then lets the sender end the stream.
func (st *stream) expireAll() {
	st.mu.Lock()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	for _, b := range st.sortedBuckets() {
		if b.timer != nil {
			b.timer.Stop()
		}
		if b.topUp != nil {
			b.topUp.Stop()
		}
		g := b.g
		if !b.hasGrant {
			g = grant{allow: true}
		}
		g.ttl = 0
		resp.BucketAction = append(resp.BucketAction, assignment(b.id, &g))
	}
	st.srv.o.Metrics.action("expire", len(resp.BucketAction))
	st.send(resp)
	st.ended = true
	st.mu.Unlock()
	st.quitOnce.Do(func() { close(st.quit) })
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
// proven unused, and abandons idle buckets.
func (st *stream) handle(r *report) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := st.bind(r.domain); err != nil {
		st.srv.o.Metrics.refuse("domain")
		return err
	}
	now := st.srv.o.Now()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	var checks []store.Check
	var refunds, writeBacks uint64
	calls := 0
	shifted := map[string]*bucket{} // the rule keys whose demand this report updated
	for i := range r.usages {
		u := &r.usages[i]
		if len(u.bucket) == 0 {
			continue // Envoy skips an action without a bucket_id: there is nothing to answer
		}
		key := BucketKey(u.bucket)
		b := st.buckets[key]
		if b == nil {
			a, n := st.subscribe(key, u, now)
			calls += n
			if a != nil {
				resp.BucketAction = append(resp.BucketAction, a)
			}
			continue
		}
		a, c := st.usage(b, u, now)
		if b.static == nil && !b.gone {
			shifted[b.check.Key] = b
		}
		if a != nil {
			resp.BucketAction = append(resp.BucketAction, a)
		}
		for _, ch := range c {
			if ch.Refund {
				refunds += ch.Hits
			} else {
				writeBacks += ch.Hits
			}
		}
		checks = append(checks, c...)
	}
	if len(checks) > 0 { // refunds and write-backs of every bucket: one call
		calls++
		if err := st.srv.decide(checks); err != nil {
			refunds, writeBacks = 0, 0
		}
		st.srv.o.Metrics.addRefunded(refunds)
		st.srv.o.Metrics.addWrittenBack(writeBacks)
	}
	calls += st.srv.shareShifted(shifted, now)
	calls += st.topUpPending(r, resp, now)
	if m := st.srv.o.Metrics; m != nil {
		m.callsPerReport.Observe(float64(calls))
	}
	st.send(resp)
	return nil
}

// topUpPending tops up the buckets of r whose report showed denials,
// appending the actions to resp; it returns the store calls made.
func (st *stream) topUpPending(r *report, resp *rlqsv3.RateLimitQuotaResponse, now time.Time) int {
	calls := 0
	for _, u := range r.usages {
		if b := st.buckets[BucketKey(u.bucket)]; b != nil && b.pendingTopUp {
			b.pendingTopUp = false
			if a := st.topUpLocked(b, now); a != nil {
				calls++
				resp.BucketAction = append(resp.BucketAction, a)
			}
		}
	}
	return calls
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

// subscribe answers a bucket's first report and returns the action and the
// store calls it made.
func (st *stream) subscribe(key string, u *usage, now time.Time) (*rlqsv3.RateLimitQuotaResponse_BucketAction, int) {
	o := &st.srv.o
	if len(st.buckets) >= o.MaxBuckets {
		o.Metrics.action("abandon", 1)
		return abandon(u.bucket), 0
	}
	b := &bucket{id: u.bucket, key: key, last: now}
	b.setDemand(u, time.Second)
	if !st.resolve(b, u) {
		o.Metrics.action("abandon", 1)
		return abandon(u.bucket), 0
	}
	st.buckets[key] = b
	o.Metrics.addBuckets(1)
	if b.static != nil {
		var calls int
		if b.shadow && u.allowed > 0 {
			calls = 1
			if st.srv.decide([]store.Check{st.force(b, u.allowed)}) == nil {
				o.Metrics.addWrittenBack(u.allowed)
			}
		}
		return st.staticAction(b), calls
	}
	st.srv.join(b)
	// What Envoy allowed before this first answer came from its
	// no_assignment_behavior: it is written back with the reservation.
	var extra []store.Check
	if u.allowed > 0 {
		extra = append(extra, st.force(b, u.allowed))
		o.Metrics.addWrittenBack(u.allowed)
	}
	return st.regrant(b, now, extra, false)
}

// resolve finds b's rule and check, or its blanket answer; false when the
// bucket matches no rule and Unmatched is Abandon.
func (st *stream) resolve(b *bucket, u *usage) bool {
	o := &st.srv.o
	entries := o.Resolver.Config().BucketEntries(st.domain, u.bucket)
	var rule *descriptors.Rule
	unlimited := false
	if len(entries) > 0 {
		var err error
		if b.check, rule, unlimited, err = o.Resolver.BucketCheck(st.domain, entries); err != nil {
			rule, unlimited = nil, false
		}
	}
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

func (st *stream) staticAction(b *bucket) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	g := *b.static
	g.ttl = int64(st.srv.o.Period / time.Second)
	b.g, b.hasGrant = g, true
	if g.deny {
		st.srv.o.Metrics.action("deny_all", 1)
	} else {
		st.srv.o.Metrics.action("allow_all", 1)
	}
	st.schedule(b, st.srv.o.Period-st.srv.o.Period/4) // renewed before it expires
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

// usage takes a later report of b: the action to send (an abandon) and the
// refunds and write-backs to apply.
func (st *stream) usage(b *bucket, u *usage, now time.Time) (*rlqsv3.RateLimitQuotaResponse_BucketAction, []store.Check) {
	o := &st.srv.o
	since := now.Sub(b.last)
	if m := o.Metrics; m != nil {
		m.reportInterval.Observe(since.Seconds())
	}
	grantBefore := b.hasGrant && !b.g.reservedAt.After(b.last) // the grant covers the whole interval
	b.last = now
	b.setDemand(u, since)
	if u.allowed == 0 && u.denied == 0 {
		b.idle++
		if b.idle >= o.IdleReports {
			st.drop(b)
			o.Metrics.action("abandon", 1)
			return abandon(b.id), nil
		}
	} else {
		b.idle = 0
	}
	if b.static != nil {
		if b.shadow && u.allowed > 0 {
			return nil, []store.Check{st.force(b, u.allowed)}
		}
		return nil, nil
	}
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
		return a, append(checks, c)
	}
	if !grantBefore {
		return nil, checks
	}
	if c, ok := st.refund(b, now); ok {
		checks = append(checks, c)
	}
	return nil, checks
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
	ng := st.distinct(b, shape(uint64(math.Ceil(b.demandRate()*left.Seconds()))+o.MinShare, wholeSeconds(left)))
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

func (b *bucket) setDemand(u *usage, since time.Duration) {
	since = max(since, time.Second) // whole seconds: a first report says 0 s
	b.demand.Store(math.Float64bits(float64(u.allowed+u.denied) / since.Seconds()))
}

func (b *bucket) demandRate() float64 { return math.Float64frombits(b.demand.Load()) }

// schedule runs the bucket's next push after d.
func (st *stream) schedule(b *bucket, d time.Duration) {
	if b.timer != nil {
		b.timer.Stop()
	}
	b.timer = time.AfterFunc(d, func() { st.push(b) })
}

// push sends b's next grant: at its window's end, or before a token-bucket
// or blanket grant expires.
func (st *stream) push(b *bucket) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if b.gone || st.ended {
		return
	}
	var a *rlqsv3.RateLimitQuotaResponse_BucketAction
	if b.static != nil {
		a = st.staticAction(b)
	} else {
		a, _ = st.regrant(b, st.srv.o.Now(), nil, true)
	}
	if a != nil {
		st.send(&rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{a}})
	}
}

func abandon(id map[string]string) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
}

// BucketKey returns a key of id that no other map shares: its entries in
// key order, each length-prefixed (BucketId keys are unordered).
func BucketKey(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "%d:%s%d:%s", len(k), k, len(id[k]), id[k])
	}
	return sb.String()
}

// printable returns s with bytes that are not printable UTF-8 as \xNN.
func printable(s string) string {
	q := fmt.Sprintf("%+q", s)
	return q[1 : len(q)-1]
}

// StreamRateLimitQuotas serves one stream (rlqsv3.RateLimitQuotaServiceServer).
// Register installs a handler that calls it with the raw stream.
func (s *Server) StreamRateLimitQuotas(ss rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	return s.serve(ss)
}

// Enable returns a Server with o and its metrics on reg when on, else nil:
// a nil Server's Register, HealthNames and ShutdownWithin do nothing.
func Enable(on bool, reg prometheus.Registerer, o Options) *Server {
	if !on {
		return nil
	}
	o.Metrics = NewMetrics(reg)
	return New(o)
}

// HealthNames returns the gRPC health service names of s (none when nil).
func (s *Server) HealthNames() []string {
	if s == nil {
		return nil
	}
	return []string{HealthName}
}

// ShutdownWithin is Shutdown bounded by d; nothing when s is nil.
func (s *Server) ShutdownWithin(d time.Duration) {
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	s.Shutdown(ctx)
}
