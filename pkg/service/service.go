// Package service adapts Envoy's rate limit protocol
// (envoy.service.ratelimit.v3.RateLimitService) to the descriptor config and
// the limiter. It is the one place where domain outcomes and errors become
// gRPC responses and status codes, and where decisions are counted.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store"
)

// Service implements rlsv3.RateLimitServiceServer. It is safe for concurrent
// use; SetConfig swaps the descriptor config (and its metric series)
// atomically under live traffic.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	snap    atomic.Pointer[snapshot]
	lim     Decider
	opts    Options
	nearPPM uint64    // NearLimitRatio in millionths
	pool    sync.Pool // *resolution
	unknown *unknownDomains
}

// DefaultNearLimitRatio is Options.NearLimitRatio's default, as
// envoyproxy/ratelimit's NEAR_LIMIT_RATIO.
const DefaultNearLimitRatio = 0.8

// HeaderNames name the rate-limit response headers.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

func (h HeaderNames) withDefaults() HeaderNames {
	if h.Limit == "" {
		h.Limit = "RateLimit-Limit"
	}
	if h.Remaining == "" {
		h.Remaining = "RateLimit-Remaining"
	}
	if h.Reset == "" {
		h.Reset = "RateLimit-Reset"
	}
	return h
}

// snapshot is a config with the metric series resolved for its rules.
type snapshot struct {
	cfg   *descriptors.Config
	stats *stats
}

// Options configure a Service.
type Options struct {
	// FailClosed is what rules that set no on_error do when the store cannot
	// answer: deny (true) or fall back to the local share (false).
	FailClosed bool
	// ResponseHeaders adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset (draft-03) to every response and Retry-After to
	// OVER_LIMIT ones, for Envoys that do not make their own.
	ResponseHeaders bool
	// HeaderNames name the ResponseHeaders' three RateLimit headers; empty
	// fields take the draft-03 names (RateLimit-Limit, -Remaining, -Reset).
	HeaderNames HeaderNames
	// ShadowMode answers OK to every request (envoyproxy/ratelimit's
	// SHADOW_MODE): descriptors keep their OVER_LIMIT statuses and metrics
	// count them as shadow_over_limit, but the overall code is OK.
	ShadowMode bool
	// QuotaMode makes every descriptor a quota descriptor (QUOTA_MODE): a
	// request is then denied only when all of its descriptors are over.
	QuotaMode bool
	// ResponseMetadata returns the request and the merged metadata of its
	// passing descriptors as the response's dynamic_metadata, as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does.
	ResponseMetadata bool
	// WholeSeconds rounds every duration_until_reset up to whole seconds,
	// as envoyproxy/ratelimit sends them (its windows on whole seconds):
	// compatibility mode; otherwise they carry the store's microseconds.
	WholeSeconds bool
	// NearLimitRatio is the share of a limit used from which an allowed
	// decision counts as near_limit in metrics [0.8].
	NearLimitRatio float64
	// Limits bound what one request may ask; zero fields take DefaultLimits'.
	Limits Limits
	// Metrics records decisions; nil records nothing.
	Metrics *Metrics
	// Log receives the errors mapped to gRPC codes [discard].
	Log *slog.Logger
	// Tracing makes a span of every ShouldRateLimit call; nil makes none.
	Tracing *Tracing
	// RefuseRefunds answers InvalidArgument to a request with a descriptor
	// that asks for a refund (is_negative_hits), naming the descriptor. By
	// default refunds are decided: any client may then give any key back
	// up to its whole limit.
	RefuseRefunds bool
	// KeyPrefix begins every counter's store key (envoyproxy/ratelimit's
	// CACHE_KEY_PREFIX), before the key's hash tag, so that a Redis Cluster
	// still keeps a request's counters together; it has no '{' or '}'.
	KeyPrefix string
	// UpstreamKeys counts fixed-window rules of one unit in
	// envoyproxy/ratelimit's own keys (prefix, domain, entries; the store
	// appends the window, see redisstore.UpstreamKeys).
	UpstreamKeys bool
	// Observer is told every config and decision (envoyproxy/ratelimit's
	// stats, pkg/upstreamstats); nil tells nobody.
	Observer Observer
	// Shares gives scope: global rules their region's share (global.go);
	// nil: such rules admit nothing.
	Shares Shares
}

