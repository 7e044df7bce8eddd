// Package lua embeds the Redis scripts, the single source of truth for the
// Redis store's arithmetic (see pkg/store for the contract they implement).
package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// DecideSource is the text of decide.lua. Its header documents KEYS, ARGV
// and the reply.
//
//go:embed decide.lua
var DecideSource string

// Decide decides one hash slot's batch of checks atomically: refunds and
// forced write-backs first, then every other check in order against the
// batch's tentative state, all consumption written or none. Call it with Run (EVALSHA, then EVAL on
// NOSCRIPT). A *redis.Script is safe for concurrent use.
var Decide = redis.NewScript(DecideSource)

// Decide's ARGV header, per-check layout, codes and flag bits: the one list
// shared by Go and decide.lua, which names each value in a `local` line
// that lua_test.go checks against these.
const (
	// HeaderArgs is the number of ARGV values before the first check: the
	// test clock ("" = redis TIME) and the mode (HEADER in decide.lua).
	HeaderArgs = 2
	// ArgsPerCheck is the number of ARGV values per check: algorithm, limit,
	// window seconds, burst, hits, flags (PER).
	ArgsPerCheck = 6
	// ReplyPerCheck is the number of reply values per check: allowed,
	// remaining, retry_after_us, reset_us (REPLY).
	ReplyPerCheck = 4

	// ModeDecide is the mode that decides and writes (MODE_DECIDE).
	ModeDecide = "0"
	// ModePeek is the mode that treats every check as check-only (Hits 0,
	// no refund, no force) and writes nothing (MODE_PEEK).
	ModePeek = "1"

	// AlgSliding is the algorithm value of a sliding-window check
	// (ALG_SLIDING); the script treats unknown values as AlgSliding.
	AlgSliding = 0
	// AlgTokenBucket is the algorithm value of a token bucket check
	// (ALG_TOKEN_BUCKET).
	AlgTokenBucket = 1
	// AlgFixed is the algorithm value of a fixed-window check (ALG_FIXED).
	AlgFixed = 2

	// FlagRefund is the flags bit of store.Check.Refund (FLAG_REFUND).
	FlagRefund = 1
	// FlagShadow is the flags bit of store.Check.Shadow (FLAG_SHADOW).
	FlagShadow = 2
	// FlagForce is the flags bit of store.Check.Force (FLAG_FORCE).
	FlagForce = 4
)

// FleetSource is the text of fleet.lua.
//
//go:embed fleet.lua
var FleetSource string

// Fleet refreshes one replica's heartbeat in the fleet's sorted set and
// returns the number of live replicas (see fleet.lua).
var Fleet = redis.NewScript(FleetSource)
