package redisstore

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/rls-project/rls/pkg/store/redisstore/lua"
)

// DemandKeyPart follows Options.KeyPrefix and precedes the counter's key
// in the name of the hash where replicas share their RLQS demand for it.
const DemandKeyPart = "rls:rlqs-demand:"

// ShareDemand records this replica's RLQS demand (hits per second over its
// streams) for the counter key, to hold for ttl on Redis's clock (0
// withdraws it), and returns the demand of every replica whose record
// holds, this one's included: each replica's part of a limit then follows
// its demand rather than being the limit over the fleet's size. A demand
// that is not a finite number of hits per second is refused; Redis's
// errors wrap store.ErrUnavailable.
func (s *Store) ShareDemand(ctx context.Context, key string, demand float64, ttl time.Duration) (float64, error) {
	if math.IsNaN(demand) || math.IsInf(demand, 0) || demand < 0 {
		return 0, fmt.Errorf("share demand of %q: %v is not a demand in hits per second", key, demand)
	}
	ms := max(ttl.Milliseconds(), 1)
	out, err := lua.Demand.Run(ctx, s.client, []string{s.demandPrefix + key}, s.replica,
		strconv.FormatFloat(demand, 'g', -1, 64), ms).Text()
	if err != nil {
		return 0, s.wrap(ctx, "share demand", err)
	}
	total, err := strconv.ParseFloat(out, 64)
	if err != nil || math.IsNaN(total) || total < 0 {
		return 0, fmt.Errorf("share demand of %q: Redis answered %q, not a demand", key, out)
	}
	return total, nil
}
