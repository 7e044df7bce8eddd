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

// Decide decides one hash slot's batch of checks atomically: refunds first,
// then every other check in order against the batch's tentative state, all
// consumption written or none. Call it with Run (EVALSHA, then EVAL on
// NOSCRIPT). A *redis.Script is safe for concurrent use.
var Decide = redis.NewScript(DecideSource)

// Decide's ARGV header and per-check layout (see decide.lua).
const (
	// HeaderArgs is the number of ARGV values before the first check: the
	// test clock ("" = redis TIME) and the mode.
	HeaderArgs = 2
	// ArgsPerCheck is the number of ARGV values per check: algorithm, limit,
	// window seconds, burst, hits, flags.
	ArgsPerCheck = 6
	// ReplyPerCheck is the number of reply values per check: allowed,
	// remaining, retry_after_us, reset_us.
	ReplyPerCheck = 4

	// ModeDecide decides and writes; ModePeek treats every check as
	// check-only (Hits 0, no refund) and writes nothing.
	ModeDecide = "0"
	ModePeek   = "1"

	// FlagRefund and FlagShadow are the bits of a check's flags value.
	FlagRefund = 1
	FlagShadow = 2
)

// FleetSource is the text of fleet.lua.
//
//go:embed fleet.lua
var FleetSource string

// Fleet refreshes one replica's heartbeat in the fleet's sorted set and
// returns the number of live replicas (see fleet.lua).
var Fleet = redis.NewScript(FleetSource)
