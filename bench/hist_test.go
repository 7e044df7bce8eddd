package main

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestBucketRoundTrip(t *testing.T) {
	prev := -1
	for v := uint64(0); v < 1<<22; v++ {
		b := bucketOf(v)
		if b < prev || b > prev+1 {
			t.Fatalf("bucketOf(%d)=%d after %d: not monotonic/contiguous", v, b, prev)
		}
		prev = b
		hi := bucketHigh(b)
		if hi < v {
			t.Fatalf("bucketHigh(%d)=%d < %d", b, hi, v)
		}
		if v >= subCount && float64(hi-v) > float64(v)/halfCount {
			t.Fatalf("v=%d hi=%d: error above 1/%d", v, hi, halfCount)
		}
		if v < subCount && hi != v {
			t.Fatalf("v=%d should be exact, got %d", v, hi)
		}
	}
	for _, v := range []uint64{1 << 39, 1<<40 - 1, 1 << 40, 1 << 50, ^uint64(0)} {
		if b := bucketOf(v); b < 0 || b >= histBuckets {
			t.Fatalf("bucketOf(%d)=%d out of range", v, b)
		}
	}
}

func TestQuantiles(t *testing.T) {
	var h hist
	if h.Quantile(0.5) != 0 || h.Mean() != 0 {
		t.Fatal("empty histogram should report zeros")
	}
	for v := uint64(1); v <= 1000; v++ {
		h.Record(v)
	}
	check := func(q float64, want uint64) {
		t.Helper()
		got := h.Quantile(q)
		lo, hi := float64(want)*(1-1.0/halfCount), float64(want)*(1+1.0/halfCount)
		if float64(got) < lo || float64(got) > hi {
			t.Errorf("q%.3f = %d, want ~%d", q, got, want)
		}
	}
	check(0.5, 500)
	check(0.9, 900)
	check(0.99, 990)
	check(0.999, 999)
	if h.Quantile(1) != 1000 || h.Max() != 1000 || h.Min() != 1 {
		t.Errorf("max/min: %d %d %d", h.Quantile(1), h.Max(), h.Min())
	}
	if h.Mean() != 500.5 {
		t.Errorf("mean %v", h.Mean())
	}
	// 500 lies in the width-2 bucket [500,501]: reported as its high end.
	if got := h.Quantile(0.5); got != 501 {
		t.Errorf("q50 = %d, want 501", got)
	}
}

func TestQuantileAgainstSort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var a, b, all hist
	vals := make([]uint64, 0, 100000)
	for i := range 100000 {
		v := uint64(r.ExpFloat64() * 800) // µs, long tail
		vals = append(vals, v)
		if i%2 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
	}
	all.Merge(&a)
	all.Merge(&b)
	slices.Sort(vals)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := vals[int(q*float64(len(vals)))-1]
		got := all.Quantile(q)
		if got < exact || float64(got) > float64(exact)*(1+1.0/halfCount)+1 {
			t.Errorf("q%v: got %d, exact %d", q, got, exact)
		}
	}
	if all.Count() != 100000 || all.Max() != vals[len(vals)-1] || all.Min() != vals[0] {
		t.Errorf("merge: n=%d max=%d min=%d", all.Count(), all.Max(), all.Min())
	}
}
