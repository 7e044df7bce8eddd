package descriptors_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store/redisstore"
)

// TestSubKeySlotsAsRedisComputes: the slots AppendSubKey aims sub-keys at
// are the slots the Redis store (redisstore.Slot, Redis Cluster's CRC16)
// puts them in: sub-key i of N is in the i-th N-th of the slot space.
func TestSubKeySlotsAsRedisComputes(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 5000 {
		n := 2 + trial%(descriptors.MaxSplit-1)
		r := &descriptors.Rule{Unit: descriptors.UnitSecond, RequestsPerUnit: 1 << 20, Split: uint32(n)}
		value := strings.Repeat(string(rune('a'+rng.IntN(26))), 1+rng.IntN(40)) + string(rune('0'+trial%10))
		es := []*rlcommon.RateLimitDescriptor_Entry{{Key: "api_key", Value: value}}
		for i := range n {
			key := string(descriptors.AppendSubKey(nil, "d", es, r, i))
			slot := redisstore.Slot(key)
			if part := slot * n / redisstore.Slots; part != i {
				t.Fatalf("sub-key %d of %d, %q: slot %d is in part %d", i, n, key, slot, part)
			}
		}
	}
}
