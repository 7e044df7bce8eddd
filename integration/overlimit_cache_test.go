package integration

import (
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/integration/redistest"
)

// A request naming one key twice is denied for the hits it asked of the key
// in all; the over-limit cache then does not deny an ordinary 1-hit request
// that the store admits.

const dupKeyConfig = `
domain: dk
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1000000}
`

func TestDuplicateKeyDenialLeavesSmallRequestsAdmitted(t *testing.T) {
	light(t) // processes of its own; asserts counts and memory, not time
	if now := time.Now(); now.Add(time.Minute).Truncate(time.Hour) != now.Truncate(time.Hour) {
		t.Skip("too close to the hourly window's end: the counter would start over")
	}
	dir := writeConfig(t, map[string]string{"dk.yaml": dupKeyConfig})
	for _, tc := range []struct {
		name string
		args func(t *testing.T) []string
	}{
		{"memory", func(*testing.T) []string { return nil }},
		{"redis", func(t *testing.T) []string {
			return []string{"--store", "redis", "--redis-url", redistest.StartServer(t).URL()}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startRLS(t, dir, tc.args(t)...).client()
			with := func(hits uint64) *rlcommon.RateLimitDescriptor {
				d := desc("k", "v")
				d.HitsAddend = wrapperspb.UInt64(hits)
				return d
			}
			if got := should(t, c, "dk", with(3)).Statuses[0].LimitRemaining; got != 999_997 {
				t.Fatalf("remaining %d after 3 hits, want 999,997", got)
			}
			if got := should(t, c, "dk", with(999_997), with(1)).OverallCode; got != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("999,997 + 1 hits with 999,997 left: %v, want OVER_LIMIT", got)
			}
			for i := range 3 {
				r := should(t, c, "dk", desc("k", "v"))
				if r.OverallCode != rlsv3.RateLimitResponse_OK {
					t.Fatalf("1-hit request %d after the denied one: %v, want OK (the cache answered what the store would not)", i+1, r.OverallCode)
				}
				if want := uint32(999_996 - i); r.Statuses[0].LimitRemaining != want {
					t.Fatalf("1-hit request %d: remaining %d, want %d: the denied request consumed", i+1, r.Statuses[0].LimitRemaining, want)
				}
			}
		})
	}
}
