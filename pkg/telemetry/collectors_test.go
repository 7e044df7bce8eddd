package telemetry

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rls-project/rls/pkg/reload"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
)

// TestConfigLastReloadSuccessful: the gauge is 0 from a failed reload until
// one loads again (a fix back to the config in force is "unchanged").
func TestConfigLastReloadSuccessful(t *testing.T) {
	c := NewConfigMetrics(prometheus.NewRegistry())
	for i, step := range []struct {
		r    reload.Result
		want float64
	}{
		{"", 1}, // at start-up the config loaded
		{reload.Failure, 0},
		{reload.Failure, 0},
		{reload.Unchanged, 1},
		{reload.Failure, 0},
		{reload.Success, 1},
	} {
		if step.r != "" {
			c.Report(step.r)
		}
		if got := testutil.ToFloat64(c.lastOK); got != step.want {
			t.Errorf("step %d (%s): rls_config_last_reload_successful = %v, want %v", i, step.r, got, step.want)
		}
	}
	if got := testutil.ToFloat64(c.reloads.WithLabelValues(string(reload.Failure))); got != 3 {
		t.Errorf("failures counted %v, want 3", got)
	}
}

func TestErrorKind(t *testing.T) {
	for err, want := range map[error]string{
		store.ErrCircuitOpen: "circuit_open",
		fmt.Errorf("%w: %w", store.ErrUnavailable, context.DeadlineExceeded): "deadline",
		fmt.Errorf("dial: %w", store.ErrUnavailable):                         "unavailable",
		store.ErrProtocol:       "protocol",
		errors.New("something"): "other",
	} {
		if got := ErrorKind(err); got != want {
			t.Errorf("ErrorKind(%v) = %s, want %s", err, got, want)
		}
	}
}

// TestMeteredStore: every call is timed; failures are counted by kind,
// not a cancellation by the caller.
func TestMeteredStore(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMeteredStore(memory.New(memory.Options{}), reg)
	if err := m.Delete(context.Background(), store.Check{Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.latency); n != 2 { // decide (made at once) and delete
		t.Errorf("%d latency series after one delete, want 2", n)
	}
	m.count("decide", store.ErrCircuitOpen)
	m.count("decide", context.Canceled)
	if got := testutil.ToFloat64(m.errs.WithLabelValues("decide", "circuit_open")); got != 1 {
		t.Errorf("circuit_open errors %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.errs.WithLabelValues("decide", "other")); got != 0 {
		t.Errorf("a cancellation counted as an error: %v", got)
	}
}
