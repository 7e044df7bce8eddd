package deploy

// What a PromQL expression of the dashboard or the alert rules refers to,
// read from the syntax tree of Prometheus's own parser: the series it
// selects and the label names it groups by, copies, defines or reads.

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
)

// pqMatcher is one label matcher of a selector, as written.
type pqMatcher struct {
	Label string
	Op    string // =, !=, =~ or !~
	Value string
}

// pqSelector is one vector selector: a metric name and its matchers.
type pqSelector struct {
	Metric   string      // from the name or a __name__="..." matcher; "" if neither
	Matchers []pqMatcher // without the __name__ matcher that set Metric
}

// refs are the names an expression refers to.
type refs struct {
	Selectors []pqSelector
	// Grouping are the label names of by, without, on, ignoring,
	// group_left and group_right lists.
	Grouping []string
	// By are the label names of by lists only: an aggregation's output
	// has only these labels.
	By []string
	// Included are the labels of group_left and group_right lists: the
	// result copies them from the "one" side.
	Included []string
	// Without is true if the expression aggregates with without, whose
	// output labels refs cannot tell.
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
func (r refs) Metrics() []string {
	var out []string
	for _, s := range r.Selectors {
		if s.Metric != "" && !slices.Contains(out, s.Metric) {
			out = append(out, s.Metric)
		}
	}
	return out
}

// grafanaDurations are Grafana's built-in interval variables, which stand
// where PromQL takes a duration; Grafana replaces them before Prometheus
// sees the query, and so does parseRefs. Other variables ($job) stand in
// label values, inside strings, which PromQL parses as they are.
var grafanaDurations = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)(_ms|_s)?\}?`)

var promql = parser.NewParser(parser.Options{})

// parseRefs parses expr with Prometheus's parser and returns what it
// refers to.
func parseRefs(expr string) (refs, error) {
	e, err := promql.ParseExpr(grafanaDurations.ReplaceAllString(expr, "5m"))
	if err != nil {
		return refs{}, err
	}
	var r refs
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			r.Selectors = append(r.Selectors, selectorOf(n))
		case *parser.AggregateExpr:
			r.aggregation(n)
		case *parser.BinaryExpr:
			if m := n.VectorMatching; m != nil {
				r.Grouping = append(r.Grouping, m.MatchingLabels...)
				r.Grouping = append(r.Grouping, m.Include...)
				r.Included = append(r.Included, m.Include...)
			}
		case *parser.Call:
			r.call(n)
		}
		return nil
	})
	return r, nil
}

func selectorOf(n *parser.VectorSelector) pqSelector {
	s := pqSelector{Metric: n.Name}
	for _, m := range n.LabelMatchers {
		if m.Name == model.MetricNameLabel && (n.Name != "" || m.Type.String() == "=") {
			s.Metric = m.Value // the name, as a selector keeps it, or written as a matcher
			continue
		}
		s.Matchers = append(s.Matchers, pqMatcher{Label: m.Name, Op: m.Type.String(), Value: m.Value})
	}
	return s
}

func (r *refs) aggregation(n *parser.AggregateExpr) {
	r.Grouping = append(r.Grouping, n.Grouping...)
	if n.Without {
		r.Without = true
	} else {
		r.By = append(r.By, n.Grouping...)
	}
	if n.Op == parser.COUNT_VALUES {
		if s, ok := n.Param.(*parser.StringLiteral); ok {
			r.Defined = append(r.Defined, s.Val)
		}
	}
}

// call records the label names a function's string arguments define or
// read.
func (r *refs) call(n *parser.Call) {
	str := func(i int) string {
		if i < len(n.Args) {
			if s, ok := n.Args[i].(*parser.StringLiteral); ok {
				return s.Val
			}
		}
		return ""
	}
	read := func(from int) {
		for i := from; i < len(n.Args); i++ {
			if l := str(i); l != "" {
				r.LabelArgs = append(r.LabelArgs, l)
			}
		}
	}
	switch n.Func.Name {
	case "label_replace":
		r.Defined = append(r.Defined, str(1))
		if l := str(3); l != "" {
			r.LabelArgs = append(r.LabelArgs, l)
		}
	case "label_join":
		r.Defined = append(r.Defined, str(1))
		read(3)
	case "sort_by_label", "sort_by_label_desc":
		read(1)
	}
}

// templateQuery splits a Grafana template variable's query: for
// label_values(expr, label) it returns expr and label, for
// label_values(label) an empty expr and label, for query_result(expr) expr.
// Other forms (label_names(), metrics()) are an error: they name no series
// to check. The comma before the label is the last one after which a label
// name follows and before which PromQL parses.
func templateQuery(q string) (expr, label string, err error) {
	q = strings.TrimSpace(q)
	if inner, ok := strings.CutPrefix(q, "query_result("); ok && strings.HasSuffix(inner, ")") {
		return strings.TrimSpace(inner[:len(inner)-1]), "", nil
	}
	inner, ok := strings.CutPrefix(q, "label_values(")
	if !ok || !strings.HasSuffix(inner, ")") {
		return "", "", fmt.Errorf("variable query %q: want label_values(...) or query_result(...)", q)
	}
	inner = strings.TrimSpace(inner[:len(inner)-1])
	if model.LegacyValidation.IsValidLabelName(inner) {
		return "", inner, nil
	}
	for i := strings.LastIndexByte(inner, ','); i >= 0; i = strings.LastIndexByte(inner[:i], ',') {
		e, l := strings.TrimSpace(inner[:i]), strings.TrimSpace(inner[i+1:])
		if !model.LegacyValidation.IsValidLabelName(l) {
			continue
		}
		if _, err := parseRefs(e); err == nil {
			return e, l, nil
		}
	}
	return "", "", fmt.Errorf("variable query %q: want label_values([expr, ]label)", q)
}

func TestParseRefs(t *testing.T) {
	for _, c := range []struct {
		expr string
		want refs
	}{
		{
			`sum by (domain, outcome) (rate(rls_decisions_total{job=~"$job", instance=~"$instance", domain=~"$domain"}[$__rate_interval]))`,
			refs{
				Selectors: []pqSelector{{Metric: "rls_decisions_total", Matchers: []pqMatcher{
					{"job", "=~", "$job"}, {"instance", "=~", "$instance"}, {"domain", "=~", "$domain"}}}},
				Grouping: []string{"domain", "outcome"}, By: []string{"domain", "outcome"},
			},
		},
		{
			// Vector matching, group_left with and without labels, bool, offset, @, a subquery.
			`sum without (kind) (rate(rls_store_errors_total{op="decide"}[5m] offset 1h)) / ignoring(kind) group_left(hash) ` +
				`rls_config_info > bool 1 and on (instance) max_over_time(up[10m:1m] @ end()) unless rls_store_up * on(job) group_right rls_fleet_size`,
			refs{
				Selectors: []pqSelector{
					{Metric: "rls_store_errors_total", Matchers: []pqMatcher{{"op", "=", "decide"}}},
					{Metric: "rls_config_info"}, {Metric: "up"}, {Metric: "rls_store_up"}, {Metric: "rls_fleet_size"}},
				Grouping: []string{"kind", "kind", "hash", "instance", "job"}, Included: []string{"hash"}, Without: true,
			},
		},
		{
			// A selector by __name__ and a quoted name.
			`({__name__="rls_fleet_size", job!="x"} + {"go_goroutines"}) * 1e-3 > -Inf`,
			refs{Selectors: []pqSelector{
				{Metric: "rls_fleet_size", Matchers: []pqMatcher{{"job", "!=", "x"}}},
				{Metric: "go_goroutines"}}},
		},
		{
			// Label functions: dst is made, src must exist.
			`count_values("n", label_join(label_replace(rls_config_info, "short", "$1", "hash", "(.{8}).*"), "both", "/", "job", "instance"))`,
			refs{
				Selectors: []pqSelector{{Metric: "rls_config_info"}},
				LabelArgs: []string{"hash", "job", "instance"}, Defined: []string{"n", "short", "both"},
			},
		},
		{
			`{__name__=~".+"}`,
			refs{Selectors: []pqSelector{{Matchers: []pqMatcher{{"__name__", "=~", ".+"}}}}},
		},
	} {
		got, err := parseRefs(c.expr)
		if err != nil {
			t.Errorf("parseRefs(%s): %v", c.expr, err)
			continue
		}
		for _, s := range [][]string{got.Grouping, got.By, got.Included, got.LabelArgs, got.Defined, c.want.Grouping, c.want.By, c.want.Included, c.want.LabelArgs, c.want.Defined} {
			slices.Sort(s)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("parseRefs(%s)\n got %+v\nwant %+v", c.expr, got, c.want)
		}
	}
	for _, bad := range []string{``, `histogram_quantle(0.9, x)`, `rate(x[5m]`, `x{a=b}`, `sum by x (y)`, `a, b`} {
		if _, err := parseRefs(bad); err == nil {
			t.Errorf("parseRefs(%s) accepted", bad)
		}
	}
}

func TestTemplateQuery(t *testing.T) {
	for _, c := range []struct{ q, expr, label string }{
		{`label_values(rls_config_info, job)`, "rls_config_info", "job"},
		{` label_values(rls_decisions_total{job=~"$job", instance=~"a,b"}, domain) `, `rls_decisions_total{job=~"$job", instance=~"a,b"}`, "domain"},
		{`label_values(instance)`, "", "instance"},
		{`query_result(count by (hash) (rls_config_info))`, "count by (hash) (rls_config_info)", ""},
	} {
		expr, label, err := templateQuery(c.q)
		if err != nil || expr != c.expr || label != c.label {
			t.Errorf("templateQuery(%s) = %q, %q, %v; want %q, %q", c.q, expr, label, err, c.expr, c.label)
		}
	}
	for _, bad := range []string{`metrics(rls_.*)`, `label_values(rate(x[5m], job)`} {
		if _, _, err := templateQuery(bad); err == nil {
			t.Errorf("templateQuery(%s) accepted", bad)
		}
	}
}

// TestCheckFindsWhatRlsDoesNotExport: the dashboard check can fail.
func TestCheckFindsWhatRlsDoesNotExport(t *testing.T) {
	cat := newCatalog(t, "# TYPE rls_store_up gauge\nrls_store_up 1\n# TYPE rls_decisions_total counter\nrls_decisions_total{outcome=\"ok\"} 3\n")
	for expr, want := range map[string]string{
		`rls_store_up`:                                   "",
		`sum(rate(rls_requests_total[5m]))`:              "metric rls_requests_total is not exported by rls",
		`rls_decisions_total{result="ok"}`:               "label result is not a label of rls_decisions_total",
		`rls_decisions_total{outcome="over"}`:            `no series of rls_decisions_total has outcome="over"`,
		`sum by (rule) (rls_decisions_total)`:            "label rule (grouping or label argument) is not a label",
		`sum(rate(rls_decisions_total[$__rate_interval]`: "PromQL: ",
	} {
		got := strings.Join(cat.check(query{where: "test", expr: expr, vars: true}), "; ")
		if want == "" && got != "" || !strings.Contains(got, want) {
			t.Errorf("check(%s) = %q, want %q", expr, got, want)
		}
	}
}
