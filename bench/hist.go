package main

import (
	"math"
	"math/bits"
)

// hist is a log-linear latency histogram in microseconds, in the spirit of
// HdrHistogram: values below 2^subBits are counted exactly; above that each
// power-of-two range is split into 2^(subBits-1) equal sub-buckets, so any
// recorded value is reported within 1/2^(subBits-1) (< 0.8%) of its true
// value. The maximum, minimum and sum are tracked exactly.
type hist struct {
	counts [histBuckets]uint64
	n      uint64
	sum    uint64
	min    uint64
	max    uint64
}

const (
	subBits     = 8            // first 256 µs exact
	subCount    = 1 << subBits // 256
	halfCount   = subCount / 2 // sub-buckets per power of two above that
	maxExp      = 40           // values up to 2^40 µs (~12.7 days) before clamping
	histBuckets = subCount + (maxExp-subBits)*halfCount
)

// bucketOf returns the bucket index of v (µs).
func bucketOf(v uint64) int {
	if v < subCount {
		return int(v)
	}
	shift := bits.Len64(v) - subBits // v>>shift is in [halfCount, subCount)
	if shift >= maxExp-subBits+1 {
		return histBuckets - 1
	}
	return subCount + (shift-1)*halfCount + int(v>>uint(shift)) - halfCount
}

// bucketHigh returns the highest value that lands in bucket i.
func bucketHigh(i int) uint64 {
	if i < subCount {
		return uint64(i)
	}
	j := i - subCount
	shift := j/halfCount + 1
	sub := uint64(j%halfCount + halfCount)
	return (sub+1)<<uint(shift) - 1
}

// Record adds one value in microseconds.
func (h *hist) Record(us uint64) {
	h.counts[bucketOf(us)]++
	if h.n == 0 || us < h.min {
		h.min = us
	}
	if us > h.max {
		h.max = us
	}
	h.n++
	h.sum += us
}

// Merge adds o's counts into h.
func (h *hist) Merge(o *hist) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// Count is the number of recorded values.
func (h *hist) Count() uint64 { return h.n }

// Max is the largest recorded value (exact).
func (h *hist) Max() uint64 { return h.max }

// Min is the smallest recorded value (exact).
func (h *hist) Min() uint64 { return h.min }

// Mean is the exact mean of the recorded values.
func (h *hist) Mean() float64 {
	if h.n == 0 {
		return 0
	}
	return float64(h.sum) / float64(h.n)
}

// Quantile returns the value at quantile q in [0,1]: the highest value of
// the bucket holding the ceil(q*n)-th smallest value, clamped to the
// exact min and max.
func (h *hist) Quantile(q float64) uint64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank < 1 {
		rank = 1
	}
	if rank >= h.n {
		return h.max
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			v := bucketHigh(i)
			if v > h.max {
				v = h.max
			}
			if v < h.min {
				v = h.min
			}
			return v
		}
	}
	return h.max
}
