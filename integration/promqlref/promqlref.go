// Package promqlref lists the metric and label names a PromQL expression
// refers to, so a test can check a dashboard's or an alert rule's queries
// against what a process really exports.
//
// It is a tokenizer that knows where PromQL puts names, not a full parser
// (github.com/prometheus/prometheus/promql/parser would pull the whole of
// Prometheus into the module): an identifier that is not a function,
// aggregation or keyword is a metric name, optionally followed by {label
// matchers}; label names come from matchers and from the lists of by,
// without, on, ignoring, group_left and group_right, and from the label
// arguments of label_replace, label_join, count_values and sort_by_label.
// Grafana variables ($name, ${name}, ${name:format}) are accepted wherever
// PromQL takes a value. It rejects unknown functions and unbalanced
// brackets, but does not check types or operator precedence: run promtool
// for full validation.
package promqlref

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Matcher is one label matcher of a selector, as written.
type Matcher struct {
	Label string
	Op    string // =, !=, =~ or !~
	Value string
}

// Selector is one vector selector: a metric name and its matchers.
type Selector struct {
	Metric   string    // from the name or a __name__="..." matcher; "" if neither
	Matchers []Matcher // without the __name__ matcher that set Metric
}

// Refs are the names an expression refers to.
type Refs struct {
	Selectors []Selector
	// Grouping are the label names of by, without, on, ignoring,
	// group_left and group_right lists, in order.
	Grouping []string
	// By are the label names of by lists only: an aggregation's output
	// has only these labels.
	By []string
	// Included are the labels of group_left and group_right lists: the
	// result copies them from the "one" side.
	Included []string
	// Without is true if the expression aggregates with without, whose
	// output labels Refs cannot tell.
	Without bool
	// LabelArgs are label names passed as string arguments that must
	// exist: label_replace's src_label, label_join's source labels,
	// sort_by_label's labels.
	LabelArgs []string
	// Defined are labels the expression makes: label_replace's and
	// label_join's dst_label, count_values's label.
	Defined []string
}

// Metrics returns the distinct metric names of the selectors, in order.
func (r Refs) Metrics() []string {
	var out []string
	for _, s := range r.Selectors {
		if s.Metric != "" && !slices.Contains(out, s.Metric) {
			out = append(out, s.Metric)
		}
	}
	return out
}

// aggregations take an optional by/without clause before or after their
// parenthesised arguments.
var aggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// functions are PromQL's functions (Prometheus 3.x, experimental ones
// included).
var functions = map[string]bool{
	"abs": true, "absent": true, "absent_over_time": true, "acos": true, "acosh": true, "asin": true,
	"asinh": true, "atan": true, "atanh": true, "avg_over_time": true, "ceil": true, "changes": true,
	"clamp": true, "clamp_max": true, "clamp_min": true, "cos": true, "cosh": true,
	"count_over_time": true, "day_of_month": true, "day_of_week": true, "day_of_year": true,
	"days_in_month": true, "deg": true, "delta": true, "deriv": true, "double_exponential_smoothing": true,
	"exp": true, "floor": true, "histogram_avg": true, "histogram_count": true, "histogram_fraction": true,
	"histogram_quantile": true, "histogram_stddev": true, "histogram_stdvar": true, "histogram_sum": true,
	"holt_winters": true, "hour": true, "idelta": true, "increase": true, "info": true, "irate": true,
	"label_join": true, "label_replace": true, "last_over_time": true, "ln": true, "log10": true,
	"log2": true, "mad_over_time": true, "max_over_time": true, "min_over_time": true, "minute": true,
	"month": true, "pi": true, "predict_linear": true, "present_over_time": true,
	"quantile_over_time": true, "rad": true, "rate": true, "resets": true, "round": true,
	"scalar": true, "sgn": true, "sin": true, "sinh": true, "sort": true, "sort_by_label": true,
	"sort_by_label_desc": true, "sort_desc": true, "sqrt": true, "stddev_over_time": true,
	"stdvar_over_time": true, "sum_over_time": true, "tan": true, "tanh": true, "time": true,
	"timestamp": true, "vector": true, "year": true,
}

