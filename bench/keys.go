package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// keyPicker chooses the key index (0..n-1) of the seq-th request. seq is the
// global request sequence number (shared by all workers), r the worker's own
// random source. Implementations are read-only after construction, so one
// picker serves every worker.
type keyPicker interface {
	Pick(seq uint64, r *rand.Rand) int
}

type onePicker struct{}

func (onePicker) Pick(uint64, *rand.Rand) int { return 0 }

type uniformPicker struct{ n int }

func (p uniformPicker) Pick(_ uint64, r *rand.Rand) int { return r.IntN(p.n) }

type roundRobinPicker struct{ n uint64 }

func (p roundRobinPicker) Pick(seq uint64, _ *rand.Rand) int { return int(seq % p.n) }

// zipfPicker draws key k (0-based) with probability proportional to
// 1/(k+1)^s, for any s > 0 (math/rand's Zipf needs s > 1), by binary search
// in the precomputed cumulative distribution.
type zipfPicker struct{ cdf []float64 }

func newZipfPicker(n int, s float64) zipfPicker {
	cdf := make([]float64, n)
	var total float64
	for k := range n {
		total += math.Pow(float64(k+1), -s)
		cdf[k] = total
	}
	for k := range cdf {
		cdf[k] /= total
	}
	cdf[n-1] = 1
	return zipfPicker{cdf: cdf}
}

func (p zipfPicker) Pick(_ uint64, r *rand.Rand) int {
	u := r.Float64()
	i := sort.SearchFloat64s(p.cdf, u)
	if u == p.cdf[min(i, len(p.cdf)-1)] && i < len(p.cdf)-1 {
		i++ // SearchFloat64s finds cdf[i] >= u; a tie belongs to the next key
	}
	return min(i, len(p.cdf)-1)
}

// newKeyPicker builds the picker for -dist over n keys.
func newKeyPicker(dist string, n int, s float64) (keyPicker, error) {
	if n < 1 {
		return nil, fmt.Errorf("-keys %d: want at least 1", n)
	}
	switch dist {
	case "one":
		return onePicker{}, nil
	case "uniform":
		return uniformPicker{n: n}, nil
	case "roundrobin":
		return roundRobinPicker{n: uint64(n)}, nil
	case "zipf":
		if !(s > 0) || math.IsInf(s, 0) {
			return nil, fmt.Errorf("-zipf-s %v: want a finite value > 0", s)
		}
		return newZipfPicker(n, s), nil
	}
	return nil, fmt.Errorf("-dist %q: want one, uniform, zipf or roundrobin", dist)
}
