package descriptors

import (
	"sort"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// BucketEntries maps an RLQS BucketId (an unordered map of keys to values)
// of domain to the ordered entries of a rate-limit descriptor, by one rule:
// at each level of the domain's descriptor tree, starting at the top, the
// BucketId entry whose key is a key of that level is the next entry; when
// several BucketId keys are keys of one level, the smallest in byte order
// is taken. The walk ends at a level no BucketId key belongs to, or when
// the descriptor its entry matched has no children. Keys of the BucketId
// that the walk never reaches are ignored. It returns nil for an unknown
// domain or when no top-level key is in the BucketId; the entries are then
// decided as ShouldRateLimit decides a descriptor with these entries
// (Match).
func (c *Config) BucketEntries(domain string, bucket map[string]string) []*rlcommon.RateLimitDescriptor_Entry {
	if c == nil {
		return nil
	}
	lv := c.domains[domain]
	keys := make([]string, 0, len(bucket))
	for k := range bucket {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []*rlcommon.RateLimitDescriptor_Entry
	for lv != nil && len(out) < len(keys) {
		var n *node
		for _, k := range keys {
			g := lv.byKey[k]
			if g == nil {
				continue
			}
			n = g.find(bucket[k])
			out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: bucket[k]})
			break
		}
		if n == nil {
			break
		}
		lv = n.children
	}
	return out
}
