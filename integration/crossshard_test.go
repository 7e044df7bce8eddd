package integration

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/integration/redistest"
)

// A denied request consumes nothing on any shard of a Redis Cluster: the
// counters of its other descriptors, in other hash slots, keep no hit of it.

const crossConfig = `
domain: cs
descriptors:
  - key: multi_a
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: multi_b
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: over
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 100000}
`

// csRemaining asks rls for key=value's remaining budget with a request that
// consumes one hit (and so reports the budget before it minus one).
func csRemaining(t *testing.T, c rlsv3.RateLimitServiceClient, key, value string) uint32 {
	t.Helper()
	return should(t, c, "cs", desc(key, value)).Statuses[0].LimitRemaining
}

func TestCrossShardDeniedConsumesNothing(t *testing.T) {
	light(t) // processes of its own; asserts counts and memory, not time
	cl := redistest.StartCluster(t, 3, 0)
	dir := writeConfig(t, map[string]string{"cs.yaml": crossConfig})
	p := startRLS(t, dir, "--store", "redis-cluster", "--redis-url", cl.Seeds(), "--redis-timeout", "200ms",
		"--over-limit-cache=false") // else requests denied from the cache never reach (or consume on) the other shard
	c := p.client()
	if a, b := cl.MasterOf("rl:{cs|multi_a=X}:s3600"), cl.MasterOf("rl:{cs|multi_b=X}:s3600"); a == b {
		t.Fatalf("multi_a and multi_b are on one master (%s): the test needs two", a.Addr)
	}

	// A denial on one shard refunds the other: OK, OK, then OVER_LIMIT on multi_a; multi_b has
	// 98 left, not 97.
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := should(t, c, "cs", desc("multi_a", "X"), desc("multi_b", "X")).OverallCode; got != want {
			t.Fatalf("request %d: %v, want %v", i+1, got, want)
		}
	}
	if got := csRemaining(t, c, "multi_b", "X"); got != 97 { // 98 left, this request takes one
		t.Errorf("multi_b: %d left after this request, want 97 (98 before it): the denied request was counted on the other shard", got)
	}

	// 200 clients send two-descriptor requests whose first descriptor has
	// 10 an hour: exactly 10 pass, and the second descriptor's counter
	// ends where those 10 put it.
	var ok atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "cs",
				Descriptors: []*rlcommon.RateLimitDescriptor{desc("over", "T"), desc("big", "T")}})
			if err != nil {
				t.Error(err)
				return
			}
			if r.OverallCode == rlsv3.RateLimitResponse_OK {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 10 {
		t.Fatalf("%d of 200 passed on a limit of 10", ok.Load())
	}
	// The remaining a lease reports is the store's last answer: it may
	// count denied requests still in flight then, never more.
	if got := csRemaining(t, c, "big", "T"); got < 100000-10-1-190 || got > 100000-10-1 {
		t.Errorf("big: %d left after 10 admitted and 190 denied requests (and this one), want %d (at most 190 fewer)", got, 100000-10-1)
	}
	if n := exMetric(t, p, "rls_undo_refunds_total", `result="refunded"`); n < 190 {
		t.Errorf("rls_undo_refunds_total{result=\"refunded\"} = %v, want at least 190", n)
	}
	// A clean stop returns what leases hold: the counter is then what was
	// admitted, exactly.
	p.stop(t)
	key := winKey("rl:{cs|big=T}:s3600", time.Hour, time.Now())
	rc := cl.MasterOf(key).Client()
	defer rc.Close()
	if got, err := rc.Get(context.Background(), key).Int64(); err != nil || got != 11 {
		t.Errorf("big's counter %s after a clean stop: %d (%v), want 11 (10 admitted and one asked)", key, got, err)
	}
}

// TestCrossShardUndoDuringPause: the shard of a request's second
// descriptor is paused (SIGSTOP) while denied requests are being refunded;
// once it is back, its counter holds exactly the admitted requests plus
// what rls_undo_refunds_total{result="lost"} says was lost.
func TestCrossShardUndoDuringPause(t *testing.T) {
	light(t) // processes of its own; asserts counts and memory, not time
	cl := redistest.StartCluster(t, 3, 0)
	dir := writeConfig(t, map[string]string{"cs.yaml": crossConfig})
	p := startRLS(t, dir, "--store", "redis-cluster", "--redis-url", cl.Seeds(), "--redis-timeout", "200ms",
		"--over-limit-cache=false")
	c := p.client()
	overMaster, bigMaster := cl.MasterOf("rl:{cs|over=P}:s3600"), cl.MasterOf("rl:{cs|big=P}:s3600")
	if overMaster == bigMaster {
		t.Fatal("over=P and big=P on one master")
	}
	// Use up over=P, so every later request is denied by it and refunded
	// on big=P's shard.
	for range 10 {
		should(t, c, "cs", desc("over", "P"), desc("big", "P"))
	}
	var admitted, denied, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 20; w++ {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "cs",
					Descriptors: []*rlcommon.RateLimitDescriptor{desc("over", "P"), desc("big", "P")}})
				cancel()
				switch {
				case err != nil:
					failed.Add(1)
				case r.OverallCode == rlsv3.RateLimitResponse_OK:
					admitted.Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // traffic before the pause: real time on purpose
	bigMaster.Pause()
	time.Sleep(400 * time.Millisecond) // the pause lasts 400 ms: real time on purpose
	bigMaster.Resume()
	time.Sleep(300 * time.Millisecond) // traffic after the resume: real time on purpose
	close(stop)
	wg.Wait()
	// Background retries end within their backoff (3.75 s) plus a 1 s
	// timeout per try.
	if exMetric(t, p, "rls_undo_refunds_total", `result="retried"`) > 0 {
		time.Sleep(9 * time.Second) // no state says the retries ended: their bound must pass
	}
	lost := exMetric(t, p, "rls_undo_refunds_total", `result="lost"`)
	unknown := exMetric(t, p, "rls_undo_refunds_total", `result="unknown"`)
	retried := exMetric(t, p, "rls_undo_refunds_total", `result="retried"`)
	v, err := cl.Client().Get(context.Background(), winKey("rl:{cs|big=P}:s3600", time.Hour, time.Now())).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("admitted %d, denied %d, failed %d; undo retried %v, lost %v, unknown %v; big=P state %q",
		admitted.Load(), denied.Load(), failed.Load(), retried, lost, unknown, v)
	if admitted.Load() != 0 {
		t.Errorf("%d requests admitted with over=P used up", admitted.Load())
	}
	// Exactly the admitted ones, plus the refunds counted lost, plus at
	// most the calls that timed out after they were sent (and ran when
	// the shard came back), and calls whose caller gave up (the answer
	// was an error, which Envoy's default admits).
	count := csSlidingCount(t, v)
	if low, high := 10+lost, 10+lost+unknown+float64(failed.Load()); count < low || count > high {
		t.Errorf("big=P counts %v hits, want the 10 admitted plus %v lost refunds, and at most %v more of calls that timed out", count, lost, unknown+float64(failed.Load()))
	}
}

// csSlidingCount parses a window key's count.
func csSlidingCount(t *testing.T, v string) float64 {
	t.Helper()
	x, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("state %q is not a window's count", v)
	}
	return float64(x)
}
