package service

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/rls-project/rls/pkg/descriptors"
)

// Outcome is what a decision meant for one descriptor, as metrics count it.
type Outcome uint8

// The outcomes, each a value of the outcome label of rls_decisions_total.
const (
	OutcomeOK              Outcome = iota // allowed, below the near-limit threshold
	OutcomeNearLimit                      // allowed, with 80% or more of the limit used
	OutcomeOverLimit                      // denied
	OutcomeShadowOverLimit                // over a shadow-mode limit: reported, not denied
	OutcomeUnlimited                      // matched an unlimited rule
	OutcomeNoRule                         // matched no rule
	OutcomeQuotaOverLimit                 // over a quota_mode limit: denies only with every quota descriptor over
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"ok", "near_limit", "over_limit", "shadow_over_limit", "unlimited", "no_rule", "quota_over_limit"}

// String returns the outcome's label value.
func (o Outcome) String() string { return outcomeNames[o] }

// Label values that stand for many: requests for domains the config does not
// have, override rules, and detailed values beyond a rule's cap.
const (
	unknownDomain = "_unknown"
	overrideRule  = "_override"
	otherValue    = "_other"
)

// Metrics are the service's Prometheus series. They are made once in main
// on its registry, for one Service.
//
// The decision series (rls_decisions_total, rls_detailed_decisions_total)
// follow the config: SetConfig resolves each rule's counters once, so the
// decision path looks nothing up by name; a rule that a new config keeps
// (same domain, same rule label) keeps its counts, and its detailed values
// and their cap; the series of rules and domains that left the config are
// gone from the next scrape. A series appears with its first decision, so
// a config of 100,000 rules costs a scrape only the series its traffic
// made, and a rule has at most three (ok, near_limit and one kind of over).
type Metrics struct {
	decisions, detailed *prometheus.Desc
	latency             prometheus.Histogram
	panics              prometheus.Counter
	invalid             prometheus.Counter
	maxDetailed         int

	mu     sync.Mutex                   // serialises statsFor
	byKey  map[seriesKey]*ruleStats     // the series of the config last set
	domLPs map[string]*dto.LabelPair    // their domains' label pairs
	series atomic.Pointer[[]*ruleStats] // the same, by domain and rule: what a scrape walks
}

// NewMetrics registers the service's series on reg. maxDetailed caps the
// distinct descriptor values counted per detailed_metric rule; later values
// are counted under value="_other".
func NewMetrics(reg prometheus.Registerer, maxDetailed int) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewDesc("rls_decisions_total",
			"Descriptor decisions by domain, rule (its name, else its path in the YAML) and outcome.",
			[]string{"domain", "rule", "outcome"}, nil),
		detailed: prometheus.NewDesc("rls_detailed_decisions_total",
			"Decisions of detailed_metric rules by descriptor value (capped per rule; the rest under value=\"_other\").",
			[]string{"domain", "rule", "value", "outcome"}, nil),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rls_decision_duration_seconds",
			Help:    "Time to answer one ShouldRateLimit call, from request to response.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .02, .05, .1},
		}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_panics_total",
			Help: "Panics recovered in gRPC handlers (each answered with codes.Internal).",
		}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_invalid_requests_total",
			Help: "Requests rejected as invalid (InvalidArgument): malformed, or beyond the request bounds.",
		}),
		maxDetailed: maxDetailed,
	}
	reg.MustRegister(decisionCollector{m}, m.latency, m.panics, m.invalid)
	return m
}

// Panic counts a recovered panic.
func (m *Metrics) Panic() {
	if m != nil {
		m.panics.Inc()
	}
}

// Invalid counts a request rejected as invalid.
func (m *Metrics) Invalid() {
	if m != nil {
		m.invalid.Inc()
	}
}

// seriesKey is the labels of a rule's series but the outcome.
type seriesKey struct{ domain, rule string }

