package simulate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"
)

func rowKey(entries []string) (string, bool) { return strings.Join(entries, "|"), true }

// TestReadCSVKeyCap: a trace is refused at the row of its first key beyond
// the cap, with an error naming the file, the line and the cap; below it,
// the events of one key share one key string.
func TestReadCSVKeyCap(t *testing.T) {
	csv := "1,k=a\n2,k=b\n3,k=a\n4,k=c\n5,k=a\n6,k=d\n"
	_, err := readCSV(context.Background(), strings.NewReader(csv), "t.csv", rowKey, 3)
	var ke *KeyCapError
	if !errors.As(err, &ke) || ke.Line != 6 || ke.Max != 3 ||
		err.Error() != "t.csv:6: more than 3 distinct keys, rls simulate's cap (simulate.MaxKeys): simulate one rule's keys, or a sample of them" {
		t.Fatalf("got %v, want a KeyCapError at t.csv:6 naming the cap of 3", err)
	}
	tr, err := readCSV(context.Background(), strings.NewReader(csv), "t.csv", rowKey, 4)
	if err != nil || len(tr.Events) != 6 {
		t.Fatalf("cap 4: %d events, %v; want all 6", len(tr.Events), err)
	}
	if unsafe.StringData(tr.Events[0].Key) != unsafe.StringData(tr.Events[4].Key) {
		t.Error("two events of key a hold two strings, want one")
	}
	if _, err := ReadCSV(context.Background(), strings.NewReader(csv), "t.csv", rowKey); err != nil {
		t.Errorf("ReadCSV under MaxKeys: %v", err)
	}
}

// TestContextStops: a done context stops reading a trace and running one,
// and RunAll then returns the reports it made (none here) with an error
// that says it stopped.
func TestContextStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var b strings.Builder
	for i := range 3 * checkEvery {
		fmt.Fprintf(&b, "%d,k=a\n", i)
	}
	if _, err := ReadCSV(ctx, strings.NewReader(b.String()), "t.csv", rowKey); !errors.Is(err, context.Canceled) ||
		!strings.HasPrefix(err.Error(), fmt.Sprintf("t.csv:%d: ", checkEvery)) {
		t.Errorf("reading with a done context: %v, want context.Canceled at line %d", err, checkEvery)
	}
	l := Limit{Requests: 10, Window: time.Second}
	tr, err := Generate("poisson", l.Requests, l.Window, 1, "k")
	if err != nil {
		t.Fatal(err)
	}
	cands := Candidates(l, nil, nil)
	if _, err := Run(ctx, tr, l, cands); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a done context: %v, want context.Canceled", err)
	}
	reps, err := RunAll(ctx, []Trace{tr, tr}, l, cands)
	if reps == nil || len(reps) != 0 || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "0 of 2 traces") {
		t.Errorf("RunAll with a done context: %d reports, %v; want none, and an error saying 0 of 2", len(reps), err)
	}
	reps, err = RunAll(context.Background(), []Trace{tr, tr}, l, cands)
	if len(reps) != 2 || err != nil {
		t.Errorf("RunAll: %d reports, %v; want 2", len(reps), err)
	}
}
