package xds

import (
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
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/testkit"
	"github.com/rls-project/rls/pkg/xds/xdstest"
)

func TestTypeURLIsGoControlPlanes(t *testing.T) {
	if TypeURL != resourcev3.RateLimitConfigType {
		t.Fatalf("TypeURL %q, go-control-plane's resource.RateLimitConfigType %q", TypeURL, resourcev3.RateLimitConfigType)
	}
}

// applied records what a client's Update accepted.
type applied struct {
	mu        sync.Mutex
	calls     map[string]int // Update calls by version
	versions  []string
	cfg       *descriptors.Config
	connected bool
}

func (a *applied) update(version string, res []*rlsconf.RateLimitConfig) error {
	a.mu.Lock()
	if a.calls == nil {
		a.calls = map[string]int{}
	}
	a.calls[version]++
	a.mu.Unlock()
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
func startClient(t *testing.T, addr string, a *applied, logs *testkit.Buffer) *Client {
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

// TestACKAndNACK against go-control-plane's server: each response is
// answered with its nonce; an ACK names its version, a NACK the version last
// ACKed and the validation error, and the config in force stays.
func TestACKAndNACK(t *testing.T) {
	s := xdstest.Start(t, "127.0.0.1:0")
	a := &applied{}
	c := startClient(t, s.Addr, a, nil)

	s.Set(t, "test", "1", xdstest.Limit("foo", "foo", "k1", 3, rlsconf.RateLimitUnit_MINUTE))
	_, ack := s.AnswerTo(t, "1", 5*time.Second)
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
	bad := xdstest.Limit("bar", "bar", "k", 1, rlsconf.RateLimitUnit_UNKNOWN)
	dup := xdstest.Limit("foo", "foo", "k1", 3, rlsconf.RateLimitUnit_MINUTE)
	dup.Descriptors = append(dup.Descriptors, dup.Descriptors[0])
	s.Set(t, "test", "2", bad, dup)
	resp, nack := s.AnswerTo(t, "2", 5*time.Second)
	if nack.GetVersionInfo() != "1" || nack.GetResponseNonce() != resp.GetNonce() {
		t.Errorf("NACK of 2: version %q nonce %q; want version 1 and nonce %q", nack.GetVersionInfo(), nack.GetResponseNonce(), resp.GetNonce())
	}
	d := nack.GetErrorDetail()
	want := `xds:bar: descriptors[0].rate_limit.unit: invalid unit "UNKNOWN"; choices are second, minute, hour, day, week, month, year` + "\n" +
		`xds:foo: descriptors[1].key: duplicate descriptor key "k1" at this level (first at descriptors[0])`
	if d.GetCode() != int32(codes.InvalidArgument) || d.GetMessage() != want {
		t.Errorf("NACK error_detail code %d message\n%s\nwant %d\n%s", d.GetCode(), d.GetMessage(), codes.InvalidArgument, want)
	}
	if v, _ := a.last(); v != "1" || accepted(c) != "1" {
		t.Errorf("after a NACK: applied %q, accepted %q; want 1", v, accepted(c))
	}
	// The server resends a NACKed version at once (the NACK names another
	// version than its snapshot's): the repetitions are NACKed again after
	// 1 s, then 2 s, without being applied again.
	nacks := func() int {
		n := 0
		for _, r := range s.Requests() {
			if r.GetErrorDetail() != nil {
				n++
				if r.GetVersionInfo() != "1" || r.GetErrorDetail().GetMessage() != want {
					t.Errorf("a repeated NACK: version %q, detail %q", r.GetVersionInfo(), r.GetErrorDetail().GetMessage())
				}
			}
		}
		return n
	}
	wait := func() time.Duration {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.rejected.wait
	}
	testkit.WaitFor(t, "the first repetition NACKed after 1 s", 5*time.Second, func() bool { return nacks() == 2 })
	testkit.WaitFor(t, "the next repetition waiting 2 s", 5*time.Second, func() bool { return wait() == 2*nackRepeatMin })
	a.mu.Lock()
	calls := a.calls["2"]
	a.mu.Unlock()
	if n := nacks(); n != 2 || calls != 1 {
		t.Errorf("while the third NACK of version 2 waits 2 s: %d NACKs, %d Update calls; want 2 NACKs, 1 call", n, calls)
	}

	s.Set(t, "test", "3", xdstest.Limit("foo", "foo", "k1", 5, rlsconf.RateLimitUnit_SECOND))
	if _, ack := s.AnswerTo(t, "3", 5*time.Second); ack.GetVersionInfo() != "3" || ack.GetErrorDetail() != nil {
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
	s := xdstest.Start(t, "127.0.0.1:0")
	a := &applied{}
	logs := &testkit.Buffer{}
	c := startClient(t, s.Addr, a, logs)
	s.Set(t, "test", "1", xdstest.Limit("foo", "foo", "k", 1, rlsconf.RateLimitUnit_SECOND))
	s.AnswerTo(t, "1", 5*time.Second)
	testkit.WaitFor(t, "connected", 5*time.Second, a.isConnected)
	s.Stop()
	testkit.WaitFor(t, "disconnected", 5*time.Second, func() bool { return !a.isConnected() })
	tried := c.attempts.Load()
	testkit.WaitFor(t, "two more attempts to open a stream", 5*time.Second, func() bool { return c.attempts.Load() >= tried+2 })
	if v, cfg := a.last(); v != "1" || cfg == nil {
		t.Fatalf("config after disconnect: %q", v)
	}

	s2 := xdstest.Start(t, s.Addr)
	s2.Set(t, "test", "1", xdstest.Limit("foo", "foo", "k", 7, rlsconf.RateLimitUnit_SECOND))
	_, ack := s2.AnswerTo(t, "1", 5*time.Second)
	if ack.GetErrorDetail() != nil {
		t.Fatalf("NACK: %v", ack.GetErrorDetail())
	}
	testkit.WaitFor(t, "the new server's config applied", 5*time.Second, func() bool {
		_, cfg := a.last()
		return cfg.Match("foo", entries("k", "x")).RequestsPerUnit == 7
	})
	// A stream's first request names no version and no nonce.
	first := s2.Requests()[0]
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
	good := mustAny(t, xdstest.Limit("foo", "foo", "k", 1, rlsconf.RateLimitUnit_SECOND))
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
		{"a", "n4", "resource 0: not a valid protobuf message"},
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

type rlcommonEntry = rlcommon.RateLimitDescriptor_Entry

// TestResponseKey: a response's key ignores the order of its resources and
// of metadata fields, and follows its version and content.
func TestResponseKey(t *testing.T) {
	meta := func() *structpb.Struct {
		m := map[string]any{}
		for i := range 20 {
			m[string(rune('a'+i))] = float64(i)
		}
		s, _ := structpb.NewStruct(m)
		return s
	}
	a, b := xdstest.Limit("a", "a", "k", 1, rlsconf.RateLimitUnit_SECOND), xdstest.Limit("b", "b", "k", 2, rlsconf.RateLimitUnit_SECOND)
	a.Descriptors[0].Metadata = meta()
	resp := func(version string, rs ...*rlsconf.RateLimitConfig) string {
		r := &discoveryv3.DiscoveryResponse{VersionInfo: version, TypeUrl: TypeURL}
		for _, c := range rs {
			r.Resources = append(r.Resources, mustAny(t, c))
		}
		res, err := decode(r, Limits{}.withDefaults(0))
		if err != nil {
			t.Fatal(err)
		}
		return responseKey(version, res, r)
	}
	k := resp("1", a, b)
	a2 := xdstest.Limit("a", "a", "k", 1, rlsconf.RateLimitUnit_SECOND)
	a2.Descriptors[0].Metadata = meta()
	if resp("1", b, a2) != k {
		t.Error("key depends on the order of resources or metadata fields")
	}
	if resp("2", a, b) == k || resp("1", a) == k || resp("1", a, xdstest.Limit("b", "b", "k", 3, rlsconf.RateLimitUnit_SECOND)) == k {
		t.Error("key ignores a new version or content")
	}
}

// oldCacheADS answers a stream's first request only when it names another
// version than its own, as a snapshot cache that does not track what each
// stream was sent would.
type oldCacheADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	version string
	res     *anypb.Any
}

func (o *oldCacheADS) StreamAggregatedResources(st grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	req, err := st.Recv()
	if err != nil {
		return err
	}
	if req.GetVersionInfo() != o.version {
		if err := st.Send(&discoveryv3.DiscoveryResponse{VersionInfo: o.version, Nonce: "1", TypeUrl: TypeURL, Resources: []*anypb.Any{o.res}}); err != nil {
			return err
		}
	}
	for {
		if _, err := st.Recv(); err != nil {
			return nil
		}
	}
}

func serveOldCache(t *testing.T, addr string, o *oldCacheADS) (string, func()) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, o)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), srv.Stop
}

