package telemetry

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/pkg/breaker"
	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/reload"
)

// LimiterState is what RegisterLimiter reads of the limiter at scrape time
// (pkg/limiter's Limiter).
type LimiterState interface {
	Counters() limiter.Counters
	Count(limiter.Source) uint64
	Tables() [3]limiter.Table
}

// RegisterLimiter exposes the limiter's state and the fleet's size on reg,
// read at scrape time: the checks by source, the fallback decisions and
// their causes, the write-backs and refunds, the fleet size and the local
// tables.
func RegisterLimiter(reg prometheus.Registerer, lim LimiterState, fleetSize func() int) {
	counter := func(name, help string, labels prometheus.Labels, v func(limiter.Counters) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(v(lim.Counters())) })
	}
	src := func(s limiter.Source) func() float64 {
		return func() float64 { return float64(lim.Count(s)) }
	}
	const fallbackHelp = "Checks decided without the store because it could not answer, by mode."
	const writebackHelp = "Hits admitted locally while the store could not answer, then written back to it."
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rls_fallback_decisions_total", Help: fallbackHelp,
			ConstLabels: prometheus.Labels{"mode": "fail_open"}}, src(limiter.FromFailOpen)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rls_fallback_decisions_total", Help: fallbackHelp,
			ConstLabels: prometheus.Labels{"mode": "fail_closed"}}, src(limiter.FromFailClosed)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rls_local_cache_hits_total", Help: "Checks denied by the local over-limit cache without a store call."},
			src(limiter.FromCache)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rls_fleet_size", Help: "Replicas sharing the limits, as used for the fail-open share."},
			func() float64 { return float64(fleetSize()) }),
		counter("rls_writeback_hits_total", writebackHelp, prometheus.Labels{"result": "written"},
			func(c limiter.Counters) uint64 { return c.WrittenBack }),
		counter("rls_writeback_hits_total", writebackHelp, prometheus.Labels{"result": "lost"},
			func(c limiter.Counters) uint64 { return c.WriteBackLost }),
		counter("rls_store_protocol_errors_total", "Store answers rls could not use (a script error, a reply of the wrong shape): bugs, answered with codes.Internal, never a fallback.",
			nil, func(c limiter.Counters) uint64 { return c.ProtocolErrors }),
	)
	for result, n := range map[string]func(limiter.Counters) uint64{
		"refunded": func(c limiter.Counters) uint64 { return c.Undone },
		"retried":  func(c limiter.Counters) uint64 { return c.UndoRetried },
		"lost":     func(c limiter.Counters) uint64 { return c.UndoLost },
		"unknown":  func(c limiter.Counters) uint64 { return c.UndoUnknown },
	} {
		reg.MustRegister(counter("rls_undo_refunds_total", "Checks the store consumed for a request denied after all (another Cluster slot, the fallback or its quotas denied it), by what became of their refund: refunded, retried (not at once), lost (never), unknown (the call timed out after it may have been sent: not refunded).",
			prometheus.Labels{"result": result}, n))
	}
	for result, n := range map[string]func(limiter.Counters) uint64{
		"used":     func(c limiter.Counters) uint64 { return c.ReservedUsed },
		"returned": func(c limiter.Counters) uint64 { return c.ReservedReturned },
		"expired":  func(c limiter.Counters) uint64 { return c.ReservedExpired },
	} {
		reg.MustRegister(counter("rls_reserved_hits_total", "Hits of leases: counted in the store ahead of a key's requests, by what became of them: used (admitted requests), returned (unused, refunded in their window), expired (unused when their window ended, their rule changed or their refund failed).",
			prometheus.Labels{"result": result}, n))
	}
	for _, s := range limiter.Sources {
		reg.MustRegister(counter("rls_checks_total", "Checks (one per counted descriptor) by where their result came from: store, local_cache, fail_open, fail_closed, reserved (a slice of hits reserved in the store).",
			prometheus.Labels{"source": s.String()}, func(c limiter.Counters) uint64 { return c.Sources[s] }))
	}
	for _, c := range limiter.Causes {
		reg.MustRegister(counter("rls_fallback_batches_total", "Requests decided without the store, by cause: deadline (the caller's deadline or the store timeout ran out), unavailable (an error), circuit_open.",
			prometheus.Labels{"cause": c.String()}, func(n limiter.Counters) uint64 { return n.Causes[c] }))
	}
	reg.MustRegister(&tablesCollector{lim: lim})
}

// tablesCollector reports the limiter's local tables, read once per scrape.
type tablesCollector struct{ lim LimiterState }

var (
	tableEntriesDesc = prometheus.NewDesc("rls_local_table_entries",
		"Entries of each local table: last_answers (what the store last said per key: the over-limit cache and fail-open seeds), fail_open_buckets, write_backs (keys whose locally admitted hits wait for write-back).",
		[]string{"table"}, nil)
	tableBytesDesc = prometheus.NewDesc("rls_local_table_bytes",
		"Bytes each local table's entries count against its share of the local tables' byte cap (key length plus a per-entry overhead).",
		[]string{"table"}, nil)
	tableEvictionsDesc = prometheus.NewDesc("rls_local_table_evictions_total",
		"Least recently used entries dropped from a local table at its share of the local tables' byte cap (write_backs never evicts: see rls_writeback_hits_total{result=\"lost\"}).",
		[]string{"table"}, nil)
)

func (c *tablesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- tableEntriesDesc
	ch <- tableBytesDesc
	ch <- tableEvictionsDesc
}

