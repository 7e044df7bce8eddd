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

// ReasonNone is a StoreState's reason while the store answers; otherwise
// the reason is ErrorKind of the probe's error (auth: the store refused
// rls's credentials), the reason label of rls_store_down.
const ReasonNone = "none"

// WaitLogEvery is how often a store that has not answered since start is
// logged, at WARN, with its address and the last error.
const WaitLogEvery = 5 * time.Second

// StoreState is what the last probe found: whether the store answers,
// and if not, why (ErrorKind of Err); and whether it has answered once
// since start.
type StoreState struct {
	OK       bool
	Reason   string // ReasonNone when OK
	Err      error  // nil when OK
	Answered bool   // some probe since start found the store answering (this one included)
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
	// Addr names the store in log lines (a URL without its password).
	Addr string
	// WaitLogEvery is how often the store that has not answered since start
	// is logged [WaitLogEvery].
	WaitLogEvery time.Duration
}

// StoreProbe follows the store's readiness, as State and the series
// rls_store_up (1 while the store answers its probe), rls_store_down{reason}
// (1 for why it does not; every reason of ErrorKinds always exported, so
// no series comes and goes) and rls_store_answered (1 once it has answered
// since start) report it. It starts not ready. It is safe for concurrent
// use.
type StoreProbe struct {
	o                    StoreProbeOptions
	mu                   sync.Mutex
	state                StoreState
	auth                 *logthrottle.Throttle
	up, down, answered   *prometheus.Desc
	started, lastWaitLog time.Time
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
	if o.WaitLogEvery <= 0 {
		o.WaitLogEvery = WaitLogEvery
	}
	p := &StoreProbe{o: o, state: StoreState{Reason: "unknown"}, auth: logthrottle.New(logthrottle.Every, nil), started: time.Now(),
		up: prometheus.NewDesc("rls_store_up",
			"1 while the store answers its readiness probe (gRPC health rls.store SERVING), 0 while it does not (rls_store_down says why).", nil, nil),
		down: prometheus.NewDesc("rls_store_down",
			"1 for the reason the store does not answer its readiness probe, 0 for the others (auth: Redis refused rls's credentials, rls NOT_SERVING; "+
				"unavailable, deadline, circuit_open: an outage, rls decides in fallback once the store has answered since start).",
			[]string{"reason"}, nil),
		answered: prometheus.NewDesc("rls_store_answered",
			"1 once the store has answered since rls started; until then the rate limit service is NOT_SERVING.", nil, nil)}
	reg.MustRegister(p)
	return p
}

// Describe implements prometheus.Collector.
func (p *StoreProbe) Describe(ch chan<- *prometheus.Desc) { ch <- p.up; ch <- p.down; ch <- p.answered }

// Collect implements prometheus.Collector: rls_store_up, one
// rls_store_down series per reason of ErrorKinds, rls_store_answered.
func (p *StoreProbe) Collect(ch chan<- prometheus.Metric) {
	s := p.State()
	ch <- prometheus.MustNewConstMetric(p.up, prometheus.GaugeValue, b2f(s.OK))
	for _, r := range ErrorKinds {
		ch <- prometheus.MustNewConstMetric(p.down, prometheus.GaugeValue, b2f(!s.OK && s.Reason == r), r)
	}
	ch <- prometheus.MustNewConstMetric(p.answered, prometheus.GaugeValue, b2f(s.Answered))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
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
		s.Answered = s.OK || p.state.Answered
		changed := p.state.OK != s.OK || p.state.Reason != s.Reason || p.state.Answered != s.Answered
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
// it but a fix of the configuration); a store that has not answered since
// start at WARN every WaitLogEvery, with its address; any other reason at
// WARN, once per new error.
func (p *StoreProbe) log(s StoreState, lastErr string) {
	switch {
	case s.OK:
		if p.lastWaitLog != (time.Time{}) {
			p.o.Log.Info("store answered: serving", "addr", p.o.Addr, "after", time.Since(p.started).Round(time.Millisecond))
			p.lastWaitLog = time.Time{}
		}
	case s.Auth():
		if held, ok := p.auth.Allow(); ok {
			p.o.Log.Error("store refused rls's credentials: rls is NOT_SERVING and answers Unavailable until they are fixed "+
				"(no fallback: a wrong password is not an outage)", "err", s.Err, "probes_not_logged", held,
				"note", "logged at most every "+p.auth.Interval().String())
		}
	case !s.Answered:
		if now := time.Now(); now.Sub(p.lastWaitLog) >= p.o.WaitLogEvery {
			p.lastWaitLog = now
			p.o.Log.Warn("store has not answered since rls started: the rate limit service is NOT_SERVING until it does (a wrong address or port, or a store not up yet)",
				"addr", p.o.Addr, "waited", now.Sub(p.started).Round(time.Second), "err", s.Err)
		}
	case s.Err.Error() != lastErr:
		p.o.Log.Warn("store not ready", "err", s.Err)
	}
}