// Observer receives the service's configs and decisions. Its methods run
// on the decision path: they must not block.
type Observer interface {
	// SetConfig is told each config the service takes.
	SetConfig(cfg *descriptors.Config)
	// Decided is told each descriptor's decision: its rule (nil for none),
	// outcome, and for a counted rule its limiter item and the whole
	// rule's remaining budget (nil and 0 otherwise).
	Decided(domain string, d *rlcommon.RateLimitDescriptor, r *descriptors.Rule, o Outcome, it *limiter.Item, remaining uint64)
}

// Limits bound one request. A request beyond any of them is InvalidArgument
// with a *LimitError that names the field and the bound.
type Limits struct {
	Descriptors int    // descriptors per request
	Entries     int    // entries per descriptor
	KeyBytes    int    // bytes of one entry key
	ValueBytes  int    // bytes of one entry value (and of the domain)
	Hits        uint64 // hits of one descriptor, however given
}

// LimitError is a request beyond one of its Limits: Limit names the Limits
// field (Descriptors, Entries, KeyBytes, ValueBytes, Hits), Field the
// request's field, Got its size and Max the bound.
type LimitError struct {
	Limit    string
	Field    string
	Got, Max uint64
}

// Error says what was too large, by how much, and the bound.
func (e *LimitError) Error() string {
	switch e.Limit {
	case "Descriptors":
		return fmt.Sprintf("%d descriptors, over the limit of %d per request", e.Got, e.Max)
	case "Entries":
		return fmt.Sprintf("%s has %d entries, over the limit of %d", e.Field, e.Got, e.Max)
	case "Hits":
		return fmt.Sprintf("%s %d is over the limit of %d", e.Field, e.Got, e.Max)
	}
	return fmt.Sprintf("%s is %d bytes, over the limit of %d", e.Field, e.Got, e.Max)
}

// DefaultLimits are generous for Envoy (which sends a handful of short
// descriptors) and small enough that no request costs much.
var DefaultLimits = Limits{Descriptors: 64, Entries: 32, KeyBytes: 256, ValueBytes: 4096, Hits: 1_000_000_000}

// MaxHitsBound is the largest Limits.Hits: hit counts stay exact in the Lua
// scripts' doubles and in the memory store's integers below 2^53.
const MaxHitsBound = 1 << 53

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.Descriptors > 0 {
		d.Descriptors = l.Descriptors
	}
	if l.Entries > 0 {
		d.Entries = l.Entries
	}
	if l.KeyBytes > 0 {
		d.KeyBytes = l.KeyBytes
	}
	if l.ValueBytes > 0 {
		d.ValueBytes = l.ValueBytes
	}
	if l.Hits > 0 {
		d.Hits = min(l.Hits, MaxHitsBound)
	}
	return d
}

// Decider decides a request's items, filling each item's Result, or
// returns why it could not (pkg/limiter's Limiter).
type Decider interface {
	Decide(ctx context.Context, items []limiter.Item) error
}

// New returns a Service deciding with cfg through lim.
func New(cfg *descriptors.Config, lim Decider, opts Options) *Service {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	opts.Limits = opts.Limits.withDefaults()
	opts.HeaderNames = opts.HeaderNames.withDefaults()
	if opts.NearLimitRatio <= 0 || opts.NearLimitRatio > 1 {
		opts.NearLimitRatio = DefaultNearLimitRatio
	}
	s := &Service{lim: lim, opts: opts, nearPPM: uint64(math.Round(opts.NearLimitRatio * 1e6)), unknown: opts.Metrics.unknownDomains()}
	s.SetConfig(cfg)
	s.pool.New = func() any { return new(resolution) }
	return s
}

// SetConfig replaces the descriptor config used by later calls.
func (s *Service) SetConfig(cfg *descriptors.Config) {
	s.snap.Store(&snapshot{cfg: cfg, stats: s.opts.Metrics.statsFor(cfg)})
	if s.opts.Observer != nil {
		s.opts.Observer.SetConfig(cfg)
	}
}

// Config returns the descriptor config in force.
func (s *Service) Config() *descriptors.Config { return s.snap.Load().cfg }

