package descriptors

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"
)

// DomainSpec is one domain's configuration decoded from something other
// than a YAML file, such as an xDS RateLimitConfig resource: the fields of a
// descriptor YAML file as values. ParseSpecs validates specs with exactly
// the rules of the YAML (it hands the parser the YAML node tree the spec
// stands for), so a spec and the file it could have been load alike.
type DomainSpec struct {
	// Name names the spec where a file name would appear: in errors
	// ("xds:<resource>: descriptors[0].key: ..."), Rule.File and the hash.
	// Names must be unique among the specs of one ParseSpecs call.
	Name        string
	Domain      string
	Descriptors []DescriptorSpec
}

// DescriptorSpec is one descriptor: key, value (empty: key only), its
// rate_limit (nil: none), its flags and nested descriptors.
type DescriptorSpec struct {
	Key, Value     string
	RateLimit      *RateLimitSpec
	ShadowMode     bool
	DetailedMetric bool
	QuotaMode      bool
	Metadata       *structpb.Struct // nil or empty: none
	Descriptors    []DescriptorSpec
}

// RateLimitSpec is a descriptor's rate_limit. An empty Unit is absent (an
// error unless Unlimited); RequestsPerUnit is absent only when it is 0 on
// an Unlimited rule (a protobuf cannot tell 0 from absent).
type RateLimitSpec struct {
	Unit            string
	RequestsPerUnit uint32
	Unlimited       bool
	Name            string
	Replaces        []string // the names of the replaces list's entries
}

// ParseSpecs builds a Config from specs as Parse builds one from files:
// same validation, same errors, merged domains with opts.MergeDomains. Its
// errors name the spec and the field path instead of a line:
// "xds:ratelimit: descriptors[2].rate_limit.unit: invalid unit ...".
// The hash covers the specs' names and contents. Rules have Line 0.
// Besides the parser's own, it holds about 24 bytes per node of the tree
// (a field path is kept as its last segment and its parent's place).
func ParseSpecs(specs []DomainSpec, opts ParseOptions) (*Config, error) {
	b := &specBuilder{lines: []int32{0}, paths: []specPath{{parent: -1}}} // line 0: no place
	srcs := make([]source, 0, len(specs))
	seen := make(map[string]bool, len(specs))
	var dups Errors
	for _, s := range specs {
		if seen[s.Name] {
			dups.add(s.Name, 0, "", "a second resource with this name")
			continue
		}
		seen[s.Name] = true
		top := b.domain(s)
		srcs = append(srcs, source{name: s.Name, data: digest(top), top: top})
	}
	if len(dups) > 0 {
		return nil, dups
	}
	cfg, err := parse(srcs, opts)
	if err != nil {
		if list, ok := err.(Errors); ok {
			for _, e := range list {
				b.locate(e)
			}
		}
		return nil, err
	}
	for _, r := range cfg.rules {
		r.Line = 0
	}
	return cfg, nil
}

