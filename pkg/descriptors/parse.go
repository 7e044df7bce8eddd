package descriptors

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/rls-project/rls/pkg/store"
)

// maxNodes bounds the descriptors one file may expand to (aliases can
// multiply them), so a hostile file cannot exhaust memory.
const maxNodes = 100000

// maxDepth bounds the nesting of descriptors (a recursive alias would
// otherwise nest them without end).
const maxDepth = 64

var (
	rootFields       = []string{"domain", "descriptors"}
	descriptorFields = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode",
		"detailed_metric", "value_to_metric", "share_threshold", "quota_mode", "metadata"}
	rateLimitFields = []string{"unit", "unit_multiplier", "requests_per_unit", "name", "unlimited", "replaces",
		"algorithm", "burst", "precision", "on_error", "response_body", "content_type", "split", "reserve", "strict", "scope"}
	replacesFields = []string{"name"}
)

// ParseOptions tune ParseWith.
type ParseOptions struct {
	// MergeDomains lets several files define one domain, as
	// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG does: their top-level
	// descriptors are combined in file-name order (which orders wildcards
	// of one key), and a top-level descriptor (key and value) defined in
	// two files is an error naming both. Without it, a domain defined in
	// two files is an error.
	MergeDomains bool
	// MergeDomainsName is how the error of a domain defined twice names
	// the MergeDomains option, e.g. the flag that sets it; "" names none.
	MergeDomainsName string
	// DefaultAlgorithm is the algorithm of every rule that names none
	// (and sets no precision, which only a sliding window has), and of an
	// override that matches no rule. The zero value is SlidingWindow. It
	// never changes what is valid: a file accepted with one default is
	// accepted with any other.
	DefaultAlgorithm store.Algorithm
	// Global allows rules of scope: global (scope.go): rls serve's
	// --region and --global-redis-url are set.
	Global bool
}

// Parse is ParseWith with the default options: one domain per file.
func Parse(files map[string][]byte) (*Config, error) {
	return ParseWith(files, ParseOptions{})
}

// ParseWith builds a Config from files, a map from file name (used in errors
// and Rule.File) to YAML content. It returns every problem of every file as
// an Errors, sorted by file and line, and a nil Config then.
func ParseWith(files map[string][]byte, opts ParseOptions) (*Config, error) {
	srcs := make([]source, 0, len(files))
	for name, data := range files {
		srcs = append(srcs, source{name: name, data: data})
	}
	return parse(srcs, opts)
}

// source is one input of parse: a file's YAML text, or a document already
// decoded into a YAML node tree (ParseSpecs), with its text for the hash.
type source struct {
	name string
	data []byte
	top  *yaml.Node // nil: parse data
}

// parse builds a Config from srcs, in name order (see ParseWith).
func parse(srcs []source, opts ParseOptions) (*Config, error) {
	sort.Slice(srcs, func(i, j int) bool { return srcs[i].name < srcs[j].name })

	var errs Errors
	h := sha256.New()
	cfg := &Config{domains: make(map[string]*level), defaultAlg: opts.DefaultAlgorithm}
	firstFile := make(map[string]*ConfigError) // domain -> where it was first defined
	for _, src := range srcs {
		name, data := src.name, src.data
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(data))
		h.Write(data)

		p := &parser{file: name, errs: &errs, budget: maxNodes, defaultAlg: opts.DefaultAlgorithm, global: opts.Global}
		before := len(errs)
		var domain string
		var domainNode *yaml.Node
		var root *level
		if src.top != nil {
			domain, domainNode, root = p.parseTop(src.top)
		} else {
			domain, domainNode, root = p.parseFile(data)
		}
		// The YAML parser can place a node past the end of a file (the
		// empty document of "---"): name the last line instead.
		if len(errs) > before && src.top == nil {
			last := lineCount(data)
			for _, e := range errs[before:] {
				e.Line = min(e.Line, last)
			}
		}
		if domainNode == nil || domain == "" {
			continue
		}
		if first, dup := firstFile[domain]; dup && !opts.MergeDomains {
			p.errorf(domainNode, "domain", "duplicate domain %q, also defined at %s:%d%s", domain, first.File, first.Line, mergeHint(opts.MergeDomainsName))
			continue
		} else if dup {
			cfg.domains[domain].merge(root, p)
		} else {
			firstFile[domain] = &ConfigError{File: name, Line: domainNode.Line}
			cfg.domains[domain] = root
		}
		for _, r := range p.rules {
			r.Domain = domain
		}
		cfg.rules = append(cfg.rules, p.rules...)
	}
	if len(errs) > 0 {
		errs.sort()
		return nil, errs
	}
	cfg.names = sortedKeys(cfg.domains)
	sort.SliceStable(cfg.rules, func(i, j int) bool { return cfg.rules[i].Domain < cfg.rules[j].Domain })
	cfg.hash = hex.EncodeToString(h.Sum(nil))
	return cfg, nil
}