// ShouldRateLimit decides a request as Envoy defines it: one status per
// descriptor in request order, overall OVER_LIMIT when any non-shadow
// descriptor is over its limit, never UNKNOWN. A malformed request is
// InvalidArgument.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	var span trace.Span // nil unless tracing is on: see tracing.go
	if s.opts.Tracing != nil {
		ctx, span = s.opts.Tracing.start(ctx)
	}
	snap := s.snap.Load()
	res := s.pool.Get().(*resolution)
	defer s.pool.Put(res)
	res.deadline, _ = ctx.Deadline()
	if err := s.resolve(snap.cfg, req, res); err != nil {
		return nil, s.endSpan(span, req, nil, nil, s.toStatus(err))
	}
	if !snap.cfg.HasDomain(req.Domain) {
		s.unknown.record(req.Domain, s.opts.Log)
	}
	if len(res.items) > 0 {
		if err := s.lim.Decide(ctx, res.items); err != nil {
			return nil, s.endSpan(span, req, res, nil, s.toStatus(err))
		}
	}
	resp := s.respond(snap, req, res)
	snap.stats.refunds(req.Domain, res)
	if m := s.opts.Metrics; m != nil {
		m.latency.Observe(time.Since(start).Seconds())
	}
	if span != nil {
		s.endSpan(span, req, res, resp, nil)
	}
	return resp, nil
}

// toStatus maps an error to a gRPC status, logging it once here: the one
// error mapping of the service and the admin API.
func (s *Service) toStatus(err error) error {
	var bad badRequest
	switch {
	case errors.As(err, &bad):
		s.opts.Metrics.Invalid()
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, store.ErrUnavailable):
		s.opts.Log.Warn("store unavailable", "err", err)
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, store.ErrAuth):
		// Not logged per call: the store's readiness probe logs it,
		// throttled, and turns health NOT_SERVING. Unavailable, so
		// Envoy's failure_mode_deny decides, as for any rls it cannot use.
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, store.ErrProtocol):
		s.opts.Log.Error("store protocol error: the store answered something rls cannot use (a bug, not an outage)", "err", err)
		return status.Error(codes.Internal, err.Error())
	}
	s.opts.Log.Error("decision failed", "err", err)
	return status.Error(codes.Internal, err.Error())
}

// respond builds the response to a decided request and counts its outcomes.
// The request is OVER_LIMIT when a descriptor neither shadow nor quota is
// over, or when every one of its quota descriptors is (quota_mode; the
// limiter has refunded such a request). The global shadow mode answers OK
// all the same.
func (s *Service) respond(snap *snapshot, req *rlsv3.RateLimitRequest, res *resolution) *rlsv3.RateLimitResponse {
	resp, sts, lims, durs := newResponse(len(req.Descriptors))
	var v verdict
	res.outcomes = res.outcomes[:0]
	for i, d := range req.Descriptors {
		r := res.rules[i]
		st := &sts[i]
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		var o Outcome
		switch {
		case r == nil:
			o = OutcomeNoRule
		case r.Unlimited:
			st.LimitRemaining = math.MaxUint32
			o = OutcomeUnlimited
		default:
			o = s.limitedStatus(r, res.item(i), st, &lims[i], &durs[i], &v)
		}
		res.outcomes = append(res.outcomes, o)
		s.observe(req.Domain, d, r, o, res.item(i))
		if r == nil {
			snap.stats.record(req.Domain, nil, o, nil)
		} else {
			snap.stats.record(req.Domain, r, o, detailOf(d, r))
		}
	}
	if v.over() && !s.opts.ShadowMode {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		if body := v.bodyRule(); body != nil {
			resp.RawBody = []byte(body.ResponseBody)
			if body.ContentType != "" {
				resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, header("content-type", body.ContentType))
			}
		}
	}
	if s.opts.ResponseHeaders {
		addRateLimitHeaders(resp, &s.opts.HeaderNames)
	}
	if s.opts.ResponseMetadata {
		resp.DynamicMetadata = responseMetadata(req, res, resp, s.quotaMode)
	}
	return resp
}

