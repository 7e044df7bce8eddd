package redisstore

import (
	"strconv"
	"strings"
	"testing"
)

// TestPreviousCountsBounded: the kept previous counts stay within
// maxPrevBytes, keys included, however many and however long the keys
// (integration's TestTablesBoundedByBytes sends 4 KB ones); what has
// expired goes first, and a count is read back as it was kept.
func TestPreviousCountsBounded(t *testing.T) {
	var p prevCounts
	long := strings.Repeat("k", 4096)
	for i := range 20_000 {
		p.put(long+strconv.Itoa(i), int64(i), 1_000, 0)
		if p.bytes > maxPrevBytes {
			t.Fatalf("after %d counts: %d bytes kept, over %d", i+1, p.bytes, maxPrevBytes)
		}
	}
	if n, ok := p.get(long+"19999", 999); !ok || n != 19_999 {
		t.Errorf("the last count: %d, %v", n, ok)
	}
	if _, ok := p.get(long+"19999", 1_000); ok {
		t.Errorf("a count read after its window ended")
	}
	// Expired counts make room without dropping live ones.
	p = prevCounts{}
	for i := range maxPrevBytes / (100 + prevOverhead) {
		p.put(strings.Repeat("e", 90)+strconv.Itoa(i), 1, 10, 0) // until 10
	}
	p.put("live", 7, 1_000, 0)
	for i := range 1_000 {
		p.put(strings.Repeat("n", 90)+strconv.Itoa(i), 1, 1_000, 20) // now past 10
	}
	if n, ok := p.get("live", 20); !ok || n != 7 {
		t.Errorf("a live count was dropped making room: %d, %v", n, ok)
	}
}
