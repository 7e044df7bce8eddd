package service

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store"
)

// resolution is a request resolved against a config: per descriptor, the
// rule it matched, the rule that counts once replaces apply, and its
// limiter item. It is reused across calls (see Service.pool).
type resolution struct {
	matched []*descriptors.Rule // per descriptor: the rule it matched; nil for none
	rules   []*descriptors.Rule // per descriptor: the rule counted; nil for none, or replaced
	slot    []int               // per descriptor: its index in items; -1 when not counted
	items   []limiter.Item
	key     []byte
	// outcomes holds, per descriptor, what respond counted (for traces).
	outcomes []Outcome
}

// item returns descriptor i's limiter item, or nil when it is not counted.
func (r *resolution) item(i int) *limiter.Item {
	if r.slot[i] < 0 {
		return nil
	}
	return &r.items[r.slot[i]]
}

// resolve validates req against the request bounds and resolves it against
// cfg: the rule each descriptor matches (a descriptor's limit override
// makes its own rule), the replaces between them, and the store check of
// every counted descriptor (unlimited rules count nothing). It is the one
// path from a request to checks, for ShouldRateLimit and the admin API
// alike. A request that breaks a bound or cannot be decided gives a
// badRequest error.
func (s *Service) resolve(cfg *descriptors.Config, req *rlsv3.RateLimitRequest, res *resolution) error {
	if err := validateRequest(req, &s.opts.Limits); err != nil {
		return badRequest{err}
	}
	res.matched, res.rules = res.matched[:0], res.rules[:0]
	for _, d := range req.Descriptors {
		var r *descriptors.Rule
		if l := d.Limit; l != nil {
			r = cfg.MatchOverride(req.Domain, d.Entries, l.RequestsPerUnit, descriptors.Unit(l.Unit))
		} else {
			r = cfg.Match(req.Domain, d.Entries)
		}
		res.matched = append(res.matched, r)
	}
	res.rules = append(res.rules, res.matched...)
	descriptors.ApplyReplaces(res.rules)

	reqHits := uint64(req.HitsAddend)
	if reqHits == 0 {
		reqHits = 1
	}
	res.items, res.slot = res.items[:0], res.slot[:0]
	for i, d := range req.Descriptors {
		r := res.rules[i]
		if r == nil || r.Unlimited {
			res.slot = append(res.slot, -1)
			continue
		}
		hits := reqHits
		if d.HitsAddend != nil {
			hits = d.HitsAddend.Value
		}
		res.key = descriptors.AppendKey(res.key[:0], req.Domain, d.Entries, r)
		c := ruleCheck(r, string(res.key))
		c.Hits, c.Refund = hits, d.IsNegativeHits
		// The global shadow mode makes every check a shadow. A quota
		// descriptor denies the request only with all the others (the
		// limiter's rule; it refunds what a denied request consumed).
		c.Shadow = c.Shadow || s.opts.ShadowMode
		res.slot = append(res.slot, len(res.items))
		res.items = append(res.items, limiter.Item{Check: c, FailClosed: s.failClosed(r), Quota: s.quotaMode(r)})
	}
	return nil
}

// quotaMode reports whether r is a quota descriptor: it denies a request
// only when every quota descriptor of the request is over its limit
// (envoyproxy/ratelimit's quota_mode and QUOTA_MODE).
func (s *Service) quotaMode(r *descriptors.Rule) bool {
	return (r.QuotaMode || s.opts.QuotaMode) && !r.ShadowMode
}

// failClosed reports whether r denies, rather than falls back to the local
// share, when the store cannot answer.
func (s *Service) failClosed(r *descriptors.Rule) bool {
	return r.OnError == descriptors.OnErrorFailClosed || (r.OnError == descriptors.OnErrorDefault && s.opts.FailClosed)
}

// ruleCheck returns the store check of rule r at key, consuming nothing
// (the caller sets Hits and Refund). It is the one place where a rule
// becomes a store check.
func ruleCheck(r *descriptors.Rule, key string) store.Check {
	return store.Check{
		Key:       key,
		Algorithm: storeAlgorithm(r.Algorithm),
		Limit:     uint64(r.RequestsPerUnit),
		Window:    r.Window(),
		Burst:     uint64(r.Burst),
		Precision: uint8(r.Precision), // at most descriptors.MaxPrecision
		Shadow:    r.ShadowMode,
	}
}

// badRequest marks an error the caller made: InvalidArgument.
type badRequest struct{ error }

func (e badRequest) Unwrap() error { return e.error }

// storeAlgorithm maps a rule's algorithm to the store's.
func storeAlgorithm(a descriptors.Algorithm) store.Algorithm {
	switch a {
	case descriptors.TokenBucket:
		return store.TokenBucket
	case descriptors.FixedWindow:
		return store.FixedWindow
	}
	return store.SlidingWindow
}
