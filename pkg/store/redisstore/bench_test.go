//go:build redis

package redisstore

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store"
)

// BenchmarkDecideConcurrent measures Decide (plain commands: a hit far
// from its limit) with 50 concurrent callers on one Redis server, each
// call sent alone ("alone": an in-flight limit above the number of
// callers, so nothing ever queues) against the default pipelining. It
// reports round trips per call and the p50/p99 latency of a call.
//
//	go test -run '^$' -bench DecideConcurrent -benchmem ./pkg/store/redisstore/
func BenchmarkDecideConcurrent(b *testing.B) {
	srv := redistest.StartServer(b)
	for _, tc := range []struct {
		name     string
		inFlight int
	}{{"alone", MaxMaxInFlight}, {"coalesced", DefaultMaxInFlight}, {"coalesced4", 4}} {
		b.Run(tc.name, func(b *testing.B) {
			c, sent := counted(srv.Addr)
			defer c.Close()
			s := mustNew(b, Options{Client: c, Timeout: time.Second, MaxInFlight: tc.inFlight})
			warm := []store.Check{{Key: "rl:{warm}:x", Limit: 1 << 40, Window: time.Second, Hits: 1}}
			if err := s.Decide(context.Background(), warm, make([]store.Result, 1)); err != nil {
				b.Fatal(err)
			}
			var mu sync.Mutex
			var lat []time.Duration
			var n atomic.Int64
			b.SetParallelism((50 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := n.Add(1)
				check := []store.Check{{Key: fmt.Sprintf("rl:{bench%d}:x", i), Limit: 1 << 40, Window: time.Second, Hits: 1}}
				res := make([]store.Result, 1)
				var mine []time.Duration
				for pb.Next() {
					start := time.Now()
					if err := s.Decide(context.Background(), check, res); err != nil {
						b.Error(err)
						return
					}
					mine = append(mine, time.Since(start))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			b.ReportMetric(float64(sent.trips.Load())/float64(n.Load()+int64(b.N)), "roundtrips/call")
			if len(lat) > 0 {
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
		})
	}
}
