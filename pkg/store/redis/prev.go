package redisstore

import (
	"hash/maphash"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// prevCounts keeps two-counter sliding windows' previous counts, read once
// per key and window (docs/redis.md, "Window keys"). A window that has
// ended only falls (a refund, a take-back), so a kept count is the store's
// or above it, and a decision from it never admits what the store would
// deny. A count is keyed by its window key, which names its window, and
// kept until the window after it ends. A call that may lower one (a
// refund that reads the previous key) drops it.
type prevCounts struct {
	seed   maphash.Seed
	shards [prevShards]prevShard
}

const (
	prevShards   = 16
	prevPerShard = 4096 // 65,536 counts: a few MB
)

type prevShard struct {
	mu sync.Mutex
	m  map[string]prevCount
}

type prevCount struct {
	n, until int64 // the count; unix µs when its next window ends
}

func (p *prevCounts) shard(key string) *prevShard {
	return &p.shards[maphash.String(p.seed, key)%prevShards]
}

// get returns key's kept count at now (unix µs).
func (p *prevCounts) get(key string, now int64) (int64, bool) {
	sh := p.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c, ok := sh.m[key]
	if !ok || now >= c.until {
		return 0, false
	}
	return c.n, true
}

// put keeps n as key's count until until (unix µs). A full shard drops
// what has expired, and everything when that is not a quarter of it.
func (p *prevCounts) put(key string, n, until, now int64) {
	sh := p.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m == nil {
		sh.m = make(map[string]prevCount)
	}
	if len(sh.m) >= prevPerShard {
		for k, c := range sh.m {
			if now >= c.until {
				delete(sh.m, k)
			}
		}
		if len(sh.m) > prevPerShard*3/4 {
			clear(sh.m)
		}
	}
	sh.m[key] = prevCount{n: n, until: until}
}

func (p *prevCounts) drop(key string) {
	sh := p.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
}

// parseCount reads a window key's GET reply as decide.lua does: absent is
// 0; ok is false for a value that is not a count (the script reads it as
// 0 and writes over it, so it is not kept).
func parseCount(cmd *redis.StringCmd) (n int64, ok bool) {
	if cmd.Err() == redis.Nil {
		return 0, true
	}
	if cmd.Err() != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(cmd.Val(), 10, 64)
	return n, err == nil && n >= 0
}
