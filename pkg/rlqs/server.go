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
	"fmt"
	"log/slog"
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
	// StreamsPerConn bounds the open streams of one connection; more are
	// refused ResourceExhausted [64: Envoy opens one per domain and filter
	// config]. Streams are counted by their peer's address: a TCP
	// connection's, or a Unix-socket connection's as connguard names it
	// (other Unix-socket peers, which share one address, are not counted).
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
	// SendWait is how long a client may leave a response unread (its
	// flow-control window full) before its stream is cut
	// ResourceExhausted [10s].
	SendWait time.Duration
	// MemoryBudget bounds, in bytes, what every stream holds together: the
	// reports being decoded and handled, the BucketIds of the buckets
	// subscribed, the responses not yet sent; a stream holds at most a
	// quarter of it. The stream that would pass it ends ResourceExhausted,
	// naming it [64 MiB].
	MemoryBudget int64
	// SilentMin is the least time a stream may send no report before it is
	// ended Unavailable; it is ended after two of its reporting intervals
	// otherwise (the longest between two reports of a bucket; 15 s before
	// a bucket's second report) [10s].
	SilentMin time.Duration
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
	if o.SendWait <= 0 {
		o.SendWait = 10 * time.Second
	}
	if o.MemoryBudget <= 0 {
		o.MemoryBudget = 64 << 20
	}
	if o.SilentMin <= 0 {
		o.SilentMin = 10 * time.Second
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
	perConn    map[string]int                  // open streams by connection (connOf)
	groups     map[string]map[*bucket]struct{} // by store key: the buckets of every stream counting on it
	closing    bool
	demands    map[string]demandSeen // by store key: the fleet's demand as last read (Options.Demand)
	demandDown atomic.Int64          // unix nanoseconds until which Demand is not called (demandBackoff)
	storeLog   *logthrottle.Throttle
	budget     *budget
	work       context.Context // the streams' store calls; cancelled by Shutdown
	stopWork   context.CancelFunc
	wg         sync.WaitGroup // the streams' goroutines
}

// New returns a Server.
func New(o Options) *Server {
	o.defaults()
	s := &Server{o: o, streams: map[*stream]struct{}{}, perConn: map[string]int{}, demands: map[string]demandSeen{}, groups: map[string]map[*bucket]struct{}{},
		storeLog: logthrottle.New(logthrottle.Every, nil), budget: newBudget(o.MemoryBudget)}
	s.work, s.stopWork = context.WithCancel(context.Background())
	return s
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

// Shutdown ends the streams' store calls in flight, has every stream send
// its buckets' assignments expired (TTL 0, so Envoys go to their
// fallbacks on purpose) and then end, withdraws this replica's demand, and
// returns when the streams' goroutines have ended or ctx is done,
// whichever comes first. A stream whose client does not read its expiry
// ends drainWait after it was queued.
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
	s.stopWork()
	for _, st := range sts {
		st.quitOnce.Do(func() { close(st.quit) })
	}
	s.withdrawDemand(ctx, shared)
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Reconfigure tells every stream that the config in force changed: each
// re-resolves its buckets at once, and its next response carries what
// changed (see stream.reconfigure). Streams also notice a change at their
// next report or tick without it. Safe for concurrent use.
func (s *Server) Reconfigure() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for st := range s.streams {
		select {
		case st.wake <- struct{}{}:
		default:
		}
	}
}

// serve runs one stream: a receiving goroutine decodes reports, a sending
// goroutine writes responses, and serve's own goroutine does everything
// else (stream.run) until the stream ends. When serve returns, nothing of
// the stream is handled any more, its buckets have left their share
// groups and the budget; the two goroutines end as soon as gRPC ends the
// stream (Shutdown waits for them too).
func (s *Server) serve(ss grpc.ServerStream) error {
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
	st := s.newStream(ss)
	s.streams[st] = struct{}{}
	s.wg.Add(3)
	s.mu.Unlock()
	s.o.Metrics.addStreams(1)
	defer func() {
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
	go func() { defer s.wg.Done(); st.recvLoop() }()
	go func() { defer s.wg.Done(); st.sendLoop() }()
	return st.run()
}

// connOf names the connection a stream came on by its two addresses, or
// returns "" where the peer's address does not name one connection (a
// Unix-socket peer not named by connguard, whose peers share one address).
func connOf(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	switch r := p.Addr.(type) {
	case *net.TCPAddr:
	case *net.UnixAddr:
		if r.Name == "" || r.Name == "@" {
			return ""
		}
	default:
		return ""
	}
	local := ""
	if p.LocalAddr != nil {
		local = p.LocalAddr.String()
	}
	return p.Addr.Network() + " " + p.Addr.String() + " " + local
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
