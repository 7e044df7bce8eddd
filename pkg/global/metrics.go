package global

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The metrics of a table, by domain and rule (bounded by the config, never
// by key), read at scrape time.
var (
	descKeys     = prometheus.NewDesc("rls_global_keys", "Keys of scope: global rules this replica holds shares of.", []string{"region", "domain", "rule"}, nil)
	descShare    = prometheus.NewDesc("rls_global_share", "This region's shares of the current window, summed over the rule's keys.", []string{"region", "domain", "rule"}, nil)
	descDemand   = prometheus.NewDesc("rls_global_demand", "Hits asked of this replica (admitted and denied) per window over the last interval, summed over the rule's keys.", []string{"region", "domain", "rule"}, nil)
	descLease    = prometheus.NewDesc("rls_global_lease_seconds", "Least time left, over the rule's keys, until this region's granted shares end and it decides on its floor.", []string{"region", "domain", "rule"}, nil)
	descAge      = prometheus.NewDesc("rls_global_exchange_age_seconds", "Since the global store last answered this replica's exchange (-1: never).", []string{"region"}, nil)
	descCalls    = prometheus.NewDesc("rls_global_exchange_calls_total", "Calls of the global store's exchange script, per key: a round's publish and its grant.", []string{"region"}, nil)
	descFailures = prometheus.NewDesc("rls_global_exchange_failures_total", "Calls of the exchange script, per key, that failed (the global store unreachable, slow or refusing).", []string{"region"}, nil)
)

// Register adds the table's metrics to reg.
func (t *Table) Register(reg prometheus.Registerer) { reg.MustRegister(collector{t}) }

type collector struct{ t *Table }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descKeys, descShare, descDemand, descLease, descAge, descCalls, descFailures} {
		ch <- d
	}
}

type ruleStats struct {
	keys, share, demand float64
	lease               float64 // seconds; -1 none
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	t := c.t
	region := t.s.Region
	for k, st := range t.stats() {
		ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, st.keys, region, k[0], k[1])
		ch <- prometheus.MustNewConstMetric(descShare, prometheus.GaugeValue, st.share, region, k[0], k[1])
		ch <- prometheus.MustNewConstMetric(descDemand, prometheus.GaugeValue, st.demand, region, k[0], k[1])
		ch <- prometheus.MustNewConstMetric(descLease, prometheus.GaugeValue, st.lease, region, k[0], k[1])
	}
	age := -1.0
	if ok := t.lastOK.Load(); ok != 0 {
		age = t.now().Sub(time.Unix(0, ok)).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(descAge, prometheus.GaugeValue, age, region)
	ch <- prometheus.MustNewConstMetric(descCalls, prometheus.CounterValue, float64(t.calls.Load()), region)
	ch <- prometheus.MustNewConstMetric(descFailures, prometheus.CounterValue, float64(t.failures.Load()), region)
}

// stats returns the table's figures by domain and rule: keys, the shares
// of the current window, the demand, and the least lease left in seconds
// (-1 when no key has a grant).
func (t *Table) stats() map[[2]string]ruleStats {
	now := t.now()
	out := map[[2]string]ruleStats{}
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, e := range t.keys {
		k := [2]string{e.domain, e.rule}
		st, ok := out[k]
		if !ok {
			st.lease = -1
		}
		e.mu.Lock()
		st.keys++
		st.share += float64(t.limitLocked(e, now, span{}))
		st.demand += float64(e.demand)
		if fix := t.clock.Load(); e.granted && fix != nil {
			left := float64((e.leaseEnd+1)*e.window.Microseconds()-now.UnixMicro()-fix.off) / 1e6
			if st.lease < 0 || left < st.lease {
				st.lease = max(left, 0)
			}
		}
		e.mu.Unlock()
		out[k] = st
	}
	return out
}
