package telemetry

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
		OnChange: func(ok bool) { mu.Lock(); changes = append(changes, ok); mu.Unlock() },
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
	if len(changes) != 2 || !changes[0] || changes[1] {
		t.Errorf("changes %v, want [true false]", changes)
	}
	if n := strings.Count(logs.String(), "store not ready"); n != 2 {
		t.Errorf("%d warnings for two outages, want 2:\n%s", n, logs.String())
	}
}
