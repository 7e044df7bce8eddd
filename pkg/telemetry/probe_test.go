package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/testkit"
)

// TestStoreProbe: the probe follows the store's answers (rls_store_up with
// it), tells each change once, warns once per outage (not per failed
// probe), and stops with its context.
func TestStoreProbe(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	var mu sync.Mutex
	var changes []bool
	var logs testkit.Buffer
	reg := prometheus.NewRegistry()
	p := NewStoreProbe(reg, StoreProbeOptions{
		Ready: func(context.Context) error {
			if failing.Load() {
				return errors.New("connection refused")
			}
			return nil
		},
		OnChange: func(s StoreState) { mu.Lock(); changes = append(changes, s.OK); mu.Unlock() },
		Log:      slog.New(slog.NewTextHandler(&logs, nil)),
		Every:    time.Millisecond, Failing: time.Millisecond,
	})
	up := func() float64 {
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 {
			t.Fatalf("gathered %v %v", mfs, err)
		}
		return mfs[0].GetMetric()[0].GetGauge().GetValue()
	}
	if p.OK() || up() != 0 {
		t.Fatal("ready before any probe")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	testkit.WaitFor(t, "a failed probe logged", 5*time.Second, func() bool { return strings.Contains(logs.String(), "store not ready") })
	failing.Store(false)
	testkit.WaitFor(t, "ready", 5*time.Second, func() bool { return p.OK() && up() == 1 })
	failing.Store(true)
	testkit.WaitFor(t, "not ready again", 5*time.Second, func() bool { return !p.OK() && up() == 0 })
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 3 || changes[0] || !changes[1] || changes[2] {
		t.Errorf("changes %v, want [false true false]", changes)
	}
	if n := strings.Count(logs.String(), "store not ready"); n != 2 {
		t.Errorf("%d warnings for two outages, want 2:\n%s", n, logs.String())
	}
}

// TestStoreProbeAuth: a refusal of rls's credentials is its own reason
// (rls_store_up{reason="auth"} 0), told once as a change, logged at ERROR
// at most once per interval however many probes fail, and cleared by the
// next answer.
func TestStoreProbeAuth(t *testing.T) {
	var refused atomic.Bool
	refused.Store(true)
	var mu sync.Mutex
	var changes []StoreState
	var logs testkit.Buffer
	var probes atomic.Int64
	reg := prometheus.NewRegistry()
	p := NewStoreProbe(reg, StoreProbeOptions{
		Ready: func(context.Context) error {
			probes.Add(1)
			if refused.Load() {
				return fmt.Errorf("redis ping: %w: WRONGPASS invalid username-password pair", store.ErrAuth)
			}
			return nil
		},
		OnChange: func(s StoreState) { mu.Lock(); changes = append(changes, s); mu.Unlock() },
		Log:      slog.New(slog.NewTextHandler(&logs, nil)),
		Every:    time.Millisecond, Failing: time.Millisecond,
	})
	series := func() string {
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 || len(mfs[0].GetMetric()) != 1 {
			t.Fatalf("gathered %v %v", mfs, err)
		}
		m := mfs[0].GetMetric()[0]
		return fmt.Sprintf("%s=%s %v", m.GetLabel()[0].GetName(), m.GetLabel()[0].GetValue(), m.GetGauge().GetValue())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	testkit.WaitFor(t, "20 refused probes", 5*time.Second, func() bool { return probes.Load() >= 20 })
	if got := series(); got != "reason=auth 0" {
		t.Errorf("rls_store_up while refused: %s", got)
	}
	if s := p.State(); s.OK || !s.Auth() {
		t.Errorf("state while refused: %+v", s)
	}
	refused.Store(false)
	testkit.WaitFor(t, "ready", 5*time.Second, func() bool { return p.OK() })
	cancel()
	<-done
	if got := series(); got != "reason=none 1" {
		t.Errorf("rls_store_up once answered: %s", got)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("%d ERROR lines for %d refused probes within one interval, want 1:\n%s", n, probes.Load(), logs.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 2 || changes[0].Reason != "auth" || !changes[0].Auth() || !changes[1].OK {
		t.Errorf("changes %+v, want [auth, ok]", changes)
	}
}
