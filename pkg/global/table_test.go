//go:build redis

package global

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/testkit"
)

// TestTableShare: a key is denied (limit 0) until its first exchange,
// which the first request starts; then its limit is its region's share,
// and its hits are counted as demand.
func TestTableShare(t *testing.T) {
	c := redistest.StartServer(t).Client()
	tb := NewTable(c, settings("eu", "p1"), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tb.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	check := store.Check{Key: "rl:{d:k=z}:k", Algorithm: store.FixedWindow, Limit: 300, Window: time.Second, Hits: 1}
	c1 := check
	tb.Share("d", "r", &c1, time.Time{})
	if c1.Limit != 0 {
		t.Fatalf("limit %d before any exchange, want 0", c1.Limit)
	}
	var c2 store.Check
	if !testkit.EventuallyEvery(5*time.Second, 10*time.Millisecond, func() bool {
		c2 = check
		tb.Share("d", "r", &c2, time.Time{})
		return c2.Limit == 300 // alone: the whole limit
	}) {
		t.Fatalf("limit %d 5 s on, want 300 (eu alone)", c2.Limit)
	}
	if tb.calls.Load() == 0 || tb.lastOK.Load() == 0 {
		t.Errorf("calls %d, lastOK %d", tb.calls.Load(), tb.lastOK.Load())
	}
}

// TestTableLimitAtEdges: near a window's edge (within the clock's error
// and the margin) the limit is the least of the two windows' shares; a
// window never granted has the floor, for 10 leases after the last grant,
// then nothing.
func TestTableLimitAtEdges(t *testing.T) {
	tb := NewTable(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), settings("eu", "p1"), nil)
	defer tb.client.Close()
	tb.clock.Store(&clockFix{off: 0, err: 1000})
	base := time.Now().Unix() + 100
	e := &entry{window: time.Second, granted: true, shares: map[int64]uint64{base: 200, base + 1: 50}, floor: 30, floorFrom: base - 5, seen: base * sec}
	at := func(us int64) uint64 { return tb.limitLocked(e, time.UnixMicro(us), span{}) }
	if l := at(base*sec + 500_000); l != 200 {
		t.Errorf("mid-window: %d, want 200", l)
	}
	if l := at((base+1)*sec - 10_000); l != 50 {
		t.Errorf("10 ms before the edge (margin 20 ms): %d, want the next window's 50", l)
	}
	if l := at((base+2)*sec + 500_000); l != 30 {
		t.Errorf("past the lease: %d, want the floor 30", l)
	}
	if l := at((base+25)*sec + 500_000); l != 0 {
		t.Errorf("10 leases past the last grant: %d, want 0", l)
	}
	// With the region's Redis's clock measured, its span (from now to the
	// call's deadline) picks the windows, whatever the global clock says.
	mid := base*sec + 500_000
	in := func(from, to int64) uint64 { return tb.limitLocked(e, time.UnixMicro(mid), span{from, to, true}) }
	if l := in(mid, mid+20_000); l != 200 {
		t.Errorf("a span inside the window: %d, want 200", l)
	}
	if l := in((base+1)*sec-5_000, (base+1)*sec+15_000); l != 50 {
		t.Errorf("a span across the edge: %d, want the least, 50", l)
	}
	if l := in((base+1)*sec+1_000, (base+1)*sec+21_000); l != 50 {
		t.Errorf("a span in the next window (the regional clock ahead): %d, want its 50", l)
	}
	if l := tb.limitLocked(e, time.UnixMicro((base+1)*sec-10_000), span{mid, mid + 20_000, true}); l != 200 {
		t.Errorf("10 ms before the edge by the global clock, mid-window by the region's: %d, want 200 (no margin needed)", l)
	}
}

