package telemetry

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/pkg/store"
)

// MeteredStore is a store.Store that records its calls' latency
// (rls_store_duration_seconds) and errors by operation and kind
// (rls_store_errors_total). It is safe for concurrent use, as the store
// it wraps is.
type MeteredStore struct {
	store.Store
	latency *prometheus.HistogramVec
	errs    *prometheus.CounterVec
	decideL prometheus.Observer
	// lastAuth is the last refusal of rls's credentials by a decision
	// (see AuthRefused), with its time.
	lastAuth atomic.Pointer[authRefusal]
}

type authRefusal struct {
	at  time.Time
	err error
}

// AuthRefusedHold is how long after a decision's refusal of rls's
// credentials the store still counts as refusing them (Ready).
const AuthRefusedHold = 2 * ProbeEvery

// Ready returns ready (a readiness probe of the store) failing also while
// a decision's refusal of rls's credentials is within AuthRefusedHold: a
// PING may be allowed where the scripts are not (an ACL without EVALSHA).
func (t *MeteredStore) Ready(ready func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := ready(ctx); err != nil {
			return err
		}
		return t.AuthRefused(AuthRefusedHold)
	}
}

// RefusedCredentials probes the store once, within timeout, and returns
// the error when it refuses rls's credentials (store.ErrAuth), else nil:
// any other failure (Redis not up yet) is an outage, left to the probe.
func RefusedCredentials(ready func(context.Context) error, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := ready(ctx); errors.Is(err, store.ErrAuth) {
		return err
	}
	return nil
}

// AuthRefused returns the last error of an operation that the store
// refused for rls's credentials or permissions (store.ErrAuth) within the
// last d, else nil: a readiness probe's PING may be allowed where the
// scripts are not (an ACL without EVALSHA).
func (t *MeteredStore) AuthRefused(d time.Duration) error {
	if r := t.lastAuth.Load(); r != nil && time.Since(r.at) < d {
		return r.err
	}
	return nil
}

// ErrorKinds are the kinds ErrorKind returns, the kind label of
// rls_store_errors_total.
var ErrorKinds = []string{"deadline", "unavailable", "circuit_open", "protocol", "auth", "other"}

// ErrorKind classifies a store error for metrics and spans: deadline (the
// budget ran out), circuit_open, unavailable (any other outage), protocol
// (an answer rls cannot use: a bug), auth (the store refused rls's
// credentials or permissions), other.
func ErrorKind(err error) string {
	switch {
	case errors.Is(err, store.ErrCircuitOpen):
		return "circuit_open"
	case errors.Is(err, store.ErrUnavailable) && errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, store.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, store.ErrProtocol):
		return "protocol"
	case errors.Is(err, store.ErrAuth):
		return "auth"
	}
	return "other"
}

// NewMeteredStore wraps st, registering its series on reg.
func NewMeteredStore(st store.Store, reg prometheus.Registerer) *MeteredStore {
	t := &MeteredStore{
		Store: st,
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rls_store_duration_seconds",
			Help:    "Time of store operations (decide: one batch, all its shards).",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .02, .05, .1},
		}, []string{"op"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_store_errors_total",
			Help: "Store operations that failed, by operation and kind (deadline: no answer within the budget; unavailable: Redis refused or failed; circuit_open; protocol: an answer rls cannot use, a bug; auth: Redis refused rls's credentials or permissions).",
		}, []string{"op", "kind"}),
	}
	reg.MustRegister(t.latency, t.errs)
	t.decideL = t.latency.WithLabelValues("decide")
	for _, op := range []string{"decide", "peek", "delete"} {
		for _, k := range ErrorKinds {
			t.errs.WithLabelValues(op, k)
		}
	}
	return t
}

// count records err of op, unless the caller cancelled.
func (t *MeteredStore) count(op string, err error) {
	if err != nil && !errors.Is(err, context.Canceled) {
		t.errs.WithLabelValues(op, ErrorKind(err)).Inc()
		if errors.Is(err, store.ErrAuth) {
			t.lastAuth.Store(&authRefusal{at: time.Now(), err: err})
		}
	}
}

// Decide is the store's Decide, timed and counted.
func (t *MeteredStore) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	start := time.Now()
	err := t.Store.Decide(ctx, checks, results)
	t.decideL.Observe(time.Since(start).Seconds())
	t.count("decide", err)
	return err
}

// Peek is the store's Peek, timed and counted.
func (t *MeteredStore) Peek(ctx context.Context, checks []store.Check, results []store.Result) error {
	start := time.Now()
	err := t.Store.Peek(ctx, checks, results)
	t.latency.WithLabelValues("peek").Observe(time.Since(start).Seconds())
	t.count("peek", err)
	return err
}

// Delete is the store's Delete, timed and counted.
func (t *MeteredStore) Delete(ctx context.Context, checks ...store.Check) error {
	start := time.Now()
	err := t.Store.Delete(ctx, checks...)
	t.latency.WithLabelValues("delete").Observe(time.Since(start).Seconds())
	t.count("delete", err)
	return err
}