// keywords are identifiers that are neither metric nor label names where
// they stand. by, without, on, ignoring, group_left and group_right take a
// label list; the others are operators or modifiers.
var keywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "atan2": true, "offset": true,
	"start": true, "end": true, "inf": true, "nan": true,
}

type kind int

const (
	tIdent  kind = iota
	tString      // the unquoted value
	tNumber      // numbers and durations
	tVar         // a Grafana variable
	tOp          // operators and punctuation
)

type token struct {
	kind kind
	text string
	pos  int
}

// lex splits expr into tokens.
func lex(expr string) ([]token, error) {
	var toks []token
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			s, n, err := lexString(expr[i:])
			if err != nil {
				return nil, fmt.Errorf("at %d: %w", i, err)
			}
			toks = append(toks, token{tString, s, i})
			i += n
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(expr) && expr[i+1] >= '0' && expr[i+1] <= '9':
			n := lexNumber(expr[i:])
			toks = append(toks, token{tNumber, expr[i : i+n], i})
			i += n
		case c == '$':
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				end := strings.IndexByte(expr[j:], '}')
				if end < 0 {
					return nil, fmt.Errorf("at %d: unterminated ${", i)
				}
				j += end + 1
			} else {
				for j < len(expr) && isNameChar(expr[j]) && expr[j] != ':' {
					j++
				}
			}
			if j == i+1 {
				return nil, fmt.Errorf("at %d: $ without a variable name", i)
			}
			toks = append(toks, token{tVar, expr[i:j], i})
			i = j
		case isNameStart(c) && !(c == ':' && i+1 < len(expr) && (expr[i+1] == ']' || expr[i+1] >= '0' && expr[i+1] <= '9' || expr[i+1] == '$')):
			// (a ':' before a duration or ']' is a subquery's step)
			j := i
			for j < len(expr) && isNameChar(expr[j]) {
				j++
			}
			toks = append(toks, token{tIdent, expr[i:j], i})
			i = j
		default:
			op := ""
			for _, o := range []string{"==", "!=", "=~", "!~", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "^", "@", "(", ")", "{", "}", "[", "]", ",", ":"} {
				if strings.HasPrefix(expr[i:], o) {
					op = o
					break
				}
			}
			if op == "" {
				r, _ := utf8.DecodeRuneInString(expr[i:])
				return nil, fmt.Errorf("at %d: unexpected %q", i, r)
			}
			toks = append(toks, token{tOp, op, i})
			i += len(op)
		}
	}
	return toks, nil
}

// lexNumber returns the length of the number or duration at the start of
// s: 1, 0.5, 1e-3, 0x1F, 5m, 1h30m.
func lexNumber(s string) int {
	j := 0
	for j < len(s) {
		c := s[j]
		exponentSign := (c == '+' || c == '-') && j > 0 && (s[j-1] == 'e' || s[j-1] == 'E') &&
			!strings.ContainsAny(s[:j], "xX")
		if !(isNameChar(c) && c != ':' || c == '.' || exponentSign) {
			break
		}
		j++
	}
	return j
}

func isNameStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isNameChar(c byte) bool { return isNameStart(c) || c >= '0' && c <= '9' }

// lexString reads a quoted string at the start of s and returns its value
// and its length in s. Escapes are kept as written except \" and \\,
// which is all a label value in a dashboard needs.
func lexString(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == q:
			return b.String(), i + 1, nil
		case c == '\\' && q != '`' && i+1 < len(s):
			i++
			if s[i] != q && s[i] != '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[i])
		case c == '\n' && q != '`':
			return "", 0, fmt.Errorf("newline in string")
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, fmt.Errorf("unterminated string")
}

// frame is an open parenthesis: a call's arguments (fn set) or a group.
type frame struct {
	fn  string
	arg int
}

