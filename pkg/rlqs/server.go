// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3, StreamRateLimitQuotas) from the same
// descriptor config and store counters as ShouldRateLimit. Every grant an
// Envoy enforces locally is carved from the store before it is sent: its
// worst case is consumed with one all-or-nothing store check, so that the
// grants of every Envoy and every rls replica sharing the store never pass
// a rule's limit (docs/rlqs.md, invariant 1).
package rlqs

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/pkg/logthrottle"
)

// HealthName is the gRPC health service name of the RLQS service.
const HealthName = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"

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
