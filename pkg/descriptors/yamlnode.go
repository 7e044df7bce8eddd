package descriptors

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

var (
	yamlLine       = regexp.MustCompile(`line (\d+)`)
	yamlLinePrefix = regexp.MustCompile(`^line \d+: `)
)

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