// Parse returns the names expr refers to.
func Parse(expr string) (Refs, error) {
	toks, err := lex(expr)
	if err != nil {
		return Refs{}, err
	}
	if len(toks) == 0 {
		return Refs{}, fmt.Errorf("empty expression")
	}
	var r Refs
	var stack []frame
	pending := "" // a function or aggregation whose '(' comes next
	brackets := 0 // depth of [...]: ranges and subqueries hold no names
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		next := token{kind: -1}
		if i+1 < len(toks) {
			next = toks[i+1]
		}
		if brackets > 0 {
			switch {
			case t.kind == tOp && t.text == "[":
				brackets++
			case t.kind == tOp && t.text == "]":
				brackets--
			case t.kind == tIdent || t.kind == tString || t.kind == tOp && !strings.Contains(":-+", t.text):
				return r, fmt.Errorf("at %d: %q inside a range", t.pos, t.text)
			}
			continue
		}
		switch t.kind {
		case tIdent:
			lower := strings.ToLower(t.text)
			switch {
			case lower == "by" || lower == "without" || lower == "on" || lower == "ignoring" ||
				lower == "group_left" || lower == "group_right":
				if !isOp(next, "(") {
					if lower == "group_left" || lower == "group_right" {
						continue // no extra labels
					}
					return r, fmt.Errorf("at %d: %s without a label list", t.pos, t.text)
				}
				labels, n, err := labelList(toks[i+1:])
				if err != nil {
					return r, err
				}
				r.Grouping = append(r.Grouping, labels...)
				switch lower {
				case "by":
					r.By = append(r.By, labels...)
				case "without":
					r.Without = true
				case "group_left", "group_right":
					r.Included = append(r.Included, labels...)
				}
				i += n
			case lower == "and" || lower == "or" || lower == "unless" || lower == "atan2" || lower == "bool" || lower == "offset":
				// binary operators and modifiers, also before a '('
			case aggregations[lower] && (isOp(next, "(") || next.kind == tIdent && (strings.EqualFold(next.text, "by") || strings.EqualFold(next.text, "without"))):
				pending = lower
			case isOp(next, "("):
				if !functions[lower] && lower != "start" && lower != "end" { // start() and end() follow @
					return r, fmt.Errorf("at %d: unknown function %q", t.pos, t.text)
				}
				pending = lower
			case keywords[lower]:
			default:
				sel := Selector{Metric: t.text}
				if isOp(next, "{") {
					ms, n, err := matchers(toks[i+1:])
					if err != nil {
						return r, err
					}
					sel.Matchers = ms
					i += n
				}
				r.Selectors = append(r.Selectors, sel)
			}
		case tString:
			if len(stack) > 0 {
				f := stack[len(stack)-1]
				switch {
				case f.fn == "label_replace" && f.arg == 1, f.fn == "label_join" && f.arg == 1, f.fn == "count_values" && f.arg == 0:
					r.Defined = append(r.Defined, t.text)
				case f.fn == "label_replace" && f.arg == 3, f.fn == "label_join" && f.arg >= 3,
					(f.fn == "sort_by_label" || f.fn == "sort_by_label_desc") && f.arg >= 1:
					if t.text != "" {
						r.LabelArgs = append(r.LabelArgs, t.text)
					}
				}
			}
		case tOp:
			switch t.text {
			case "(":
				stack = append(stack, frame{fn: pending})
				pending = ""
			case ")":
				if len(stack) == 0 {
					return r, fmt.Errorf("at %d: unbalanced )", t.pos)
				}
				stack = stack[:len(stack)-1]
			case ",":
				if len(stack) == 0 || stack[len(stack)-1].fn == "" {
					return r, fmt.Errorf("at %d: comma outside a call", t.pos)
				}
				stack[len(stack)-1].arg++
			case "{":
				ms, n, err := matchers(toks[i:])
				if err != nil {
					return r, err
				}
				sel := Selector{}
				for _, m := range ms {
					if m.Label == "__name__" && m.Op == "=" {
						sel.Metric = m.Value
					} else {
						sel.Matchers = append(sel.Matchers, m)
					}
				}
				r.Selectors = append(r.Selectors, sel)
				i += n - 1
			case "}", "]":
				return r, fmt.Errorf("at %d: unbalanced %s", t.pos, t.text)
			case "[":
				brackets++
			}
		}
	}
	if len(stack) > 0 || brackets > 0 {
		return r, fmt.Errorf("unclosed ( or [")
	}
	return r, nil
}

