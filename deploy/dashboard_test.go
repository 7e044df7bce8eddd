package deploy

// The Grafana dashboard and the Prometheus alert rules of deploy/ use only
// series rls exports: a real rls on a real Redis is driven through the
// events that make its labelled series appear (OK and OVER_LIMIT answers,
// the over-limit cache, reloads that succeed and fail, Redis paused then
// killed then restarted: store errors of each kind, fail_open and
// fail_closed fallback, an open breaker, write-backs), its /metrics is
// parsed, and every metric name, label name and label value that a panel,
// a template variable or an alert uses is looked up in it.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
)

const (
	dashboardFile = chartDir + "/files/grafana-dashboard.json"
	rulesFile     = chartDir + "/files/prometheus-rules.yaml"
	// runbookBase is where the rules' runbook_url point: a section of a
	// docs/ page (or the README), by its GitHub anchor.
	runbookBase = "https://github.com/rls-project/rls/blob/main/"
)

// fromPrometheus are the series Prometheus itself makes for every target;
// rls cannot export them.
var fromPrometheus = map[string]string{
	"up": "1 if Prometheus's last scrape of the target succeeded: how RLSDown sees a dead rls",
}

// targetLabels are the labels Prometheus attaches to every series it
// scrapes (from the scrape config and service discovery), on top of those
// in /metrics.
var targetLabels = map[string]string{
	"job":      "the scrape job",
	"instance": "the target's host:port",
}

// notProduced are series rls exports only after an event this test cannot
// make happen, so they are not in its scrape. Every other series the
// dashboard and the rules use is made to appear (or exists from start-up,
// like rls_connections_closed_total{reason="refused_streams"}).
var notProduced = map[string]string{
	"rls_global_exchange_age_seconds": "only with --region (pkg/global's tests scrape it)",
}

// grafanaBuiltins are Grafana's own variables.
var grafanaBuiltins = []string{"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms"}

// dashConfig has a rule for every outcome and failure policy.
const dashConfig = `domain: dash
descriptors:
  - key: tenant
    rate_limit: {name: per-tenant, unit: minute, requests_per_unit: 5}
  - key: closed
    rate_limit: {name: closed, unit: minute, requests_per_unit: 1000000, on_error: fail_closed}
  - key: trial
    shadow_mode: true
    detailed_metric: true
    rate_limit: {name: trial, unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
`

