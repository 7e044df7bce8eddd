package descriptors

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

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

// ParseOptions tune Parse.
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

// Parse builds a Config from files, a map from file name (used in errors
// and Rule.File) to YAML content, with the first of opts (without one, the
// defaults: one domain per file). It returns every problem of every file as
// an Errors, sorted by file and line, and a nil Config then.
func Parse(files map[string][]byte, opts ...ParseOptions) (*Config, error) {
	srcs := make([]source, 0, len(files))
	for name, data := range files {
		srcs = append(srcs, source{name: name, data: data})
	}
	return parse(srcs, first(opts))
}

// first returns the first of opts, or the zero options.
func first[T any](opts []T) T {
	var o T
	if len(opts) > 0 {
		o = opts[0]
	}
	return o
}

// source is one input of parse: a file's YAML text, or a document already
// decoded into a YAML node tree (ParseSpecs), with its text for the hash.
type source struct {
	name string
	data []byte
	top  *yaml.Node // nil: parse data
}

// parse builds a Config from srcs, in name order (see Parse).
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
