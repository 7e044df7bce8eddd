package service

import (
	"context"
	"fmt"
	"strings"
	"time"

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
	lim LocalState
}

// LocalState is the limiter's local state the admin API reads and clears
// (pkg/limiter's Limiter): the over-limit cache's denial of a check, and every
// local table's entries of keys.
type LocalState interface {
	CachedDenial(c *store.Check) (time.Duration, bool)
	Forget(keys ...string)
}

// NewAdmin returns the admin API of svc, reading counters from st.
func NewAdmin(svc *Service, st store.Store, lim LocalState) *Admin {
	return &Admin{svc: svc, st: st, lim: lim}
}

// resolve resolves an admin request exactly as ShouldRateLimit resolves the
// same request (bounds, overrides, replaces, keys), checking without
// consuming.
func (a *Admin) resolve(domain string, ds []*adminv1.Descriptor) (*rlsv3.RateLimitRequest, *resolution, error) {
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: make([]*rlcommon.RateLimitDescriptor, len(ds))}
	for i, d := range ds {
		rd := &rlcommon.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(0)}
		for _, e := range d.GetEntries() {
			rd.Entries = append(rd.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		if l := d.GetLimit(); l != nil {
			u, ok := typev3.RateLimitUnit_value[strings.ToUpper(l.Unit)]
			if !ok || u == 0 {
				return nil, nil, a.svc.toStatus(badRequest{fmt.Errorf("descriptors[%d].limit.unit %q is invalid; choices are [SECOND MINUTE HOUR DAY MONTH YEAR]", i, l.Unit)})
			}
			rd.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: l.RequestsPerUnit, Unit: typev3.RateLimitUnit(u)}
		}
		req.Descriptors[i] = rd
	}
	res := new(resolution)
	if err := a.svc.resolve(a.svc.Config(), req, res); err != nil {
		return nil, nil, a.svc.toStatus(err)
	}
	return req, res, nil
}

// subChecks returns the checks of every sub-key of descriptor i of req,
// counted as res.item(i): one for a rule without split (the item's own),
// else one per sub-key in sub-key order.
func subChecks(req *rlsv3.RateLimitRequest, res *resolution, i int) []store.Check {
	it, r := res.item(i), res.rules[i]
	n := r.Splits()
	if n <= 1 {
		return []store.Check{it.Check}
	}
	out := make([]store.Check, n)
	d := req.Descriptors[i]
	for sub := range n {
		c := ruleCheck(r, string(descriptors.AppendSubKey(nil, req.Domain, d.Entries, r, sub)), sub)
		c.Hits, c.Refund, c.Shadow = it.Check.Hits, it.Check.Refund, it.Check.Shadow
		out[sub] = c
	}
	return out
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

// Explain implements AdminService.Explain. A split rule's counter is read
// on every sub-key: remaining is their sum (exact, unlike ShouldRateLimit's
// estimate), it is over limit when every sub-key is, and the note says how
// many are. The key shown is sub-key 0's.
func (a *Admin) Explain(ctx context.Context, req *adminv1.ExplainRequest) (*adminv1.ExplainResponse, error) {
	rreq, res, err := a.resolve(req.Domain, req.Descriptors)
	if err != nil {
		return nil, err
	}
	var checks []store.Check
	first := make([]int, len(req.Descriptors)+1) // descriptor i's checks are checks[first[i]:first[i+1]]
	for i := range req.Descriptors {
		first[i] = len(checks)
		if res.index[i] >= 0 {
			checks = append(checks, subChecks(rreq, res, i)...)
		}
	}
	first[len(req.Descriptors)] = len(checks)
	results := make([]store.Result, len(checks))
	if len(checks) > 0 {
		if err := a.st.Peek(ctx, checks, results); err != nil {
			return nil, a.svc.toStatus(fmt.Errorf("read counters: %w", err))
		}
	}
	resp := &adminv1.ExplainResponse{Explanations: make([]*adminv1.Explanation, len(req.Descriptors))}
	for i := range req.Descriptors {
		e := &adminv1.Explanation{Matched: res.matched[i] != nil, Note: res.note(i), Rule: ruleProto(res.matched[i])}
		resp.Explanations[i] = e
		if res.index[i] < 0 {
			continue
		}
		lo, hi := first[i], first[i+1]
		e.Key = printable(checks[lo].Key) // keys are UTF-8 (AppendKey escapes); a proto string must be
		e.State = &adminv1.CounterState{Source: limiter.FromStore.String()}
		over := 0
		var retry time.Duration
		for j := lo; j < hi; j++ {
			r := results[j]
			if d, ok := a.lim.CachedDenial(&checks[j]); ok {
				r.Allowed, r.Remaining, r.RetryAfter = false, 0, d
				e.State.Source = limiter.FromCache.String()
			}
			e.State.Remaining += r.Remaining
			e.State.UntilReset = durationpb.New(max(e.State.UntilReset.AsDuration(), r.Reset))
			if !r.Allowed {
				if over == 0 || r.RetryAfter < retry {
					retry = r.RetryAfter
				}
				over++
			}
		}
		if n := hi - lo; n > 1 {
			e.Note = fmt.Sprintf("split: each request counts on one of %d sub-keys in turn (key: sub-key 0); remaining is their sum; %d of %d over their share", n, over, n)
		}
		if over == hi-lo {
			e.State.OverLimit = true
			e.State.RetryAfter = durationpb.New(retry)
		}
		a.svc.shareNote(e, res.rules[i], checks[lo].Key) // scope: global (global.go)
	}
	return resp, nil
}

// ResetCounters implements AdminService.ResetCounters: every sub-key of a
// split rule's counter is deleted.
func (a *Admin) ResetCounters(ctx context.Context, req *adminv1.ResetCountersRequest) (*adminv1.ResetCountersResponse, error) {
	rreq, res, err := a.resolve(req.Domain, req.Descriptors)
	if err != nil {
		return nil, err
	}
	var keys []string
	var checks []store.Check
	for i := range req.Descriptors {
		if res.index[i] < 0 {
			continue
		}
		for _, c := range subChecks(rreq, res, i) {
			keys, checks = append(keys, c.Key), append(checks, c)
		}
	}
	if len(keys) == 0 {
		return &adminv1.ResetCountersResponse{}, nil
	}
	if err := a.st.Delete(ctx, checks...); err != nil {
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
