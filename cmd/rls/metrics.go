package main

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rls-project/rls/pkg/breaker"
	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/reload"
	"github.com/rls-project/rls/pkg/store"
	redisstore "github.com/rls-project/rls/pkg/store/redis"
)

// newRegistry makes the process's metrics registry, with Go runtime and
// process series.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// timedStore records the store's latency, and its errors by operation and
// kind.
type timedStore struct {
	store.Store
	latency *prometheus.HistogramVec
	errs    *prometheus.CounterVec
	decideL prometheus.Observer
}

// Store error kinds, the kind label of rls_store_errors_total.
var storeErrorKinds = []string{"deadline", "unavailable", "circuit_open", "protocol", "other"}

// errorKind classifies a store error for metrics: deadline (the budget ran
// out), circuit_open, unavailable (any other outage), protocol (an answer
// rls cannot use: a bug), other.
func errorKind(err error) string {
	switch {
	case errors.Is(err, store.ErrCircuitOpen):
		return "circuit_open"
	case errors.Is(err, store.ErrUnavailable) && errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, store.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, store.ErrProtocol):
		return "protocol"
	}
	return "other"
}

func newTimedStore(st store.Store, reg prometheus.Registerer) *timedStore {
	t := &timedStore{
		Store: st,
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rls_store_duration_seconds",
			Help:    "Time of store operations (decide: one batch, all its shards).",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .02, .05, .1},
		}, []string{"op"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_store_errors_total",
			Help: "Store operations that failed, by operation and kind (deadline: no answer within the budget; unavailable: Redis refused or failed; circuit_open; protocol: an answer rls cannot use, a bug).",
		}, []string{"op", "kind"}),
	}
	reg.MustRegister(t.latency, t.errs)
	t.decideL = t.latency.WithLabelValues("decide")
	for _, op := range []string{"decide", "peek", "delete"} {
		for _, k := range storeErrorKinds {
			t.errs.WithLabelValues(op, k)
		}
	}
	return t
}

// count records err of op, unless the caller cancelled.
func (t *timedStore) count(op string, err error) {
	if err != nil && !errors.Is(err, context.Canceled) {
		t.errs.WithLabelValues(op, errorKind(err)).Inc()
	}
}

func (t *timedStore) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	start := time.Now()
	err := t.Store.Decide(ctx, checks, results)
	t.decideL.Observe(time.Since(start).Seconds())
	t.count("decide", err)
	return err
}

func (t *timedStore) Peek(ctx context.Context, checks []store.Check, results []store.Result) error {
	start := time.Now()
	err := t.Store.Peek(ctx, checks, results)
	t.latency.WithLabelValues("peek").Observe(time.Since(start).Seconds())
	t.count("peek", err)
	return err
}

func (t *timedStore) Delete(ctx context.Context, keys ...string) error {
	start := time.Now()
	err := t.Store.Delete(ctx, keys...)
	t.latency.WithLabelValues("delete").Observe(time.Since(start).Seconds())
	t.count("delete", err)
	return err
}

// registerLocal exposes the limiter's and fleet's state, read at scrape time.
func registerLocal(reg prometheus.Registerer, lim *limiter.Limiter, fleet *limiter.Fleet) {
	src := func(s limiter.Source) func() float64 {
		return func() float64 { return float64(lim.Count(s)) }
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rls_fallback_decisions_total", Help: "Checks decided without the store because it could not answer, by mode.",
			ConstLabels: prometheus.Labels{"mode": "fail_open"}}, src(limiter.FromFailOpen)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rls_fallback_decisions_total", Help: "Checks decided without the store because it could not answer, by mode.",
			ConstLabels: prometheus.Labels{"mode": "fail_closed"}}, src(limiter.FromFailClosed)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rls_local_cache_hits_total", Help: "Checks denied by the local over-limit cache without a store call."},
			src(limiter.FromCache)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rls_fleet_size", Help: "Replicas sharing the limits, as used for the fail-open share."},
			func() float64 { return float64(fleet.Size()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rls_writeback_hits_total", Help: "Hits admitted locally while the store could not answer, then written back to it.",
			ConstLabels: prometheus.Labels{"result": "written"}}, func() float64 { return float64(lim.Counters().WrittenBack) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rls_writeback_hits_total", Help: "Hits admitted locally while the store could not answer, then written back to it.",
			ConstLabels: prometheus.Labels{"result": "lost"}}, func() float64 { return float64(lim.Counters().WriteBackLost) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rls_store_protocol_errors_total", Help: "Store answers rls could not use (a script error, a reply of the wrong shape): bugs, answered with codes.Internal, never a fallback."},
			func() float64 { return float64(lim.Counters().ProtocolErrors) }),
	)
	for result, n := range map[string]func(limiter.Counters) uint64{
		"refunded": func(c limiter.Counters) uint64 { return c.Undone },
		"retried":  func(c limiter.Counters) uint64 { return c.UndoRetried },
		"lost":     func(c limiter.Counters) uint64 { return c.UndoLost },
		"unknown":  func(c limiter.Counters) uint64 { return c.UndoUnknown },
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rls_undo_refunds_total", Help: "Checks the store consumed for a request denied after all (another Cluster slot, the fallback or its quotas denied it), by what became of their refund: refunded, retried (not at once), lost (never), unknown (the call timed out after it may have been sent: not refunded).",
			ConstLabels: prometheus.Labels{"result": result}}, func() float64 { return float64(n(lim.Counters())) }))
	}
	for _, s := range limiter.Sources {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rls_checks_total", Help: "Checks (one per counted descriptor) by where their result came from: store, local_cache, fail_open, fail_closed.",
			ConstLabels: prometheus.Labels{"source": s.String()}}, func() float64 { return float64(lim.Counters().Sources[s]) }))
	}
	for _, c := range limiter.Causes {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rls_fallback_batches_total", Help: "Requests decided without the store, by cause: deadline (the caller's deadline or the store timeout ran out), unavailable (an error), circuit_open.",
			ConstLabels: prometheus.Labels{"cause": c.String()}}, func() float64 { return float64(lim.Counters().Causes[c]) }))
	}
	reg.MustRegister(&tablesCollector{lim: lim})
}

