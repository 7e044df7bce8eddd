package simulate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore"
	"github.com/rls-project/rls/pkg/testkit"
)

// strictTraces are the five standard traces at L = 50 per second.
func strictTraces(t *testing.T, l Limit) []Trace {
	t.Helper()
	var trs []Trace
	for _, g := range StandardGenerators {
		tr, err := Generate(g, l.Requests, l.Window, 1, "sim")
		if err != nil {
			t.Fatal(err)
		}
		trs = append(trs, tr)
	}
	return trs
}

// TestStrictNeverOverTheLimit: strict: true at every precision holds every
// trailing second at or below L on the five standard traces (the memory
// store's arithmetic, as rls simulate replays it), where the same
// precision without strict goes over.
func TestStrictNeverOverTheLimit(t *testing.T) {
	l := Limit{Requests: 50, Window: time.Second}
	over := 0
	for _, tr := range strictTraces(t, l) {
		for _, p := range DefaultPrecisions {
			for _, strict := range []bool{true, false} {
				rep, err := Run(context.Background(), tr, l, []Candidate{{Algorithm: store.SlidingWindow, Precision: p, Strict: strict}})
				if err != nil {
					t.Fatal(err)
				}
				r := rep.Results[0]
				if strict && r.Peak > l.Requests {
					t.Errorf("%s, %s: %d in a trailing second, over the limit of %d", tr.Name, r.Name, r.Peak, l.Requests)
				}
				if !strict && r.Peak > l.Requests {
					over++
				}
			}
		}
	}
	if over == 0 {
		t.Error("no precision without strict went over the limit: the traces do not test strict")
	}
}

// TestStrictRedisDecidesAsMemory: the five standard traces through the
// Redis store (a real redis-server, its script on a test clock) with
// strict precision 10 get, event for event, the memory store's decisions.
func TestStrictRedisDecidesAsMemory(t *testing.T) {
	srv := redistest.StartServer(t)
	rc := srv.Client()
	defer rc.Close()
	clk := testkit.NewClock(time.Unix(0, 0))
	s, err := redisstore.New(redisstore.Options{Client: rc, Timeout: 5 * time.Second, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := Limit{Requests: 50, Window: time.Second}
	c := Candidate{Algorithm: store.SlidingWindow, Precision: 10, Strict: true}
	ctx := context.Background()
	for n, tr := range strictTraces(t, l) {
		want, err := Decide(context.Background(), tr, l, c)
		if err != nil {
			t.Fatal(err)
		}
		res := make([]store.Result, 1)
		for i, e := range tr.Events {
			clk.Set(time.UnixMicro(e.At))
			if err := s.Decide(ctx, []store.Check{c.check(l, fmt.Sprintf("rl:{strict%d|%s}:s1p10x", n, e.Key), e.Hits)}, res); err != nil {
				t.Fatal(err)
			}
			if res[0].Allowed != want[i] {
				t.Fatalf("%s event %d at %d µs: Redis allowed=%v, the memory store %v", tr.Name, i, e.At, res[0].Allowed, want[i])
			}
		}
	}
}
