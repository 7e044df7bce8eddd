package descriptors

import (
	"fmt"
	"sort"
	"strings"

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

// BucketUnreachable returns, for every descriptor of domain that has a
// rule and that no BucketId reaches by BucketEntries' walk, where it is
// and why, in file order: "file:line: rule k1 > k2: why". A BucketId holds
// one value per key, and at each level the walk takes the smallest of its
// keys that belong to the level, so a rule is unreachable when its path
// names one key twice, or when a key of its path sorts after another key
// of the same level that the path also needs elsewhere. ShouldRateLimit
// reaches such rules as before; only RLQS buckets cannot.
func (c *Config) BucketUnreachable(domain string) []string {
	if c == nil || c.domains[domain] == nil {
		return nil
	}
	type found struct {
		file string
		line int
		msg  string
	}
	var out []found
	var path []string
	var levels []*level
	var walk func(lv *level)
	walk = func(lv *level) {
		keys := make([]string, 0, len(lv.byKey))
		for k := range lv.byKey {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			g := lv.byKey[k]
			path, levels = append(path, k), append(levels, lv)
			for _, n := range g.nodes() {
				if n.rule != nil {
					if why := bucketBlocked(path, levels); why != "" {
						out = append(out, found{n.file, n.line, fmt.Sprintf("%s:%d: rule %s: %s", n.file, n.line, strings.Join(path, " > "), why)})
					}
				}
				if n.children != nil {
					walk(n.children)
				}
			}
			path, levels = path[:len(path)-1], levels[:len(levels)-1]
		}
	}
	walk(c.domains[domain])
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].file != out[j].file {
			return out[i].file < out[j].file
		}
		return out[i].line < out[j].line
	})
	msgs := make([]string, len(out))
	for i, f := range out {
		msgs[i] = f.msg
	}
	return msgs
}

// bucketBlocked says why no BucketId reaches the descriptor at path (its
// keys, top first), levels[i] being the level path[i] belongs to; "" when
// one does.
func bucketBlocked(path []string, levels []*level) string {
	for i, k := range path {
		for j := range i {
			if path[j] == k {
				return fmt.Sprintf("no RLQS BucketId reaches it: key %q is on its path twice, and a BucketId holds one value per key", k)
			}
		}
	}
	for i, k := range path {
		for j, other := range path {
			if j != i && other < k && levels[i].byKey[other] != nil {
				return fmt.Sprintf("no RLQS BucketId reaches it: at the level of %q, the walk takes %q first (also a key of that level, and needed elsewhere on the path)", k, other)
			}
		}
	}
	return ""
}

// nodes returns the group's descriptors: exact values, wildcards, then the
// key-only default.
func (g *group) nodes() []*node {
	var ns []*node
	vals := make([]string, 0, len(g.exact))
	for v := range g.exact {
		vals = append(vals, v)
	}
	sort.Strings(vals)
	for _, v := range vals {
		ns = append(ns, g.exact[v])
	}
	ns = append(ns, g.wild...)
	if g.def != nil {
		ns = append(ns, g.def)
	}
	return ns
}
