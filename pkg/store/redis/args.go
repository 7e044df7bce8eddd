package redisstore

import (
	"strconv"
	"sync/atomic"

	"github.com/rls-project/rls/lua"
)

// Script arguments go to go-redis as []any, and a number formatted and put
// in an interface costs two allocations per argument, eight arguments per
// call. The values repeat (a rule's limit, window and burst; hits of 1;
// small flags), so each is formatted and boxed once and then shared.

// smallArgs holds the boxed decimal strings of 0 to len-1.
var smallArgs = func() (a [1024]any) {
	for i := range a {
		a[i] = strconv.Itoa(i)
	}
	return a
}()

// argEntry is one cached argument; entries are never modified once stored.
type argEntry struct {
	v uint64
	a any
}

// argCache remembers the boxed strings of larger values, direct-mapped:
// lock-free, bounded (a value arriving in a request, such as a limit
// override, can only replace a slot, never grow the cache), and a miss
// costs what formatting did before.
type argCache struct {
	slots [512]atomic.Pointer[argEntry]
}

// arg returns v as a boxed decimal string for the script.
func (c *argCache) arg(v uint64) any {
	if v < uint64(len(smallArgs)) {
		return smallArgs[v]
	}
	h := v * 0x9E3779B97F4A7C15 >> (64 - 9) // Fibonacci hashing onto 512 slots
	slot := &c.slots[h]
	if e := slot.Load(); e != nil && e.v == v {
		return e.a
	}
	e := &argEntry{v: v, a: strconv.FormatUint(v, 10)}
	slot.Store(e)
	return e.a
}

// Boxed once: the header arguments of every call.
var (
	argNoClock    any = ""
	argModeDecide any = lua.ModeDecide
	argModePeek   any = lua.ModePeek
)
