package promqlref

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		expr string
		want Refs
	}{
		{
			`sum by (domain, outcome) (rate(rls_decisions_total{job=~"$job", instance=~"$instance", domain=~"$domain"}[$__rate_interval]))`,
			Refs{
				Selectors: []Selector{{Metric: "rls_decisions_total", Matchers: []Matcher{
					{"job", "=~", "$job"}, {"instance", "=~", "$instance"}, {"domain", "=~", "$domain"}}}},
				Grouping: []string{"domain", "outcome"}, By: []string{"domain", "outcome"},
			},
		},
		{
			// by after the arguments; a histogram's le; a number before the vector.
			`histogram_quantile(0.99, sum(rate(rls_decision_duration_seconds_bucket[5m])) by (le, instance)) > 0.02`,
			Refs{
				Selectors: []Selector{{Metric: "rls_decision_duration_seconds_bucket"}},
				Grouping:  []string{"le", "instance"}, By: []string{"le", "instance"},
			},
		},
		{
			// Vector matching, group_left with and without labels, bool, offset, @, a subquery.
			`sum without (kind) (rate(rls_store_errors_total{op="decide"}[5m] offset 1h)) / ignoring(kind) group_left(hash) ` +
				`rls_config_info > bool 1 and on (instance) max_over_time(up[10m:1m] @ end()) unless rls_store_up * on(job) group_right rls_fleet_size`,
			Refs{
				Selectors: []Selector{
					{Metric: "rls_store_errors_total", Matchers: []Matcher{{"op", "=", "decide"}}},
					{Metric: "rls_config_info"}, {Metric: "up"}, {Metric: "rls_store_up"}, {Metric: "rls_fleet_size"}},
				Grouping: []string{"kind", "kind", "hash", "instance", "job"}, Included: []string{"hash"}, Without: true,
			},
		},
		{
			// A selector by __name__ and a quoted (UTF-8 style) name; Inf and NaN are numbers.
			`({__name__="rls_fleet_size", job!="x"} + {"go_goroutines"}) * 1e-3 > -Inf < NaN`,
			Refs{Selectors: []Selector{
				{Metric: "rls_fleet_size", Matchers: []Matcher{{"job", "!=", "x"}}},
				{Metric: "go_goroutines"}}},
		},
		{
			// Label functions: dst is made, src must exist.
			`count_values("n", label_join(label_replace(rls_config_info, "short", "$1", "hash", "(.{8}).*"), "both", "/", "job", "instance"))`,
			Refs{
				Selectors: []Selector{{Metric: "rls_config_info"}},
				LabelArgs: []string{"hash", "job", "instance"}, Defined: []string{"n", "short", "both"},
			},
		},
		{
			`topk(5, sum by (rule) (increase(rls_decisions_total{outcome="over_limit", rule!~"_.*"}[1h30m]))) # a comment`,
			Refs{
				Selectors: []Selector{{Metric: "rls_decisions_total", Matchers: []Matcher{{"outcome", "=", "over_limit"}, {"rule", "!~", "_.*"}}}},
				Grouping:  []string{"rule"}, By: []string{"rule"},
			},
		},
		{
			// Binary keywords before a parenthesis; a subquery without a step.
			`a and (b > 1) or (c) unless (d) atan2 (e) > bool f offset 5m or max_over_time(rate(g[5m])[1h:])`,
			Refs{Selectors: []Selector{{Metric: "a"}, {Metric: "b"}, {Metric: "c"}, {Metric: "d"}, {Metric: "e"}, {Metric: "f"}, {Metric: "g"}}},
		},
		{
			`time() - rls_config_loaded_timestamp_seconds{instance=~"${instance:regex}"} > 3600`,
			Refs{Selectors: []Selector{{Metric: "rls_config_loaded_timestamp_seconds", Matchers: []Matcher{{"instance", "=~", "${instance:regex}"}}}}},
		},
		{
			// Escaped quotes in a value; a label named like a keyword.
			`absent(up{job="rls", on="a\"b"})`,
			Refs{Selectors: []Selector{{Metric: "up", Matchers: []Matcher{{"job", "=", "rls"}, {"on", "=", `a"b`}}}}},
		},
	} {
		got, err := Parse(c.expr)
		if err != nil {
			t.Errorf("Parse(%s): %v", c.expr, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("Parse(%s)\n got %+v\nwant %+v", c.expr, got, c.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ expr, want string }{
		{``, "empty"},
		{`histogram_quantle(0.9, x)`, `unknown function "histogram_quantle"`},
		{`rate(x[5m]`, "unclosed"},
		{`rate(x[5m]))`, "unbalanced )"},
		{`x{a="b"`, "unclosed {"},
		{`x{a=b}`, "not a string"},
		{`x{a=="b"}`, `want =, !=, =~ or !~`},
		{`sum by x (y)`, "without a label list"},
		{`sum by (a b+) (y)`, "in a label list"},
		{`x[5m foo]`, "inside a range"},
		{`x{a="b}`, "unterminated string"},
		{`a, b`, "comma outside a call"},
		{`x ; y`, "unexpected"},
	} {
		_, err := Parse(c.expr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%s) = %v, want an error with %q", c.expr, err, c.want)
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
		expr, label, err := TemplateQuery(c.q)
		if err != nil || expr != c.expr || label != c.label {
			t.Errorf("TemplateQuery(%s) = %q, %q, %v; want %q, %q", c.q, expr, label, err, c.expr, c.label)
		}
	}
	if _, _, err := TemplateQuery(`metrics(rls_.*)`); err == nil {
		t.Error("metrics(...) accepted")
	}
}

func TestValidName(t *testing.T) {
	for s, want := range map[string]bool{"rls_up": true, "job:rls:rate5m": true, "_x": true, "": false, "1x": false, "a-b": false, "é": false} {
		if got := ValidName(s); got != want {
			t.Errorf("ValidName(%q) = %v", s, got)
		}
	}
}
