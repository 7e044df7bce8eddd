package rlqs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/rlqs/rlqstest"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

const testYAML = `
domain: d
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 1000, algorithm: fixed_window}
    descriptors:
      - key: route
        rate_limit: {unit: minute, requests_per_unit: 600}
  - key: open
    rate_limit: {unlimited: true}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket}
  - key: prec
    rate_limit: {unit: minute, requests_per_unit: 600, precision: 6}
`

type harness struct {
	srv  *Server
	st   *memory.Store
	svc  *service.Service
	conn *grpc.ClientConn
	m    *Metrics
}

func newHarness(t *testing.T, o Options) *harness {
	t.Helper()
	return newHarnessYAML(t, testYAML, o)
}

// newHarnessYAML is newHarness with the config yaml.
func newHarnessYAML(t *testing.T, yaml string, o Options) *harness {
	t.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"d.yaml": []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{st: memory.New(memory.Options{Now: o.Now})}
	h.svc = service.New(cfg, limiter.New(h.st, limiter.Options{}), service.Options{})
	h.m = NewMetrics(prometheus.NewRegistry())
	o.Store, o.Resolver, o.Metrics = h.st, h.svc, h.m
	if o.SilentMin == 0 {
		// Tests that advance a fake clock by tens of seconds between
		// reports must not find their stream silent (TestSilentStreamEnded
		// sets it).
		o.SilentMin = time.Hour
	}
	h.srv = New(o)
	lis := bufconn.Listen(1 << 20)
	h.serve(t, lis)
	h.conn = dial(t, "passthrough:///buf", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return lis.DialContext(ctx)
	}))
	return h
}

// serve serves h.srv on lis until the test ends.
func (h *harness) serve(t *testing.T, lis net.Listener) {
	gs := grpc.NewServer(grpc.ForceServerCodecV2(service.Codec()))
	h.srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
}

// dial returns a client connection to target, closed when the test ends.
func dial(t *testing.T, target string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(target, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// raw is a message sent and received as bytes, so tests can send what Go's
// protobuf refuses to marshal (non-UTF-8 strings) and read rls's echo of it.
type raw struct{ b []byte }

type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)   { return v.(*raw).b, nil }
func (rawCodec) Unmarshal(b []byte, v any) error { v.(*raw).b = append([]byte(nil), b...); return nil }
func (rawCodec) Name() string                    { return "proto" }

func (h *harness) rawStream(t *testing.T) grpc.ClientStream {
	t.Helper()
	return rawStreamOn(t, h.conn)
}

// rawStreamOn opens a raw StreamRateLimitQuotas stream on conn.
func rawStreamOn(t *testing.T, conn *grpc.ClientConn) grpc.ClientStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return rawStreamCtx(t, ctx, conn)
}

// rawStreamCtx opens a raw StreamRateLimitQuotas stream on conn that ends
// with ctx.
func rawStreamCtx(t *testing.T, ctx context.Context, conn *grpc.ClientConn) grpc.ClientStream {
	t.Helper()
	cs, err := conn.NewStream(ctx, &rlqsv3.RateLimitQuotaService_ServiceDesc.Streams[0], rlqsv3.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName,
		grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// encodeReport encodes a report by hand (values may be any bytes).
func encodeReport(domain string, elapsedSec int64, allowed, denied uint64, ids ...map[string]string) []byte {
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: domain}
	for _, id := range ids {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: id}, TimeElapsed: durationpb.New(time.Duration(elapsedSec) * time.Second),
			NumRequestsAllowed: allowed, NumRequestsDenied: denied})
	}
	return rlqstest.MarshalReports(m)
}

func recv(t *testing.T, cs grpc.ClientStream) *rlqsv3.RateLimitQuotaResponse {
	t.Helper()
	var m raw
	if err := cs.RecvMsg(&m); err != nil {
		t.Fatalf("recv: %v", err)
	}
	resp, err := rlqstest.DecodeResponse(m.b)
	if err != nil {
		t.Fatalf("decode response: %v", err)
	}
	return resp
}

