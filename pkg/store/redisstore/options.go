package redisstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/breaker"
)

// DefaultTimeout is the budget of one Decide, Peek or Delete call whose
// context has no deadline, when Options.Timeout is zero. Calls that carry
// a deadline (the limiter derives one from its gRPC caller's) are bounded
// by it instead.
const DefaultTimeout = time.Second

// Options configures a Redis store. Client is required (package
// redisclient makes it from a URL); zero fields take the defaults their
// comments name, applied by New.
type Options struct {
	// Client is the go-redis client of the Redis, Cluster (a
	// *redis.ClusterClient: checks are grouped by hash slot) or Sentinel
	// master; Close closes it when CloseClient is set.
	Client      redis.UniversalClient
	CloseClient bool
	// KeyPrefix begins the store's own keys (the fleet's heartbeats), as
	// the service's prefix begins the counters' (--key-prefix).
	KeyPrefix string
	// Timeout bounds each call whose context has no deadline
	// [DefaultTimeout].
	Timeout time.Duration
	// MaxInFlight is how many round trips may be in flight to one node at
	// once; calls that find them all busy leave together in one pipeline
	// when one returns (pipe.go) [DefaultMaxInFlight, at most
	// MaxMaxInFlight]. MaxBatch caps a pipeline's calls [DefaultMaxBatch].
	MaxInFlight, MaxBatch int
	// Breaker configures each node's circuit breaker (OnChange is set from
	// OnBreakerChange, which is called with the node's address, "" outside
	// cluster mode).
	Breaker         breaker.Options
	OnBreakerChange func(node string, from, to breaker.State)
	// OnScriptMode is called when a node's script mode is found or changes
	// (ScriptFunction or ScriptEval, and why): one log line per node.
	OnScriptMode func(node, mode, reason string)
	// NoPlain sends every check to decide.lua (see plain.go): for tests and
	// comparisons.
	NoPlain bool
	// Clock, when set, replaces Redis's clock: for tests (a deterministic
	// clock shared with the memory store's conformance suite). No flag and
	// nothing in a request can set it.
	Clock func() time.Time
}

// withDefaults returns o with its zero fields set to their defaults.
func (o Options) withDefaults() Options {
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	return o
}

// validate checks o.
func (o Options) validate() error {
	switch {
	case o.Client == nil:
		return errors.New("redis store: no client")
	case o.MaxInFlight < 0 || o.MaxInFlight > MaxMaxInFlight || o.MaxBatch < 0:
		return fmt.Errorf("redis pipelining: max in flight %d must be 0 (the default) to %d and max batch %d 0 (the default) or more", o.MaxInFlight, MaxMaxInFlight, o.MaxBatch)
	case o.Timeout < 0:
		return fmt.Errorf("redis store: timeout %v is invalid; it must be positive (0 means %v)", o.Timeout, DefaultTimeout)
	}
	return nil
}