func isOp(t token, op string) bool { return t.kind == tOp && t.text == op }

// labelList reads "(a, b, ...)" at the start of toks and returns the
// labels and the tokens read.
func labelList(toks []token) ([]string, int, error) {
	var labels []string
	for i := 1; i < len(toks); i++ {
		t := toks[i]
		switch {
		case isOp(t, ")"):
			return labels, i + 1, nil
		case isOp(t, ","):
		case t.kind == tIdent || t.kind == tString:
			labels = append(labels, t.text)
		default:
			return nil, 0, fmt.Errorf("at %d: %q in a label list", t.pos, t.text)
		}
	}
	return nil, 0, fmt.Errorf("unclosed label list")
}

// matchers reads "{l op "v", ...}" at the start of toks and returns the
// matchers and the tokens read. A lone quoted name is a __name__ matcher.
func matchers(toks []token) ([]Matcher, int, error) {
	var ms []Matcher
	for i := 1; i < len(toks); {
		t := toks[i]
		switch {
		case isOp(t, "}"):
			return ms, i + 1, nil
		case isOp(t, ","):
			i++
		case t.kind == tString && i+1 < len(toks) && (isOp(toks[i+1], ",") || isOp(toks[i+1], "}")):
			ms = append(ms, Matcher{Label: "__name__", Op: "=", Value: t.text})
			i++
		case (t.kind == tIdent || t.kind == tString) && i+2 < len(toks):
			op, v := toks[i+1], toks[i+2]
			if op.kind != tOp || !slices.Contains([]string{"=", "!=", "=~", "!~"}, op.text) {
				return nil, 0, fmt.Errorf("at %d: %q after label %q, want =, !=, =~ or !~", op.pos, op.text, t.text)
			}
			if v.kind != tString {
				return nil, 0, fmt.Errorf("at %d: the value of label %q is not a string", v.pos, t.text)
			}
			ms = append(ms, Matcher{Label: t.text, Op: op.text, Value: v.text})
			i += 3
		default:
			return nil, 0, fmt.Errorf("at %d: %q in label matchers", t.pos, t.text)
		}
	}
	return nil, 0, fmt.Errorf("unclosed {")
}

// TemplateQuery splits a Grafana Prometheus variable query: for
// label_values(expr, label) it returns expr and label, for
// label_values(label) an empty expr and label, for query_result(expr) expr.
// Other forms (label_names(), metrics()) are an error: they name no series
// to check.
func TemplateQuery(q string) (expr, label string, err error) {
	q = strings.TrimSpace(q)
	inner, ok := strings.CutPrefix(q, "label_values(")
	if ok && strings.HasSuffix(inner, ")") {
		inner = inner[:len(inner)-1]
		i := lastTopLevelComma(inner)
		if i < 0 {
			return "", strings.TrimSpace(inner), nil
		}
		return strings.TrimSpace(inner[:i]), strings.TrimSpace(inner[i+1:]), nil
	}
	if inner, ok := strings.CutPrefix(q, "query_result("); ok && strings.HasSuffix(inner, ")") {
		return strings.TrimSpace(inner[:len(inner)-1]), "", nil
	}
	return "", "", fmt.Errorf("variable query %q: want label_values(...) or query_result(...)", q)
}

// lastTopLevelComma returns the index of the last comma of s outside
// brackets and strings, or -1.
func lastTopLevelComma(s string) int {
	depth, last := 0, -1
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '(', '{', '[':
			depth++
		case ')', '}', ']':
			depth--
		case '"', '\'', '`':
			if _, n, err := lexString(s[i:]); err == nil {
				i += n - 1
			}
		case ',':
			if depth == 0 {
				last = i
			}
		}
	}
	return last
}

// ValidName reports whether s is a legacy Prometheus label or metric name.
func ValidName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if r > unicode.MaxASCII || !isNameChar(byte(r)) || i == 0 && r >= '0' && r <= '9' {
			return false
		}
	}
	return true
}