// ruleStats counts the decisions of one seriesKey, by outcome.
type ruleStats struct {
	seriesKey
	out    [numOutcomes]atomic.Uint64
	detail atomic.Pointer[detailSet] // nil unless a rule of these labels is detailed
	domLP  *dto.LabelPair            // shared by the domain's ruleStats; set once
	ruleLP dto.LabelPair             // set once
}

// detailSet counts a detailed rule's decisions by value: the first max
// values seen, then the rest under "_other".
type detailSet struct {
	mu     sync.Mutex
	values map[string]*detailValue
	other  *detailValue
}

type detailValue struct {
	value string
	lp    dto.LabelPair
	out   [numOutcomes]atomic.Uint64
}

func newDetailValue(v string) *detailValue {
	d := &detailValue{value: v}
	d.lp = dto.LabelPair{Name: &labelValue, Value: &d.value}
	return d
}

// Label names, for the label pairs of a scrape.
var (
	labelDomain, labelOutcome, labelRule, labelValue = "domain", "outcome", "rule", "value"
	outcomeLPs                                       [numOutcomes]*dto.LabelPair
)

func init() {
	for o := range numOutcomes {
		outcomeLPs[o] = &dto.LabelPair{Name: &labelOutcome, Value: &outcomeNames[o]}
	}
}

// count counts one decision of value v with outcome o.
func (d *detailSet) count(v string, o Outcome, max int) {
	d.mu.Lock()
	dv := d.values[v]
	if dv == nil {
		if v == otherValue || len(d.values) >= max {
			if d.other == nil {
				d.other = newDetailValue(otherValue)
			}
			dv = d.other
		} else {
			dv = newDetailValue(v)
			d.values[v] = dv
		}
	}
	d.mu.Unlock()
	dv.out[o].Add(1)
}

// sorted returns the set's values in label order.
func (d *detailSet) sorted() []*detailValue {
	d.mu.Lock()
	out := make([]*detailValue, 0, len(d.values)+1)
	for _, v := range d.values {
		out = append(out, v)
	}
	if d.other != nil {
		out = append(out, d.other)
	}
	d.mu.Unlock()
	slices.SortFunc(out, func(a, b *detailValue) int { return cmp.Compare(a.value, b.value) })
	return out
}

// stats holds one config's resolved series. A nil *stats records nothing.
type stats struct {
	m        *Metrics
	rules    map[*descriptors.Rule]ruleRef
	domains  map[string]*ruleStats // per domain: no_rule
	override map[string]*ruleStats // per domain: override rules
	unknown  *ruleStats
}

// ruleRef is a rule's series and whether the rule counts by value.
type ruleRef struct {
	rs       *ruleStats
	detailed bool
}

// statsFor resolves the series of every rule of cfg, keeping those of the
// config in force that cfg keeps, and makes them the series a scrape
// exports.
func (m *Metrics) statsFor(cfg *descriptors.Config) *stats {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	next := make(map[seriesKey]*ruleStats, len(cfg.Rules())+2*len(cfg.Domains())+1)
	detailed := map[*ruleStats]bool{}
	domLPs := map[string]*dto.LabelPair{}
	domLP := func(domain string) *dto.LabelPair {
		lp := domLPs[domain]
		if lp == nil {
			if lp = m.domLPs[domain]; lp == nil {
				lp = &dto.LabelPair{Name: &labelDomain, Value: &domain}
			}
			domLPs[domain] = lp
		}
		return lp
	}
	get := func(domain, rule string) *ruleStats {
		k := seriesKey{printable(domain), printable(rule)}
		rs := next[k]
		if rs == nil {
			if rs = m.byKey[k]; rs == nil {
				rs = &ruleStats{seriesKey: k, domLP: domLP(k.domain)}
				rs.ruleLP = dto.LabelPair{Name: &labelRule, Value: &rs.rule}
			}
			domLP(k.domain) // kept for the next config
			next[k] = rs
		}
		return rs
	}
	st := &stats{m: m, rules: make(map[*descriptors.Rule]ruleRef, len(cfg.Rules())), domains: map[string]*ruleStats{},
		override: map[string]*ruleStats{}, unknown: get(unknownDomain, "")}
	for _, d := range cfg.Domains() {
		st.domains[d] = get(d, "")
		st.override[d] = get(d, overrideRule)
	}
	for _, r := range cfg.Rules() {
		rs := get(r.Domain, ruleLabel(r))
		det := r.DetailedMetric || r.ValueToMetric()
		st.rules[r] = ruleRef{rs: rs, detailed: det}
		detailed[rs] = detailed[rs] || det
	}
	list := make([]*ruleStats, 0, len(next))
	for _, rs := range next {
		// The values counted so far, and so the cap, stay with the rule.
		if !detailed[rs] {
			rs.detail.Store(nil)
		} else if rs.detail.Load() == nil {
			rs.detail.Store(&detailSet{values: map[string]*detailValue{}})
		}
		list = append(list, rs)
	}
	slices.SortFunc(list, func(a, b *ruleStats) int {
		return cmp.Or(cmp.Compare(a.domain, b.domain), cmp.Compare(a.rule, b.rule))
	})
	m.byKey, m.domLPs = next, domLPs
	m.series.Store(&list)
	return st
}

