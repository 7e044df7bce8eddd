package redisstore

import "github.com/redis/go-redis/v9"

// Client returns the go-redis client the store runs on, for what reads
// Redis's own state beside the counters (package telemetry's eviction
// watch reads INFO of each master). The store owns it: do not close it.
func (s *Store) Client() redis.UniversalClient { return s.client }
