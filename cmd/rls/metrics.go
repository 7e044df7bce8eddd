package main

import (
	"context"
	"errors"
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
	info    *prometheus.GaugeVec
	loaded  prometheus.Gauge
}

func newConfigMetrics(reg prometheus.Registerer) *configMetrics {
	c := &configMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_config_reloads_total", Help: "Config reload attempts by result (success, failure: kept the last good config, unchanged)."},
			[]string{"result"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rls_config_info", Help: "1 for the config in force, labelled with its SHA-256."}, []string{"hash"}),
		loaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rls_config_loaded_timestamp_seconds", Help: "When the config in force was loaded (Unix time)."}),
	}
	reg.MustRegister(c.reloads, c.info, c.loaded)
	for _, r := range []reload.Result{reload.Success, reload.Failure, reload.Unchanged} {
		c.reloads.WithLabelValues(string(r))
	}
	return c
}

// loaded records cfg as the config in force.
func (c *configMetrics) set(cfg *descriptors.Config) {
	c.info.Reset()
	c.info.WithLabelValues(cfg.Hash()).Set(1)
	c.loaded.SetToCurrentTime()
}
