// Package service adapts Envoy's rate limit protocol
// (envoy.service.ratelimit.v3.RateLimitService) to the descriptor config and
// a store. It is the one place where domain outcomes and errors become gRPC
// responses and status codes.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store"
)

// Service implements rlsv3.RateLimitServiceServer. It is safe for concurrent
// use; SetConfig swaps the descriptor config atomically under live traffic.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	cfg  atomic.Pointer[descriptors.Config]
	lim  *limiter.Limiter
	opts Options
	pool sync.Pool // *scratch
}

// Options configure a Service.
type Options struct {
	// FailClosed is what rules that set no on_error do when the store cannot
	// answer: deny (true) or fall back to the local share (false).
	FailClosed bool
	// Log receives the errors mapped to gRPC codes [discard].
	Log *slog.Logger
}

// New returns a Service deciding with cfg through lim.
func New(cfg *descriptors.Config, lim *limiter.Limiter, opts Options) *Service {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{lim: lim, opts: opts}
	s.cfg.Store(cfg)
	s.pool.New = func() any { return new(scratch) }
	return s
}

// SetConfig replaces the descriptor config used by later calls.
func (s *Service) SetConfig(cfg *descriptors.Config) { s.cfg.Store(cfg) }

// Config returns the descriptor config in force.
func (s *Service) Config() *descriptors.Config { return s.cfg.Load() }

// scratch holds per-call buffers reused across calls.
type scratch struct {
	rules   []*descriptors.Rule
	checks  []store.Check
	results []store.Result
	sources []limiter.Source
	closed  []bool
	slot    []int // descriptor index -> check index, -1 when none
	key     []byte
}

// ShouldRateLimit decides a request as Envoy defines it: one status per
// descriptor in request order, overall OVER_LIMIT when any non-shadow
// descriptor is over its limit, never UNKNOWN. A malformed request is
// InvalidArgument; a store that cannot answer is Unavailable.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validateRequest(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	cfg := s.cfg.Load()
	sc := s.pool.Get().(*scratch)
	defer s.pool.Put(sc)
	resp, err := s.decide(ctx, cfg, req, sc)
	if err != nil {
		return nil, s.toStatus(err)
	}
	return resp, nil
}

// toStatus maps a decision error to a gRPC status, logging it once here.
func (s *Service) toStatus(err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, store.ErrUnavailable):
		s.opts.Log.Warn("store unavailable", "err", err)
		return status.Error(codes.Unavailable, err.Error())
	}
	s.opts.Log.Error("decision failed", "err", err)
	return status.Error(codes.Internal, err.Error())
}

func (s *Service) decide(ctx context.Context, cfg *descriptors.Config, req *rlsv3.RateLimitRequest, sc *scratch) (*rlsv3.RateLimitResponse, error) {
	n := len(req.Descriptors)
	sc.rules = sc.rules[:0]
	for _, d := range req.Descriptors {
		var r *descriptors.Rule
		if l := d.Limit; l != nil {
			r = cfg.MatchOverride(req.Domain, d.Entries, l.RequestsPerUnit, descriptors.Unit(l.Unit))
		} else {
			r = cfg.Match(req.Domain, d.Entries)
		}
		sc.rules = append(sc.rules, r)
	}
	descriptors.ApplyReplaces(sc.rules)

	reqHits := uint64(req.HitsAddend)
	if reqHits == 0 {
		reqHits = 1
	}
	sc.checks = sc.checks[:0]
	sc.closed = sc.closed[:0]
	sc.slot = sc.slot[:0]
	for i, d := range req.Descriptors {
		r := sc.rules[i]
		if r == nil || r.Unlimited {
			sc.slot = append(sc.slot, -1)
			continue
		}
		hits := reqHits
		if d.HitsAddend != nil {
			hits = d.HitsAddend.Value
		}
		sc.key = descriptors.AppendKey(sc.key[:0], req.Domain, d.Entries, r)
		sc.slot = append(sc.slot, len(sc.checks))
		sc.checks = append(sc.checks, store.Check{
			Key:       string(sc.key),
			Algorithm: r.Algorithm,
			Limit:     uint64(r.RequestsPerUnit),
			Window:    r.Window(),
			Burst:     uint64(r.Burst),
			Hits:      hits,
			Refund:    d.IsNegativeHits,
			Shadow:    r.ShadowMode,
		})
		sc.closed = append(sc.closed, r.OnError == descriptors.OnErrorFailClosed ||
			(r.OnError == descriptors.OnErrorDefault && s.opts.FailClosed))
	}
	if cap(sc.results) < len(sc.checks) {
		sc.results = make([]store.Result, len(sc.checks))
		sc.sources = make([]limiter.Source, len(sc.checks))
	}
	sc.results = sc.results[:len(sc.checks)]
	sc.sources = sc.sources[:len(sc.checks)]
	if len(sc.checks) > 0 {
		if err := s.lim.Decide(ctx, sc.checks, sc.closed, sc.results, sc.sources); err != nil {
			return nil, err
		}
	}

	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
	}
	for i := range req.Descriptors {
		r := sc.rules[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch {
		case r == nil:
			continue
		case r.Unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		}
		res := &sc.results[sc.slot[i]]
		st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{
			Name:            r.Name,
			RequestsPerUnit: r.RequestsPerUnit,
			Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(r.Unit),
		}
		st.LimitRemaining = clampUint32(res.Remaining)
		if res.Allowed {
			st.DurationUntilReset = durationpb.New(res.Reset)
			continue
		}
		st.DurationUntilReset = durationpb.New(res.RetryAfter)
		if r.ShadowMode {
			continue // counted and reported, never denied
		}
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return resp, nil
}

func clampUint32(v uint64) uint32 {
	if v > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(v)
}

// validateRequest rejects what Envoy never sends and what cannot be decided,
// naming the offending field.
func validateRequest(req *rlsv3.RateLimitRequest) error {
	if req.Domain == "" {
		return errors.New("domain is empty")
	}
	if len(req.Descriptors) == 0 {
		return errors.New("descriptors is empty: a request needs at least one descriptor")
	}
	for i, d := range req.Descriptors {
		if d == nil || len(d.Entries) == 0 {
			return fmt.Errorf("descriptors[%d] has no entries", i)
		}
		for j, e := range d.Entries {
			if e == nil || e.Key == "" {
				return fmt.Errorf("descriptors[%d].entries[%d].key is empty", i, j)
			}
		}
		if err := validateOverride(d.Limit); err != nil {
			return fmt.Errorf("descriptors[%d].limit: %w", i, err)
		}
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
		return nil
	}
	return fmt.Errorf("unit %s (%d) is invalid; choices are [SECOND MINUTE HOUR DAY MONTH YEAR]", l.Unit, int32(l.Unit))
}