// checkAssignment asserts what Envoy needs of every assignment.
func checkAssignment(t *testing.T, a *rlqsv3.RateLimitQuotaResponse_BucketAction) {
	t.Helper()
	q := a.GetQuotaAssignmentAction()
	if q == nil {
		t.Fatalf("action %v is not an assignment", a)
	}
	ttl := q.GetAssignmentTimeToLive()
	if ttl == nil || ttl.Nanos != 0 || ttl.Seconds < 1 {
		t.Errorf("TTL %v: want whole seconds >= 1", ttl)
	}
	s := q.GetRateLimitStrategy()
	if s.GetRequestsPerTimeUnit() != nil || s.GetStrategy() == nil {
		t.Errorf("strategy %v: want blanket_rule or token_bucket", s)
	}
	if tb := s.GetTokenBucket(); tb != nil {
		if tb.TokensPerFill == nil || tb.TokensPerFill.Value < 1 {
			t.Errorf("token bucket %v: tokens_per_fill unset or 0", tb)
		}
		if f := tb.FillInterval; f == nil || f.Nanos != 0 || f.Seconds < 1 {
			t.Errorf("token bucket %v: fill_interval not whole seconds >= 1", tb)
		}
		if tb.MaxTokens < 1 {
			t.Errorf("token bucket %v: max_tokens 0", tb)
		}
	}
}

func TestFirstReportAnsweredEchoed(t *testing.T) {
	h := newHarness(t, Options{})
	cs := h.rawStream(t)
	ids := []map[string]string{{"api_key": "k1", "route": "r"}, {"api_key": "k2\xff\xfe"}, {"open": "x"}, {"tb": "t"}, {"nothing": "here"}}
	start := time.Now()
	if err := cs.SendMsg(&raw{encodeReport("d", 0, 1, 0, ids...)}); err != nil {
		t.Fatal(err)
	}
	resp := recv(t, cs)
	if d := time.Since(start); d > time.Second {
		t.Errorf("first answer after %v, want within 1 s", d)
	}
	if len(resp.BucketAction) != len(ids) {
		t.Fatalf("%d actions, want %d: %v", len(resp.BucketAction), len(ids), resp)
	}
	for i, a := range resp.BucketAction {
		if BucketKey(a.BucketId.Bucket) != BucketKey(ids[i]) {
			t.Errorf("action %d echoes %q, want %q byte for byte", i, a.BucketId.Bucket, ids[i])
		}
		checkAssignment(t, a)
	}
	if tb := resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb == nil {
		t.Errorf("limited bucket got %v, want a token bucket", resp.BucketAction[0])
	}
	if r := resp.BucketAction[2].GetQuotaAssignmentAction().GetRateLimitStrategy(); r.GetBlanketRule().String() != "ALLOW_ALL" || r.GetTokenBucket() != nil {
		t.Errorf("unlimited bucket got %v, want ALLOW_ALL", r)
	}
	// The stream is still up after the non-UTF-8 bucket: a second report is answered or accepted.
	if err := cs.SendMsg(&raw{encodeReport("d", 1, 0, 0, ids[1])}); err != nil {
		t.Fatalf("stream after a non-UTF-8 BucketId: %v", err)
	}
	if got := testutil.ToFloat64(h.m.buckets); got != float64(len(ids)) {
		t.Errorf("buckets gauge %v, want %d", got, len(ids))
	}
}

