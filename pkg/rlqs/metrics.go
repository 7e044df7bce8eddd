package rlqs

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the RLQS server's series. A nil *Metrics records nothing.
type Metrics struct {
	streams, buckets                prometheus.Gauge
	actions                         *prometheus.CounterVec
	reserved, refunded, writtenBack prometheus.Counter
	callsPerReport, reportInterval  prometheus.Histogram
	refused                         *prometheus.CounterVec
}

// NewMetrics registers the RLQS series on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rls_rlqs_streams", Help: "Open StreamRateLimitQuotas streams."}),
		buckets: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rls_rlqs_buckets", Help: "Buckets subscribed over all open streams."}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rls_rlqs_actions_total",
			Help: "Bucket actions sent, by kind: token_bucket, deny_all, allow_all, abandon, expire (TTL 0 on shutdown)."}, []string{"kind"}),
		reserved: prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_reserved_hits_total",
			Help: "Hits consumed from the store for grants before they were sent (their worst case, and the overlap charged at a window boundary)."}),
		refunded: prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_refunded_hits_total",
			Help: "Reserved hits given back because a report proved them unused, in the window they were reserved in."}),
		writtenBack: prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_written_back_hits_total",
			Help: "Hits Envoy reported allowed beyond its grants (its own fallbacks, or shadow rules), added to the counters."}),
		callsPerReport: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rls_rlqs_store_calls_per_report",
			Help: "Store round trips made to process one usage report, whatever its buckets and request counts (the buckets of a report share each round trip; demand sharing calls count one each).", Buckets: []float64{0, 1, 2, 4, 8, 16, 64, 256}}),
		reportInterval: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rls_rlqs_report_interval_seconds",
			Help: "Time between two reports of one bucket on one stream, on rls's clock (the lag of the demand shares follow).", Buckets: []float64{0.5, 1, 2, 5, 6, 10, 30}}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rls_rlqs_refused_total",
			Help: "Streams ended by rls, by reason: too_big, invalid, domain, slow_reader, budget (the streams' memory budget), silent (no report for two intervals), per_connection (refused at open)."}, []string{"reason"}),
	}
	reg.MustRegister(m.streams, m.buckets, m.actions, m.reserved, m.refunded, m.writtenBack, m.callsPerReport, m.reportInterval, m.refused)
	return m
}

func (m *Metrics) action(kind string, n int) {
	if m != nil && n > 0 {
		m.actions.WithLabelValues(kind).Add(float64(n))
	}
}

func (m *Metrics) addStreams(d float64) {
	if m != nil {
		m.streams.Add(d)
	}
}

func (m *Metrics) addBuckets(d float64) {
	if m != nil {
		m.buckets.Add(d)
	}
}

func (m *Metrics) addReserved(n uint64) {
	if m != nil {
		m.reserved.Add(float64(n))
	}
}

func (m *Metrics) addRefunded(n uint64) {
	if m != nil {
		m.refunded.Add(float64(n))
	}
}

func (m *Metrics) addWrittenBack(n uint64) {
	if m != nil {
		m.writtenBack.Add(float64(n))
	}
}

func (m *Metrics) refuse(reason string) {
	if m != nil {
		m.refused.WithLabelValues(reason).Inc()
	}
}