// TestNewStreamNamesNoVersion: a control plane restarted with its version
// counter back at the version rls last accepted, but other content, still
// sends it, because a new stream's first request names no version.
func TestNewStreamNamesNoVersion(t *testing.T) {
	addr, stop := serveOldCache(t, "127.0.0.1:0", &oldCacheADS{version: "1", res: mustAny(t, xdstest.Limit("foo", "foo", "k", 1, rlsconf.RateLimitUnit_SECOND))})
	a := &applied{}
	startClient(t, addr, a, nil)
	testkit.WaitFor(t, "version 1 applied", 5*time.Second, func() bool { v, _ := a.last(); return v == "1" })
	stop()
	serveOldCache(t, addr, &oldCacheADS{version: "1", res: mustAny(t, xdstest.Limit("foo", "foo", "k", 9, rlsconf.RateLimitUnit_SECOND))})
	testkit.WaitFor(t, "the restarted server's version 1 applied", 5*time.Second, func() bool {
		_, cfg := a.last()
		return cfg.Match("foo", entries("k", "x")).RequestsPerUnit == 9
	})
}

// TestBackoffBounds: a server that fails every stream at once is retried
// with waits between half and all of a backoff doubling from MinBackoff to
// MaxBackoff, not in a loop.
func TestBackoffBounds(t *testing.T) {
	var mu sync.Mutex
	var at []time.Time
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		return errors.New("no")
	}))
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	c, err := New(Options{Server: lis.Addr().String(), NodeID: "n", MinBackoff: 40 * time.Millisecond, MaxBackoff: 160 * time.Millisecond,
		Update: func(string, []*rlsconf.RateLimitConfig) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_ = c.Run(ctx)
	mu.Lock()
	defer mu.Unlock()
	// Waits: [20,40], [40,80], [80,160], then [80,160] ms each, plus the
	// attempts themselves: 1.5 s holds about 10 to 17 attempts.
	if len(at) < 5 || len(at) > 25 {
		t.Fatalf("%d attempts in 1.5 s, want about 10 to 17", len(at))
	}
	for i := 3; i+1 < len(at); i++ {
		if gap := at[i+1].Sub(at[i]); gap < 70*time.Millisecond {
			t.Errorf("attempt %d came %v after the one before, want at least 80 ms (half of MaxBackoff)", i+2, gap)
		}
	}
}

// accepted returns the version_info of the last response c ACKed ("" before
// the first).
func accepted(c *Client) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.accepted
}
