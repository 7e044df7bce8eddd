package redisstore

import (
	"strconv"
	"sync"
	"testing"
)

func TestArgCache(t *testing.T) {
	var c argCache
	vals := []uint64{0, 1, 1023, 1024, 1000000000, 1<<53 + 1, ^uint64(0)}
	for round := 0; round < 2; round++ { // the second round reads the cache
		for _, v := range vals {
			if got, want := c.arg(v), strconv.FormatUint(v, 10); got != want {
				t.Errorf("round %d: arg(%d) = %v, want %q", round, v, got, want)
			}
		}
	}
	// Values colliding on a slot replace each other and stay correct.
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range uint64(20000) {
				v := 5000 + i*uint64(g+1)
				if got, want := c.arg(v), strconv.FormatUint(v, 10); got != want {
					t.Errorf("arg(%d) = %v, want %q", v, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestArgCacheAllocs(t *testing.T) {
	var c argCache
	c.arg(1000000000)
	if n := testing.AllocsPerRun(100, func() {
		_ = c.arg(1)
		_ = c.arg(1000000000)
		_ = c.arg(60)
	}); n != 0 {
		t.Errorf("cached arguments allocate %v times", n)
	}
}
