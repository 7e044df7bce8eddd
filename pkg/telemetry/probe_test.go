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
// it, and rls_store_answered once it has answered), tells each change
// once, warns every WaitLogEvery with the store's address until the store
// first answers, then once per outage (not per failed probe), and stops
// with its context.
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
		Addr: "redis://h:1", WaitLogEvery: 20 * time.Millisecond,
	})
	up := func() float64 { return gauge(t, reg, "rls_store_up", "") }
	if p.OK() || up() != 0 {
		t.Fatal("ready before any probe")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	testkit.WaitFor(t, "two waits logged", 5*time.Second, func() bool {
		return strings.Count(logs.String(), "store has not answered since rls started") >= 2
	})
	if !strings.Contains(logs.String(), "addr=redis://h:1") || gauge(t, reg, "rls_store_answered", "") != 0 ||
		gauge(t, reg, "rls_store_down", "unavailable") != 0 || gauge(t, reg, "rls_store_down", "other") != 1 {
		t.Errorf("before the first answer: log without the address, or series wrong:\n%s", logs.String())
	}
	failing.Store(false)
	testkit.WaitFor(t, "ready", 5*time.Second, func() bool { return p.OK() && up() == 1 && gauge(t, reg, "rls_store_answered", "") == 1 })
	failing.Store(true)
	testkit.WaitFor(t, "not ready again", 5*time.Second, func() bool { return !p.OK() && up() == 0 })
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 3 || changes[0] || !changes[1] || changes[2] {
		t.Errorf("changes %v, want [false true false]", changes)
	}
	if n := strings.Count(logs.String(), "store not ready"); n != 1 {
		t.Errorf("%d warnings for the outage after the first answer, want 1:\n%s", n, logs.String())
	}
	if !p.State().Answered {
		t.Error("the state forgot the store answered once")
	}
}

// gauge returns the value of the series of name with reason (none: "").
func gauge(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if reason == "" && len(m.GetLabel()) == 0 || len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == reason {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no series %s{reason=%q}", name, reason)
	return 0
}

// TestStoreProbeAuth: a refusal of rls's credentials is its own reason
// (rls_store_down{reason="auth"} 1), told once as a change, logged at
// ERROR at most once per interval however many probes fail, and cleared by
// the next answer; rls_store_down keeps every reason's series throughout.
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
		s := fmt.Sprint(gauge(t, reg, "rls_store_up", ""))
		for _, r := range ErrorKinds {
			s += fmt.Sprintf(" %s=%v", r, gauge(t, reg, "rls_store_down", r))
		}
		return s
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	testkit.WaitFor(t, "20 refused probes", 5*time.Second, func() bool { return probes.Load() >= 20 })
	if got := series(); got != "0 deadline=0 unavailable=0 circuit_open=0 protocol=0 auth=1 other=0" {
		t.Errorf("rls_store_up while refused: %s", got)
	}
	if s := p.State(); s.OK || !s.Auth() {
		t.Errorf("state while refused: %+v", s)
	}
	refused.Store(false)
	testkit.WaitFor(t, "ready", 5*time.Second, func() bool { return p.OK() })
	cancel()
	<-done
	if got := series(); got != "1 deadline=0 unavailable=0 circuit_open=0 protocol=0 auth=0 other=0" {
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