// ruleLabel names a rule in metrics: its name, else its path in the YAML.
func ruleLabel(r *descriptors.Rule) string {
	if r.Name != "" {
		return r.Name
	}
	return r.Path
}

// record counts one descriptor's outcome. r is nil for no_rule.
func (st *stats) record(domain string, r *descriptors.Rule, o Outcome, entries func() string) {
	if st == nil {
		return
	}
	var ref ruleRef
	switch {
	case r == nil:
		ref.rs = st.domains[domain]
	case r.Override:
		ref.rs = st.override[domain]
	default:
		ref = st.rules[r]
	}
	if ref.rs == nil {
		ref.rs = st.unknown
	}
	ref.rs.out[o].Add(1)
	if ref.detailed {
		if d := ref.rs.detail.Load(); d != nil {
			d.count(entries(), o, st.m.maxDetailed)
		}
	}
}

// decisionCollector exports the decision series of the config in force.
// It emits them in label order (domain, outcome, rule, value), which the
// registry's sort of a family then finds sorted.
type decisionCollector struct{ m *Metrics }

func (c decisionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.m.decisions
	ch <- c.m.detailed
}

func (c decisionCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.m.series.Load()
	if p == nil {
		return
	}
	list := *p
	for i := 0; i < len(list); {
		j := i + 1
		for j < len(list) && list[j].domain == list[i].domain {
			j++
		}
		c.collectDomain(ch, list[i:j])
		i = j
	}
}

// collectDomain emits the series of one domain's ruleStats.
func (c decisionCollector) collectDomain(ch chan<- prometheus.Metric, block []*ruleStats) {
	type detailRows struct {
		rs     *ruleStats
		values []*detailValue
	}
	var details []detailRows
	for _, rs := range block {
		if d := rs.detail.Load(); d != nil {
			details = append(details, detailRows{rs, d.sorted()})
		}
	}
	for o := range numOutcomes {
		for _, rs := range block {
			if n := rs.out[o].Load(); n > 0 {
				ch <- counter{c.m.decisions, []*dto.LabelPair{rs.domLP, outcomeLPs[o], &rs.ruleLP}, n}
			}
		}
	}
	for o := range numOutcomes {
		for _, d := range details {
			for _, v := range d.values {
				if n := v.out[o].Load(); n > 0 {
					ch <- counter{c.m.detailed, []*dto.LabelPair{d.rs.domLP, outcomeLPs[o], &d.rs.ruleLP, &v.lp}, n}
				}
			}
		}
	}
}

// counter is one series of a scrape: labels sorted by name.
type counter struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	n      uint64
}

func (c counter) Desc() *prometheus.Desc { return c.desc }

func (c counter) Write(out *dto.Metric) error {
	v := float64(c.n)
	out.Label = c.labels
	out.Counter = &dto.Counter{Value: &v}
	return nil
}
