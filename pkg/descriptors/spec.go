package descriptors

import (
	"fmt"
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

// ParseSpecs builds a Config from specs as ParseWith builds one from files:
// same validation, same errors, merged domains with opts.MergeDomains. Its
// errors name the spec and the field path instead of a line:
// "xds:ratelimit: descriptors[2].rate_limit.unit: invalid unit ...".
// The hash covers the specs' names and contents. Rules have Line 0.
func ParseSpecs(specs []DomainSpec, opts ParseOptions) (*Config, error) {
	b := &specBuilder{paths: []specPath{{}}} // line 0: no place
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
		data, err := yaml.Marshal(top)
		if err != nil { // cannot happen for the node kinds built here
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		srcs = append(srcs, source{name: s.Name, data: data, top: top})
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

// specPath is where a node of a spec's tree came from.
type specPath struct {
	name, path string
}

// specBuilder turns specs into YAML node trees. Every node gets a line of
// its own, an index into paths, so the parser's errors, which name a node
// by its line, can be turned back into a field path.
type specBuilder struct {
	paths []specPath
	name  string // of the spec being built
}

// node returns a new node of kind with tag and value, placed at path.
func (b *specBuilder) node(kind yaml.Kind, tag, value, path string) *yaml.Node {
	b.paths = append(b.paths, specPath{name: b.name, path: path})
	return &yaml.Node{Kind: kind, Tag: tag, Value: value, Line: len(b.paths) - 1, Column: 1}
}

func (b *specBuilder) mapping(path string) *yaml.Node {
	return b.node(yaml.MappingNode, "!!map", "", path)
}

func (b *specBuilder) seq(path string) *yaml.Node {
	return b.node(yaml.SequenceNode, "!!seq", "", path)
}

// field appends the field name: val to the mapping m.
func (b *specBuilder) field(m *yaml.Node, name, path string, val *yaml.Node) {
	m.Content = append(m.Content, b.node(yaml.ScalarNode, "!!str", name, path), val)
}

func (b *specBuilder) str(m *yaml.Node, name, path, v string) {
	b.field(m, name, path, b.node(yaml.ScalarNode, "!!str", v, path))
}

// flag appends a boolean field when it is true (false is the default).
func (b *specBuilder) flag(m *yaml.Node, name, path string, v bool) {
	if v {
		b.field(m, name, path, b.node(yaml.ScalarNode, "!!bool", "true", path))
	}
}

func (b *specBuilder) domain(s DomainSpec) *yaml.Node {
	b.name = s.Name
	top := b.mapping("")
	b.str(top, "domain", "domain", s.Domain)
	b.field(top, "descriptors", "descriptors", b.descriptors(s.Descriptors, "descriptors"))
	return top
}

func (b *specBuilder) descriptors(ds []DescriptorSpec, path string) *yaml.Node {
	seq := b.seq(path)
	for i, d := range ds {
		seq.Content = append(seq.Content, b.descriptor(d, fmt.Sprintf("%s[%d]", path, i)))
	}
	return seq
}

func (b *specBuilder) descriptor(d DescriptorSpec, path string) *yaml.Node {
	m := b.mapping(path)
	b.str(m, "key", path+".key", d.Key)
	if d.Value != "" {
		b.str(m, "value", path+".value", d.Value)
	}
	if d.RateLimit != nil {
		b.field(m, "rate_limit", path+".rate_limit", b.rateLimit(d.RateLimit, path+".rate_limit"))
	}
	b.flag(m, "shadow_mode", path+".shadow_mode", d.ShadowMode)
	b.flag(m, "detailed_metric", path+".detailed_metric", d.DetailedMetric)
	b.flag(m, "quota_mode", path+".quota_mode", d.QuotaMode)
	if len(d.Metadata.GetFields()) > 0 {
		b.field(m, "metadata", path+".metadata", b.metaStruct(d.Metadata, path+".metadata"))
	}
	if len(d.Descriptors) > 0 {
		b.field(m, "descriptors", path+".descriptors", b.descriptors(d.Descriptors, path+".descriptors"))
	}
	return m
}

func (b *specBuilder) rateLimit(r *RateLimitSpec, path string) *yaml.Node {
	m := b.mapping(path)
	if r.Unit != "" {
		b.str(m, "unit", path+".unit", r.Unit)
	}
	if !r.Unlimited || r.RequestsPerUnit != 0 {
		b.field(m, "requests_per_unit", path+".requests_per_unit",
			b.node(yaml.ScalarNode, "!!int", strconv.FormatUint(uint64(r.RequestsPerUnit), 10), path+".requests_per_unit"))
	}
	b.flag(m, "unlimited", path+".unlimited", r.Unlimited)
	if r.Name != "" {
		b.str(m, "name", path+".name", r.Name)
	}
	if len(r.Replaces) > 0 {
		seq := b.seq(path + ".replaces")
		for i, name := range r.Replaces {
			p := fmt.Sprintf("%s.replaces[%d]", path, i)
			item := b.mapping(p)
			b.str(item, "name", p+".name", name)
			seq.Content = append(seq.Content, item)
		}
		b.field(m, "replaces", path+".replaces", seq)
	}
	return m
}

// metaStruct converts metadata, fields in name order (the hash must not
// depend on a map's order).
func (b *specBuilder) metaStruct(s *structpb.Struct, path string) *yaml.Node {
	m := b.mapping(path)
	names := make([]string, 0, len(s.GetFields()))
	for k := range s.GetFields() {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		p := path + metaSegment(k)
		b.field(m, k, p, b.metaValue(s.GetFields()[k], p))
	}
	return m
}

func (b *specBuilder) metaValue(v *structpb.Value, path string) *yaml.Node {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		return b.metaStruct(k.StructValue, path)
	case *structpb.Value_ListValue:
		seq := b.seq(path)
		for i, e := range k.ListValue.GetValues() {
			seq.Content = append(seq.Content, b.metaValue(e, fmt.Sprintf("%s[%d]", path, i)))
		}
		return seq
	case *structpb.Value_BoolValue:
		return b.node(yaml.ScalarNode, "!!bool", strconv.FormatBool(k.BoolValue), path)
	case *structpb.Value_NumberValue:
		return b.node(yaml.ScalarNode, "!!float", yamlFloat(k.NumberValue), path)
	case *structpb.Value_StringValue:
		return b.node(yaml.ScalarNode, "!!str", k.StringValue, path)
	}
	return b.node(yaml.ScalarNode, "!!null", "null", path) // null, or no kind
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
	if e.Line > 0 && e.Line < len(b.paths) {
		e.Field = joinField(b.paths[e.Line].path, e.Field)
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
		if err != nil || n <= 0 || n >= len(b.paths) {
			continue
		}
		at := b.paths[n]
		if isFile && !strings.HasSuffix(e.Msg[:m[0]], at.name) {
			continue // a number after some other colon
		}
		out.WriteString(e.Msg[last:m[0]])
		if isFile {
			out.WriteString(": ") // "xds:foo:12" becomes "xds:foo: descriptors[0]"
		}
		out.WriteString(joinField(at.path, ""))
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