func TestDashboardAndAlertsUseExportedSeries(t *testing.T) {
	t.Parallel()
	start := time.Now()
	dash := loadDashboard(t)
	rules := loadRules(t)
	queries := append(dashboardQueries(t, dash), ruleQueries(rules)...)

	rs := redistest.StartServer(t)
	dir := writeConfig(t, map[string]string{"dash.yaml": dashConfig})
	p := startServing(t, dir, "--store", "redis", "--redis-url", rs.URL())
	c := p.client
	var scrapes []string
	metrics := func() map[string]float64 {
		text := p.scrape(t)
		scrapes = append(scrapes, text)
		return series(text)
	}
	// until waits for an event; if it does not come, the test goes on, so
	// a renamed series fails below with the panels and alerts that use it.
	until := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		began := time.Now()
		if !testkit.EventuallyEvery(within, 50*time.Millisecond, cond) {
			t.Errorf("%s: not within %v", what, within)
			return
		}
		t.Logf("%s: after %v", what, time.Since(began).Round(time.Millisecond))
	}
	call := func(deadline time.Duration, domain string, kv ...string) {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		_, _ = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: dashDescs(kv...)})
	}

	// Redis answers: every outcome, and the over-limit cache.
	for range 8 {
		should(t, c, "dash", desc("tenant", "a"))
	}
	for range 3 {
		should(t, c, "dash", desc("trial", "x"))
	}
	should(t, c, "dash", desc("free", "y"), desc("closed", "z"), desc("nothing", "n"))
	should(t, c, "unknown-domain", desc("tenant", "a"))

	// Reloads: a change, a broken file, the fix.
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, ".tmp"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, ".tmp"), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("dash.yaml", dashConfig+"  - key: extra\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	until("a successful reload", 10*time.Second, func() bool { return metrics()[`rls_config_reloads_total{result="success"}`] >= 1 })
	write("broken.yaml", "domain: broken\ndescriptors:\n  - key: k\n    bogus: true\n")
	until("a failed reload", 10*time.Second, func() bool { return metrics()["rls_config_last_reload_successful"] == 0 })
	if err := os.Remove(filepath.Join(dir, "broken.yaml")); err != nil {
		t.Fatal(err)
	}
	until("a reload after the fix", 10*time.Second, func() bool { return metrics()["rls_config_last_reload_successful"] == 1 })

	// Redis paused: deadlines run out, fail_open and fail_closed rules
	// decide in fallback. (The deadline leaves a starved rls time to
	// answer: one that runs out before rls decides counts nothing.)
	rs.Pause()
	until("fallback decisions of both modes while Redis is paused", 10*time.Second, func() bool {
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() { call(250*time.Millisecond, "dash", "tenant", fmt.Sprint("p", i), "closed", "p") })
		}
		wg.Wait()
		m := metrics()
		return m[`rls_fallback_decisions_total{mode="fail_open"}`] > 0 && m[`rls_fallback_decisions_total{mode="fail_closed"}`] > 0 &&
			m[`rls_store_errors_total{kind="deadline",op="decide"}`] > 0
	})
	// Killed: refused connections, the store's probe fails, the breaker opens.
	rs.Resume()
	rs.Stop()
	until("store down and its breaker open after Redis is killed", 10*time.Second, func() bool {
		call(time.Second, "dash", "tenant", "k")
		m := metrics()
		return strings.HasPrefix(storeUp(m), "0 ") && storeUp(m) != "0 auth" && m[`rls_redis_breaker_state{node="`+rs.Addr+`",state="open"}`] == 1 &&
			m[`rls_store_errors_total{kind="unavailable",op="decide"}`]+m[`rls_store_errors_total{kind="circuit_open",op="decide"}`] > 0
	})
	// Back: the store answers again and the hits admitted locally are
	// written back.
	rs.Restart(t)
	until("store up and write-backs after Redis restarts", 15*time.Second, func() bool {
		call(time.Second, "dash", "tenant", "w")
		m := metrics()
		return storeUp(m) == "1 none" && m[`rls_writeback_hits_total{result="written"}`] > 0
	})
	m := metrics()
	for _, want := range []string{
		`rls_decisions_total{domain="dash",outcome="ok",rule="per-tenant"}`,
		`rls_decisions_total{domain="dash",outcome="over_limit",rule="per-tenant"}`,
		`rls_decisions_total{domain="dash",outcome="shadow_over_limit",rule="trial"}`,
		`rls_checks_total{source="local_cache"}`,
		`rls_config_reloads_total{result="failure"}`,
		`rls_fallback_batches_total{cause="deadline"}`,
	} {
		if m[want] == 0 {
			t.Errorf("the traffic did not make %s count", want)
		}
	}

	cat := newCatalog(t, scrapes...)
	for _, q := range queries {
		for _, problem := range cat.check(q) {
			t.Errorf("%s: %s\n\texpr: %s", q.where, problem, q.expr)
		}
	}
	t.Logf("%d queries (%d from the dashboard, %d alert rules) checked against %d series names of rls's /metrics in %v",
		len(queries), len(queries)-len(rules), len(rules), len(cat), time.Since(start).Round(time.Millisecond))
}

// dashDescs is desc for one or more key, value pairs, one descriptor each.
func dashDescs(kv ...string) []*rlcommon.RateLimitDescriptor {
	var out []*rlcommon.RateLimitDescriptor
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, desc(kv[i], kv[i+1]))
	}
	return out
}

