//go:build redis

package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
)

// TestEvictionWatch: on a real Redis with a maxmemory and allkeys-lru, the
// first reading is a WARN naming the policy; keys evicted after it are
// counted and logged; with noeviction nothing is.
func TestEvictionWatch(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "noeviction"} {
		t.Run(policy, func(t *testing.T) {
			srv := redistest.StartServer(t, "--maxmemory", "4mb", "--maxmemory-policy", policy)
			c := srv.Client()
			t.Cleanup(func() { c.Close() })
			log := &testkit.Buffer{}
			reg := prometheus.NewRegistry()
			w := NewEvictionWatch(reg, EvictionOptions{Client: c, Log: slog.New(slog.NewTextHandler(log, nil))})
			ctx := context.Background()
			w.Check(ctx)
			evicting := policy != "noeviction"
			if warned := strings.Contains(log.String(), "level=WARN msg=\"Redis may evict rls's counters"); warned != evicting {
				t.Errorf("policy %s: warned %v at the first reading, want %v:\n%s", policy, warned, evicting, log.String())
			}
			if got := testutil.ToFloat64(w.evicts); got != map[bool]float64{true: 1}[evicting] {
				t.Errorf("rls_store_eviction_policy_evicts %v", got)
			}
			value := strings.Repeat("x", 64<<10)
			for i := range 200 { // 12.5 MB into 4 MB
				if err := c.Set(ctx, fmt.Sprint("junk", i), value, 0).Err(); err != nil {
					break // noeviction: OOM
				}
			}
			w.Check(ctx)
			got := testutil.ToFloat64(w.evicted)
			if evicting && (got == 0 || !strings.Contains(log.String(), "Redis evicted keys")) {
				t.Errorf("after filling Redis past maxmemory: %v evictions counted; log:\n%s", got, log.String())
			}
			if !evicting && got != 0 {
				t.Errorf("noeviction: %v evictions counted, want 0", got)
			}
		})
	}
}
