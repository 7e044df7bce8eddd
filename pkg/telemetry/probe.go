package telemetry

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/pkg/logthrottle"
	"github.com/rls-project/rls/pkg/store"
)

// Readiness probe intervals: while the store answers, and while it does not
// (often, so its return is seen within a fraction of a second).
const (
	ProbeEvery   = time.Second
	ProbeFailing = 200 * time.Millisecond
)

// ReasonNone is the reason label of rls_store_up while the store answers;
// otherwise the label is ErrorKind of the probe's error (auth: the store
// refused rls's credentials).
const ReasonNone = "none"

// StoreState is what the last probe found: whether the store answers,
// and if not, why (ErrorKind of Err).
type StoreState struct {
	OK     bool
	Reason string // ReasonNone when OK
	Err    error  // nil when OK
}

// Auth reports whether the store refused rls's credentials: a
// misconfiguration, not an outage (store.ErrAuth).
func (s StoreState) Auth() bool { return errors.Is(s.Err, store.ErrAuth) }

// StoreProbeOptions configures NewStoreProbe.
type StoreProbeOptions struct {
	// Ready asks the store whether it answers (a PING); required. Each
	// call gets a context of at most a second.
	Ready func(context.Context) error
	// OnChange, when set, is told the first probe's state and then each
	// change of it (of OK or of the reason).
	OnChange func(StoreState)
	// Log receives a warning for each new reason the store is not ready,
	// and an error, at most once per logthrottle.Every, for as long as it
	// refuses rls's credentials [discard].
	Log *slog.Logger
	// Every and Failing are the intervals between probes while the store
	// answers and while it does not [ProbeEvery, ProbeFailing].
	Every, Failing time.Duration
}

// StoreProbe follows the store's readiness, as rls_store_up{reason} (1 while
// the store answers its probe) and State report it. It starts not ready.
// It is safe for concurrent use.
type StoreProbe struct {
	o     StoreProbeOptions
	mu    sync.Mutex
	state StoreState
	auth  *logthrottle.Throttle
	desc  *prometheus.Desc
}

// NewStoreProbe registers rls_store_up on reg; Run probes.
func NewStoreProbe(reg prometheus.Registerer, o StoreProbeOptions) *StoreProbe {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Every <= 0 {
		o.Every = ProbeEvery
	}
	if o.Failing <= 0 {
		o.Failing = ProbeFailing
	}
	p := &StoreProbe{o: o, state: StoreState{Reason: "unknown"}, auth: logthrottle.New(logthrottle.Every, nil),
		desc: prometheus.NewDesc("rls_store_up",
			"1 while the store answers its readiness probe (gRPC health rls.store SERVING), 0 while it does not; "+
				"reason: none, or why not (auth: Redis refused rls's credentials, rls NOT_SERVING; unavailable, deadline, circuit_open: an outage, rls decides in fallback).",
			[]string{"reason"}, nil)}
	reg.MustRegister(p)
	return p
}

// Describe implements prometheus.Collector.
func (p *StoreProbe) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }

// Collect implements prometheus.Collector: one series, labelled with the
// current reason.
func (p *StoreProbe) Collect(ch chan<- prometheus.Metric) {
	s := p.State()
	v := 0.0
	if s.OK {
		v = 1
	}
	ch <- prometheus.MustNewConstMetric(p.desc, prometheus.GaugeValue, v, s.Reason)
}

// OK reports the last probe's answer.
func (p *StoreProbe) OK() bool { return p.State().OK }

// State returns what the last probe found.
func (p *StoreProbe) State() StoreState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// Run probes until ctx ends, at once and then every Every (Failing while
// the store does not answer).
func (p *StoreProbe) Run(ctx context.Context) {
	lastErr := ""
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := p.o.Ready(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		s := StoreState{OK: err == nil, Reason: ReasonNone, Err: err}
		if err != nil {
			s.Reason = ErrorKind(err)
		}
		p.mu.Lock()
		changed := p.state.OK != s.OK || p.state.Reason != s.Reason
		p.state = s
		p.mu.Unlock()
		if changed && p.o.OnChange != nil {
			p.o.OnChange(s)
		}
		p.log(s, lastErr)
		every := p.o.Every
		lastErr = ""
		if err != nil {
			lastErr, every = err.Error(), p.o.Failing
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// log reports a failed probe: a refusal of rls's credentials at ERROR, at
// most once per logthrottle.Every for as long as it lasts (nothing mends
// it but a fix of the configuration); any other reason at WARN, once per
// new error.
func (p *StoreProbe) log(s StoreState, lastErr string) {
	switch {
	case s.OK:
	case s.Auth():
		if held, ok := p.auth.Allow(); ok {
			p.o.Log.Error("store refused rls's credentials: rls is NOT_SERVING and answers Unavailable until they are fixed "+
				"(no fallback: a wrong password is not an outage)", "err", s.Err, "probes_not_logged", held,
				"note", "logged at most every "+p.auth.Interval().String())
		}
	case s.Err.Error() != lastErr:
		p.o.Log.Warn("store not ready", "err", s.Err)
	}
}
