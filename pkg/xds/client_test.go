package xds

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rls-project/rls/pkg/descriptors"
)

func TestTypeURLIsGoControlPlanes(t *testing.T) {
	if TypeURL != resourcev3.RateLimitConfigType {
		t.Fatalf("TypeURL %q, go-control-plane's resource.RateLimitConfigType %q", TypeURL, resourcev3.RateLimitConfigType)
	}
}

// cpServer is a go-control-plane SotW server on a loopback port with a
// snapshot cache, recording the requests it receives and the responses it
// sends, by stream.
type cpServer struct {
	addr  string
	cache cachev3.SnapshotCache
	grpc  *grpc.Server

	mu        sync.Mutex
	requests  []*discoveryv3.DiscoveryRequest
	responses []*discoveryv3.DiscoveryResponse
	opened    int
}

func startCP(t *testing.T, addr string) *cpServer {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &cpServer{addr: lis.Addr().String(), cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)}
	ctx, cancel := context.WithCancel(context.Background())
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(context.Context, int64, string) error {
			s.mu.Lock()
			s.opened++
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
	s.grpc = grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.grpc, serverv3.NewServer(ctx, s.cache, cb))
	done := make(chan struct{})
	go func() { _ = s.grpc.Serve(lis); close(done) }()
	t.Cleanup(func() { s.stop(); cancel(); <-done })
	return s
}

func (s *cpServer) stop() { s.grpc.Stop() }

// set puts a snapshot of configs at version for node "test".
func (s *cpServer) set(t *testing.T, version string, configs ...*rlsconf.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), "test", snap); err != nil {
		t.Fatal(err)
	}
}

// answerTo returns the request that answered the response with version
// (the request carrying its nonce), waiting up to 5 s.
func (s *cpServer) answerTo(t *testing.T, version string) (*discoveryv3.DiscoveryResponse, *discoveryv3.DiscoveryRequest) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		for _, resp := range s.responses {
			if resp.GetVersionInfo() != version {
				continue
			}
			for _, req := range s.requests {
				if req.GetResponseNonce() == resp.GetNonce() {
					s.mu.Unlock()
					return resp, req
				}
			}
		}
		s.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no answer to version %q within 5s", version)
	return nil, nil
}

func limit(name, domain, key string, rpu uint32, unit rlsconf.RateLimitUnit) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: key, RateLimit: &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: rpu}}}}
}

// applied records what a client's Update accepted.
type applied struct {
	mu        sync.Mutex
	versions  []string
	cfg       *descriptors.Config
	connected bool
}

func (a *applied) update(version string, res []*rlsconf.RateLimitConfig) error {
	cfg, err := Build(res, descriptors.ParseOptions{})
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.versions, a.cfg = append(a.versions, version), cfg
	return nil
}

func (a *applied) last() (string, *descriptors.Config) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.versions) == 0 {
		return "", nil
	}
	return a.versions[len(a.versions)-1], a.cfg
}

func (a *applied) isConnected() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.connected
}

