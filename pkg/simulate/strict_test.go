package simulate

import (
	"context"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
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
