package service

import (
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

// upstreamKeyed reports whether rule r counts in upstream's key.
func (s *Service) upstreamKeyed(r *descriptors.Rule) bool {
	return s.opts.UpstreamKeys && UpstreamKeyed(r)
}

// appendUpstreamKey appends upstream's cache key (src/limiter/cache_key.go)
// but its window start, which the store appends: domain "_", then key "_"
// value "_" per entry, where a level r matched through a share_threshold
// wildcard has the wildcard's pattern instead of the value (so every value
// it matches shares one counter, as upstream's). The caller has appended
// the prefix.
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
