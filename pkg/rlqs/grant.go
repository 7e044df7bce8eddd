package rlqs

import (
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// grant is one assignment: a token bucket of max tokens, refilled with
// per tokens every fill seconds, for ttl whole seconds (Envoy truncates
// every duration to whole seconds). Its worst case, what an Envoy can admit
// under it, is max + per*ttl/fill, and worst returns it rounded down (an
// Envoy admits whole requests). deny marks a blanket DENY_ALL, allow a
// blanket ALLOW_ALL.
type grant struct {
	max, per   uint64
	fill, ttl  int64 // whole seconds, at least 1
	deny       bool
	allow      bool
	reservedAt time.Time // when its worst case was reserved
	windowEnd  time.Time // when the window it was reserved in ends (zero: a token-bucket rule)
	reserved   uint64    // hits consumed for it in the store
}

// worst returns the most requests an Envoy admits under g from receiving
// it until it expires: its whole bucket and ttl seconds of refill.
func (g *grant) worst() uint64 {
	if g.deny || g.allow {
		return 0
	}
	return g.max + g.per*uint64(g.ttl)/uint64(g.fill)
}

// rate returns g's refill in tokens per second (0 for a blanket grant).
func (g *grant) rate() float64 {
	if g.deny || g.allow || g.fill <= 0 {
		return 0
	}
	return float64(g.per) / float64(g.fill)
}

// shape returns the grant of at most x hits over ttl seconds: a burst of a
// thirty-second of x (at least 4 tokens where x has them, leaving at least
// one token a second of refill), then a steady refill; below ttl+1 hits, x
// tokens refilled once per ttl+1 seconds; x 0 is DENY_ALL. Its worst case
// never passes x (invariant 1 of docs/rlqs.md, which says why the burst).
func shape(x uint64, ttl int64) grant {
	if ttl < 1 {
		ttl = 1
	}
	g := grant{ttl: ttl}
	switch {
	case x == 0:
		g.deny = true
	case x <= uint64(ttl):
		g.max, g.per, g.fill = x, 1, ttl+1
	default:
		burst := min(max(1, min(4, x/4), x/32), x-uint64(ttl)) // at least 1 per second
		g.per = (x - burst) / uint64(ttl)
		g.max = x - g.per*uint64(ttl)
		g.fill = 1
	}
	return g
}

// strategy returns g as Envoy's RateLimitStrategy: only blanket_rule and
// token_bucket (Envoy skips requests_per_time_unit), tokens_per_fill always
// set (Envoy reads an unset one as rate 0), fill_interval whole seconds.
func (g *grant) strategy() *typev3.RateLimitStrategy {
	switch {
	case g.deny:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	case g.allow:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(min(g.max, 1<<32-1)),
		TokensPerFill: wrapperspb.UInt32(uint32(min(g.per, 1<<32-1))),
		FillInterval:  durationpb.New(time.Duration(g.fill) * time.Second),
	}}}
}

// wholeSeconds returns d rounded up to whole seconds, at least 1.
func wholeSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(1, s)
}
