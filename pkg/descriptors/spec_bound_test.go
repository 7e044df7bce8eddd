package descriptors

import (
	"runtime"
	"strconv"
	"testing"
)

// TestSpecTreeMemoryLinear: a spec's field paths cost their last segment,
// not their depth, so the node tree of leaves under a deep chain costs what
// the tree of leaves at the top does.
func TestSpecTreeMemoryLinear(t *testing.T) {
	tree := func(depth, leaves int) []DomainSpec {
		top := DescriptorSpec{Key: "k"}
		cur := &top
		for range depth - 1 {
			cur.Descriptors = []DescriptorSpec{{Key: "k"}}
			cur = &cur.Descriptors[0]
		}
		for i := range leaves {
			cur.Descriptors = append(cur.Descriptors, DescriptorSpec{Key: "leaf", Value: strconv.Itoa(i),
				RateLimit: &RateLimitSpec{Unit: "SECOND", RequestsPerUnit: 1}})
		}
		return []DomainSpec{{Name: "xds:t", Domain: "t", Descriptors: []DescriptorSpec{top}}}
	}
	alloc := func(specs []DomainSpec) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b := &specBuilder{lines: []int32{0}, paths: []specPath{{parent: -1}}}
		_ = digest(b.domain(specs[0]))
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	shallow, deep := alloc(tree(2, 5000)), alloc(tree(60, 5000))
	if deep > shallow+shallow/5 {
		t.Errorf("5000 leaves under 60 levels allocate %d KB, under 2 levels %d KB: paths grow with depth", deep>>10, shallow>>10)
	}
}