// mergeHint is the end of the duplicate-domain error: the option that
// would merge them, when it has a name.
func mergeHint(name string) string {
	if name == "" {
		return ""
	}
	return " (" + name + " combines them)"
}

// parser holds the state of parsing one file.
type parser struct {
	file     string
	errs     *Errors
	budget   int
	exceeded bool
	rules    []*Rule
	// defaultAlg is ParseOptions.DefaultAlgorithm.
	defaultAlg store.Algorithm
	global     bool // ParseOptions.Global
}

// field is one key/value pair of a YAML mapping.
type field struct {
	key, val *yaml.Node
}

func (p *parser) errorf(n *yaml.Node, fieldName, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	*p.errs = append(*p.errs, &ConfigError{File: p.file, Line: line, Field: fieldName, Msg: fmt.Sprintf(format, args...)})
}

var (
	yamlLine       = regexp.MustCompile(`line (\d+)`)
	yamlLinePrefix = regexp.MustCompile(`^line \d+: `)
)

// parseFile parses one file. domainNode is nil when the file has no usable
// domain.
func (p *parser) parseFile(data []byte) (domain string, domainNode *yaml.Node, root *level) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.errs.add(p.file, 1, "domain", "file is empty: missing domain")
			return "", nil, nil
		}
		p.syntaxError(data, err)
		return "", nil, nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.errorf(&extra, "", "more than one YAML document: one domain per file")
	} else if !errors.Is(err, io.EOF) {
		p.syntaxError(data, err)
	}
	if len(doc.Content) == 0 {
		p.errs.add(p.file, 1, "domain", "file is empty: missing domain")
		return "", nil, nil
	}
	return p.parseTop(doc.Content[0])
}

// parseTop parses a document's top node: a mapping with domain and
// descriptors.
func (p *parser) parseTop(top *yaml.Node) (domain string, domainNode *yaml.Node, root *level) {
	top = resolve(top)
	if top.Kind != yaml.MappingNode {
		if top.Tag == "!!null" {
			p.errorf(top, "domain", "file is empty: missing domain")
		} else {
			p.errorf(top, "", "the document must be a mapping with domain and descriptors, got %s", kindName(top))
		}
		return "", nil, nil
	}
	fs := p.mapping(top, "", rootFields)
	df, ok := fs["domain"]
	if !ok {
		p.errorf(top, "domain", "missing")
	} else if domain, ok = p.str(df, "domain"); ok && domain == "" {
		p.errorf(df.val, "domain", "must not be empty")
	} else if ok {
		domainNode = df.val
	}
	root = &level{byKey: map[string]*group{}}
	if f, ok := fs["descriptors"]; ok {
		root = p.descriptors(f, "", 0, nil, nil)
	}
	return domain, domainNode, root
}

func (es *Errors) add(file string, line int, fieldName, msg string) {
	*es = append(*es, &ConfigError{File: file, Line: line, Field: fieldName, Msg: msg})
}

