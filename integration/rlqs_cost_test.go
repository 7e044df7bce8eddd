package integration

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/integration/redistest"
)

// rlqsCostSeconds is how long each protocol is driven in
// TestRLQSRedisCost.
const rlqsCostSeconds = 4

// TestRLQSRedisCost drives one bucket at twice its limit (400/s, fixed
// window) through RLQS from two fake Envoys, then another at the same rate
// through ShouldRateLimit, on one replica and one Redis, and compares
// the Redis commands each protocol costs per 1,000 admitted requests
// (INFO commandstats, every command). RLQS pays a reservation per grant
// and a refund per report, whatever the request rate; ShouldRateLimit at
// least one command per request. The figures are in docs/bench/HISTORY.md;
// the test asserts counts only.
func TestRLQSRedisCost(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	p := startRLSFast(t, writeConfig(t, rlqsConfig("fixed_window")), "--store", "redis", "--redis-url", srv.URL())
	ctx := context.Background()
	var es []*fakeEnvoy
	for range 2 {
		e := newFakeEnvoy("d", time.Second, p.GRPCAddr) // Envoy's 5 s, shortened
		e.expiredDeny = true
		es = append(es, e)
		t.Cleanup(e.close)
	}
	commands := func() int64 {
		n := int64(0)
		for name, c := range srv.CommandStats(ctx) {
			if name != "info" && name != "ping" {
				n += c
			}
		}
		return n
	}

	// RLQS: two Envoys, each sending the limit (2x the fleet's limit).
	before := commands()
	first := waitSecond()
	load := startLoad(es, map[string]string{"api_key": "rlqs"}, rlqsLimit, rlqsLimit)
	time.Sleep(time.Until(time.Unix(first+rlqsCostSeconds, 0))) // the measured seconds: real time on purpose
	load.end()
	rlqsCmds, rlqsAdmitted := commands()-before, load.total.Load()

	// ShouldRateLimit: the same rate from 8 callers.
	before = commands()
	srlAdmitted, srlErrors, srlSent := shouldRateLimitLoad(p.client(), "srl", 2*rlqsLimit, rlqsCostSeconds*time.Second)
	srlCmds := commands() - before

	per1000 := func(cmds, admitted int64) float64 { return 1000 * float64(cmds) / float64(max(admitted, 1)) }
	t.Logf("RLQS: %d admitted in %d s, %d Redis commands: %.1f per 1,000 admitted", rlqsAdmitted, rlqsCostSeconds, rlqsCmds, per1000(rlqsCmds, rlqsAdmitted))
	t.Logf("ShouldRateLimit: %d admitted of %d sent in %d s (%d errors), %d Redis commands: %.1f per 1,000 admitted", srlAdmitted, srlSent, rlqsCostSeconds, srlErrors, srlCmds, per1000(srlCmds, srlAdmitted))
	if srlErrors != 0 {
		t.Errorf("ShouldRateLimit: %d errors", srlErrors)
	}
	// Both admit a sizeable part of the limit over the run (the first
	// window is RLQS's ramp-up).
	for name, n := range map[string]int64{"RLQS": rlqsAdmitted, "ShouldRateLimit": srlAdmitted} {
		if n < rlqsLimit*(rlqsCostSeconds-1)/2 || n > rlqsLimit*(rlqsCostSeconds+1) {
			t.Errorf("%s admitted %d in %d s of a limit of %d/s", name, n, rlqsCostSeconds, rlqsLimit)
		}
	}
	// ShouldRateLimit pays for every request it is sent: a generator that
	// fell behind (this process, on a machine as busy as CI's) sent too
	// few for the comparison to say anything.
	if want := int64(2 * rlqsLimit * rlqsCostSeconds); srlSent < want*3/4 {
		t.Logf("the ShouldRateLimit load sent %d of %d requests: the costs are not compared", srlSent, want)
	} else if per1000(rlqsCmds, rlqsAdmitted)*3 > per1000(srlCmds, srlAdmitted) {
		t.Errorf("RLQS costs %.1f Redis commands per 1,000 admitted, ShouldRateLimit %.1f: want RLQS at most a third",
			per1000(rlqsCmds, rlqsAdmitted), per1000(srlCmds, srlAdmitted))
	}
}

// shouldRateLimitLoad calls ShouldRateLimit for descriptor api_key=key at
// rate per second for d, from 8 callers, and returns the requests answered
// OK, the calls that failed and the calls sent.
func shouldRateLimitLoad(c rlsv3.RateLimitServiceClient, key string, rate int, d time.Duration) (admitted, failed, sent int64) {
	const callers, tick = 8, 10 * time.Millisecond
	var ok, errs, calls atomic.Int64
	var wg sync.WaitGroup
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: descs(desc("api_key", key))}
	end := time.Now().Add(d)
	for range callers {
		wg.Go(func() {
			t := time.NewTicker(tick)
			defer t.Stop()
			owed := 0.0
			for now := range t.C {
				if now.After(end) {
					return
				}
				owed += float64(rate) / callers * tick.Seconds()
				for ; owed >= 1; owed-- {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					calls.Add(1)
					resp, err := c.ShouldRateLimit(ctx, req)
					cancel()
					switch {
					case err != nil:
						errs.Add(1)
					case resp.OverallCode == rlsv3.RateLimitResponse_OK:
						ok.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	return ok.Load(), errs.Load(), calls.Load()
}