// tablesCollector reports the limiter's local tables, read once per scrape.
type tablesCollector struct{ lim *limiter.Limiter }

var (
	tableEntriesDesc = prometheus.NewDesc("rls_local_table_entries",
		"Entries of each local table: last_answers (what the store last said per key: the over-limit cache and fail-open seeds), fail_open_buckets, write_backs (keys whose locally admitted hits wait for write-back).",
		[]string{"table"}, nil)
	tableBytesDesc = prometheus.NewDesc("rls_local_table_bytes",
		"Bytes each local table's entries count against its share of --local-max-bytes (key length plus a per-entry overhead).",
		[]string{"table"}, nil)
	tableEvictionsDesc = prometheus.NewDesc("rls_local_table_evictions_total",
		"Least recently used entries dropped from a local table at --local-max-keys or its share of --local-max-bytes (write_backs never evicts: see rls_writeback_hits_total{result=\"lost\"}).",
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

// registerStoreUp exposes the store's readiness probe, as the gRPC health
// service "rls.store" reports it.
func registerStoreUp(reg prometheus.Registerer, ok *atomic.Bool) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rls_store_up", Help: "1 while the store answers its readiness probe (gRPC health rls.store SERVING), 0 while it does not (rls decides in fallback)."},
		func() float64 {
			if ok.Load() {
				return 1
			}
			return 0
		}))
}

// breakerCollector reports each Redis node's circuit breaker state.
type breakerCollector struct {
	st   *redisstore.Store
	desc *prometheus.Desc
}

func (b *breakerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- b.desc }

func (b *breakerCollector) Collect(ch chan<- prometheus.Metric) {
	for node, s := range b.st.BreakerStates() {
		for _, st := range []breaker.State{breaker.Closed, breaker.Open, breaker.HalfOpen} {
			v := 0.0
			if s == st {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(b.desc, prometheus.GaugeValue, v, node, st.String())
		}
	}
}

func registerBreakers(reg prometheus.Registerer, st *redisstore.Store) {
	reg.MustRegister(&breakerCollector{st: st, desc: prometheus.NewDesc("rls_redis_breaker_state",
		"1 for the current state of each Redis node's circuit breaker (node \"\" outside cluster mode).",
		[]string{"node", "state"}, nil)})
}

// configMetrics counts reloads and shows the config in force.
type configMetrics struct {
	reloads *prometheus.CounterVec
	lastOK  prometheus.Gauge
	info    *prometheus.GaugeVec
	loaded  prometheus.Gauge
}

func newConfigMetrics(reg prometheus.Registerer) *configMetrics {
	c := &configMetrics{
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

// report counts a reload attempt.
func (c *configMetrics) report(r reload.Result) {
	c.reloads.WithLabelValues(string(r)).Inc()
	if r == reload.Failure {
		c.lastOK.Set(0)
	} else {
		c.lastOK.Set(1)
	}
}

// loaded records cfg as the config in force.
func (c *configMetrics) set(cfg *descriptors.Config) {
	c.info.Reset()
	c.info.WithLabelValues(cfg.Hash()).Set(1)
	c.loaded.SetToCurrentTime()
}
