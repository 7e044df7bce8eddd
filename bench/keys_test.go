package main

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestPickers(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	p, err := newKeyPicker("one", 50, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint64(100) {
		if p.Pick(i, r) != 0 {
			t.Fatal("one: want key 0")
		}
	}
	p, _ = newKeyPicker("roundrobin", 3, 0)
	for i, want := range []int{0, 1, 2, 0, 1, 2, 0} {
		if got := p.Pick(uint64(i), r); got != want {
			t.Fatalf("roundrobin seq %d: %d want %d", i, got, want)
		}
	}
	p, _ = newKeyPicker("uniform", 10, 0)
	var counts [10]int
	for i := range uint64(100000) {
		counts[p.Pick(i, r)]++
	}
	for k, c := range counts {
		if c < 9000 || c > 11000 {
			t.Errorf("uniform key %d: %d of 100000", k, c)
		}
	}
	for _, bad := range []struct {
		dist string
		n    int
		s    float64
	}{{"zipf", 10, 0}, {"zipf", 10, -1}, {"zipf", 10, math.NaN()}, {"nope", 10, 1}, {"one", 0, 1}} {
		if _, err := newKeyPicker(bad.dist, bad.n, bad.s); err == nil {
			t.Errorf("%+v: want an error", bad)
		}
	}
}

func TestZipf(t *testing.T) {
	const n, draws = 100, 400000
	for _, s := range []float64{0.8, 1, 1.2} {
		p, err := newKeyPicker("zipf", n, s)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(1, uint64(s*10)))
		counts := make([]int, n)
		for i := range uint64(draws) {
			counts[p.Pick(i, r)]++
		}
		var h float64
		for k := 1; k <= n; k++ {
			h += math.Pow(float64(k), -s)
		}
		for _, k := range []int{0, 1, 9, 99} {
			want := draws * math.Pow(float64(k+1), -s) / h
			got := float64(counts[k])
			if math.Abs(got-want) > 5*math.Sqrt(want)+1 {
				t.Errorf("s=%v key %d: %v draws, want ~%.0f", s, k, got, want)
			}
		}
	}
	// A single key always picks it.
	p, _ := newKeyPicker("zipf", 1, 1)
	if p.Pick(0, rand.New(rand.NewPCG(0, 0))) != 0 {
		t.Fatal("zipf over 1 key")
	}
}