func (p *parser) syntaxError(data []byte, err error) {
	msg := err.Error()
	line := 0
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
	}
	if line <= 0 {
		// The YAML reader's errors (control characters, invalid UTF-8)
		// carry no line: find the offending byte ourselves.
		line = badCharLine(data)
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	msg = strings.TrimPrefix(msg, yamlLinePrefix.FindString(msg))
	p.errs.add(p.file, line, "", "YAML syntax: "+msg)
}

// badCharLine returns the 1-based line (counting YAML's line breaks) of the
// first byte of data that YAML does not allow (invalid UTF-8 or a control
// character other than a tab or a line break), or 1 when there is none.
func badCharLine(data []byte) int {
	line := 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			return line
		case lineBreak(data, i, r):
			line++
		case forbiddenRune(r):
			return line
		}
		i += size
	}
	return 1
}

// lineBreak reports whether r, the rune at data[i], ends a line as YAML
// counts them: a line feed, a carriage return not followed by a line feed
// (the pair is one break), NEL, LS or PS.
func lineBreak(data []byte, i int, r rune) bool {
	switch r {
	case '\r':
		return i+1 >= len(data) || data[i+1] != '\n'
	case '\n', 0x85, 0x2028, 0x2029:
		return true
	}
	return false
}

// forbiddenRune reports whether YAML disallows r: a C0 or C1 control
// character other than a tab or a line break, a surrogate, U+FFFE or U+FFFF.
// (A byte order mark, U+FEFF, is allowed.)
func forbiddenRune(r rune) bool {
	switch r {
	case '\t', '\n', '\r', 0x85:
		return false
	}
	return r < 0x20 || (r >= 0x7f && r < 0xa0) || (r >= 0xd800 && r < 0xe000) || r == 0xfffe || r == 0xffff
}

// lineCount returns the number of lines of data as YAML counts them: line
// feeds, lone carriage returns, NEL, LS and PS each end a line.
func lineCount(data []byte) int {
	n := 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if lineBreak(data, i, r) {
			n++
		}
		i += size
	}
	return n
}

// resolve follows aliases.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return "the scalar " + strconv.Quote(n.Value)
	}
	return "an unexpected node"
}

// mapping returns the fields of mapping node n, reporting unknown and
// duplicate fields and merging "<<" keys. what names n in errors. It
// returns nil when n is not a mapping.
func (p *parser) mapping(n *yaml.Node, what string, allowed []string) map[string]field {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		p.errorf(n, what, "must be a mapping, got %s", kindName(n))
		return nil
	}
	fs := make(map[string]field, len(n.Content)/2)
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			m := resolve(v)
			if m.Kind == yaml.SequenceNode {
				merges = append(merges, m.Content...)
			} else {
				merges = append(merges, m)
			}
			continue
		}
		if k.Kind != yaml.ScalarNode {
			p.errorf(k, what, "field names must be strings, got %s", kindName(k))
			continue
		}
		name := k.Value
		if !contains(allowed, name) {
			p.errorf(k, name, "unknown field; allowed: %s", strings.Join(allowed, ", "))
			continue
		}
		if first, dup := fs[name]; dup {
			p.errorf(k, name, "duplicate field (first at line %d)", first.key.Line)
			continue
		}
		fs[name] = field{key: k, val: v}
	}
	for _, m := range merges {
		if p.spend() {
			return fs
		}
		for name, f := range p.mapping(m, what, allowed) {
			if _, ok := fs[name]; !ok {
				fs[name] = f
			}
		}
	}
	return fs
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// spend takes one node from the file's budget and reports whether it is
// exhausted (reporting that once).
func (p *parser) spend() bool {
	p.budget--
	if p.budget >= 0 {
		return false
	}
	if !p.exceeded {
		p.exceeded = true
		p.errs.add(p.file, 0, "descriptors", fmt.Sprintf("more than %d descriptors (after expanding aliases)", maxNodes))
	}
	return true
}

