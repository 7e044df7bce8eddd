package service

import (
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
)

// upstreamKeyed reports whether rule r counts in envoyproxy/ratelimit's key
// with Options.UpstreamKeys: a fixed window of one unit, not split, as
// upstream counts every rule.
func (s *Service) upstreamKeyed(r *descriptors.Rule) bool {
	return s.opts.UpstreamKeys && r.Algorithm == store.FixedWindow && r.Splits() <= 1 && r.UnitMultiplier <= 1
}

// appendUpstreamKey appends upstream's cache key (src/limiter/cache_key.go)
// but its window start, which the store appends: domain "_", then key "_"
// value "_" per entry. The caller has appended the prefix.
func appendUpstreamKey(dst []byte, domain string, entries []*rlcommon.RateLimitDescriptor_Entry) []byte {
	dst = append(append(dst, domain...), '_')
	for _, e := range entries {
		dst = append(append(dst, e.GetKey()...), '_')
		dst = append(append(dst, e.GetValue()...), '_')
	}
	return dst
}