// limitedStatus fills st, lim and dur, the status of a descriptor that
// rule r (limited) decided on it, adds its verdict to v and returns its
// outcome.
func (s *Service) limitedStatus(r *descriptors.Rule, it *limiter.Item, st *rlsv3.RateLimitResponse_DescriptorStatus,
	lim *rlsv3.RateLimitResponse_RateLimit, dur *durationpb.Duration, v *verdict) Outcome {
	out := &it.Result
	remaining := wholeRemaining(r, &it.Check, out.Remaining)
	st.CurrentLimit = currentLimit(lim, r)
	st.LimitRemaining = clampUint32(remaining)
	st.DurationUntilReset = dur
	quota := s.quotaMode(r)
	if quota {
		v.quotas++
	}
	switch {
	case out.Allowed:
		setDuration(dur, s.untilReset(out.Reset))
		if s.nearLimit(remaining, r.RequestsPerUnit) {
			return OutcomeNearLimit
		}
		return OutcomeOK
	case r.ShadowMode: // counted and reported, never denied
		setDuration(dur, s.untilReset(out.RetryAfter))
		return OutcomeShadowOverLimit
	}
	setDuration(dur, s.untilReset(out.RetryAfter))
	st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	outcome := v.deny(r, quota)
	if s.opts.ShadowMode {
		outcome = OutcomeShadowOverLimit
	}
	return outcome
}

// verdict gathers a request's denials over its descriptors (respond).
type verdict struct {
	regularOver        bool              // a descriptor neither shadow nor quota is over
	quotas, quotasOver int               // quota descriptors, and those over
	body, quotaBody    *descriptors.Rule // the first denying (quota) rule with a response body
}

// deny records that rule r, a quota rule or not, is over its limit, and
// returns the outcome.
func (v *verdict) deny(r *descriptors.Rule, quota bool) Outcome {
	if quota {
		v.quotasOver++
		if v.quotaBody == nil && r.ResponseBody != "" {
			v.quotaBody = r
		}
		return OutcomeQuotaOverLimit
	}
	v.regularOver = true
	if v.body == nil && r.ResponseBody != "" {
		v.body = r
	}
	return OutcomeOverLimit
}

// over reports whether the request is OVER_LIMIT (before the global
// shadow mode): a regular descriptor is over, or it has quota descriptors
// and every one of them is over.
func (v *verdict) over() bool {
	return v.regularOver || (v.quotas > 0 && v.quotasOver == v.quotas)
}

// bodyRule is the rule whose response body an OVER_LIMIT answer carries:
// the first denying regular rule with one, else the first quota rule.
func (v *verdict) bodyRule() *descriptors.Rule {
	if v.body != nil {
		return v.body
	}
	return v.quotaBody
}

// currentLimit fills lim, a status's current_limit, from rule r and
// returns it.
func currentLimit(lim *rlsv3.RateLimitResponse_RateLimit, r *descriptors.Rule) *rlsv3.RateLimitResponse_RateLimit {
	lim.Name, lim.RequestsPerUnit = r.Name, r.RequestsPerUnit
	lim.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(r.Unit)
	if r.UnitMultiplier > 1 {
		// Envoy reads an absent multiplier as 1: set it only when it
		// says something (one allocation, for such rules only).
		lim.UnitMultiplier = wrapperspb.UInt32(r.UnitMultiplier)
	}
	return lim
}

// observe tells the Observer, if any, a descriptor's decision: for a
// counted rule (it not nil) with the whole rule's remaining budget.
func (s *Service) observe(domain string, d *rlcommon.RateLimitDescriptor, r *descriptors.Rule, o Outcome, it *limiter.Item) {
	if s.opts.Observer == nil {
		return
	}
	var remaining uint64
	if it != nil && r != nil {
		remaining = wholeRemaining(r, &it.Check, it.Result.Remaining)
	}
	s.opts.Observer.Decided(domain, d, r, o, it, remaining)
}

// oneStatus holds a response to one descriptor, the usual request, in one
// allocation.
type oneStatus struct {
	resp rlsv3.RateLimitResponse
	ptr  [1]*rlsv3.RateLimitResponse_DescriptorStatus
	st   [1]rlsv3.RateLimitResponse_DescriptorStatus
	lim  [1]rlsv3.RateLimitResponse_RateLimit
	dur  [1]durationpb.Duration
}