// str returns a scalar's text; null is "". ok is false (and an error
// recorded) for a list or mapping.
func (p *parser) str(f field, name string) (s string, ok bool) {
	v := resolve(f.val)
	if v.Kind != yaml.ScalarNode {
		p.errorf(v, name, "must be a string, got %s", kindName(v))
		return "", false
	}
	if v.Tag == "!!null" {
		return "", true
	}
	return v.Value, true
}

// boolean returns a boolean field; YAML 1.1 forms (yes, on) are accepted as
// envoyproxy/ratelimit's YAML library does.
func (p *parser) boolean(f field, name string) bool {
	v := resolve(f.val)
	var b bool
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" || v.Decode(&b) != nil {
		p.errorf(v, name, "must be true or false, got %s", kindName(v))
		return false
	}
	return b
}

// uint32Field returns a non-negative integer field that fits uint32.
func (p *parser) uint32Field(f field, name string) (uint32, bool) {
	v := resolve(f.val)
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		p.errorf(v, name, "must be a non-negative integer, got %s", kindName(v))
		return 0, false
	}
	switch v.Tag {
	case "!!int":
	case "!!float":
		p.errorf(v, name, "must be an integer, got %s", v.Value)
		return 0, false
	default:
		p.errorf(v, name, "must be a non-negative integer, got %s", kindName(v))
		return 0, false
	}
	if strings.HasPrefix(strings.TrimSpace(v.Value), "-") {
		p.errorf(v, name, "must not be negative, got %s", v.Value)
		return 0, false
	}
	var u uint64
	if err := v.Decode(&u); err != nil || u > math.MaxUint32 {
		p.errorf(v, name, "too large: %s (at most %d)", v.Value, uint32(math.MaxUint32))
		return 0, false
	}
	return uint32(u), true
}

// descriptors parses a descriptors list at depth; share holds the
// share_threshold patterns of the levels above.
func (p *parser) descriptors(f field, path string, depth int, share []string, metric []metricLevel) *level {
	lv := &level{byKey: map[string]*group{}}
	seq := resolve(f.val)
	if seq.Kind == yaml.ScalarNode && seq.Tag == "!!null" {
		return lv
	}
	if seq.Kind != yaml.SequenceNode {
		p.errorf(seq, "descriptors", "must be a list, got %s", kindName(seq))
		return lv
	}
	if depth >= maxDepth {
		p.errorf(f.key, "descriptors", "nested deeper than %d levels", maxDepth)
		return lv
	}
	seen := make(map[string]int) // key "\x00" value -> line
	for _, item := range seq.Content {
		if p.spend() {
			return lv
		}
		p.descriptor(resolve(item), lv, seen, path, depth, share, metric)
	}
	return lv
}

// descFlags are a descriptor's boolean fields.
type descFlags struct {
	shadow, detailed, quota, share, valueToMetric bool
}

