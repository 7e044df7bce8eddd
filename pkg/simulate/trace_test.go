package simulate

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func plainKey(entries []string) (string, bool) { return strings.Join(entries, "|"), true }

func TestReadCSV(t *testing.T) {
	in := `timestamp,descriptor
# a comment
2.5, api_key=a, 3
1751540400.1234567,api_key=b,route=/x

0.000001,api_key=a
1,skip=me
`
	key := func(e []string) (string, bool) {
		if len(e) > 0 && strings.HasPrefix(e[0], "skip=") {
			return "", false
		}
		return plainKey(e)
	}
	tr, err := ReadCSV(context.Background(), strings.NewReader(in), "t.csv", key)
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{
		{At: 1, Key: "api_key=a", Hits: 1, Line: 6},
		{At: 2_500_000, Key: "api_key=a", Hits: 3, Line: 3},
		{At: 1751540400_123456, Key: "api_key=b|route=/x", Hits: 1, Line: 4},
	}
	if len(tr.Events) != len(want) || tr.Skipped != 1 {
		t.Fatalf("got %+v, %d skipped", tr.Events, tr.Skipped)
	}
	for i := range want {
		if tr.Events[i] != want[i] {
			t.Errorf("event %d: %+v, want %+v", i, tr.Events[i], want[i])
		}
	}

	for in, want := range map[string]string{
		"1,a=b\nx,a=b\n":       "t.csv:2: timestamp \"x\"",
		"-1,a=b\n":             "t.csv:1: timestamp \"-1\"",
		"1.2.3,a=b\n":          "t.csv:1: timestamp",
		"1,a=b,0\n":            "t.csv:1: hits \"0\"",
		"1,a=b,x\n":            "t.csv:1: hits \"x\"",
		"1,a=b,3,c=d\n":        "t.csv:1: descriptor entry \"3\"",
		"1,=b\n":               "t.csv:1: descriptor entry \"=b\"",
		"\n# only a comment\n": "t.csv: no requests",
		"1,skip=me\n":          "t.csv: none of its 1 rows matches",
		"99999999999999,a=b\n": "t.csv:1: timestamp",
	} {
		_, err := ReadCSV(context.Background(), strings.NewReader(in), "t.csv", key)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

func TestParseRow(t *testing.T) {
	for _, tc := range []struct {
		fields  []string
		ev      Event
		entries []string
		err     string
	}{
		{[]string{"1.5"}, Event{At: 1_500_000, Hits: 1}, nil, ""},
		{[]string{"2", "a=1", "b=2"}, Event{At: 2_000_000, Hits: 1}, []string{"a=1", "b=2"}, ""},
		{[]string{"2", "a=1", "7"}, Event{At: 2_000_000, Hits: 7}, []string{"a=1"}, ""},
		{[]string{"3", "4"}, Event{At: 3_000_000, Hits: 4}, []string{}, ""},
		{[]string{"3", "a=1", "9007199254740993"}, Event{}, nil, `hits "9007199254740993"`},
		{[]string{"", "a=1"}, Event{}, nil, `timestamp ""`},
		{[]string{"1", "a", "2"}, Event{}, nil, `descriptor entry "a"`},
	} {
		ev, entries, err := parseRow(tc.fields)
		if tc.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Errorf("parseRow(%q): %v, want %q", tc.fields, err, tc.err)
			}
			continue
		}
		if err != nil || ev != tc.ev || strings.Join(entries, ",") != strings.Join(tc.entries, ",") {
			t.Errorf("parseRow(%q) = %+v, %q, %v; want %+v, %q", tc.fields, ev, entries, err, tc.ev, tc.entries)
		}
	}
}

func TestGenerate(t *testing.T) {
	const limit = 50
	count := func(spec string) int {
		t.Helper()
		tr, err := Generate(spec, limit, time.Second, 1, "k")
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(tr.Events); i++ {
			if tr.Events[i].At < tr.Events[i-1].At {
				t.Fatalf("%s: not in time order at %d", spec, i)
			}
		}
		return len(tr.Events)
	}
	for spec, want := range map[string]float64{
		"poisson":                              1.1 * limit * 20,
		"poisson:rate=2L,duration=10s":         2 * limit * 10,
		"poisson:rate=30,duration=10s":         300,
		"onoff":                                4 * limit * 20 / 4,
		"onoff:rate=8L,on=100ms,off=900ms":     8 * limit * 20 / 10,
		"boundary":                             2 * limit * 10,
		"boundary:n=1.2L,every=1s,duration=3s": 5 * 60, // both sides of 1 s and 2 s, the side before 3 s
	} {
		if got := float64(count(spec)); math.Abs(got-want) > 0.1*want {
			t.Errorf("%s: %v requests, want about %v", spec, got, want)
		}
	}
	// On/off: nothing in the off periods.
	tr, _ := Generate("onoff:on=200ms,off=300ms", limit, time.Second, 1, "k")
	for _, e := range tr.Events {
		if e.At%500_000 >= 200_000 {
			t.Fatalf("onoff request at %d µs, in an off period", e.At)
		}
	}
	// The same seed gives the same trace; another seed another.
	a, _ := Generate("poisson", limit, time.Second, 3, "k")
	b, _ := Generate("poisson", limit, time.Second, 3, "k")
	c, _ := Generate("poisson", limit, time.Second, 4, "k")
	if len(a.Events) != len(b.Events) || a.Events[10] != b.Events[10] || a.Events[10] == c.Events[10] {
		t.Error("traces do not follow their seed")
	}
	for spec, want := range map[string]string{
		"bursty":                      `unknown generator "bursty"`,
		"poisson:rate=x":              "rate=x: want requests per second",
		"poisson:rate=-1L":            "rate=-1L: want a positive multiple",
		"poisson:speed=3":             `unknown parameter "speed"`,
		"poisson:rate":                `parameter "rate": want name=value`,
		"poisson:rate=1,rate=2":       "rate given twice",
		"onoff:on=0s":                 "on=0s: want a positive duration",
		"boundary:spread=2s":          "spread=2s: at most the window",
		"boundary:n=x":                "n=x: want a count",
		"poisson:duration=1ms,rate=1": "the trace has no requests",
	} {
		_, err := Generate(spec, limit, time.Second, 1, "k")
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), spec) {
			t.Errorf("%s: %v, want %q", spec, err, want)
		}
		if ge := (*GenError)(nil); !errors.As(err, &ge) || ge.Spec != spec {
			t.Errorf("%s: %#v, want a *GenError of the spec", spec, err)
		}
	}
}