// TestReserveBeforeGrant checks that a grant's worst case is consumed from
// the same key ShouldRateLimit counts before it is sent, and that two
// streams together never get more than the limit.
func TestReserveBeforeGrant(t *testing.T) {
	h := newHarness(t, Options{})
	id := map[string]string{"api_key": "k", "route": "r"}
	var worst, ttl uint64
	for i := 0; i < 3; i++ {
		cs := h.rawStream(t)
		if err := cs.SendMsg(&raw{encodeReport("d", 0, 0, 1000, id)}); err != nil {
			t.Fatal(err)
		}
		a := recv(t, cs).BucketAction[0]
		checkAssignment(t, a)
		if i == 0 {
			ttl = uint64(a.GetQuotaAssignmentAction().AssignmentTimeToLive.Seconds) - 1 // the time left, rounded up
		}
		if tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb != nil {
			ttl := uint64(a.GetQuotaAssignmentAction().AssignmentTimeToLive.Seconds)
			worst += uint64(tb.MaxTokens) + uint64(tb.TokensPerFill.Value)*ttl/uint64(tb.FillInterval.Seconds)
		}
	}
	if worst > 600 {
		t.Errorf("grants' worst cases sum to %d, over the limit 600", worst)
	}
	// Each claims far more than the limit, which is held to the limit's
	// pace (demandCap): together they get at least that pace over the
	// time left in the minute, and top-ups (not read here) the rest.
	if paced := min(500, 10*ttl); worst < paced {
		t.Errorf("grants' worst cases sum to %d: the demand asked for the whole limit's pace over the %d s left, %d", worst, ttl, paced)
	}
	// ShouldRateLimit sees the reservation in the same key.
	if left := h.remaining(t, id); left+worst > 600 {
		t.Errorf("store has %d left after grants of %d: the grants were not reserved", left, worst)
	}
}

func TestOversizedReportRefused(t *testing.T) {
	h := newHarness(t, Options{MaxReportBytes: 200})
	cs := h.rawStream(t)
	ids := make([]map[string]string, 20)
	for i := range ids {
		ids[i] = map[string]string{"api_key": strings.Repeat("x", 20)}
	}
	if err := cs.SendMsg(&raw{encodeReport("d", 0, 1, 0, ids...)}); err != nil {
		t.Fatal(err)
	}
	err := cs.RecvMsg(&raw{})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "over the limit of 200 bytes") {
		t.Fatalf("oversized report: %v, want ResourceExhausted naming the bound", err)
	}
}

func TestIdleBucketsAbandoned(t *testing.T) {
	h := newHarness(t, Options{IdleReports: 2})
	cs := h.rawStream(t)
	id := map[string]string{"open": "x"}
	if err := cs.SendMsg(&raw{encodeReport("d", 0, 1, 0, id)}); err != nil {
		t.Fatal(err)
	}
	recv(t, cs)
	for i := 0; i < 2; i++ {
		if err := cs.SendMsg(&raw{encodeReport("d", 5, 0, 0, id)}); err != nil {
			t.Fatal(err)
		}
	}
	resp := recv(t, cs)
	if len(resp.BucketAction) != 1 || resp.BucketAction[0].GetAbandonAction() == nil {
		t.Fatalf("after 2 idle reports got %v, want an abandon", resp)
	}
	if got := testutil.ToFloat64(h.m.buckets); got != 0 {
		t.Errorf("buckets gauge %v after abandon, want 0", got)
	}
}

func TestUnmatchedDefault(t *testing.T) {
	for _, tc := range []struct {
		a    Action
		want string
	}{{Allow, "ALLOW_ALL"}, {Deny, "DENY_ALL"}, {Abandon, "abandon"}} {
		h := newHarness(t, Options{Unmatched: tc.a})
		cs := h.rawStream(t)
		if err := cs.SendMsg(&raw{encodeReport("d", 0, 1, 0, map[string]string{"unknown": "x"})}); err != nil {
			t.Fatal(err)
		}
		a := recv(t, cs).BucketAction[0]
		got := "abandon"
		if q := a.GetQuotaAssignmentAction(); q != nil {
			got = q.GetRateLimitStrategy().GetBlanketRule().String()
		}
		if got != tc.want {
			t.Errorf("unmatched with %v: got %s, want %s", tc.a, got, tc.want)
		}
	}
}