// descriptor parses item, one entry of a descriptors list at depth under
// path, into lv; seen maps the key "\x00" value of the level's earlier
// entries to their lines.
func (p *parser) descriptor(item *yaml.Node, lv *level, seen map[string]int, path string, depth int, share []string, metric []metricLevel) {
	fs := p.mapping(item, "descriptors", descriptorFields)
	if fs == nil {
		return
	}
	key, value := p.keyValue(item, fs)
	wild := strings.Contains(value, "*")
	fl := p.descFlags(fs, wild)

	seg := key
	if value != "" {
		seg += "=" + value
	}
	nodePath := seg
	if path != "" {
		nodePath = path + "/" + seg
	}
	levelShare := make([]string, depth+1)
	copy(levelShare, share)
	if fl.share && wild {
		levelShare[depth] = value
	}

	levelMetric := make([]metricLevel, depth+1)
	copy(levelMetric, metric)
	levelMetric[depth] = newMetricLevel(key, value, wild, fl)

	n := &node{file: p.file, line: item.Line}
	if rf, ok := fs["rate_limit"]; ok {
		n.rule = p.rule(rf, nodePath, fl, levelShare, levelMetric)
		if mf, ok := fs["metadata"]; ok && n.rule != nil {
			n.rule.Metadata = p.metadata(mf)
		}
	}
	if mf, ok := fs["metadata"]; ok && n.rule == nil {
		p.metadata(mf) // validated; envoyproxy/ratelimit returns only a rate_limit's metadata
	}
	if df, ok := fs["descriptors"]; ok {
		n.children = p.descriptors(df, nodePath, depth+1, levelShare, levelMetric)
	}

	if key == "" {
		return
	}
	id := key + "\x00" + value
	if first, dup := seen[id]; dup {
		fieldName, what := "key", "key "+strconv.Quote(key)
		if value != "" {
			fieldName, what = "value", what+" with value "+strconv.Quote(value)
		}
		p.errorf(item, fieldName, "duplicate descriptor %s at this level (first at line %d)", what, first)
		return
	}
	seen[id] = item.Line
	lv.add(key, value, wild, n)
}

// keyValue returns a descriptor's key and value ("" when absent or
// invalid), reporting a missing or empty key.
func (p *parser) keyValue(item *yaml.Node, fs map[string]field) (key, value string) {
	kf, ok := fs["key"]
	if !ok {
		p.errorf(item, "key", "missing")
	} else if key, ok = p.str(kf, "key"); ok && key == "" {
		p.errorf(kf.val, "key", "must not be empty")
	}
	if vf, ok := fs["value"]; ok {
		value, _ = p.str(vf, "value")
	}
	return key, value
}

// descFlags returns a descriptor's boolean fields, reporting a
// share_threshold without a wildcard value.
func (p *parser) descFlags(fs map[string]field, wild bool) descFlags {
	flag := func(name string) bool {
		if f, ok := fs[name]; ok {
			return p.boolean(f, name)
		}
		return false
	}
	var fl descFlags
	fl.shadow, fl.detailed, fl.quota = flag("shadow_mode"), flag("detailed_metric"), flag("quota_mode")
	fl.valueToMetric = flag("value_to_metric")
	fl.share = flag("share_threshold")
	if fl.share && !wild {
		p.errorf(fs["share_threshold"].key, "share_threshold", "requires a wildcard value (with '*')")
	}
	return fl
}

// rule parses the rate_limit of the descriptor at nodePath and records it;
// nil when it is not a mapping. levelShare holds the share_threshold
// patterns of the descriptor's levels.
func (p *parser) rule(rf field, nodePath string, fl descFlags, levelShare []string, levelMetric []metricLevel) *Rule {
	r := p.rateLimit(rf)
	if r == nil {
		return nil
	}
	r.Path, r.File, r.Line = nodePath, p.file, rf.key.Line
	var sp strings.Builder
	for i, m := range levelMetric {
		if i > 0 {
			sp.WriteByte('.')
		}
		sp.WriteString(m.key)
		if m.fixed != "" {
			sp.WriteByte('_')
			sp.WriteString(m.fixed)
		}
	}
	r.statsPath = sp.String()
	r.ShadowMode, r.DetailedMetric, r.QuotaMode = fl.shadow, fl.detailed, fl.quota
	for _, s := range levelShare {
		if s != "" {
			r.share = levelShare
			break
		}
	}
	for _, m := range levelMetric {
		if m.runtime {
			r.metric = levelMetric
			break
		}
	}
	p.rules = append(p.rules, r)
	return r
}

// add puts n, the descriptor with key and value (a wildcard pattern when
// wild), into lv.
func (lv *level) add(key, value string, wild bool, n *node) {
	g := lv.byKey[key]
	if g == nil {
		g = &group{}
		lv.byKey[key] = g
	}
	switch {
	case value == "":
		g.def = n
	case wild:
		n.glob = compileGlob(value)
		g.wild = append(g.wild, n)
	default:
		if g.exact == nil {
			g.exact = make(map[string]*node)
		}
		g.exact[value] = n
	}
}

