//go:build redis

package telemetry

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store/redisstore"
)

// TestScriptModeGauge: rls_redis_script_mode follows the store, on a real
// Redis with Functions and on one without FUNCTION.
func TestScriptModeGauge(t *testing.T) {
	for _, tc := range []struct {
		args           []string
		function, eval float64
	}{
		{nil, 1, 0},
		{[]string{"--rename-command", "FUNCTION", ""}, 0, 1},
	} {
		srv := redistest.StartServer(t, tc.args...)
		c := srv.Client()
		t.Cleanup(func() { c.Close() })
		st, err := redisstore.New(redisstore.Options{Client: c, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		reg := prometheus.NewRegistry()
		RegisterScriptMode(reg, st)
		if n := testutil.CollectAndCount(reg, "rls_redis_script_mode"); n != 2 {
			t.Fatalf("%d series, want 2", n)
		}
		if err := st.Ping(context.Background()); err != nil {
			t.Fatal(err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, m := range mfs[0].GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
		if got["function"] != tc.function || got["eval"] != tc.eval {
			t.Errorf("redis-server %v: rls_redis_script_mode %v, want function %v, eval %v", tc.args, got, tc.function, tc.eval)
		}
	}
}