// startClient runs a client for node "test" against addr until the test ends.
func startClient(t *testing.T, addr string, a *applied, logs *syncBuf) *Client {
	t.Helper()
	var log *slog.Logger
	if logs != nil {
		log = slog.New(slog.NewTextHandler(logs, nil))
	}
	c, err := New(Options{Server: addr, NodeID: "test", NodeMetadata: map[string]string{"cluster": "rls"}, Version: "v-test",
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Update: a.update, Log: log,
		Connected: func(up bool) { a.mu.Lock(); a.connected = up; a.mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return 5s after its context ended")
		}
	})
	return c
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestACKAndNACK against go-control-plane's server: each response is
// answered with its nonce; an ACK names its version, a NACK the version last
// ACKed and the validation error, and the config in force stays.
func TestACKAndNACK(t *testing.T) {
	s := startCP(t, "127.0.0.1:0")
	a := &applied{}
	c := startClient(t, s.addr, a, nil)

	s.set(t, "1", limit("foo", "foo", "k1", 3, rlsconf.RateLimitUnit_MINUTE))
	_, ack := s.answerTo(t, "1")
	if ack.GetVersionInfo() != "1" || ack.GetErrorDetail() != nil {
		t.Fatalf("answer to version 1: version %q, error %v; want an ACK of 1", ack.GetVersionInfo(), ack.GetErrorDetail())
	}
	if n := ack.GetNode(); n.GetId() != "test" || n.GetUserAgentName() != "rls" || n.GetUserAgentVersion() != "v-test" ||
		n.GetMetadata().GetFields()["cluster"].GetStringValue() != "rls" {
		t.Errorf("node %v", n)
	}
	if v, cfg := a.last(); v != "1" || cfg.Match("foo", entries("k1", "x")).RequestsPerUnit != 3 {
		t.Fatalf("applied %q %v", v, cfg.Rules())
	}

	// Bad: a unit of UNKNOWN, and a duplicate descriptor in another resource.
	bad := limit("bar", "bar", "k", 1, rlsconf.RateLimitUnit_UNKNOWN)
	dup := limit("foo", "foo", "k1", 3, rlsconf.RateLimitUnit_MINUTE)
	dup.Descriptors = append(dup.Descriptors, dup.Descriptors[0])
	s.set(t, "2", bad, dup)
	resp, nack := s.answerTo(t, "2")
	if nack.GetVersionInfo() != "1" || nack.GetResponseNonce() != resp.GetNonce() {
		t.Errorf("NACK of 2: version %q nonce %q; want version 1 and nonce %q", nack.GetVersionInfo(), nack.GetResponseNonce(), resp.GetNonce())
	}
	d := nack.GetErrorDetail()
	want := `xds:bar: descriptors[0].rate_limit.unit: invalid unit "UNKNOWN"; choices are second, minute, hour, day, week, month, year` + "\n" +
		`xds:foo: descriptors[1].key: duplicate descriptor key "k1" at this level (first at descriptors[0])`
	if d.GetCode() != int32(codes.InvalidArgument) || d.GetMessage() != want {
		t.Errorf("NACK error_detail code %d message\n%s\nwant %d\n%s", d.GetCode(), d.GetMessage(), codes.InvalidArgument, want)
	}
	if v, _ := a.last(); v != "1" || c.Accepted() != "1" {
		t.Errorf("after a NACK: applied %q, accepted %q; want 1", v, c.Accepted())
	}

	s.set(t, "3", limit("foo", "foo", "k1", 5, rlsconf.RateLimitUnit_SECOND))
	if _, ack := s.answerTo(t, "3"); ack.GetVersionInfo() != "3" || ack.GetErrorDetail() != nil {
		t.Errorf("answer to 3: version %q error %v", ack.GetVersionInfo(), ack.GetErrorDetail())
	}
	if v, cfg := a.last(); v != "3" || cfg.Match("foo", entries("k1", "x")).RequestsPerUnit != 5 {
		t.Errorf("applied %q", v)
	}
}

// TestReconnect: the server goes away (the client reports it and keeps its
// config) and comes back on the same address with a new cache that reuses
// a version number for other content; the client applies it.
func TestReconnect(t *testing.T) {
	s := startCP(t, "127.0.0.1:0")
	a := &applied{}
	logs := &syncBuf{}
	startClient(t, s.addr, a, logs)
	s.set(t, "1", limit("foo", "foo", "k", 1, rlsconf.RateLimitUnit_SECOND))
	s.answerTo(t, "1")
	waitUntil(t, "connected", a.isConnected)
	s.stop()
	waitUntil(t, "disconnected", func() bool { return !a.isConnected() })
	time.Sleep(300 * time.Millisecond) // a few failed attempts
	if v, cfg := a.last(); v != "1" || cfg == nil {
		t.Fatalf("config after disconnect: %q", v)
	}

	s2 := startCP(t, s.addr)
	s2.set(t, "1", limit("foo", "foo", "k", 7, rlsconf.RateLimitUnit_SECOND))
	_, ack := s2.answerTo(t, "1")
	if ack.GetErrorDetail() != nil {
		t.Fatalf("NACK: %v", ack.GetErrorDetail())
	}
	waitUntil(t, "the new server's config applied", func() bool {
		_, cfg := a.last()
		return cfg.Match("foo", entries("k", "x")).RequestsPerUnit == 7
	})
	// A stream's first request names no version and no nonce.
	s2.mu.Lock()
	first := s2.requests[0]
	s2.mu.Unlock()
	if first.GetVersionInfo() != "" || first.GetResponseNonce() != "" || first.GetTypeUrl() != TypeURL {
		t.Errorf("first request on the new stream: %v", first)
	}
	if n := strings.Count(logs.String(), "stream to the management server failed"); n < 1 {
		t.Errorf("the disconnect was not logged:\n%s", logs.String())
	}
}

// fakeADS serves scripted responses on each stream and records requests.
type fakeADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	responses []*discoveryv3.DiscoveryResponse
	requests  chan *discoveryv3.DiscoveryRequest
}

func (f *fakeADS) StreamAggregatedResources(st grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	if _, err := st.Recv(); err != nil {
		return err
	}
	for _, r := range f.responses {
		if err := st.Send(r); err != nil {
			return err
		}
		if r.GetTypeUrl() != TypeURL {
			continue // not answered
		}
		req, err := st.Recv()
		if err != nil {
			return err
		}
		f.requests <- req
	}
	<-st.Context().Done()
	return nil
}