// digest is the hash of a node tree: what the hash of a config covers for
// a spec, in place of a file's text.
func digest(n *yaml.Node) []byte {
	h := sha256.New()
	var walk func(n *yaml.Node)
	var num [binary.MaxVarintLen64]byte
	put := func(s string) {
		h.Write(num[:binary.PutUvarint(num[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	walk = func(n *yaml.Node) {
		h.Write(num[:binary.PutUvarint(num[:], uint64(n.Kind))])
		put(n.Tag)
		put(n.Value)
		h.Write(num[:binary.PutUvarint(num[:], uint64(len(n.Content)))])
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(n)
	return h.Sum(nil)
}

// specPath is a place in a spec's tree: its parent's place and its last
// segment, a field (".key", `["a b"]`) or, when seg is empty, an index.
// A spec's root has parent -1 and its name as seg.
type specPath struct {
	parent, index int32
	seg           string
}

// specBuilder turns specs into YAML node trees. Every node gets a line of
// its own, an index into lines, which holds its place, so the parser's
// errors, which name a node by its line, can be turned back into a field
// path.
type specBuilder struct {
	lines []int32 // line -> index into paths
	paths []specPath
	root  int32 // of the spec being built
}

// at returns the place seg (a field with its separator) under parent.
func (b *specBuilder) at(parent int32, seg string) int32 {
	b.paths = append(b.paths, specPath{parent: parent, seg: seg})
	return int32(len(b.paths) - 1)
}

// item returns the place of element i of the list at parent.
func (b *specBuilder) item(parent int32, i int) int32 {
	b.paths = append(b.paths, specPath{parent: parent, index: int32(i)})
	return int32(len(b.paths) - 1)
}

// path renders place p: "descriptors[0].rate_limit.unit".
func (b *specBuilder) path(p int32) string {
	var segs []specPath
	for ; p >= 0 && b.paths[p].parent >= 0; p = b.paths[p].parent {
		segs = append(segs, b.paths[p])
	}
	var out strings.Builder
	for i := len(segs) - 1; i >= 0; i-- {
		if s := segs[i]; s.seg != "" {
			out.WriteString(s.seg)
		} else {
			out.WriteByte('[')
			out.WriteString(strconv.Itoa(int(s.index)))
			out.WriteByte(']')
		}
	}
	return strings.TrimPrefix(out.String(), ".")
}

// specOf returns the name of the spec place p belongs to.
func (b *specBuilder) specOf(p int32) string {
	for b.paths[p].parent >= 0 {
		p = b.paths[p].parent
	}
	return b.paths[p].seg
}

// node returns a new node of kind with tag and value, placed at p.
func (b *specBuilder) node(kind yaml.Kind, tag, value string, p int32) *yaml.Node {
	b.lines = append(b.lines, p)
	return &yaml.Node{Kind: kind, Tag: tag, Value: value, Line: len(b.lines) - 1, Column: 1}
}

func (b *specBuilder) mapping(p int32) *yaml.Node {
	return b.node(yaml.MappingNode, "!!map", "", p)
}

func (b *specBuilder) seq(p int32) *yaml.Node {
	return b.node(yaml.SequenceNode, "!!seq", "", p)
}

// field appends the field name: val to the mapping m.
func (b *specBuilder) field(m *yaml.Node, name string, p int32, val *yaml.Node) {
	m.Content = append(m.Content, b.node(yaml.ScalarNode, "!!str", name, p), val)
}

// str appends the field name: v at a new place under parent.
func (b *specBuilder) str(m *yaml.Node, name string, parent int32, v string) {
	p := b.at(parent, "."+name)
	b.field(m, name, p, b.node(yaml.ScalarNode, "!!str", v, p))
}

// flag appends a boolean field when it is true (false is the default).
func (b *specBuilder) flag(m *yaml.Node, name string, parent int32, v bool) {
	if v {
		p := b.at(parent, "."+name)
		b.field(m, name, p, b.node(yaml.ScalarNode, "!!bool", "true", p))
	}
}

func (b *specBuilder) domain(s DomainSpec) *yaml.Node {
	b.root = b.at(-1, s.Name)
	top := b.mapping(b.root)
	b.str(top, "domain", b.root, s.Domain)
	p := b.at(b.root, ".descriptors")
	b.field(top, "descriptors", p, b.descriptors(s.Descriptors, p))
	return top
}

func (b *specBuilder) descriptors(ds []DescriptorSpec, p int32) *yaml.Node {
	seq := b.seq(p)
	for i, d := range ds {
		seq.Content = append(seq.Content, b.descriptor(d, b.item(p, i)))
	}
	return seq
}

func (b *specBuilder) descriptor(d DescriptorSpec, p int32) *yaml.Node {
	m := b.mapping(p)
	b.str(m, "key", p, d.Key)
	if d.Value != "" {
		b.str(m, "value", p, d.Value)
	}
	if d.RateLimit != nil {
		rp := b.at(p, ".rate_limit")
		b.field(m, "rate_limit", rp, b.rateLimit(d.RateLimit, rp))
	}
	b.flag(m, "shadow_mode", p, d.ShadowMode)
	b.flag(m, "detailed_metric", p, d.DetailedMetric)
	b.flag(m, "quota_mode", p, d.QuotaMode)
	if len(d.Metadata.GetFields()) > 0 {
		mp := b.at(p, ".metadata")
		b.field(m, "metadata", mp, b.metaStruct(d.Metadata, mp))
	}
	if len(d.Descriptors) > 0 {
		dp := b.at(p, ".descriptors")
		b.field(m, "descriptors", dp, b.descriptors(d.Descriptors, dp))
	}
	return m
}

func (b *specBuilder) rateLimit(r *RateLimitSpec, p int32) *yaml.Node {
	m := b.mapping(p)
	if r.Unit != "" {
		b.str(m, "unit", p, r.Unit)
	}
	if !r.Unlimited || r.RequestsPerUnit != 0 {
		rp := b.at(p, ".requests_per_unit")
		b.field(m, "requests_per_unit", rp,
			b.node(yaml.ScalarNode, "!!int", strconv.FormatUint(uint64(r.RequestsPerUnit), 10), rp))
	}
	b.flag(m, "unlimited", p, r.Unlimited)
	if r.Name != "" {
		b.str(m, "name", p, r.Name)
	}
	if len(r.Replaces) > 0 {
		sp := b.at(p, ".replaces")
		seq := b.seq(sp)
		for i, name := range r.Replaces {
			ip := b.item(sp, i)
			item := b.mapping(ip)
			b.str(item, "name", ip, name)
			seq.Content = append(seq.Content, item)
		}
		b.field(m, "replaces", sp, seq)
	}
	return m
}

// metaStruct converts metadata, fields in name order (the hash must not
// depend on a map's order).
func (b *specBuilder) metaStruct(s *structpb.Struct, p int32) *yaml.Node {
	m := b.mapping(p)
	names := make([]string, 0, len(s.GetFields()))
	for k := range s.GetFields() {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fp := b.at(p, metaSegment(k))
		b.field(m, k, fp, b.metaValue(s.GetFields()[k], fp))
	}
	return m
}

func (b *specBuilder) metaValue(v *structpb.Value, p int32) *yaml.Node {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		return b.metaStruct(k.StructValue, p)
	case *structpb.Value_ListValue:
		seq := b.seq(p)
		for i, e := range k.ListValue.GetValues() {
			seq.Content = append(seq.Content, b.metaValue(e, b.item(p, i)))
		}
		return seq
	case *structpb.Value_BoolValue:
		return b.node(yaml.ScalarNode, "!!bool", strconv.FormatBool(k.BoolValue), p)
	case *structpb.Value_NumberValue:
		return b.node(yaml.ScalarNode, "!!float", yamlFloat(k.NumberValue), p)
	case *structpb.Value_StringValue:
		return b.node(yaml.ScalarNode, "!!str", k.StringValue, p)
	}
	return b.node(yaml.ScalarNode, "!!null", "null", p) // null, or no kind
}

// yamlFloat writes f as a YAML float.
func yamlFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return ".nan"
	case math.IsInf(f, 1):
		return ".inf"
	case math.IsInf(f, -1):
		return "-.inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

var plainSegment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// metaSegment is the path segment of a metadata field: .name, or ["name"]
// when name is not a plain word.
func metaSegment(name string) string {
	if plainSegment.MatchString(name) {
		return "." + name
	}
	return "[" + strconv.Quote(name) + "]"
}

// lineRef finds the parser's references to other nodes in a message: "line
// N" and "FILE:N".
var lineRef = regexp.MustCompile(`line (\d+)|:(\d+)\b`)

// locate turns an error of the parser about a spec's node back into the
// spec's field path: the Field becomes the path (with the parser's field
// name when the path does not hold it already), the Line 0, and the lines
// the message refers to become paths too.
func (b *specBuilder) locate(e *ConfigError) {
	if e.Line > 0 && e.Line < len(b.lines) {
		e.Field = joinField(b.path(b.lines[e.Line]), e.Field)
	}
	e.Line = 0
	idx := lineRef.FindAllStringSubmatchIndex(e.Msg, -1)
	if idx == nil {
		return
	}
	var out strings.Builder
	last := 0
	for _, m := range idx {
		lineNo, isFile := m[2:4], false
		if m[2] < 0 {
			lineNo, isFile = m[4:6], true
		}
		n, err := strconv.Atoi(e.Msg[lineNo[0]:lineNo[1]])
		if err != nil || n <= 0 || n >= len(b.lines) {
			continue
		}
		at := b.lines[n]
		if isFile && !strings.HasSuffix(e.Msg[:m[0]], b.specOf(at)) {
			continue // a number after some other colon
		}
		out.WriteString(e.Msg[last:m[0]])
		if isFile {
			out.WriteString(": ") // "xds:foo:12" becomes "xds:foo: descriptors[0]"
		}
		out.WriteString(joinField(b.path(at), ""))
		last = m[1]
	}
	out.WriteString(e.Msg[last:])
	e.Msg = out.String()
}

// joinField names a node at path whose field the parser calls field:
// path itself when one of its segments is field already
// ("descriptors[0].rate_limit.unit", "unit"), else path.field.
func joinField(path, field string) string {
	switch {
	case path == "":
		return field
	case field == "":
		return path
	}
	for _, seg := range strings.Split(path, ".") {
		if i := strings.IndexByte(seg, '['); i >= 0 {
			seg = seg[:i]
		}
		if seg == field {
			return path
		}
	}
	return path + "." + field
}