// TestTableRegionClock: Share asks RegionClock for the key's span with
// the request's deadline, and decides on it; without a measurement it
// falls back to the global clock and the margin.
func TestTableRegionClock(t *testing.T) {
	s := settings("eu", "p1")
	base := time.Now().Unix() + 100
	var gotKey string
	var gotDeadline time.Time
	ok := true
	s.RegionClock = func(key string, deadline time.Time) (time.Time, time.Time, bool) {
		gotKey, gotDeadline = key, deadline
		return time.UnixMicro((base+1)*sec - 5_000), time.UnixMicro((base+1)*sec + 15_000), ok
	}
	tb := NewTable(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), s, nil)
	defer tb.client.Close()
	tb.now = func() time.Time { return time.UnixMicro(base*sec + 500_000) }
	tb.clock.Store(&clockFix{off: 0, err: 1000})
	c := store.Check{Key: "rl:{d:k=c}:k", Algorithm: store.FixedWindow, Limit: 300, Window: time.Second, Hits: 1}
	e := tb.entry("d", "r", &c)
	e.granted, e.shares, e.floor, e.seen = true, map[int64]uint64{base: 200, base + 1: 50}, 30, base*sec
	dl := time.Now().Add(20 * time.Millisecond)
	c1 := c
	tb.Share("d", "r", &c1, dl)
	if c1.Limit != 50 || gotKey != c.Key || !gotDeadline.Equal(dl) {
		t.Errorf("limit %d, RegionClock told %q %v; want 50 (the span crosses the edge), %q, %v", c1.Limit, gotKey, gotDeadline, c.Key, dl)
	}
	ok = false
	c2 := c
	tb.Share("d", "r", &c2, dl)
	if c2.Limit != 200 {
		t.Errorf("unmeasured regional clock: limit %d, want 200 (mid-window by the global clock)", c2.Limit)
	}
}

// TestTableMetrics: the table's series by region and rule, as
// docs/global.md and the RLSGlobalShareStale alert name them: the age of
// the last exchange is -1 before any, then small; the rule's share and
// keys follow its grants.
func TestTableMetrics(t *testing.T) {
	c := redistest.StartServer(t).Client()
	tb := NewTable(c, settings("eu", "p1"), nil)
	reg := prometheus.NewRegistry()
	tb.Register(reg)
	age := func() float64 {
		return testutil.ToFloat64(prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
			mfs, _ := reg.Gather()
			for _, mf := range mfs {
				if mf.GetName() == "rls_global_exchange_age_seconds" {
					ch <- prometheus.MustNewConstMetric(descAge, prometheus.GaugeValue, mf.GetMetric()[0].GetGauge().GetValue(), "eu")
				}
			}
		}))
	}
	if a := age(); a != -1 {
		t.Errorf("age before any exchange: %v, want -1", a)
	}
	check := store.Check{Key: "rl:{d:k=m}:k", Algorithm: store.FixedWindow, Limit: 50, Window: time.Second, Hits: 1}
	tb.Share("d", "per_key", &check, time.Time{})
	tb.exchange(context.Background(), false)
	if a := age(); a < 0 || a > 5 {
		t.Errorf("age after an exchange: %v", a)
	}
	want := `# HELP rls_global_keys Keys of scope: global rules this replica holds shares of.
# TYPE rls_global_keys gauge
rls_global_keys{domain="d",region="eu",rule="per_key"} 1
# HELP rls_global_share This region's shares of the current window, summed over the rule's keys.
# TYPE rls_global_share gauge
rls_global_share{domain="d",region="eu",rule="per_key"} 50
`
	// The share is of the current window: an exchange that lands at a
	// window's end may have granted the next one only, so exchange again
	// (as the loop would) until the current window's grant shows.
	var err error
	testkit.EventuallyEvery(5*time.Second, 100*time.Millisecond, func() bool {
		if err = testutil.GatherAndCompare(reg, strings.NewReader(want), "rls_global_keys", "rls_global_share"); err != nil {
			tb.exchange(context.Background(), false)
		}
		return err == nil
	})
	if err != nil {
		t.Error(err)
	}
}

// TestTableDescribe: Explain's note says there is no share before the
// first exchange, then the region's share, floor and lease.
func TestTableDescribe(t *testing.T) {
	c := redistest.StartServer(t).Client()
	tb := NewTable(c, settings("eu", "p1"), nil)
	if d := tb.Describe("rl:{d:k=e}:k", 40, time.Second); !strings.Contains(d, "region eu: no share of this key yet") {
		t.Errorf("before any exchange: %q", d)
	}
	check := store.Check{Key: "rl:{d:k=e}:k", Algorithm: store.FixedWindow, Limit: 40, Window: time.Second, Hits: 1}
	tb.Share("d", "r", &check, time.Time{})
	tb.exchange(context.Background(), false)
	if d := tb.Describe("rl:{d:k=e}:k", 40, time.Second); !strings.Contains(d, "region eu: share 40 of 40 in the current window (next window: 40), floor 4, leased to window") {
		t.Errorf("after an exchange: %q", d)
	}
}
