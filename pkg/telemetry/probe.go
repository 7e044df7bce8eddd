package telemetry

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Readiness probe intervals: while the store answers, and while it does not
// (often, so its return is seen within a fraction of a second).
const (
	ProbeEvery   = time.Second
	ProbeFailing = 200 * time.Millisecond
)

// StoreProbeOptions configures NewStoreProbe.
type StoreProbeOptions struct {
	// Ready asks the store whether it answers (a PING); required. Each
	// call gets a context of at most a second.
	Ready func(context.Context) error
	// OnChange, when set, is told each change of the answer, the first
	// success included.
	OnChange func(ok bool)
	// Log receives a warning for each new reason the store is not ready
	// [discard].
	Log *slog.Logger
	// Every and Failing are the intervals between probes while the store
	// answers and while it does not [ProbeEvery, ProbeFailing].
	Every, Failing time.Duration
}

// StoreProbe follows the store's readiness, as rls_store_up (1 while the
// store answers its probe) and OK report it. It starts not ready. It is
// safe for concurrent use.
type StoreProbe struct {
	o  StoreProbeOptions
	ok atomic.Bool
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
	p := &StoreProbe{o: o}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rls_store_up", Help: "1 while the store answers its readiness probe (gRPC health rls.store SERVING), 0 while it does not (rls decides in fallback)."},
		func() float64 {
			if p.OK() {
				return 1
			}
			return 0
		}))
	return p
}

// OK reports the last probe's answer.
func (p *StoreProbe) OK() bool { return p.ok.Load() }

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
		if p.ok.Swap(err == nil) != (err == nil) && p.o.OnChange != nil {
			p.o.OnChange(err == nil)
		}
		msg, every := "", p.o.Every
		if err != nil {
			msg, every = err.Error(), p.o.Failing
		}
		if msg != "" && msg != lastErr {
			p.o.Log.Warn("store not ready", "err", err)
		}
		lastErr = msg
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
