// Package xdstest runs a go-control-plane state-of-the-world xDS server
// with a snapshot cache on a loopback port, for tests of rls's xDS client:
// it serves RateLimitConfig snapshots and records every request (ACKs and
// NACKs) and response.
package xdstest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Server is a running xDS server. Stop it (or let the test end) to close
// its port and every stream.
type Server struct {
	Addr  string
	Cache cachev3.SnapshotCache

	grpc   *grpc.Server
	done   chan struct{}
	cancel context.CancelFunc
	stop   sync.Once

	mu        sync.Mutex
	requests  []*discoveryv3.DiscoveryRequest
	responses []*discoveryv3.DiscoveryResponse
	streams   int
}

// Start serves on addr ("127.0.0.1:0" for any free port) until Stop or the
// end of the test. The server accepts the client's keepalive pings (every
// 10 s by default), as a control plane must; opts come after that policy,
// so a test can set another.
func Start(t testing.TB, addr string, opts ...grpc.ServerOption) *Server {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Addr: lis.Addr().String(), Cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		done: make(chan struct{}), cancel: cancel}
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(context.Context, int64, string) error {
			s.mu.Lock()
			s.streams++
			s.mu.Unlock()
			return nil
		},
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			s.mu.Lock()
			s.requests = append(s.requests, r)
			s.mu.Unlock()
			return nil
		},
		StreamResponseFunc: func(_ context.Context, _ int64, _ *discoveryv3.DiscoveryRequest, r *discoveryv3.DiscoveryResponse) {
			s.mu.Lock()
			s.responses = append(s.responses, r)
			s.mu.Unlock()
		},
	}
	opts = append([]grpc.ServerOption{grpc.KeepaliveEnforcementPolicy(KeepalivePolicy)}, opts...)
	s.grpc = grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.grpc, serverv3.NewServer(ctx, s.Cache, cb))
	go func() { _ = s.grpc.Serve(lis); close(s.done) }()
	t.Cleanup(s.Stop)
	return s
}

// KeepalivePolicy lets an xds.Client ping every 10 s, with a margin for
// jitter; grpc-go's default policy (5 minutes) would close the connection
// with "too_many_pings".
var KeepalivePolicy = keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}

// Stop closes the port and every stream at once, as a crash would.
func (s *Server) Stop() {
	s.stop.Do(func() {
		s.grpc.Stop()
		s.cancel()
		<-s.done
	})
}

// Set makes configs, at version, the snapshot of node.
func (s *Server) Set(t testing.TB, node, version string, configs ...*rlsconf.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

// AnswerTo waits up to within for the client's answer to the response
// that carried version: that response and the request with its nonce (an
// ACK, or a NACK with an error_detail).
func (s *Server) AnswerTo(t testing.TB, version string, within time.Duration) (*discoveryv3.DiscoveryResponse, *discoveryv3.DiscoveryRequest) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if resp, req := s.answer(version); req != nil {
			return resp, req
		}
		if time.Now().After(deadline) {
			t.Fatalf("xds server: no answer to version %q within %v", version, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *Server) answer(version string) (*discoveryv3.DiscoveryResponse, *discoveryv3.DiscoveryRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, resp := range s.responses {
		if resp.GetVersionInfo() != version {
			continue
		}
		for _, req := range s.requests {
			if req.GetResponseNonce() == resp.GetNonce() {
				return resp, req
			}
		}
	}
	return nil, nil
}

// Requests returns the requests received so far.
func (s *Server) Requests() []*discoveryv3.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discoveryv3.DiscoveryRequest(nil), s.requests...)
}

// Streams returns how many streams were opened.
func (s *Server) Streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams
}

// Limit is a RateLimitConfig of one domain with one key-only descriptor.
func Limit(name, domain, key string, rpu uint32, unit rlsconf.RateLimitUnit) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: key, RateLimit: &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: rpu}}}}
}
