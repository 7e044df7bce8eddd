//go:build redis

package global

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
)

// BenchmarkExchangeRound: what a round costs the global store, per key and
// replica: three regions of two replicas each, 100 keys, each replica
// publishing its demand for every key (one pipeline) and then asking for
// its grants (another). It reports the global store's own time per call
// of each kind (INFO commandstats' evalsha usec over calls), what sizes
// the global store: a key exchanged by R replicas costs R × (publish +
// grant) of it a second. An op is one round of all six replicas.
func BenchmarkExchangeRound(b *testing.B) {
	srv := redistest.StartServer(b)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	const keys = 100
	regions := []string{"eu", "us", "ap"}
	demand := map[string]uint64{"eu": 300, "us": 75, "ap": 75} // per replica: 600/150/150 a region
	asks := func(at int64) []Ask {
		out := make([]Ask, keys)
		for k := range out {
			out[k] = Ask{Key: fmt.Sprintf("rl:{d:k=%d}:k", k), Limit: 300, Window: time.Second, Sliding: true, Now: at}
		}
		return out
	}
	var pubUsec, pubCalls, grantUsec, grantCalls float64
	t0 := testEpoch()
	round := 0
	for b.Loop() {
		for phase := range 2 {
			before := evalsha(ctx, srv)
			for r, region := range regions {
				for p := range 2 {
					s := roundSettings(region, "p"+strconv.Itoa(p))
					a := asks(t0 + int64(round)*sec + int64(1+phase)*sec/4 + int64(r*2+p)*1000)
					for i := range a {
						a[i].Demand = demand[region]
					}
					var errs []error
					if phase == 0 {
						errs = Publish(ctx, c, s, a)
					} else {
						_, errs = Exchange(ctx, c, s, a)
					}
					if errs[0] != nil {
						b.Fatal(errs[0])
					}
				}
			}
			after := evalsha(ctx, srv)
			if phase == 0 {
				pubUsec, pubCalls = pubUsec+after[1]-before[1], pubCalls+after[0]-before[0]
			} else {
				grantUsec, grantCalls = grantUsec+after[1]-before[1], grantCalls+after[0]-before[0]
			}
		}
		round++
	}
	b.ReportMetric(pubUsec/pubCalls, "publish-µs/call")
	b.ReportMetric(grantUsec/grantCalls, "grant-µs/call")
	b.ReportMetric(0, "ns/op")
}

// evalsha returns the global store's evalsha calls and their usec so far.
func evalsha(ctx context.Context, srv *redistest.Server) [2]float64 {
	return [2]float64{float64(srv.CommandStats(ctx)["evalsha"]), float64(srv.CommandUsec(ctx)["evalsha"])}
}