// newResponse returns a response, OverallCode OK, with room for n statuses (Statuses
// has length n, its entries still nil) and the statuses, limits and
// durations to point them at: one allocation for one descriptor, five for
// more, instead of two plus three per descriptor.
func newResponse(n int) (*rlsv3.RateLimitResponse, []rlsv3.RateLimitResponse_DescriptorStatus, []rlsv3.RateLimitResponse_RateLimit, []durationpb.Duration) {
	if n == 1 {
		b := new(oneStatus)
		b.resp.OverallCode = rlsv3.RateLimitResponse_OK
		b.resp.Statuses = b.ptr[:]
		return &b.resp, b.st[:], b.lim[:], b.dur[:]
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	return resp, make([]rlsv3.RateLimitResponse_DescriptorStatus, n),
		make([]rlsv3.RateLimitResponse_RateLimit, n), make([]durationpb.Duration, n)
}

// untilReset is x as a status's duration_until_reset: whole seconds,
// rounded up, with Options.WholeSeconds.
func (s *Service) untilReset(x time.Duration) time.Duration {
	if s.opts.WholeSeconds {
		return time.Duration(ceilSeconds(x)) * time.Second
	}
	return x
}

// setDuration sets d to x, as durationpb.New does.
func setDuration(d *durationpb.Duration, x time.Duration) {
	d.Seconds = int64(x / time.Second)
	d.Nanos = int32(x % time.Second)
}

// nearLimit reports whether the used share of limit (limit minus
// remaining) is NearLimitRatio or more.
func (s *Service) nearLimit(remaining uint64, limit uint32) bool {
	if limit == 0 || remaining >= uint64(limit) {
		return false
	}
	return (uint64(limit)-remaining)*1_000_000 >= s.nearPPM*uint64(limit)
}

// detailOf returns a func rendering the value label of r's detailed
// metrics for d (descriptors.Rule.MetricLabel, escaped for Prometheus). It
// is called only for detailed_metric and value_to_metric rules.
func detailOf(d *rlcommon.RateLimitDescriptor, r *descriptors.Rule) func() string {
	return func() string { return printable(r.MetricLabel(d.Entries)) }
}

// printable returns s with every byte that is not part of valid UTF-8
// written \xNN (as %q would, without quoting anything else): for request
// strings shown in logs, metrics and the admin API, which must be UTF-8.
// Valid strings are returned unchanged.
func printable(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	writePrintable(&b, s)
	return b.String()
}

func writePrintable(b *strings.Builder, s string) {
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n == 1 {
			b.WriteString(`\x`)
			b.WriteByte(hexDigits[s[0]>>4])
			b.WriteByte(hexDigits[s[0]&0xf])
		} else {
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
}

const hexDigits = "0123456789abcdef"

func header(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, Value: v} }

// addRateLimitHeaders adds the draft-03 RateLimit headers, from the status
// with the least remaining (as Envoy's own x-ratelimit headers do), and
// Retry-After (whole seconds, rounded up) on OVER_LIMIT. A policy's w is
// its whole window: the unit times unit_multiplier.
func addRateLimitHeaders(resp *rlsv3.RateLimitResponse, names *HeaderNames) {
	var chosen *rlsv3.RateLimitResponse_DescriptorStatus
	var policies strings.Builder
	var retry time.Duration
	for _, st := range resp.Statuses {
		l := st.CurrentLimit
		if l == nil {
			continue
		}
		if chosen == nil || st.LimitRemaining < chosen.LimitRemaining {
			chosen = st
		}
		w, _ := descriptors.Unit(l.Unit).Window(l.GetUnitMultiplier().GetValue())
		fmt.Fprintf(&policies, ", %d;w=%d", l.RequestsPerUnit, w)
		if l.Name != "" {
			fmt.Fprintf(&policies, ";name=%q", l.Name)
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			retry = max(retry, st.DurationUntilReset.AsDuration())
		}
	}
	if chosen == nil {
		return
	}
	resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
		header(names.Limit, strconv.FormatUint(uint64(chosen.CurrentLimit.RequestsPerUnit), 10)+policies.String()),
		header(names.Remaining, strconv.FormatUint(uint64(chosen.LimitRemaining), 10)),
		header(names.Reset, strconv.FormatInt(ceilSeconds(chosen.DurationUntilReset.AsDuration()), 10)))
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			header("Retry-After", strconv.FormatInt(max(1, ceilSeconds(retry)), 10)))
	}
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