// rateLimit parses a rate_limit mapping; nil when it is not a mapping.
func (p *parser) rateLimit(rf field) *Rule {
	fs := p.mapping(rf.val, "rate_limit", rateLimitFields)
	if fs == nil {
		return nil
	}
	r := &Rule{}
	if f, ok := fs["unlimited"]; ok {
		r.Unlimited = p.boolean(f, "unlimited")
	}
	if f, ok := fs["name"]; ok {
		r.Name, _ = p.str(f, "name")
	}
	p.limit(rf, fs, r)
	if f, ok := fs["replaces"]; ok {
		r.Replaces = p.replaces(f, r.Name)
	}
	p.algorithm(fs, r)
	p.split(fs, r)
	p.response(fs, r)
	if f, ok := fs["on_error"]; ok {
		r.OnError = p.onError(f)
	}
	if f, ok := fs["reserve"]; ok {
		r.NoReserve = !p.boolean(f, "reserve")
	}
	p.scope(fs, r)
	return r
}

// limit parses a rate_limit's unit, unit_multiplier and requests_per_unit
// into r: unit and requests_per_unit are required unless r is unlimited,
// and all three are forbidden when it is.
func (p *parser) limit(rf field, fs map[string]field, r *Rule) {
	uf, hasUnit := fs["unit"]
	if hasUnit {
		r.Unit = p.unit(uf)
	}
	mf, hasMult := fs["unit_multiplier"]
	if hasMult {
		p.multiplier(mf, r)
	}
	rpuf, hasRPU := fs["requests_per_unit"]
	if hasRPU {
		r.RequestsPerUnit, _ = p.uint32Field(rpuf, "requests_per_unit")
	}
	if !r.Unlimited {
		if !hasUnit {
			p.errorf(rf.key, "unit", "missing; required unless unlimited is true")
		}
		return
	}
	if hasUnit {
		p.errorf(uf.key, "unit", "must not be set when unlimited is true")
	}
	if hasMult {
		p.errorf(mf.key, "unit_multiplier", "must not be set when unlimited is true")
	}
	if hasRPU {
		p.errorf(rpuf.key, "requests_per_unit", "must not be set when unlimited is true")
	}
}

// unit parses a unit field; 0 (invalid) after an error.
func (p *parser) unit(f field) Unit {
	s, ok := p.str(f, "unit")
	if !ok {
		return 0
	}
	u, ok := ParseUnit(s)
	if !ok {
		p.errorf(f.val, "unit", "invalid unit %q; choices are second, minute, hour, day, week, month, year", s)
	}
	return u
}

// multiplier parses a rate_limit's unit_multiplier into r: at least 1,
// and a window (unit times multiplier) of at most MaxWindow. r.Unit is
// already parsed; an invalid unit is reported there.
func (p *parser) multiplier(f field, r *Rule) {
	n, ok := p.uint32Field(f, "unit_multiplier")
	if !ok {
		return
	}
	r.UnitMultiplier = n
	if _, ok := r.Unit.Window(n); n == 0 || (!ok && r.Unit.Valid()) {
		p.errorf(f.val, "unit_multiplier", "%s", WindowError(r.Unit, n))
	}
}

// precision parses a rate_limit's precision and strict into r.
func (p *parser) precision(fs map[string]field, r *Rule) {
	if f, ok := fs["precision"]; ok {
		if r.Algorithm != store.SlidingWindow {
			p.errorf(f.key, "precision", "only valid with algorithm: sliding_window (the default)")
		} else if n, ok := p.uint32Field(f, "precision"); ok {
			if n < 1 || n > store.MaxPrecision {
				p.errorf(f.val, "precision", "must be 1 to %d sub-windows per window, got %d", store.MaxPrecision, n)
			}
			r.Precision = n
		}
	}
	if f, ok := fs["strict"]; ok {
		if r.Strict = p.boolean(f, "strict"); r.Strict && r.Precision < 2 {
			p.errorf(f.key, "strict", "only valid with a sliding_window of precision 2 or more (it counts the oldest sub-window whole)")
		}
	}
}

