package main

import (
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rls-project/rls/pkg/reload"
)

// TestConfigLastReloadSuccessful: the gauge is 0 from a failed reload until
// one loads again (a fix back to the config in force is "unchanged").
func TestConfigLastReloadSuccessful(t *testing.T) {
	c := newConfigMetrics(prometheus.NewRegistry())
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
			c.report(step.r)
		}
		if got := testutil.ToFloat64(c.lastOK); got != step.want {
			t.Errorf("step %d (%s): rls_config_last_reload_successful = %v, want %v", i, step.r, got, step.want)
		}
	}
	if got := testutil.ToFloat64(c.reloads.WithLabelValues(string(reload.Failure))); got != 3 {
		t.Errorf("failures counted %v, want 3", got)
	}
}

func TestStoreUp(t *testing.T) {
	reg := prometheus.NewRegistry()
	var ok atomic.Bool
	registerStoreUp(reg, &ok)
	for _, v := range []bool{false, true, false} {
		ok.Store(v)
		want := 0.0
		if v {
			want = 1
		}
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 || mfs[0].GetMetric()[0].GetGauge().GetValue() != want {
			t.Errorf("store ok %v: gathered %v (%v), want rls_store_up %v", v, mfs, err, want)
		}
	}
}
