package redisstore

import (
	"context"
	"time"

	"github.com/rls-project/rls/pkg/store/redisstore/lua"
)

// FleetKey is the sorted set holding the replicas' heartbeats, after
// Options.KeyPrefix. Its hash tag keeps it on one Cluster shard.
const FleetKey = "rls:{fleet}:replicas"

// Heartbeat refreshes replica id's heartbeat for ttl and returns how many
// replicas have a live heartbeat, this one included. The expiry uses Redis's
// clock, so replicas' clocks need not agree. Errors wrap
// store.ErrUnavailable.
func (s *Store) Heartbeat(ctx context.Context, id string, ttl time.Duration) (int, error) {
	n, err := lua.Fleet.Run(ctx, s.client, []string{s.fleetKey}, id, ttl.Milliseconds()).Int()
	if err != nil {
		return 0, s.wrap(ctx, "heartbeat", err)
	}
	return n, nil
}

// Leave removes replica id's heartbeat. Errors wrap store.ErrUnavailable.
func (s *Store) Leave(ctx context.Context, id string) error {
	return s.wrap(ctx, "leave", s.client.ZRem(ctx, s.fleetKey, id).Err())
}