// algorithm parses a rate_limit's algorithm and burst into r. A rule that
// names no algorithm is validated as a sliding window (so what is valid
// does not depend on the default) and then gets the parser's default
// algorithm, unless it sets precision, which asks for a sliding window.
func (p *parser) algorithm(fs map[string]field, r *Rule) {
	defer func() {
		_, named := fs["algorithm"]
		_, precise := fs["precision"]
		if !named && !precise {
			r.Algorithm = p.defaultAlg
		}
	}()
	if f, ok := fs["algorithm"]; ok {
		if s, ok := p.str(f, "algorithm"); ok {
			if a, ok := store.ParseAlgorithm(s); ok {
				r.Algorithm = a
			} else {
				p.errorf(f.val, "algorithm", "invalid algorithm %q; choices are sliding_window, token_bucket, fixed_window", s)
			}
		}
	}
	p.precision(fs, r)
	f, ok := fs["burst"]
	if !ok {
		return
	}
	if r.Algorithm != store.TokenBucket {
		p.errorf(f.key, "burst", "only valid with algorithm: token_bucket")
	} else if b, ok := p.uint32Field(f, "burst"); ok {
		if b < 1 {
			p.errorf(f.val, "burst", "must be at least 1")
		}
		r.Burst = b
	}
}

// response parses a rate_limit's response_body and content_type into r.
func (p *parser) response(fs map[string]field, r *Rule) {
	if f, ok := fs["response_body"]; ok {
		if s, ok := p.str(f, "response_body"); ok {
			r.ResponseBody = s
		}
	}
	f, ok := fs["content_type"]
	if !ok {
		return
	}
	s, ok := p.str(f, "content_type")
	if !ok {
		return
	}
	if _, hasBody := fs["response_body"]; !hasBody {
		p.errorf(f.key, "content_type", "only valid with response_body")
	} else if s == "" || strings.ContainsAny(s, "\r\n") {
		p.errorf(f.val, "content_type", "must be a non-empty single-line media type")
	}
	r.ContentType = s
}

// onError parses an on_error field; OnErrorDefault after an error.
func (p *parser) onError(f field) OnError {
	s, ok := p.str(f, "on_error")
	if !ok {
		return OnErrorDefault
	}
	switch strings.ToLower(s) {
	case "fail_open":
		return OnErrorFailOpen
	case "fail_closed":
		return OnErrorFailClosed
	}
	p.errorf(f.val, "on_error", "invalid value %q; choices are fail_open, fail_closed", s)
	return OnErrorDefault
}

// replaces parses a replaces list of {name: X} mappings.
func (p *parser) replaces(f field, own string) []string {
	seq := resolve(f.val)
	if seq.Kind == yaml.ScalarNode && seq.Tag == "!!null" {
		return nil
	}
	if seq.Kind != yaml.SequenceNode {
		p.errorf(seq, "replaces", "must be a list of {name: ...}, got %s", kindName(seq))
		return nil
	}
	var names []string
	for _, item := range seq.Content {
		item = resolve(item)
		fs := p.mapping(item, "replaces", replacesFields)
		if fs == nil {
			continue
		}
		nf, ok := fs["name"]
		if !ok {
			p.errorf(item, "replaces", "entry has no name")
			continue
		}
		name, ok := p.str(nf, "name")
		switch {
		case !ok:
		case name == "":
			p.errorf(nf.val, "replaces", "entry has an empty name")
		case name == own:
			p.errorf(nf.val, "replaces", "names the rule's own name %q", name)
		default:
			names = append(names, name)
		}
	}
	return names
}