// TestDashboardStructure checks the dashboard is one Grafana imports and
// provisions as intended.
func TestDashboardStructure(t *testing.T) {
	t.Parallel()
	d := loadDashboard(t)
	if d.UID == "" || len(d.UID) > 40 || d.Title == "" || d.SchemaVersion == 0 {
		t.Errorf("uid %q (1 to 40 characters), title %q and schemaVersion %d must be set", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]grafanaVar{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v := vars["datasource"]; v.Type != "datasource" || v.Query != "prometheus" {
		t.Errorf("no $datasource variable of type datasource for prometheus: %+v", v)
	}
	for _, name := range []string{"job", "instance", "domain"} {
		if v, ok := vars[name]; !ok || v.Type != "query" || v.Datasource.UID != "${datasource}" {
			t.Errorf("no $%s query variable on ${datasource}: %+v", name, v)
		}
	}
	ids := map[int]string{}
	var boxes []grafanaPanel
	for _, p := range flatPanels(d.Panels) {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.ID <= 0 || ids[p.ID] != "" {
			t.Errorf("%s: id not unique and positive (also %q)", where, ids[p.ID])
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if p.Type == "" || p.Title == "" || g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("%s: needs a type, a title and a gridPos within 24 columns: %+v", where, p)
		}
		for _, o := range boxes {
			if g.X < o.GridPos.X+o.GridPos.W && o.GridPos.X < g.X+g.W && g.Y < o.GridPos.Y+o.GridPos.H && o.GridPos.Y < g.Y+g.H {
				t.Errorf("%s overlaps panel %d %q", where, o.ID, o.Title)
			}
		}
		boxes = append(boxes, p)
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("%s: datasource %+v, want uid ${datasource}", where, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no targets", where)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" || refs[tg.RefID] || tg.Datasource.UID != "${datasource}" {
				t.Errorf("%s target %q: needs an expr, a unique refId and datasource uid ${datasource}: %+v", where, tg.RefID, tg)
			}
			refs[tg.RefID] = true
		}
	}
}

// TestAlertRulesStructure checks the rules file is a rule file Prometheus
// and the Prometheus Operator load, each alert with what on-call needs.
func TestAlertRulesStructure(t *testing.T) {
	t.Parallel()
	rules := loadRules(t)
	if len(rules) == 0 {
		t.Fatal("no rules")
	}
	seen := map[string]bool{}
	forRE := regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)
	for _, r := range rules {
		where := "alert " + r.Alert
		if r.Alert == "" || seen[r.Alert] || !regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`).MatchString(r.Alert) {
			t.Errorf("%s (group %s): an alert needs a unique CamelCase name", where, r.group)
		}
		seen[r.Alert] = true
		if strings.TrimSpace(r.Expr) == "" || !forRE.MatchString(r.For) {
			t.Errorf("%s: needs an expr and a for duration (for %q)", where, r.For)
		}
		if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
			t.Errorf("%s: labels.severity %q, want critical, warning or info", where, s)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: needs annotations summary and description", where)
		}
		page, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookBase)
		file, anchor, _ := strings.Cut(page, "#")
		if !ok || (file != "README.md" && !strings.HasPrefix(file, "docs/")) {
			t.Errorf("%s: runbook_url %q is not a page under %s", where, r.Annotations["runbook_url"], runbookBase)
			continue
		}
		if anchors := docAnchors(t, "../"+file); !anchors[anchor] {
			t.Errorf("%s: runbook_url %q: %s has no section with anchor %q (%v)",
				where, r.Annotations["runbook_url"], file, anchor, slices.Sorted(maps.Keys(anchors)))
		}
	}
}

// --- The dashboard and the rules as files.

type grafanaDS struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type grafanaTarget struct {
	RefID        string    `json:"refId"`
	Expr         string    `json:"expr"`
	LegendFormat string    `json:"legendFormat"`
	Datasource   grafanaDS `json:"datasource"`
}

type grafanaPanel struct {
	ID         int       `json:"id"`
	Type       string    `json:"type"`
	Title      string    `json:"title"`
	Datasource grafanaDS `json:"datasource"`
	GridPos    struct {
		H int `json:"h"`
		W int `json:"w"`
		X int `json:"x"`
		Y int `json:"y"`
	} `json:"gridPos"`
	Targets []grafanaTarget `json:"targets"`
	Panels  []grafanaPanel  `json:"panels"` // a collapsed row's
}

type grafanaVar struct {
	Name       string    `json:"name"`
	Type       string    `json:"type"`
	Datasource grafanaDS `json:"datasource"`
	Query      any       `json:"query"` // a string, or {"query": "..."}
}

type dashboard struct {
	UID           string         `json:"uid"`
	Title         string         `json:"title"`
	SchemaVersion int            `json:"schemaVersion"`
	Panels        []grafanaPanel `json:"panels"`
	Templating    struct {
		List []grafanaVar `json:"list"`
	} `json:"templating"`
}

func loadDashboard(t *testing.T) *dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return &d
}

// flatPanels returns the panels with those of collapsed rows.
func flatPanels(ps []grafanaPanel) []grafanaPanel {
	var out []grafanaPanel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flatPanels(p.Panels)...)
	}
	return out
}

// Query returns a variable's query text.
func (v grafanaVar) query() string {
	switch q := v.Query.(type) {
	case string:
		return q
	case map[string]any:
		s, _ := q["query"].(string)
		return s
	}
	return ""
}

type alertRule struct {
	group       string
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// loadRules parses the rules file strictly (an unknown key is an error)
// and returns its rules.
func loadRules(t *testing.T) []alertRule {
	t.Helper()
	f, err := os.Open(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var file struct {
		Groups []struct {
			Name     string      `yaml:"name"`
			Interval string      `yaml:"interval"`
			Rules    []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var out []alertRule
	for _, g := range file.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("%s: group %q needs a name and rules", rulesFile, g.Name)
		}
		for _, r := range g.Rules {
			r.group = g.Name
			out = append(out, r)
		}
	}
	return out
}

// docAnchors returns the GitHub anchors of a Markdown file's headings.
func docAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			h = strings.ToLower(strings.TrimSpace(strings.TrimLeft(h, "#")))
			var a strings.Builder
			for _, r := range h {
				switch {
				case r == ' ':
					a.WriteRune('-')
				case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
					a.WriteRune(r)
				}
			}
			out[a.String()] = true
		}
	}
	return out
}

// --- What the queries use.

// query is one PromQL expression and the labels shown from its result.
type query struct {
	where string
	expr  string
	shows []string // labels of the result a legend or an annotation shows
	vars  bool     // may use Grafana variables
}

var (
	legendLabelRE     = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	annotationLabelRE = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)|index \$labels "([^"]*)"`)
	variableRE        = regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)`)
	// literalAlternation is a regular expression that only lists values.
	literalAlternation = regexp.MustCompile(`^[a-zA-Z0-9_]+(\|[a-zA-Z0-9_]+)+$`)
)

func dashboardQueries(t *testing.T, d *dashboard) []query {
	var out []query
	defined := slices.Clone(grafanaBuiltins)
	for _, v := range d.Templating.List {
		defined = append(defined, v.Name)
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		where := fmt.Sprintf("dashboard variable $%s", v.Name)
		expr, label, err := templateQuery(v.query())
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		if expr == "" {
			expr = `{__name__=~".+"}` // label_values(label): any series
		}
		out = append(out, query{where: where, expr: expr, shows: []string{label}, vars: true})
	}
	for _, p := range flatPanels(d.Panels) {
		for _, tg := range p.Targets {
			q := query{where: fmt.Sprintf("dashboard panel %d %q target %s", p.ID, p.Title, tg.RefID), expr: tg.Expr, vars: true}
			for _, m := range legendLabelRE.FindAllStringSubmatch(tg.LegendFormat, -1) {
				q.shows = append(q.shows, m[1])
			}
			out = append(out, q)
		}
	}
	for _, q := range out {
		for _, m := range variableRE.FindAllStringSubmatch(q.expr, -1) {
			if !slices.Contains(defined, m[1]) {
				t.Errorf("%s: variable $%s is not defined in the dashboard's templating", q.where, m[1])
			}
		}
	}
	return out
}

func ruleQueries(rules []alertRule) []query {
	var out []query
	for _, r := range rules {
		q := query{where: "alert " + r.Alert, expr: r.Expr}
		for _, text := range r.Annotations {
			for _, m := range annotationLabelRE.FindAllStringSubmatch(text, -1) {
				q.shows = append(q.shows, m[1]+m[2])
			}
		}
		slices.Sort(q.shows)
		out = append(out, q)
	}
	return out
}

// --- What rls exports.

// catalog maps each series name rls exports (a histogram's _bucket, _sum
// and _count, a summary's quantiles, _sum and _count) to its labels and
// their values.
type catalog map[string]map[string]map[string]bool

func newCatalog(t *testing.T, scrapes ...string) catalog {
	t.Helper()
	c := catalog{}
	add := func(name string, labels []*dto.LabelPair, extra string, values ...string) {
		if c[name] == nil {
			c[name] = map[string]map[string]bool{}
		}
		put := func(l, v string) {
			if c[name][l] == nil {
				c[name][l] = map[string]bool{}
			}
			c[name][l][v] = true
		}
		for _, l := range labels {
			put(l.GetName(), l.GetValue())
		}
		for _, v := range values {
			put(extra, v)
		}
	}
	float := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
	for _, text := range scrapes {
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			t.Fatalf("parse /metrics: %v", err)
		}
		for name, f := range fams {
			for _, m := range f.GetMetric() {
				switch f.GetType() {
				case dto.MetricType_HISTOGRAM:
					les := []string{"+Inf"}
					for _, b := range m.GetHistogram().GetBucket() {
						les = append(les, float(b.GetUpperBound()))
					}
					add(name+"_bucket", m.GetLabel(), "le", les...)
					add(name+"_sum", m.GetLabel(), "")
					add(name+"_count", m.GetLabel(), "")
				case dto.MetricType_SUMMARY:
					var qs []string
					for _, q := range m.GetSummary().GetQuantile() {
						qs = append(qs, float(q.GetQuantile()))
					}
					add(name, m.GetLabel(), "quantile", qs...)
					add(name+"_sum", m.GetLabel(), "")
					add(name+"_count", m.GetLabel(), "")
				default:
					add(name, m.GetLabel(), "")
				}
			}
		}
	}
	return c
}

// labelsOf returns the labels a series of metric may have, target labels
// included, and whether the metric is known.
func (c catalog) labelsOf(metric string) (map[string]map[string]bool, bool) {
	out := map[string]map[string]bool{}
	for l := range targetLabels {
		out[l] = nil // any value
	}
	if _, ok := fromPrometheus[metric]; ok {
		return out, true
	}
	ls, ok := c[metric]
	maps.Copy(out, ls)
	return out, ok
}

// check returns what q uses that rls does not export.
func (c catalog) check(q query) []string {
	refs, err := parseRefs(q.expr)
	if err != nil {
		return []string{"PromQL: " + err.Error()}
	}
	var problems []string
	if !q.vars && strings.Contains(q.expr, "$") {
		problems = append(problems, "a Grafana variable in an alert rule")
	}
	// Every label any of the expression's series may have.
	all := map[string]bool{}
	for l := range targetLabels {
		all[l] = true
	}
	for _, l := range refs.Defined {
		all[l] = true
	}
	for _, s := range refs.Selectors {
		if s.Metric == "" {
			if len(s.Matchers) == 1 && s.Matchers[0].Label == "__name__" && s.Matchers[0].Value == ".+" {
				for _, ls := range c { // label_values(label): any series
					for l := range ls {
						all[l] = true
					}
				}
				continue
			}
			problems = append(problems, "a selector without a metric name")
			continue
		}
		if _, ok := notProduced[s.Metric]; ok {
			continue
		}
		labels, ok := c.labelsOf(s.Metric)
		if !ok {
			msg := fmt.Sprintf("metric %s is not exported by rls", s.Metric)
			if _, hist := c[s.Metric+"_bucket"]; hist {
				msg += " (a histogram: use its _bucket, _sum or _count)"
			}
			problems = append(problems, msg)
			continue
		}
		for l := range labels {
			all[l] = true
		}
		for _, m := range s.Matchers {
			values, ok := labels[m.Label]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("label %s is not a label of %s (it has %s)", m.Label, s.Metric, joinKeys(labels)))
			case values == nil || strings.Contains(m.Value, "$") || m.Op == "!=" || m.Op == "!~":
				// A target label, a variable, or a negative match: any value.
			default:
				problems = append(problems, valueProblems(s.Metric, m, values)...)
			}
		}
	}
	for _, l := range append(slices.Clone(refs.Grouping), refs.LabelArgs...) {
		if !all[l] {
			problems = append(problems, fmt.Sprintf("label %s (grouping or label argument) is not a label of %s", l, strings.Join(refs.Metrics(), ", ")))
		}
	}
	// What the result can show: an aggregation's by labels (and those
	// group_left/right copies), else the series' own labels.
	out := all
	if len(refs.By) > 0 && !refs.Without {
		out = map[string]bool{}
		for _, l := range slices.Concat(refs.By, refs.Included, refs.Defined) {
			out[l] = true
		}
	}
	for _, l := range q.shows {
		if !out[l] {
			problems = append(problems, fmt.Sprintf("shows label %s, which the result does not have (it has %s)", l, joinKeys(out)))
		}
	}
	var unique []string // a metric used twice is reported once
	for _, p := range problems {
		if !slices.Contains(unique, p) {
			unique = append(unique, p)
		}
	}
	return unique
}

// valueProblems returns the values m asks for that no series has: the
// value of an = matcher, each value a =~ matcher lists ("open|half_open"),
// or a =~ pattern that matches none.
func valueProblems(metric string, m pqMatcher, values map[string]bool) []string {
	patterns := []string{m.Value}
	switch {
	case m.Op == "=":
		patterns = []string{regexp.QuoteMeta(m.Value)}
	case literalAlternation.MatchString(m.Value):
		patterns = strings.Split(m.Value, "|")
	}
	var out []string
	for _, p := range patterns {
		re, err := regexp.Compile("^(?:" + p + ")$")
		if err != nil {
			out = append(out, fmt.Sprintf("%s%s%q: %v", m.Label, m.Op, m.Value, err))
			continue
		}
		if !slices.ContainsFunc(slices.Collect(maps.Keys(values)), re.MatchString) {
			if m.Op == "=" {
				p = m.Value
			}
			out = append(out, fmt.Sprintf("no series of %s has %s%s%q (its values: %s)", metric, m.Label, m.Op, p, joinKeys(values)))
		}
	}
	return out
}

func joinKeys[V any](m map[string]V) string {
	return strings.Join(slices.Sorted(maps.Keys(m)), ", ")
}
