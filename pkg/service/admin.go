package service

import (
	"context"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store"
	adminv1 "github.com/rls-project/rls/proto/rls/admin/v1"
)

// AdminStore is what the admin API needs of a store: read counters without
// writing them, and delete them. The memory and Redis stores have both.
type AdminStore interface {
	Peek(ctx context.Context, checks []store.Check, results []store.Result) error
	Delete(ctx context.Context, keys ...string) error
}

// Admin implements rls.admin.v1.AdminService on a Service's config, the
// store and the limiter's local state.
type Admin struct {
	adminv1.UnimplementedAdminServiceServer
	svc *Service
	st  AdminStore
	lim *limiter.Limiter
}

// NewAdmin returns the admin API of svc.
func NewAdmin(svc *Service, st AdminStore, lim *limiter.Limiter) *Admin {
	return &Admin{svc: svc, st: st, lim: lim}
}

// explained is one descriptor resolved the way ShouldRateLimit resolves it.
type explained struct {
	rule  *descriptors.Rule
	note  string
	check store.Check
}

// resolve matches descriptors as ShouldRateLimit does (overrides, replaces)
// and builds their checks.
func (a *Admin) resolve(domain string, ds []*adminv1.Descriptor) ([]explained, error) {
	if domain == "" {
		return nil, status.Error(codes.InvalidArgument, "domain is empty")
	}
	if len(ds) == 0 {
		return nil, status.Error(codes.InvalidArgument, "descriptors is empty")
	}
	cfg := a.svc.Config()
	out := make([]explained, len(ds))
	rules := make([]*descriptors.Rule, len(ds))
	entries := make([][]*rlcommon.RateLimitDescriptor_Entry, len(ds))
	for i, d := range ds {
		if len(d.Entries) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "descriptors[%d] has no entries", i)
		}
		for j, e := range d.Entries {
			if e.Key == "" {
				return nil, status.Errorf(codes.InvalidArgument, "descriptors[%d].entries[%d].key is empty", i, j)
			}
			entries[i] = append(entries[i], &rlcommon.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		if l := d.Limit; l != nil {
			u, ok := typev3.RateLimitUnit_value[strings.ToUpper(l.Unit)]
			if !ok || u == 0 {
				return nil, status.Errorf(codes.InvalidArgument, "descriptors[%d].limit.unit %q is invalid; choices are [SECOND MINUTE HOUR DAY MONTH YEAR]", i, l.Unit)
			}
			rules[i] = cfg.MatchOverride(domain, entries[i], l.RequestsPerUnit, descriptors.Unit(u))
		} else {
			rules[i] = cfg.Match(domain, entries[i])
		}
	}
	matched := append([]*descriptors.Rule(nil), rules...)
	descriptors.ApplyReplaces(rules)
	for i := range ds {
		e := &out[i]
		e.rule = matched[i]
		switch {
		case matched[i] == nil:
			e.note = "no rule matches: always OK"
		case rules[i] == nil:
			e.note = "replaced by another limit of this request: not counted"
		case matched[i].Unlimited:
			e.note = "unlimited: always OK, not counted"
		default:
			r := matched[i]
			e.check = ruleCheck(r, string(descriptors.AppendKey(nil, domain, entries[i], r)))
		}
	}
	return out, nil
}

// Explain implements AdminService.Explain.
func (a *Admin) Explain(ctx context.Context, req *adminv1.ExplainRequest) (*adminv1.ExplainResponse, error) {
	ex, err := a.resolve(req.Domain, req.Descriptors)
	if err != nil {
		return nil, err
	}
	var checks []store.Check
	var idx []int
	for i := range ex {
		if ex[i].check.Key != "" {
			checks = append(checks, ex[i].check)
			idx = append(idx, i)
		}
	}
	results := make([]store.Result, len(checks))
	if len(checks) > 0 {
		if err := a.st.Peek(ctx, checks, results); err != nil {
			return nil, status.Errorf(codes.Unavailable, "read counters: %v", err)
		}
	}
	resp := &adminv1.ExplainResponse{Explanations: make([]*adminv1.Explanation, len(ex))}
	for i := range ex {
		resp.Explanations[i] = &adminv1.Explanation{Matched: ex[i].rule != nil, Note: ex[i].note, Rule: ruleProto(ex[i].rule)}
	}
	for j, i := range idx {
		r := results[j]
		e := resp.Explanations[i]
		e.Key = checks[j].Key
		e.State = &adminv1.CounterState{
			Remaining:  r.Remaining,
			OverLimit:  !r.Allowed,
			UntilReset: durationpb.New(r.Reset),
			Source:     limiter.FromStore.String(),
		}
		if !r.Allowed {
			e.State.RetryAfter = durationpb.New(r.RetryAfter)
		}
		if d, ok := a.lim.CachedDenial(&checks[j]); ok {
			e.State.OverLimit, e.State.Remaining = true, 0
			e.State.RetryAfter = durationpb.New(d)
			e.State.Source = limiter.FromCache.String()
		}
	}
	return resp, nil
}

// ResetCounters implements AdminService.ResetCounters.
func (a *Admin) ResetCounters(ctx context.Context, req *adminv1.ResetCountersRequest) (*adminv1.ResetCountersResponse, error) {
	ex, err := a.resolve(req.Domain, req.Descriptors)
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, e := range ex {
		if e.check.Key != "" {
			keys = append(keys, e.check.Key)
		}
	}
	if len(keys) == 0 {
		return &adminv1.ResetCountersResponse{}, nil
	}
	if err := a.st.Delete(ctx, keys...); err != nil {
		return nil, status.Errorf(codes.Unavailable, "delete counters: %v", err)
	}
	a.lim.Forget(keys...)
	return &adminv1.ResetCountersResponse{Keys: keys}, nil
}

func ruleProto(r *descriptors.Rule) *adminv1.Rule {
	if r == nil {
		return nil
	}
	p := &adminv1.Rule{
		Name: r.Name, Path: r.Path, File: r.File, Line: int32(r.Line),
		RequestsPerUnit: r.RequestsPerUnit, Algorithm: r.Algorithm.String(), Burst: r.Burst,
		ShadowMode: r.ShadowMode, Unlimited: r.Unlimited, Override: r.Override,
	}
	if !r.Unlimited {
		p.Unit = r.Unit.String()
	}
	if r.OnError != descriptors.OnErrorDefault {
		p.OnError = r.OnError.String()
	}
	return p
}