func (c *tablesCollector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.lim.Tables() {
		ch <- prometheus.MustNewConstMetric(tableEntriesDesc, prometheus.GaugeValue, float64(t.Entries), t.Name)
		ch <- prometheus.MustNewConstMetric(tableBytesDesc, prometheus.GaugeValue, float64(t.Bytes), t.Name)
		if t.Evictions >= 0 {
			ch <- prometheus.MustNewConstMetric(tableEvictionsDesc, prometheus.CounterValue, float64(t.Evictions), t.Name)
		}
	}
}

// Breakers reports each Redis node's circuit breaker state, the node
// outside cluster mode named "" (the Redis store).
type Breakers interface {
	BreakerStates() map[string]breaker.State
}

// RegisterBreakers exposes each Redis node's circuit breaker state as
// rls_redis_breaker_state, the node outside cluster mode named addr.
func RegisterBreakers(reg prometheus.Registerer, st Breakers, addr string) {
	reg.MustRegister(&breakerCollector{st: st, addr: addr, desc: prometheus.NewDesc("rls_redis_breaker_state",
		"1 for the current state of each Redis node's circuit breaker, by node address (outside cluster mode, --redis-url's).",
		[]string{"node", "state"}, nil)})
}

// ScriptModes counts the Redis nodes running decide.lua in each mode; its
// map has every mode as a key, counted or not (the Redis store).
type ScriptModes interface {
	ScriptModes() map[string]int
}

// RegisterScriptMode exposes how many Redis nodes run decide.lua as a
// Function library (FCALL) and how many as a script (EVALSHA, where
// FUNCTION is missing or refused), as rls_redis_script_mode{mode}: outside
// cluster mode, 1 for the mode in use. The modes are the keys of
// st.ScriptModes() when it registers.
func RegisterScriptMode(reg prometheus.Registerer, st ScriptModes) {
	const help = "Redis nodes running the decision script in each mode: function (a Redis Function library, FCALL) or eval (EVALSHA, where FUNCTION is missing or refused)."
	modes := make([]string, 0, 2)
	for mode := range st.ScriptModes() {
		modes = append(modes, mode)
	}
	slices.Sort(modes)
	for _, mode := range modes {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rls_redis_script_mode", Help: help,
			ConstLabels: prometheus.Labels{"mode": mode}}, func() float64 { return float64(st.ScriptModes()[mode]) }))
	}
}

// Routes counts the hash slots' parts of requests the Redis store decided
// by each route: plain, plain then the script, the script.
type Routes interface {
	Routes() [3]uint64
}

// RegisterRoutes exposes how the Redis store decided each hash slot's part
// of a request, as rls_redis_decisions_total{route}: plain (commands on
// window-named keys), plain_then_script (taken back, then the script, in
// one more round trip), script.
func RegisterRoutes(reg prometheus.Registerer, st Routes) {
	const help = "Hash slots' parts of requests the Redis store decided, by route: plain (INCRBY on window-named keys), plain_then_script (the INCRBYs taken back and the script run in one more round trip), script (decide.lua alone)."
	for i, route := range []string{"plain", "plain_then_script", "script"} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rls_redis_decisions_total", Help: help,
			ConstLabels: prometheus.Labels{"route": route}}, func() float64 { return float64(st.Routes()[i]) }))
	}
}

// breakerCollector reports each Redis node's circuit breaker state.
type breakerCollector struct {
	st   Breakers
	addr string // the node outside cluster mode, which the store names ""
	desc *prometheus.Desc
}

func (b *breakerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- b.desc }

func (b *breakerCollector) Collect(ch chan<- prometheus.Metric) {
	for node, s := range b.st.BreakerStates() {
		if node == "" {
			node = b.addr
		}
		for _, st := range []breaker.State{breaker.Closed, breaker.Open, breaker.HalfOpen} {
			v := 0.0
			if s == st {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(b.desc, prometheus.GaugeValue, v, node, st.String())
		}
	}
}

// ConfigMetrics counts config reloads and shows the config in force. It is
// safe for concurrent use.
type ConfigMetrics struct {
	reloads *prometheus.CounterVec
	lastOK  prometheus.Gauge
	info    *prometheus.GaugeVec
	loaded  prometheus.Gauge
}

// NewConfigMetrics registers the config series on reg; the last reload
// counts as successful until Report says otherwise.
func NewConfigMetrics(reg prometheus.Registerer) *ConfigMetrics {
	c := &ConfigMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_config_reloads_total", Help: "Config reload attempts by result (success, failure: kept the last good config, unchanged)."},
			[]string{"result"}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rls_config_last_reload_successful", Help: "0 while the config directory does not load (the last reload attempt failed; the last good config stays in force), else 1."}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rls_config_info", Help: "1 for the config in force, labelled with its SHA-256."}, []string{"hash"}),
		loaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rls_config_loaded_timestamp_seconds", Help: "When the config in force was loaded (Unix time)."}),
	}
	reg.MustRegister(c.reloads, c.lastOK, c.info, c.loaded)
	for _, r := range []reload.Result{reload.Success, reload.Failure, reload.Unchanged} {
		c.reloads.WithLabelValues(string(r))
	}
	c.lastOK.Set(1)
	return c
}

// Report counts a reload attempt.
func (c *ConfigMetrics) Report(r reload.Result) {
	c.reloads.WithLabelValues(string(r)).Inc()
	if r == reload.Failure {
		c.lastOK.Set(0)
	} else {
		c.lastOK.Set(1)
	}
}

// Set records cfg as the config in force.
func (c *ConfigMetrics) Set(cfg *descriptors.Config) {
	c.info.Reset()
	c.info.WithLabelValues(cfg.Hash()).Set(1)
	c.loaded.SetToCurrentTime()
}