func startFake(t *testing.T, f *fakeADS) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func mustAny(t *testing.T, m *rlsconf.RateLimitConfig) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestResponsesThatCannotBeDecoded are NACKed with the reason; a response
// of a type not asked for is not answered.
func TestResponsesThatCannotBeDecoded(t *testing.T) {
	good := mustAny(t, limit("foo", "foo", "k", 1, rlsconf.RateLimitUnit_SECOND))
	wrongType, _ := anypb.New(durationpb.New(time.Second))
	garbage := &anypb.Any{TypeUrl: TypeURL, Value: []byte{0xff, 0xff}}
	f := &fakeADS{requests: make(chan *discoveryv3.DiscoveryRequest, 10), responses: []*discoveryv3.DiscoveryResponse{
		{VersionInfo: "a", Nonce: "n1", TypeUrl: TypeURL, Resources: []*anypb.Any{good}},
		{VersionInfo: "b", Nonce: "n2", TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"},
		{VersionInfo: "c", Nonce: "n3", TypeUrl: TypeURL, Resources: []*anypb.Any{good, wrongType}},
		{VersionInfo: "d", Nonce: "n4", TypeUrl: TypeURL, Resources: []*anypb.Any{garbage}},
		{VersionInfo: "e", Nonce: "n5", TypeUrl: TypeURL, Resources: []*anypb.Any{good}},
	}}
	addr := startFake(t, f)
	a := &applied{}
	startClient(t, addr, a, nil)
	want := []struct{ version, nonce, detail string }{
		{"a", "n1", ""},
		{"a", "n3", "resource 1 is a type.googleapis.com/google.protobuf.Duration, want " + TypeURL},
		{"a", "n4", "resource 0: proto"},
		{"e", "n5", ""},
	}
	for _, w := range want {
		select {
		case req := <-f.requests:
			d := req.GetErrorDetail().GetMessage()
			if req.GetVersionInfo() != w.version || req.GetResponseNonce() != w.nonce || !strings.HasPrefix(d, w.detail) || (w.detail == "") != (d == "") {
				t.Errorf("answer: version %q nonce %q detail %q; want %q %q %q...", req.GetVersionInfo(), req.GetResponseNonce(), d, w.version, w.nonce, w.detail)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no answer to nonce %s", w.nonce)
		}
	}
}

// TestNewChecksOptions: the required options.
func TestNewChecksOptions(t *testing.T) {
	upd := func(string, []*rlsconf.RateLimitConfig) error { return nil }
	for _, o := range []Options{{NodeID: "n", Update: upd}, {Server: "s:1", Update: upd}, {Server: "s:1", NodeID: "n"}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// TestTruncate bounds a NACK's message.
func TestTruncate(t *testing.T) {
	if got := truncate(strings.Repeat("x", maxDetail+5), maxDetail); !strings.HasSuffix(got, "... (5 more bytes)") || len(got) > maxDetail+30 {
		t.Errorf("truncate: %d bytes, ends %q", len(got), got[len(got)-20:])
	}
	if got := truncate("short", maxDetail); got != "short" {
		t.Errorf("truncate(short) = %q", got)
	}
}

// TestBuildAcceptsUnlimitedWithoutUnit: the protobuf's UNKNOWN default is
// no unit on an unlimited rule, and a refused unit on any other.
func TestBuildAcceptsUnlimitedWithoutUnit(t *testing.T) {
	cfg, err := Build([]*rlsconf.RateLimitConfig{{Name: "u", Domain: "u", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "free", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}},
		{Key: "paid", Value: "gold", ShadowMode: true, DetailedMetric: true, QuotaMode: true,
			RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_WEEK, RequestsPerUnit: 9, Name: "gold",
				Replaces: []*rlsconf.RateLimitReplace{{Name: "silver"}}}},
	}}}, descriptors.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Match("u", entries("free", "x")); r == nil || !r.Unlimited {
		t.Errorf("free: %+v", r)
	}
	r := cfg.Match("u", entries("paid", "gold"))
	if r == nil || r.Unit != descriptors.UnitWeek || r.RequestsPerUnit != 9 || r.Name != "gold" || !r.ShadowMode || !r.DetailedMetric ||
		!r.QuotaMode || len(r.Replaces) != 1 || r.Replaces[0] != "silver" || r.File != "xds:u" {
		t.Errorf("paid: %+v", r)
	}
	_, err = Build([]*rlsconf.RateLimitConfig{{Domain: "nameless", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true, Unit: rlsconf.RateLimitUnit_HOUR}}}}}, descriptors.ParseOptions{})
	var list descriptors.Errors
	if !errors.As(err, &list) || len(list) != 1 || list[0].Error() != "xds:(domain nameless): descriptors[0].rate_limit.unit: must not be set when unlimited is true" {
		t.Errorf("unlimited with a unit: %v", err)
	}
}

func entries(kv ...string) []*rlcommonEntry {
	var out []*rlcommonEntry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &rlcommonEntry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type rlcommonEntry = rlcommon.RateLimitDescriptor_Entry
