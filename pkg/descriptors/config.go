package descriptors

import (
	"sort"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/store"
)

// Config is a loaded, validated set of domains. It is immutable after Load
// or Parse and safe for concurrent use. The zero value has no domains.
type Config struct {
	domains map[string]*level
	names   []string // sorted domain names
	rules   []*Rule  // every configured rule, by domain then file order
	hash    string
	// defaultAlg is the algorithm of an override that matches no rule
	// (ParseOptions.DefaultAlgorithm).
	defaultAlg store.Algorithm
}

// level is the set of descriptors at one depth below a parent.
type level struct {
	byKey map[string]*group
}

// group is every descriptor of one level with the same key.
type group struct {
	exact map[string]*node // by value
	wild  []*node          // wildcard values, file order
	def   *node            // key only
}

// node is one descriptor.
type node struct {
	rule     *Rule
	children *level // nil when the descriptor has none
	glob     glob   // for wildcard values
	file     string // where the descriptor is defined, for merge errors
	line     int
}

// find returns the child for value v: exact, then the first matching
// wildcard, then the key-only default; nil when none matches.
func (g *group) find(v string) *node {
	if n := g.exact[v]; n != nil {
		return n
	}
	for _, n := range g.wild {
		if n.glob.match(v) {
			return n
		}
	}
	return g.def
}

// Match returns the rule for one request descriptor of domain, following
// envoyproxy/ratelimit (see the package doc), or nil when no limit applies:
// an unknown domain, no entries, an entry no descriptor matches, a request
// deeper than the configuration, or a matched descriptor without rate_limit.
// Unlimited rules are returned. Match does not allocate; the returned rule is
// shared and read-only.
func (c *Config) Match(domain string, entries []*rlcommon.RateLimitDescriptor_Entry) *Rule {
	if c == nil || len(entries) == 0 {
		return nil
	}
	lv := c.domains[domain]
	var n *node
	for _, e := range entries {
		if lv == nil {
			return nil
		}
		g := lv.byKey[e.GetKey()]
		if g == nil {
			return nil
		}
		if n = g.find(e.GetValue()); n == nil {
			return nil
		}
		lv = n.children
	}
	return n.rule
}

// MatchOverride returns the rule for a request descriptor that carries a
// limit override of rpu requests per mult units: OverrideRule of the rule
// Match finds, or nil when the domain is unknown (as envoyproxy/ratelimit
// does). When no rule matches, the override counts with the config's
// default algorithm (ParseOptions.DefaultAlgorithm). It allocates the
// returned rule.
func (c *Config) MatchOverride(domain string, entries []*rlcommon.RateLimitDescriptor_Entry, rpu uint32, unit Unit, mult uint32) *Rule {
	if c == nil || c.domains[domain] == nil {
		return nil
	}
	base := c.Match(domain, entries)
	r := OverrideRule(base, domain, rpu, unit, mult)
	if base == nil {
		r.Algorithm = c.defaultAlg
	}
	return r
}

// Domains returns the configured domain names, sorted. The caller may modify
// the returned slice.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	return append([]string(nil), c.names...)
}

// Rules returns every configured rule, by domain name and then in file
// order, for dumps such as /rlconfig. The rules are shared and read-only.
func (c *Config) Rules() []*Rule {
	if c == nil {
		return nil
	}
	return append([]*Rule(nil), c.rules...)
}

// Hash returns the hex SHA-256 of the loaded files (names and contents, in
// name order), to tell config versions apart in metrics and logs.
func (c *Config) Hash() string {
	if c == nil {
		return ""
	}
	return c.hash
}

// glob is a compiled wildcard value: '*' matches any run of characters,
// including none.
type glob struct {
	pat            string
	prefix, suffix string
	middle         []string // non-empty parts between stars, in order
}

func compileGlob(p string) glob {
	parts := strings.Split(p, "*")
	g := glob{pat: p, prefix: parts[0], suffix: parts[len(parts)-1]}
	for _, m := range parts[1 : len(parts)-1] {
		if m != "" {
			g.middle = append(g.middle, m)
		}
	}
	return g
}

// match reports whether s matches the glob. Leftmost matching of each middle
// part is exact for patterns whose only metacharacter is '*'.
func (g *glob) match(s string) bool {
	if len(s) < len(g.prefix)+len(g.suffix) ||
		!strings.HasPrefix(s, g.prefix) || !strings.HasSuffix(s, g.suffix) {
		return false
	}
	s = s[len(g.prefix) : len(s)-len(g.suffix)]
	for _, m := range g.middle {
		i := strings.Index(s, m)
		if i < 0 {
			return false
		}
		s = s[i+len(m):]
	}
	return true
}

// pattern returns the wildcard value the glob was compiled from.
func (g *glob) pattern() string { return g.pat }

func sortedKeys(m map[string]*level) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
