package redisstore

import (
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// prevCounts keeps two-counter sliding windows' previous counts, read once
// per key and window, by window key, until the window after it ends; a
// kept count is never below the store's (docs/redis.md, invariant 2). It
// is safe for concurrent use.
type prevCounts struct {
	mu    sync.Mutex
	m     map[string]prevCount
	bytes int // len(key) + prevOverhead per count kept
}

const (
	maxPrevBytes = 4 << 20 // the table's bound, keys included
	prevOverhead = 64      // a count's map slot and string header
)

type prevCount struct{ n, until int64 } // the count; unix µs when its next window ends

// get returns key's kept count at now (unix µs).
func (p *prevCounts) get(key string, now int64) (int64, bool) {
	p.mu.Lock()
	c, ok := p.m[key]
	p.mu.Unlock()
	return c.n, ok && now < c.until
}

// put keeps n as key's count until until (unix µs). A full table drops
// what has expired, and everything when that leaves it 3/4 full.
func (p *prevCounts) put(key string, n, until, now int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil || p.bytes+len(key)+prevOverhead > maxPrevBytes {
		for k, c := range p.m {
			if now >= c.until {
				p.del(k)
			}
		}
		if p.m == nil || p.bytes > maxPrevBytes*3/4 {
			p.m, p.bytes = make(map[string]prevCount), 0
		}
	}
	p.del(key)
	p.m[key] = prevCount{n: n, until: until}
	p.bytes += len(key) + prevOverhead
}

// del forgets key's count. p.mu is held.
func (p *prevCounts) del(key string) {
	if _, ok := p.m[key]; ok {
		delete(p.m, key)
		p.bytes -= len(key) + prevOverhead
	}
}

func (p *prevCounts) drop(key string) {
	p.mu.Lock()
	p.del(key)
	p.mu.Unlock()
}

// parseCount reads a window key's GET reply as decide.lua does: absent is
// 0; ok is false for a value that is not a count (the script reads it as
// 0 and writes over it, so it is not kept).
func parseCount(cmd *redis.StringCmd) (n int64, ok bool) {
	if cmd.Err() == redis.Nil {
		return 0, true
	}
	n, err := strconv.ParseInt(cmd.Val(), 10, 64)
	return n, cmd.Err() == nil && err == nil && n >= 0
}
