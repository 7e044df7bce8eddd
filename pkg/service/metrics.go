package service

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

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
// on its registry and resolved per rule when a config is set, so the
// decision path looks nothing up by name.
type Metrics struct {
	decisions   *prometheus.CounterVec
	detailed    *prometheus.CounterVec
	latency     prometheus.Histogram
	panics      prometheus.Counter
	invalid     prometheus.Counter
	maxDetailed int
}

// NewMetrics registers the service's series on reg. maxDetailed caps the
// distinct descriptor values counted per detailed_metric rule; later values
// are counted under value="_other".
func NewMetrics(reg prometheus.Registerer, maxDetailed int) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_decisions_total",
			Help: "Descriptor decisions by domain, rule (its name, else its path in the YAML) and outcome.",
		}, []string{"domain", "rule", "outcome"}),
		detailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_detailed_decisions_total",
			Help: "Decisions of detailed_metric rules by descriptor value (capped per rule; the rest under value=\"_other\").",
		}, []string{"domain", "rule", "value", "outcome"}),
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
			Help: "Requests rejected as invalid (InvalidArgument): malformed, or beyond the --max-* bounds.",
		}),
		maxDetailed: maxDetailed,
	}
	reg.MustRegister(m.decisions, m.detailed, m.latency, m.panics, m.invalid)
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

// stats holds one config's resolved series. A nil *stats records nothing.
type stats struct {
	m        *Metrics
	rules    map[*descriptors.Rule]*ruleStats
	domains  map[string]*ruleStats // per domain: no_rule and override counters
	override map[string]*ruleStats
	unknown  *ruleStats
}

type ruleStats struct {
	domain, rule string
	out          [numOutcomes]prometheus.Counter
	detail       *detailSet // nil unless detailed_metric
}

// detailSet remembers the values a detailed rule has counted, up to the cap.
type detailSet struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

func (m *Metrics) resolve(domain, rule string, detailed bool) *ruleStats {
	rs := &ruleStats{domain: domain, rule: rule}
	for o := range numOutcomes {
		rs.out[o] = m.decisions.WithLabelValues(domain, rule, o.String())
	}
	if detailed {
		rs.detail = &detailSet{seen: map[string]struct{}{}}
	}
	return rs
}

// statsFor resolves the series of every rule of cfg.
func (m *Metrics) statsFor(cfg *descriptors.Config) *stats {
	if m == nil {
		return nil
	}
	st := &stats{m: m, rules: map[*descriptors.Rule]*ruleStats{}, domains: map[string]*ruleStats{},
		override: map[string]*ruleStats{}, unknown: m.resolve(unknownDomain, "", false)}
	for _, d := range cfg.Domains() {
		st.domains[d] = m.resolve(d, "", false)
		st.override[d] = m.resolve(d, overrideRule, false)
	}
	for _, r := range cfg.Rules() {
		st.rules[r] = m.resolve(r.Domain, ruleLabel(r), r.DetailedMetric || r.ValueToMetric())
	}
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
	var rs *ruleStats
	switch {
	case r == nil:
		if rs = st.domains[domain]; rs == nil {
			rs = st.unknown
		}
	case r.Override:
		if rs = st.override[domain]; rs == nil {
			rs = st.unknown
		}
	default:
		if rs = st.rules[r]; rs == nil {
			rs = st.unknown
		}
	}
	rs.out[o].Inc()
	if rs.detail != nil {
		st.m.detailed.WithLabelValues(rs.domain, rs.rule, rs.detail.value(entries(), st.m.maxDetailed), o.String()).Inc()
	}
}

// value returns v if it is one of the first max values seen, else "_other".
func (d *detailSet) value(v string, max int) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.seen[v]; ok {
		return v
	}
	if len(d.seen) >= max {
		return otherValue
	}
	d.seen[v] = struct{}{}
	return v
}
