package service

import (
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
)

// BucketCheck resolves one descriptor of domain with entries exactly as
// ShouldRateLimit resolves a request of that one descriptor (the same
// bounds, rule, replaces, shadow, split and key), for another protocol that
// counts in the same store keys (package rlqs). It returns the rule that
// counts and its store check, Hits 0; rule is nil when no rule counts (none
// matches, or it is unlimited: then ok reports which). A descriptor beyond
// the request bounds is an error naming the bound.
func (s *Service) BucketCheck(domain string, entries []*rlcommon.RateLimitDescriptor_Entry) (c store.Check, rule *descriptors.Rule, unlimited bool, err error) {
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: entries}}}
	res := s.pool.Get().(*resolution)
	defer s.pool.Put(res)
	res.deadline = time.Time{}
	if err := s.resolve(s.snap.Load().cfg, req, res); err != nil {
		return store.Check{}, nil, false, err
	}
	r := res.rules[0]
	if r != nil && r.Unlimited {
		return store.Check{}, nil, true, nil
	}
	it := res.item(0)
	if it == nil {
		return store.Check{}, nil, false, nil
	}
	c = it.Check
	c.Hits, c.Refund = 0, false
	if r.Global {
		// RLQS grants outlive the share this check was given: a global
		// rule's bucket admits nothing over RLQS (docs/global.md).
		c.Limit = 0
	}
	return c, r, false, nil
}
