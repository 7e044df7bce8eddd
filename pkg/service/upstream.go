package service

import (
	"fmt"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
)

// UpstreamKeyed reports whether rule r can count in envoyproxy/ratelimit's
// key (Options.UpstreamKeys): a fixed window of one unit, not split, as
// upstream counts every rule.
func UpstreamKeyed(r *descriptors.Rule) bool {
	return r.Algorithm == store.FixedWindow && r.Splits() <= 1 && r.UnitMultiplier <= 1
}

// CheckUpstreamKeyed refuses cfg when one of its limited rules cannot count
// in upstream's keys (UpstreamKeyed), as behind proxy ("twemproxy at
// ADDR"), which proxies no script. The error is one line naming the first
// such rule (file:line, domain, descriptor), why, and how many others
// there are.
func CheckUpstreamKeyed(cfg *descriptors.Config, proxy string) error {
	var bad []*descriptors.Rule
	for _, r := range cfg.Rules() {
		if !r.Unlimited && !UpstreamKeyed(r) {
			bad = append(bad, r)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	r := bad[0]
	why := "a " + r.Algorithm.String()
	switch {
	case r.Splits() > 1:
		why = fmt.Sprintf("a rule split over %d keys", r.Splits())
	case r.UnitMultiplier > 1:
		why = fmt.Sprintf("a window of %d units", r.UnitMultiplier)
	}
	where := r.File
	if r.Line > 0 {
		where = fmt.Sprintf("%s:%d", r.File, r.Line)
	}
	more := ""
	if len(bad) > 1 {
		more = fmt.Sprintf(" (and %d more rules like it)", len(bad)-1)
	}
	return fmt.Errorf("%s cannot count rule %s (domain %q, %s)%s: %s needs Redis scripts, which twemproxy does not proxy; "+
		"behind twemproxy rls counts only fixed windows of one unit, as envoyproxy/ratelimit does (algorithm: fixed_window)",
		proxy, where, r.Domain, r.Path, more, why)
}

// upstreamKeyed reports whether rule r counts in upstream's key.
func (s *Service) upstreamKeyed(r *descriptors.Rule) bool {
	return s.opts.UpstreamKeys && UpstreamKeyed(r)
}

// appendUpstreamKey appends upstream's cache key (src/limiter/cache_key.go)
// after the prefix the caller appended, without the window start the store
// appends: domain "_", then key "_" value "_" per entry. A level r matched
// through a share_threshold wildcard has the pattern for the value, so
// every value it matches shares one counter, as upstream's.
func appendUpstreamKey(dst []byte, domain string, entries []*rlcommon.RateLimitDescriptor_Entry, r *descriptors.Rule) []byte {
	dst = append(append(dst, domain...), '_')
	for i, e := range entries {
		dst = append(append(dst, e.GetKey()...), '_')
		if p, ok := r.SharedValue(i); ok {
			dst = append(append(dst, p...), '_')
			continue
		}
		dst = append(append(dst, e.GetValue()...), '_')
	}
	return dst
}
