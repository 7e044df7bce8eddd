package simtest

import (
	"context"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/simulate"
	"github.com/rls-project/rls/pkg/store"
)

var perSecond50 = simulate.Limit{Requests: 50, Window: time.Second}

// TestFollow: following a candidate's own decisions finds no difference;
// following another candidate's finds the decisions that differ given the
// same history, the first of them where Decide's first difference is.
func TestFollow(t *testing.T) {
	tr, err := simulate.Generate("poisson:rate=2L,duration=5s", 50, time.Second, 7, "k")
	if err != nil {
		t.Fatal(err)
	}
	two, p10 := simulate.Candidate{Algorithm: store.SlidingWindow}, simulate.Candidate{Algorithm: store.SlidingWindow, Precision: 10}
	own, err := simulate.Decide(context.Background(), tr, perSecond50, p10)
	if err != nil {
		t.Fatal(err)
	}
	if diff, err := Follow(tr, perSecond50, p10, own); err != nil || len(diff) != 0 {
		t.Fatalf("following its own decisions: %d differ (%v)", len(diff), err)
	}
	other, _ := simulate.Decide(context.Background(), tr, perSecond50, two)
	first := -1
	for i := range own {
		if own[i] != other[i] {
			first = i
			break
		}
	}
	diff, err := Follow(tr, perSecond50, two, own)
	if err != nil || len(diff) == 0 || diff[0] != first {
		t.Fatalf("two counters following precision 10: %v (%v), want the first at %d", diff, err, first)
	}
	t.Logf("two counters following precision 10 on %d requests: %d decisions differ", len(tr.Events), len(diff))
	if _, err := Follow(tr, perSecond50, two, own[1:]); err == nil {
		t.Error("verdicts of the wrong length: no error")
	}
}
