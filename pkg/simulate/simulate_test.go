package simulate

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

var perSecond50 = Limit{Requests: 50, Window: time.Second}

// at builds a one-key trace of one-hit events at the given seconds.
func at(secs ...float64) Trace {
	tr := Trace{Name: "t"}
	for _, s := range secs {
		tr.Events = append(tr.Events, Event{At: int64(s*1e6 + 0.5), Key: "k", Hits: 1})
	}
	return tr
}

// TestExactLog follows the exact sliding log by hand: the trailing window
// is (t-W, t], so a request exactly one window after an admitted one no
// longer counts it.
func TestExactLog(t *testing.T) {
	l := Limit{Requests: 3, Window: time.Second}
	tr := at(0, 0.1, 0.2, 0.3, 1.0, 1.05, 1.1, 1.2)
	tr.Events = append(tr.Events, Event{At: 5e6, Key: "k", Hits: 4}, Event{At: 5e6, Key: "other", Hits: 3}, Event{At: 5e6, Key: "k", Hits: 3})
	got := Exact(tr, l)
	want := []bool{true, true, true, false, true, false, true, true, false, true, true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("exact log:\n got %v\nwant %v", got, want)
	}
}

// TestBoundaryPeaks: the boundary attack (50 requests evenly in the 50 ms
// before a second's end and 50 in the 50 ms after) decided by hand. The
// fixed window admits both halves (100); the two-counter window admits
// the first 50 and then one hit each time the previous window's weight
// 50*(1-e) has dropped by one more, at 1 ms, 21 ms and 41 ms past the
// boundary (53); any precision sees that the 50 are all in the last
// sub-window and admits none after the boundary (50). The exact log
// admits 50.
func TestBoundaryPeaks(t *testing.T) {
	tr, err := Generate("boundary:every=10s,duration=2s", 50, time.Second, 1, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Events) != 100 {
		t.Fatalf("%d events, want 100", len(tr.Events))
	}
	cands := Candidates(perSecond50, []uint64{10}, nil)
	rep, err := Run(context.Background(), tr, perSecond50, cands)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{
		"sliding_window":              53,
		"sliding_window precision=10": 50,
		"fixed_window":                100,
	}
	if rep.Exact.Peak != 50 || rep.Exact.Admitted != 50 {
		t.Errorf("exact log: peak %d, admitted %d; want 50, 50", rep.Exact.Peak, rep.Exact.Admitted)
	}
	for _, r := range rep.Results {
		w, ok := want[r.Name]
		if !ok {
			continue
		}
		if r.Peak != w || r.WronglyAdmitted != int(w-50) || r.WronglyDenied != 0 {
			t.Errorf("%s: peak %d, wrongly admitted %d, denied %d; want %d, %d, 0", r.Name, r.Peak, r.WronglyAdmitted, r.WronglyDenied, w, w-50)
		}
		if r.Name == "sliding_window" {
			var after []int64
			for i, e := range tr.Events {
				if r.Allowed[i] && e.At >= 1e6 {
					after = append(after, e.At-1e6)
				}
			}
			if !slices.Equal(after, []int64{1000, 21000, 41000}) {
				t.Errorf("two counters admitted after the boundary at %v µs, want 1000, 21000, 41000", after)
			}
		}
	}
	if r := rep.Results[0]; r.PeakAt != 1.041 {
		t.Errorf("two counters peak at %v s, want 1.041", r.PeakAt)
	}
}