// subscribed returns a harness and a stream on which id got its first answer.
func subscribed(t *testing.T, id map[string]string) (*harness, grpc.ClientStream, map[string]string) {
	h := newHarness(t, Options{})
	cs := h.rawStream(t)
	if err := cs.SendMsg(&raw{encodeReport("d", 0, 1, 0, id)}); err != nil {
		t.Fatal(err)
	}
	recv(t, cs)
	return h, cs, id
}

func TestDomainMismatch(t *testing.T) {
	_, cs, id := subscribed(t, map[string]string{"open": "x"})
	_ = cs.SendMsg(&raw{encodeReport("other", 0, 1, 0, id)})
	if err := cs.RecvMsg(&raw{}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"other"`) {
		t.Fatalf("second domain: %v, want InvalidArgument naming it", err)
	}
}

func TestShutdownSendsTTLZero(t *testing.T) {
	h, cs, _ := subscribed(t, map[string]string{"api_key": "k"})
	go h.srv.Shutdown(context.Background())
	for {
		var m raw
		err := cs.RecvMsg(&m)
		if err != nil {
			t.Fatalf("stream ended (%v) before a TTL 0", err)
		}
		resp, _ := rlqstest.DecodeResponse(m.b)
		if q := resp.BucketAction[0].GetQuotaAssignmentAction(); q != nil && q.AssignmentTimeToLive.AsDuration() == 0 {
			break
		}
	}
	if err := cs.RecvMsg(&raw{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("after TTL 0: %v, want Unavailable", err)
	}
}

// TestWriteBackAndCallsPerReport: what Envoy allowed before its first
// assignment is written back, and a report costs one store call whatever
// its counts.
func TestWriteBackAndCallsPerReport(t *testing.T) {
	h := newHarness(t, Options{})
	cs := h.rawStream(t)
	id := map[string]string{"api_key": "k", "route": "r"}
	_ = cs.SendMsg(&raw{encodeReport("d", 0, 50, 0, id)})
	recv(t, cs)
	if got := testutil.ToFloat64(h.m.writtenBack); got != 50 {
		t.Errorf("written back %v, want the 50 allowed before any assignment", got)
	}
	_ = cs.SendMsg(&raw{encodeReport("d", 5, 100000, 5, id)})
	waitCount(t, h.m, 2)
	if sum := histSum(t, h.m); sum > 3 {
		t.Errorf("%v store calls for 2 reports, want about one per bucket per report", sum)
	}
}

func waitCount(t *testing.T, m *Metrics, n uint64) {
	t.Helper()
	testkit.WaitFor(t, "reports processed", 5*time.Second, func() bool { return histCount(t, m) >= n })
}

func hist(t *testing.T, m *Metrics) *dto.Histogram {
	t.Helper()
	var d dto.Metric
	if err := m.callsPerReport.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram()
}

func histCount(t *testing.T, m *Metrics) uint64 { return hist(t, m).GetSampleCount() }
func histSum(t *testing.T, m *Metrics) float64  { return hist(t, m).GetSampleSum() }

// TestRefundProvenUnused: a report gives back what it proves unused (all of
// the reservation but what was used and what the grant can still admit
// until its window ends), in the same window, to the same key. The report
// shows a denial, so its grant is not shrunk (TestShrinkFreesUnused).
func TestRefundProvenUnused(t *testing.T) {
	start := time.Unix(1_800_000_000, 0).Truncate(time.Minute).Add(time.Second)
	clk := testkit.NewClock(start)
	h := newHarness(t, Options{Now: clk.Now})
	cs := h.rawStream(t)
	id := map[string]string{"api_key": "k", "route": "r"} // 600 a minute, sliding window
	if err := cs.SendMsg(&raw{encodeReport("d", 0, 0, 1000, id)}); err != nil {
		t.Fatal(err)
	}
	a := recv(t, cs).BucketAction[0]
	q := a.GetQuotaAssignmentAction()
	tb := q.GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		t.Fatalf("got %v, want a token bucket", a)
	}
	ttl, fill := uint64(q.AssignmentTimeToLive.Seconds), uint64(tb.FillInterval.Seconds)
	reserved := uint64(tb.MaxTokens) + uint64(tb.TokensPerFill.Value)*ttl/fill
	clk.Advance(30 * time.Second)
	if err := cs.SendMsg(&raw{encodeReport("d", 30, 10, 1, id)}); err != nil {
		t.Fatal(err)
	}
	waitCount(t, h.m, 2)
	left := (29*time.Second + 40*time.Millisecond).Seconds() // to the window's end, plus Overlap
	need := 10 + uint64(tb.MaxTokens) + uint64(math.Ceil(float64(tb.TokensPerFill.Value)*left/float64(fill)))
	if got := uint64(testutil.ToFloat64(h.m.refunded)); got != reserved-need {
		t.Errorf("refunded %d, want %d (reserved %d, still needed %d)", got, reserved-need, reserved, need)
	}
	if left := h.remaining(t, id); left != 600-need {
		t.Errorf("store has %d left, want %d: the refund did not reach the rule's key", left, 600-need)
	}
	// In the next window nothing of the old reservation is refunded.
	clk.Advance(30 * time.Second)
	before := testutil.ToFloat64(h.m.refunded)
	if err := cs.SendMsg(&raw{encodeReport("d", 30, 0, 0, id)}); err != nil {
		t.Fatal(err)
	}
	waitCount(t, h.m, 3)
	if got := testutil.ToFloat64(h.m.refunded); got != before {
		t.Errorf("refunded %v more after the window ended, want none", got-before)
	}
}

// TestShrinkFreesUnused: a report whose demand leaves most of its grant
// unused until the window ends gets a grant sized to that demand, and the
// refund of all the old one's reservation but what it reported used, what
// the old grant can admit until the new one lands (its bucket and 2 x
// Overlap of refill) and the new one's worst case. A stream that ends right
// after (the new grant may not have landed) charges that refund back.
func TestShrinkFreesUnused(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("late=%v", late), func(t *testing.T) { shrinkFreesUnused(t, late) })
	}
}

func shrinkFreesUnused(t *testing.T, late bool) {
	start := time.Unix(1_800_000_000, 0).Truncate(time.Minute).Add(time.Second)
	clk := testkit.NewClock(start)
	h := newHarness(t, Options{Now: clk.Now})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := rawStreamCtx(t, ctx, h.conn)
	id := map[string]string{"api_key": "k", "route": "r"} // 600 a minute, sliding window
	if err := cs.SendMsg(&raw{encodeReport("d", 0, 0, 1000, id)}); err != nil {
		t.Fatal(err)
	}
	a := recv(t, cs).BucketAction[0]
	tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	ttl := uint64(a.GetQuotaAssignmentAction().AssignmentTimeToLive.Seconds)
	reserved := uint64(tb.MaxTokens) + uint64(tb.TokensPerFill.Value)*ttl/uint64(tb.FillInterval.Seconds)
	rate := float64(tb.TokensPerFill.Value) / float64(tb.FillInterval.Seconds)
	clk.Advance(30 * time.Second)
	if err := cs.SendMsg(&raw{encodeReport("d", 30, 10, 0, id)}); err != nil {
		t.Fatal(err)
	}
	r := recv(t, cs)
	if len(r.BucketAction) != 1 {
		t.Fatalf("got %v, want one replacement grant", r)
	}
	q := r.BucketAction[0].GetQuotaAssignmentAction()
	nb := q.GetRateLimitStrategy().GetTokenBucket()
	if nb == nil || q.AssignmentTimeToLive.Seconds != 29 {
		t.Fatalf("got %v, want a token bucket to the window's end (29 s)", r.BucketAction[0])
	}
	worst := uint64(nb.MaxTokens) + uint64(nb.TokensPerFill.Value)*29/uint64(nb.FillInterval.Seconds)
	if want := uint64(math.Ceil(10.0/30*29)) + 1; worst != want {
		t.Errorf("new grant's worst case %d, want the demand's %d", worst, want)
	}
	need := 10 + uint64(tb.MaxTokens) + uint64(math.Ceil(rate*0.08)) + worst
	if got := uint64(testutil.ToFloat64(h.m.refunded)); got != reserved-need {
		t.Errorf("refunded %d, want %d (reserved %d, still needed %d)", got, reserved-need, reserved, need)
	}
	if left := h.remaining(t, id); left != 600-need {
		t.Errorf("store has %d left, want %d", left, 600-need)
	}
	if late {
		// Ended a second after: the new grant has landed, the refund stands.
		clk.Advance(time.Second)
		cancel()
		testkit.WaitFor(t, "the stream's end", 5*time.Second, func() bool { return testutil.ToFloat64(h.m.streams) == 0 })
		if left := h.remaining(t, id); left != 600-need {
			t.Errorf("store has %d left after a late end, want %d", left, 600-need)
		}
		return
	}
	cancel() // the stream ends at once: the new grant may not have landed
	testkit.WaitFor(t, "the refund charged back", 5*time.Second, func() bool { return h.remaining(t, id) == 600-reserved })
}

// remaining returns the budget of bucket id's rule key in the store, as
// ShouldRateLimit would see it.
func (h *harness) remaining(t *testing.T, id map[string]string) uint64 {
	t.Helper()
	c, _, _, err := h.svc.BucketCheck("d", h.svc.Config().BucketEntries("d", id))
	if err != nil {
		t.Fatal(err)
	}
	res := make([]store.Result, 1)
	if err := h.st.Peek(context.Background(), []store.Check{c}, res); err != nil {
		t.Fatal(err)
	}
	return res[0].Remaining
}

// TestStreamsPerConnCapped: over real TCP, a connection holding the most
// streams rls allows gets ResourceExhausted naming the cap for one more;
// another connection is not affected, and the first can open a stream
// again once one of its own ends.
func TestStreamsPerConnCapped(t *testing.T) {
	h := newHarness(t, Options{StreamsPerConn: 2})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.serve(t, lis)
	first := dial(t, lis.Addr().String())
	id := map[string]string{"open": "x"}
	answered := func(cs grpc.ClientStream) error {
		if err := cs.SendMsg(&raw{encodeReport("d", 0, 1, 0, id)}); err != nil && !errors.Is(err, io.EOF) {
			return err
		} // io.EOF: the server ended the stream; RecvMsg says how
		return cs.RecvMsg(&raw{})
	}
	ctx, cancelFirst := context.WithCancel(context.Background())
	defer cancelFirst()
	if err := answered(rawStreamCtx(t, ctx, first)); err != nil {
		t.Fatalf("stream 1 within the cap: %v", err)
	}
	if err := answered(rawStreamOn(t, first)); err != nil {
		t.Fatalf("stream 2 within the cap: %v", err)
	}
	err = answered(rawStreamOn(t, first))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "already has 2 RLQS streams open") {
		t.Fatalf("third stream on one connection: %v, want ResourceExhausted naming the cap of 2", err)
	}
	if got := testutil.ToFloat64(h.m.refused.WithLabelValues("per_connection")); got != 1 {
		t.Errorf("rls_rlqs_refused_total{reason=per_connection} = %v, want 1", got)
	}
	if err := answered(rawStreamOn(t, dial(t, lis.Addr().String()))); err != nil {
		t.Errorf("a stream on another connection: %v, want an answer", err)
	}
	cancelFirst() // the client goes away: its stream ends on the server
	testkit.WaitFor(t, "a stream slot freed on the first connection", 10*time.Second, func() bool {
		return answered(rawStreamOn(t, first)) == nil
	})
}

// worstOf returns what an assignment can admit at most: its bucket and its
// refill over its TTL (0 for a blanket rule).
func worstOf(a *rlqsv3.RateLimitQuotaResponse_BucketAction) uint64 {
	q := a.GetQuotaAssignmentAction()
	tb := q.GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		return 0
	}
	return uint64(tb.MaxTokens) + uint64(tb.TokensPerFill.Value)*uint64(q.AssignmentTimeToLive.Seconds)/uint64(tb.FillInterval.Seconds)
}

// demandCall is one call of a fake Options.Demand.
type demandCall struct {
	key    string
	demand float64
	ttl    time.Duration
}

// TestShareFollowsFleetDemand: with Options.Demand, a replica's part of a
// limit is its share of the fleet's demand (here a quarter), shared under
// the counter's key; at shutdown it withdraws it. When Demand fails, the
// part is the limit over the fleet's size, and Demand is not asked again
// for demandBackoff.
func TestShareFollowsFleetDemand(t *testing.T) {
	var calls []demandCall
	var fail bool
	demand := func(_ context.Context, key string, d float64, ttl time.Duration) (float64, error) {
		calls = append(calls, demandCall{key, d, ttl}) // calls are serialized by the stream
		if fail {
			return 0, status.Error(codes.Unavailable, "redis down")
		}
		return d + 3000, nil // three times this replica's demand elsewhere
	}
	grant := func(h *harness, key string) uint64 {
		cs := h.rawStream(t)
		if err := cs.SendMsg(&raw{encodeReport("d", 0, 0, 1000, map[string]string{"api_key": key})}); err != nil {
			t.Fatal(err)
		}
		a := recv(t, cs).BucketAction[0]
		checkAssignment(t, a)
		return worstOf(a)
	}

	h := newHarness(t, Options{Demand: demand})
	if got := grant(h, "k"); got < 200 || got > 260 {
		t.Errorf("grant %d with a quarter of the fleet's demand here, want about 250 of the limit 1000", got)
	}
	if len(calls) != 1 || calls[0].key == "" || calls[0].demand != 1000 || calls[0].ttl < 6*time.Second {
		t.Fatalf("Demand calls %+v, want one sharing 1000 hits/s under the counter's key for >= 6 s", calls)
	}
	h.srv.Shutdown(context.Background())
	if last := calls[len(calls)-1]; len(calls) != 2 || last.key != calls[0].key || last.demand != 0 {
		t.Errorf("Demand calls after Shutdown %+v, want the key's demand withdrawn (0)", calls)
	}

	calls, fail = nil, true
	h = newHarness(t, Options{Demand: demand})
	if got := grant(h, "k"); got < 900 {
		t.Errorf("grant %d while Demand fails, want the whole limit 1000 (fleet of 1)", got)
	}
	if got := grant(h, "other"); got < 900 || len(calls) != 1 {
		t.Errorf("second key while Demand fails: grant %d, %d Demand calls; want the whole limit and no second call within the backoff", got, len(calls))
	}
}

// TestReportSharesShiftedDemand: a report that moves this replica's demand
// for a key by more than a quarter from what it last shared shares it at
// once, so that the other replicas size their parts on it at their next
// boundary; a report that moves it less makes no call.
func TestReportSharesShiftedDemand(t *testing.T) {
	var mu sync.Mutex
	var shared []float64
	demand := func(_ context.Context, _ string, d float64, _ time.Duration) (float64, error) {
		mu.Lock()
		defer mu.Unlock()
		shared = append(shared, d)
		return d, nil
	}
	calls := func() []float64 {
		mu.Lock()
		defer mu.Unlock()
		return append([]float64(nil), shared...)
	}
	// A minute's window: no boundary push within the test.
	clk := testkit.NewClock(time.Unix(1_800_000_000, 0).Truncate(time.Minute).Add(time.Second))
	h := newHarness(t, Options{Now: clk.Now, Demand: demand})
	cs := h.rawStream(t)
	id := map[string]string{"api_key": "k", "route": "r"} // 10 a second: demand is held within it (demandCap)
	if err := cs.SendMsg(&raw{encodeReport("d", 0, 0, 5, id)}); err != nil {
		t.Fatal(err)
	}
	checkAssignment(t, recv(t, cs).BucketAction[0])
	if got := calls(); len(got) != 1 {
		t.Fatalf("Demand calls %v after the first grant, want one", got)
	}
	// Each report a second after the last, once that one is handled.
	report := func(allowed uint64) {
		n := hist(t, h.m).GetSampleCount()
		clk.Advance(time.Second)
		if err := cs.SendMsg(&raw{encodeReport("d", 1, allowed, 0, id)}); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, "the report handled", 5*time.Second, func() bool { return hist(t, h.m).GetSampleCount() > n })
	}
	first := calls()[0]
	report(uint64(first * 1.2)) // a fifth more: not shared
	if got := calls(); len(got) != 1 {
		t.Errorf("Demand calls %v after a report of a fifth more demand, want still one", got)
	}
	report(uint64(first * 2)) // twice: shared at once
	if got := calls(); len(got) != 2 || got[1] != 2*first {
		t.Errorf("Demand calls %v, want %v then %v", got, first, 2*first)
	}
}

// TestPacedSlidingGrant: a sliding window's grant that lasts a whole window
// is reserved paced (store.Check.Paced): after a full window its first
// grant at the next window's start gets the whole limit (reserved against
// the weighted count it would get almost nothing), and ShouldRateLimit
// sees the reservation. A grant that lasts less than the window (a first
// report late in it) is reserved against the weighted count.
func TestPacedSlidingGrant(t *testing.T) {
	window := time.Unix(1_800_000_000, 0).Truncate(time.Minute)
	clk := testkit.NewClock(window.Add(-30 * time.Second))
	h := newHarness(t, Options{Now: clk.Now})
	worst := func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) uint64 {
		t.Helper()
		checkAssignment(t, a)
		q := a.GetQuotaAssignmentAction()
		tb := q.GetRateLimitStrategy().GetTokenBucket()
		if tb == nil {
			return 0 // DENY_ALL
		}
		return uint64(tb.MaxTokens) + uint64(tb.TokensPerFill.Value)*uint64(q.AssignmentTimeToLive.Seconds)/uint64(tb.FillInterval.Seconds)
	}
	full := func(id map[string]string) { // the previous minute used up
		c, _, _, err := h.svc.BucketCheck("d", h.svc.Config().BucketEntries("d", id))
		if err != nil {
			t.Fatal(err)
		}
		c.Hits, c.Force = 600, true
		if err := h.st.Decide(context.Background(), []store.Check{c}, make([]store.Result, 1)); err != nil {
			t.Fatal(err)
		}
	}
	early, late := map[string]string{"api_key": "early", "route": "r"}, map[string]string{"api_key": "late", "route": "r"}
	prec := map[string]string{"prec": "p"} // precision 6: the window's sub-windows so far count
	full(early)
	full(late)
	full(prec)

	clk.Set(window.Add(5 * time.Millisecond)) // a push's time: the window's start
	for _, id := range []map[string]string{early, prec} {
		cs := h.rawStream(t)
		if err := cs.SendMsg(&raw{encodeReport("d", 0, 0, 1000, id)}); err != nil {
			t.Fatal(err)
		}
		got := worst(recv(t, cs).BucketAction[0])
		if got < 550 || got > 600 {
			t.Errorf("%v: a whole window's grant after a full window reserved %d, want nearly all of the limit 600 and no more", id, got)
		}
		if left := h.remaining(t, id); left != 0 {
			t.Errorf("%v: ShouldRateLimit finds %d left beside the grant of %d, want 0", id, left, got)
		}
	}

	clk.Set(window.Add(30 * time.Second)) // half the previous window still counts: 300
	cs2 := h.rawStream(t)
	if err := cs2.SendMsg(&raw{encodeReport("d", 0, 0, 1000, late)}); err != nil {
		t.Fatal(err)
	}
	if got := worst(recv(t, cs2).BucketAction[0]); got > 300 || got < 250 {
		t.Errorf("a 30 s grant in a window half counted reserved %d, want the weighted budget 300 at most", got)
	}
}
