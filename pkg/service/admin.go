package service

import (
	"context"
	"fmt"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store"
	adminv1 "github.com/rls-project/rls/proto/rls/admin/v1"
)

// Admin implements rls.admin.v1.AdminService on a Service's config, the
// store and the limiter's local state.
type Admin struct {
	adminv1.UnimplementedAdminServiceServer
	svc *Service
	st  store.Store
	lim *limiter.Limiter
}

// NewAdmin returns the admin API of svc.
func NewAdmin(svc *Service, st store.Store, lim *limiter.Limiter) *Admin {
	return &Admin{svc: svc, st: st, lim: lim}
}

// resolve resolves an admin request exactly as ShouldRateLimit resolves the
// same request (bounds, overrides, replaces, keys), checking without
// consuming.
func (a *Admin) resolve(domain string, ds []*adminv1.Descriptor) (*resolution, error) {
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: make([]*rlcommon.RateLimitDescriptor, len(ds))}
	for i, d := range ds {
		rd := &rlcommon.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(0)}
		for _, e := range d.GetEntries() {
			rd.Entries = append(rd.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		if l := d.GetLimit(); l != nil {
			u, ok := typev3.RateLimitUnit_value[strings.ToUpper(l.Unit)]
			if !ok || u == 0 {
				return nil, a.svc.toStatus(badRequest{fmt.Errorf("descriptors[%d].limit.unit %q is invalid; choices are [SECOND MINUTE HOUR DAY MONTH YEAR]", i, l.Unit)})
			}
			rd.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: l.RequestsPerUnit, Unit: typev3.RateLimitUnit(u)}
		}
		req.Descriptors[i] = rd
	}
	res := new(resolution)
	if err := a.svc.resolve(a.svc.Config(), req, res); err != nil {
		return nil, a.svc.toStatus(err)
	}
	return res, nil
}

// note says why descriptor i of res is not counted ("" when it is).
func (res *resolution) note(i int) string {
	switch {
	case res.matched[i] == nil:
		return "no rule matches: always OK"
	case res.rules[i] == nil:
		return "replaced by another limit of this request: not counted"
	case res.matched[i].Unlimited:
		return "unlimited: always OK, not counted"
	}
	return ""
}

// Explain implements AdminService.Explain.
func (a *Admin) Explain(ctx context.Context, req *adminv1.ExplainRequest) (*adminv1.ExplainResponse, error) {
	res, err := a.resolve(req.Domain, req.Descriptors)
	if err != nil {
		return nil, err
	}
	checks := make([]store.Check, len(res.items))
	results := make([]store.Result, len(res.items))
	for j := range res.items {
		checks[j] = res.items[j].Check
	}
	if len(checks) > 0 {
		if err := a.st.Peek(ctx, checks, results); err != nil {
			return nil, a.svc.toStatus(fmt.Errorf("read counters: %w", err))
		}
	}
	resp := &adminv1.ExplainResponse{Explanations: make([]*adminv1.Explanation, len(req.Descriptors))}
	for i := range req.Descriptors {
		e := &adminv1.Explanation{Matched: res.matched[i] != nil, Note: res.note(i), Rule: ruleProto(res.matched[i])}
		resp.Explanations[i] = e
		j := res.slot[i]
		if j < 0 {
			continue
		}
		r := results[j]
		e.Key = printable(checks[j].Key) // keys are UTF-8 (AppendKey escapes); a proto string must be
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
	res, err := a.resolve(req.Domain, req.Descriptors)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(res.items))
	for j := range res.items {
		keys = append(keys, res.items[j].Check.Key)
	}
	if len(keys) == 0 {
		return &adminv1.ResetCountersResponse{}, nil
	}
	if err := a.st.Delete(ctx, keys...); err != nil {
		return nil, a.svc.toStatus(fmt.Errorf("delete counters: %w", err))
	}
	a.lim.Forget(keys...)
	for i, k := range keys {
		keys[i] = printable(k) // keys are UTF-8 (AppendKey escapes); a proto string must be
	}
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