// TestWronglyDenied: a full window's worth at the start of second 0,
// then again at the start of second 1. The exact log admits the second
// burst (the first has left the trailing window by then); the two-counter
// window weighs the first burst as if it were spread over its window and
// denies most of the second.
func TestWronglyDenied(t *testing.T) {
	l := Limit{Requests: 10, Window: time.Second}
	var secs []float64
	for i := range 10 {
		secs = append(secs, float64(i)*0.001)
	}
	for i := range 10 {
		secs = append(secs, 1.5+float64(i)*0.001)
	}
	rep, err := Run(context.Background(), at(secs...), l, []Candidate{{Algorithm: store.SlidingWindow}, {Algorithm: store.SlidingWindow, Precision: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Exact.Admitted != 20 {
		t.Fatalf("exact log admitted %d, want 20", rep.Exact.Admitted)
	}
	// At 1.5 s the previous window's 10 weigh 5: 5 of the second burst
	// pass; at 1.501 s they weigh 4.99, the rate is 9.99 and the budget
	// ceil(10 - 9.99) = 1: a sixth passes.
	if r := rep.Results[0]; r.Admitted != 16 || r.WronglyDenied != 4 || r.WronglyDeniedShare != 0.2 {
		t.Errorf("two counters: admitted %d, wrongly denied %d (%v); want 16, 4 (0.2)", r.Admitted, r.WronglyDenied, r.WronglyDeniedShare)
	}
	if r := rep.Results[1]; r.Admitted != 20 || r.WronglyDenied != 0 {
		t.Errorf("precision 10: admitted %d, wrongly denied %d; want 20, 0", r.Admitted, r.WronglyDenied)
	}
}

func TestCandidates(t *testing.T) {
	l := Limit{Requests: 50, Window: time.Second}
	names := func(cs []Candidate) (s []string) {
		for _, c := range cs {
			n := c.Name(l)
			if c.Own {
				n += " *"
			}
			s = append(s, n)
		}
		return s
	}
	got := names(Candidates(l, []uint64{10, 2, 10}, &Candidate{Algorithm: store.SlidingWindow, Precision: 10}))
	want := []string{"sliding_window", "sliding_window precision=10 *", "sliding_window precision=2",
		"sliding_window precision=10 strict", "sliding_window precision=2 strict", "fixed_window", "token_bucket burst=50", "token_bucket burst=5"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
	got = names(Candidates(Limit{Requests: 5, Window: time.Second}, nil, &Candidate{Algorithm: store.TokenBucket, Burst: 20}))
	want = []string{"sliding_window", "fixed_window", "token_bucket burst=5", "token_bucket burst=20 *"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
	got = names(Candidates(l, nil, &Candidate{Algorithm: store.TokenBucket}))
	if !slices.Contains(got, "token_bucket burst=50 *") {
		t.Errorf("a token bucket without burst is burst L: %q", got)
	}
}

func TestParsePrecisions(t *testing.T) {
	if p, err := ParsePrecisions(" 2, 60 "); err != nil || !slices.Equal(p, []uint64{2, 60}) {
		t.Errorf("got %v, %v", p, err)
	}
	for _, bad := range []string{"1", "61", "x", "2,,3", "+5", "05"} {
		if _, err := ParsePrecisions(bad); err == nil || !strings.Contains(err.Error(), "precision") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestRedisCost: a token bucket or precise window is one script call, TIME
// and GET always, SET when admitted; a window is plain commands (INCRBY,
// PEXPIRE and, sliding, GET once per key and window), plus their take-back
// and a script call (TIME, a GET) when denied.
func TestRedisCost(t *testing.T) {
	l := Limit{Requests: 2, Window: time.Second}
	tr := Trace{Events: []Event{
		{At: 0, Key: "a", Hits: 1}, {At: 1, Key: "a", Hits: 1}, {At: 2, Key: "a", Hits: 1}, // the third denied
		{At: 3, Key: "b", Hits: 1},
	}}
	allowed := []bool{true, true, false, true}
	if c, n := RedisCost(tr, l, Candidate{Algorithm: store.TokenBucket}, allowed); c != 1 || n != 2.75 {
		t.Errorf("token bucket: got %v calls, %v commands", c, n)
	}
	if c, n := RedisCost(tr, l, Candidate{Algorithm: store.FixedWindow}, allowed); c != 0.25 || n != 3 {
		t.Errorf("fixed window: got %v calls, %v commands, want 1/4 and 2+4/4", c, n)
	}
	if c, n := RedisCost(tr, l, Candidate{Algorithm: store.SlidingWindow}, allowed); c != 0.25 || n != 3.5 {
		t.Errorf("sliding window: got %v calls, %v commands, want 1/4 and 2+2/4+4/4 (two keys' windows)", c, n)
	}
	if c, n := RedisCost(Trace{}, l, Candidate{}, nil); c != 0 || n != 0 {
		t.Errorf("empty trace: %v, %v", c, n)
	}
	if b, v := RedisBytes(Candidate{Precision: 10}); b != 184 || v != 105 {
		t.Errorf("precision 10: %d bytes, %d of value", b, v)
	}
}
