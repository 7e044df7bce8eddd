package descriptors

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"
)

// This file holds the parts of envoyproxy/ratelimit's format that shape what
// rls reports rather than what it counts: value_to_metric, metadata and
// merging one domain across files.

// metricLevel is how value_to_metric names one descriptor level in metrics.
type metricLevel struct {
	key     string
	fixed   string // the configured value or wildcard pattern; "" for key only
	runtime bool   // use the request's value (value_to_metric)
}

// newMetricLevel returns the metric naming of a descriptor with key and
// value (a wildcard pattern when wild), following envoyproxy/ratelimit: an
// exact value is always named; a wildcard is named by its pattern, or by the
// request's value with value_to_metric (share_threshold keeps the pattern);
// a key-only descriptor is named by its key, or with value_to_metric by the
// request's value.
func newMetricLevel(key, value string, wild bool, fl descFlags) metricLevel {
	m := metricLevel{key: key, fixed: value}
	switch {
	case wild && fl.share:
	case wild || value == "":
		m.runtime = fl.valueToMetric
	}
	return m
}

// ValueToMetric reports whether a level of the rule's descriptor path has
// value_to_metric, so its metrics carry request values (MetricValue).
func (r *Rule) ValueToMetric() bool { return r.metric != nil }

// MetricValue renders the entries of a request that matched r as
// envoyproxy/ratelimit's value_to_metric names them: per level "key=value"
// with the request's value where value_to_metric applies, the configured
// value or wildcard pattern elsewhere, or the bare key for a key-only level;
// levels joined by '|'. It is "" when r has no value_to_metric level.
// Bytes that are not UTF-8 are the caller's to escape.
func (r *Rule) MetricValue(entries []*rlcommon.RateLimitDescriptor_Entry) string {
	return r.metricValue(entries, '|', '=')
}

// metricValue is MetricValue with levels joined by sep and each key and
// value by kv.
func (r *Rule) metricValue(entries []*rlcommon.RateLimitDescriptor_Entry, sep, kv byte) string {
	if r.metric == nil {
		return ""
	}
	var b strings.Builder
	for i, m := range r.metric {
		if i > 0 {
			b.WriteByte(sep)
		}
		b.WriteString(m.key)
		v := m.fixed
		if m.runtime && i < len(entries) {
			v = entries[i].GetValue()
		}
		if v != "" {
			b.WriteByte(kv)
			b.WriteString(v)
		}
	}
	return b.String()
}

// SharedValue returns the share_threshold pattern under which level i of a
// request that matched r is counted instead of the request's value
// (envoyproxy/ratelimit's ShareThresholdKeyPattern: every value the
// wildcard matches shares one counter), and whether there is one. Rules
// made from overrides share nothing.
func (r *Rule) SharedValue(i int) (string, bool) {
	if r.Override || i >= len(r.share) || r.share[i] == "" {
		return "", false
	}
	return r.share[i], true
}

// MetricLabel renders the detailed-metric value of a request that matched
// r: for a detailed_metric rule, every entry as "key=value", joined by '|',
// except that a level matched through a share_threshold wildcard is named
// by its pattern ("key=pattern", as envoyproxy/ratelimit's stats key; its
// values share one counter, and so one series); else MetricValue. Bytes
// that are not UTF-8 are the caller's to escape.
func (r *Rule) MetricLabel(entries []*rlcommon.RateLimitDescriptor_Entry) string {
	return r.metricLabel(entries, '|', '=')
}

// StatsName renders what MetricLabel does as envoyproxy/ratelimit's stats
// key names it after the domain: levels joined by '.', each key and value
// by '_', values as they are ('/' and '=' included).
func (r *Rule) StatsName(entries []*rlcommon.RateLimitDescriptor_Entry) string {
	return r.metricLabel(entries, '.', '_')
}

// StatsPath is the rule's place in the YAML as envoyproxy/ratelimit names
// its stats after the domain: per level key_value, or the key alone,
// joined by '.', values as configured ('/' included).
func (r *Rule) StatsPath() string { return r.statsPath }

// metricLabel is MetricLabel with levels joined by sep and each key and
// value by kv.
func (r *Rule) metricLabel(entries []*rlcommon.RateLimitDescriptor_Entry, sep, kv byte) string {
	if !r.DetailedMetric {
		return r.metricValue(entries, sep, kv)
	}
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(sep)
		}
		b.WriteString(e.GetKey())
		b.WriteByte(kv)
		if p, ok := r.SharedValue(i); ok {
			b.WriteString(p)
		} else {
			b.WriteString(e.GetValue())
		}
	}
	return b.String()
}