func clampUint32(v uint64) uint32 {
	if v > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(v)
}

// validateRequest rejects what Envoy never sends, what cannot be decided and
// what exceeds the limits, naming the offending field and the bound.
func validateRequest(req *rlsv3.RateLimitRequest, lim *Limits) error {
	if req.Domain == "" {
		return errors.New("domain is empty")
	}
	if len(req.Domain) > lim.ValueBytes {
		return &LimitError{"ValueBytes", "domain", uint64(len(req.Domain)), uint64(lim.ValueBytes)}
	}
	if len(req.Descriptors) == 0 {
		return errors.New("descriptors is empty: a request needs at least one descriptor")
	}
	if len(req.Descriptors) > lim.Descriptors {
		return &LimitError{"Descriptors", "descriptors", uint64(len(req.Descriptors)), uint64(lim.Descriptors)}
	}
	if uint64(req.HitsAddend) > lim.Hits {
		return &LimitError{"Hits", "hits_addend", uint64(req.HitsAddend), lim.Hits}
	}
	for i, d := range req.Descriptors {
		if err := validateDescriptor(i, d, lim); err != nil {
			return err
		}
	}
	return nil
}

// validateDescriptor checks req.Descriptors[i], d, as validateRequest does.
func validateDescriptor(i int, d *rlcommon.RateLimitDescriptor, lim *Limits) error {
	if d == nil || len(d.Entries) == 0 {
		return fmt.Errorf("descriptors[%d] has no entries", i)
	}
	if len(d.Entries) > lim.Entries {
		return &LimitError{"Entries", fmt.Sprintf("descriptors[%d]", i), uint64(len(d.Entries)), uint64(lim.Entries)}
	}
	for j, e := range d.Entries {
		if e == nil || e.Key == "" {
			return fmt.Errorf("descriptors[%d].entries[%d].key is empty", i, j)
		}
		if len(e.Key) > lim.KeyBytes {
			return &LimitError{"KeyBytes", fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), uint64(len(e.Key)), uint64(lim.KeyBytes)}
		}
		if len(e.Value) > lim.ValueBytes {
			return &LimitError{"ValueBytes", fmt.Sprintf("descriptors[%d].entries[%d].value", i, j), uint64(len(e.Value)), uint64(lim.ValueBytes)}
		}
	}
	if h := d.HitsAddend; h != nil && h.Value > lim.Hits {
		return &LimitError{"Hits", fmt.Sprintf("descriptors[%d].hits_addend", i), h.Value, lim.Hits}
	}
	if err := validateOverride(d.Limit); err != nil {
		return fmt.Errorf("descriptors[%d].limit: %w", i, err)
	}
	return nil
}

func validateOverride(l *rlcommon.RateLimitDescriptor_RateLimitOverride) error {
	if l == nil {
		return nil
	}
	switch l.Unit {
	case typev3.RateLimitUnit_SECOND, typev3.RateLimitUnit_MINUTE, typev3.RateLimitUnit_HOUR,
		typev3.RateLimitUnit_DAY, typev3.RateLimitUnit_MONTH, typev3.RateLimitUnit_YEAR:
	default:
		return fmt.Errorf("unit %s (%d) is invalid; choices are [SECOND MINUTE HOUR DAY MONTH YEAR]", l.Unit, int32(l.Unit))
	}
	// A period rls cannot count is refused, never clamped: a clamped
	// window would enforce another limit than the one asked for, and
	// nothing would show it. Envoy's own validation requires a
	// unit_multiplier above 0 when it is set.
	if m := l.GetUnitMultiplier(); m != nil {
		if _, ok := descriptors.Unit(l.Unit).Window(m.Value); !ok || m.Value == 0 {
			return fmt.Errorf("unit_multiplier %s", descriptors.WindowError(descriptors.Unit(l.Unit), m.Value))
		}
	}
	return nil
}
