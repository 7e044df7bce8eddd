//go:build redis

package redisstore

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
)

// TestShareDemand: two replicas' demands for one counter add up; a
// withdrawn one and an expired one no longer count (and are removed), nor
// does a field rls did not write; a demand that is not a number of hits
// per second is refused, naming the key.
func TestShareDemand(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.Client()
	t.Cleanup(func() { admin.Close() })
	a := mustNew(t, Options{Client: srv.Client(), Timeout: time.Second})
	b := mustNew(t, Options{Client: srv.Client(), Timeout: time.Second})
	ctx := context.Background()
	const key = "rl:{d}:api_key_k"
	share := func(s *Store, d float64, ttl time.Duration) float64 {
		t.Helper()
		got, err := s.ShareDemand(ctx, key, d, ttl)
		if err != nil {
			t.Fatalf("ShareDemand(%v): %v", d, err)
		}
		return got
	}
	if got := share(a, 10, time.Minute); got != 10 {
		t.Errorf("one replica: fleet demand %v, want 10", got)
	}
	if got := share(b, 30.5, time.Minute); got != 40.5 {
		t.Errorf("two replicas: fleet demand %v, want 40.5", got)
	}
	if err := admin.HSet(ctx, DemandKeyPart+key, "junk", "not a demand").Err(); err != nil {
		t.Fatal(err)
	}
	if got := share(a, 0, time.Minute); got != 30.5 {
		t.Errorf("after a's withdrawal: fleet demand %v, want 30.5", got)
	}
	if fields := admin.HKeys(ctx, DemandKeyPart+key).Val(); len(fields) != 1 || fields[0] != b.replica {
		t.Errorf("hash fields %v, want only b's (a withdrew, junk removed)", fields)
	}
	if ttl := admin.PTTL(ctx, DemandKeyPart+key).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("hash PTTL %v, want within the demands' TTL", ttl)
	}
	share(b, 30.5, 50*time.Millisecond) // b's record now ends soon
	testkit.WaitFor(t, "b's demand to expire", 5*time.Second, func() bool { return share(a, 2, time.Minute) == 2 })
	for _, bad := range []float64{math.NaN(), math.Inf(1), -1} {
		if _, err := a.ShareDemand(ctx, key, bad, time.Minute); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("ShareDemand(%v) = %v, want an error naming the key", bad, err)
		}
	}
}