// metadata parses a descriptor's metadata: any YAML mapping, kept as a
// protobuf Struct (numbers become doubles, as in envoyproxy/ratelimit).
// It returns nil for an empty or null mapping, or after an error.
func (p *parser) metadata(f field) *structpb.Struct {
	v := resolve(f.val)
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return nil
	}
	if v.Kind != yaml.MappingNode {
		p.errorf(v, "metadata", "must be a mapping, got %s", kindName(v))
		return nil
	}
	s := p.metaStruct(v, 0)
	if s == nil || len(s.Fields) == 0 {
		return nil
	}
	if n := proto.Size(s); n > MaxMetadataBytes {
		p.errorf(f.key, "metadata", "%d bytes (encoded, as the response's dynamic metadata carries it), over the limit of %d per descriptor", n, MaxMetadataBytes)
		return nil
	}
	return s
}

// MaxMetadataBytes bounds one descriptor's metadata, encoded: a response
// carries the metadata of every passing descriptor of its request
// (--response-metadata), so without a bound a few bytes of request could
// fetch megabytes of response.
const MaxMetadataBytes = 4096

// maxMetaDepth bounds the nesting of metadata values.
const maxMetaDepth = 32

func (p *parser) metaStruct(n *yaml.Node, depth int) *structpb.Struct {
	s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(n.Content)/2)}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := resolve(n.Content[i])
		if k.Kind != yaml.ScalarNode {
			p.errorf(k, "metadata", "field names must be scalars, got %s", kindName(k))
			continue
		}
		if _, dup := s.Fields[k.Value]; dup {
			p.errorf(k, "metadata", "duplicate field %q", k.Value)
			continue
		}
		v := p.metaValue(n.Content[i+1], depth+1)
		if v == nil {
			return nil
		}
		s.Fields[k.Value] = v
	}
	return s
}

// metaValue converts one metadata YAML value; nil after an error that ends
// the conversion (too deep, or too many nodes).
func (p *parser) metaValue(n *yaml.Node, depth int) *structpb.Value {
	if p.spend() {
		return nil
	}
	n = resolve(n)
	if depth > maxMetaDepth {
		p.errorf(n, "metadata", "nested deeper than %d levels", maxMetaDepth)
		return nil
	}
	switch n.Kind {
	case yaml.MappingNode:
		s := p.metaStruct(n, depth)
		if s == nil {
			return nil
		}
		return structpb.NewStructValue(s)
	case yaml.SequenceNode:
		l := &structpb.ListValue{Values: make([]*structpb.Value, 0, len(n.Content))}
		for _, c := range n.Content {
			v := p.metaValue(c, depth+1)
			if v == nil {
				return nil
			}
			l.Values = append(l.Values, v)
		}
		return structpb.NewListValue(l)
	}
	switch n.Tag {
	case "!!null":
		return structpb.NewNullValue()
	case "!!bool":
		var b bool
		if n.Decode(&b) == nil {
			return structpb.NewBoolValue(b)
		}
	case "!!int", "!!float":
		var f float64
		if n.Decode(&f) == nil {
			return structpb.NewNumberValue(f)
		}
		if x, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64); err == nil {
			return structpb.NewNumberValue(float64(x))
		}
	}
	return structpb.NewStringValue(n.Value)
}

// merge adds the top-level descriptors of other, a further file's for the
// same domain (--merge-domains), to lv. A descriptor whose key and value lv
// already has is an error naming both places.
func (lv *level) merge(other *level, p *parser) {
	for _, key := range sortedGroupKeys(other.byKey) {
		og := other.byKey[key]
		g := lv.byKey[key]
		if g == nil {
			lv.byKey[key] = og
			continue
		}
		dup := func(n, first *node, what string) {
			p.errs.add(n.file, n.line, "key", fmt.Sprintf("duplicate top-level descriptor %s in a merged domain (first at %s:%d)", what, first.file, first.line))
		}
		if og.def != nil {
			if g.def != nil {
				dup(og.def, g.def, "key "+strconv.Quote(key))
			} else {
				g.def = og.def
			}
		}
		for v, n := range og.exact {
			if first := g.exact[v]; first != nil {
				dup(n, first, "key "+strconv.Quote(key)+" with value "+strconv.Quote(v))
				continue
			}
			if g.exact == nil {
				g.exact = make(map[string]*node)
			}
			g.exact[v] = n
		}
	wild:
		for _, n := range og.wild {
			for _, first := range g.wild {
				if first.glob.pattern() == n.glob.pattern() {
					dup(n, first, "key "+strconv.Quote(key)+" with value "+strconv.Quote(n.glob.pattern()))
					continue wild
				}
			}
			g.wild = append(g.wild, n)
		}
	}
}

func sortedGroupKeys(m map[string]*group) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
