package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/integration/redistest"
)

// Periods of several units on the Redis store, on the real binary and
// Redis's clock (TIME). Two-second rules (unit: second, unit_multiplier: 2)
// show the window over a few seconds of waiting; two-minute rules are
// checked by what their answers say (duration_until_reset, the keys'
// windows), without waiting for them.

const periodRedisConfig = `domain: periods
descriptors:
  - key: fixed2s
    rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 3, algorithm: fixed_window}
  - key: sliding2s
    rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 3}
  - key: precise2s
    rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 4, precision: 4}
  - key: bucket2s
    rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 2, algorithm: token_bucket}
  - key: fixed2m
    rate_limit: {name: fixed2m, unit: minute, unit_multiplier: 2, requests_per_unit: 1, algorithm: fixed_window}
  - key: precise2m
    rate_limit: {unit: minute, unit_multiplier: 2, requests_per_unit: 2, precision: 4}
  - key: bucket2m
    rate_limit: {unit: minute, unit_multiplier: 2, requests_per_unit: 2, algorithm: token_bucket}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: fixed_window}
`

// periodCall sends one descriptor of domain periods and returns its
// status, failing the test on an RPC error.
func periodCall(t *testing.T, p *rlsProc, d *rlcommon.RateLimitDescriptor) (*rlsv3.RateLimitResponse, *rlsv3.RateLimitResponse_DescriptorStatus) {
	t.Helper()
	r, err := rdCall(p.client(), "periods", d)
	if err != nil {
		t.Fatalf("ShouldRateLimit %v: %v", d.Entries, err)
	}
	return r, r.Statuses[0]
}

// periodPos is where Redis's clock is in the current window of length w,
// and that window's index.
func periodPos(t *testing.T, rc redis.Cmdable, w time.Duration) (time.Duration, int64) {
	t.Helper()
	now := rdRedisNow(t, rc).UnixNano()
	return time.Duration(now % int64(w)), now / int64(w)
}

// periodSleepTo sleeps until Redis's clock is at least pos into the window
// of index idx (of length w), or in a later window.
func periodSleepTo(t *testing.T, rc redis.Cmdable, w time.Duration, idx int64, pos time.Duration) {
	t.Helper()
	for {
		at, i := periodPos(t, rc, w)
		switch {
		case i > idx || (i == idx && at >= pos):
			return
		case i < idx:
			time.Sleep(w - at + pos + 10*time.Millisecond) // to a window position: real time on purpose
		default:
			time.Sleep(pos - at + 10*time.Millisecond) // to a window position: real time on purpose
		}
	}
}

// TestRedisPeriods: on Redis, rules of unit_multiplier 2 count over two
// seconds or two minutes with each algorithm (where a one-unit rule would
// pass again), the fixed window is aligned to multiples of its period, the
// keys carry the whole window, and an override of 7 per 30 minutes is
// enforced and returned with unit_multiplier 30.
func TestRedisPeriods(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	dir := writeConfig(t, map[string]string{"periods.yaml": periodRedisConfig})
	// No over-limit cache: every denial below is Redis's answer.
	p := startRLS(t, dir, rdRedisArgs(srv, "--over-limit-cache=false", "--response-headers")...)
	rc := srv.Client()
	defer rc.Close()
	defer rdNoFallback(t, p)

	t.Run("two_seconds", func(t *testing.T) { periodTwoSeconds(t, p, rc) })
	t.Run("bucket", func(t *testing.T) {
		// 2 per 2 s is one token a second: after two, the next is about
		// a second away (a one-second bucket: at most half a second).
		for range 2 {
			if _, st := periodCall(t, p, desc("bucket2s", "a")); st.Code != rdOkCode {
				t.Fatalf("bucket2s: %v", st)
			}
		}
		_, st := periodCall(t, p, desc("bucket2s", "a"))
		wrote := time.Now() // the key's last write was before this
		if ra := st.DurationUntilReset.AsDuration(); st.Code != rdOverCode || ra <= 500*time.Millisecond || ra > time.Second+time.Millisecond {
			t.Errorf("bucket2s third: %s retry %v, want OVER_LIMIT in (0.5s, 1s]", st.Code, ra)
		}
		for range 2 {
			periodCall(t, p, desc("bucket2m", "a"))
		}
		_, st = periodCall(t, p, desc("bucket2m", "a"))
		if ra := st.DurationUntilReset.AsDuration(); st.Code != rdOverCode || ra <= 50*time.Second || ra > time.Minute+time.Millisecond {
			t.Errorf("bucket2m third: %s retry %v, want OVER_LIMIT in (50s, 60s] (one token a minute)", st.Code, ra)
		}
		// A bucket's key lives until it would be full, plus a second: 3 s
		// at its last write, less the time since (a quiet machine reads it
		// within a second; a CI run beside other tests read 1.895 s).
		if got, since := periodPTTL(t, rc, "tb:{periods|bucket2s=a}:t2"), time.Since(wrote); got <= 2*time.Second-since || got > 3*time.Second {
			t.Errorf("bucket2s key PTTL %v %v after its last write, want (2s - that, 3s]", got, since)
		}
		if m := st.CurrentLimit.GetUnitMultiplier().GetValue(); m != 2 {
			t.Errorf("bucket2m current_limit %v, want unit_multiplier 2", st.CurrentLimit)
		}
	})
	t.Run("precise_two_minutes", func(t *testing.T) {
		// Precision 4 of two minutes: 30-second sub-windows. Two hits
		// in this one pass again only when it has left the window, 90
		// to 120 s from now (a one-minute window: at most 60 s).
		for range 2 {
			periodCall(t, p, desc("precise2m", "a"))
		}
		_, st := periodCall(t, p, desc("precise2m", "a"))
		if ra := st.DurationUntilReset.AsDuration(); st.Code != rdOverCode || ra <= 61*time.Second || ra > 2*time.Minute+time.Millisecond {
			t.Errorf("precise2m third: %s retry %v, want OVER_LIMIT in (61s, 120s]", st.Code, ra)
		}
	})
	t.Run("fixed_two_minutes_aligned", func(t *testing.T) {
		// Both calls must fall in one window: within 2 s of its end, wait
		// for the next one (a CI run once made them straddle the boundary).
		if before, idx := periodPos(t, rc, 2*time.Minute); before > 2*time.Minute-2*time.Second {
			periodSleepTo(t, rc, 2*time.Minute, idx+1, 0)
		}
		before, _ := periodPos(t, rc, 2*time.Minute)
		r, st := periodCall(t, p, desc("fixed2m", "a"))
		after, _ := periodPos(t, rc, 2*time.Minute)
		reset := st.DurationUntilReset.AsDuration()
		// The window ends at the next multiple of 120 s since the epoch.
		if st.Code != rdOkCode || (after > before && (reset < 2*time.Minute-after-time.Millisecond || reset > 2*time.Minute-before+time.Millisecond)) {
			t.Errorf("fixed2m: %s reset %v, want OK and the end of the 120 s window (%v..%v away)", st.Code, reset, 2*time.Minute-after, 2*time.Minute-before)
		}
		if l := st.CurrentLimit; l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || l.GetUnitMultiplier().GetValue() != 2 {
			t.Errorf("fixed2m current_limit %v", l)
		}
		if h := periodHeaders(r); h["RateLimit-Limit"] != `1, 1;w=120;name="fixed2m"` {
			t.Errorf("fixed2m RateLimit-Limit %q, want w=120", h["RateLimit-Limit"])
		}
		_, st = periodCall(t, p, desc("fixed2m", "a"))
		if st.Code != rdOverCode || st.DurationUntilReset.AsDuration() > reset {
			t.Errorf("fixed2m second: %s retry %v, want OVER_LIMIT until the window's end", st.Code, st.DurationUntilReset.AsDuration())
		}
	})
	t.Run("override_30_minutes", func(t *testing.T) { periodOverride(t, p, rc) })
	t.Run("keys", func(t *testing.T) {
		keys := map[string]bool{}
		for k := range rdScanAll(t, srv) {
			keys[k] = true
		}
		for _, want := range []string{
			"tb:{periods|bucket2m=a}:t120", "rl:{periods|precise2m=a}:s120p4",
			"rl:{periods|fixed2m=a}:f120", "rl:{periods|route=o}:f1800o7",
		} {
			if strings.HasSuffix(want, ":f120") { // a window's key: named by its window
				want = winKey(want, 2*time.Minute, rdRedisNow(t, rc))
			} else if strings.HasSuffix(want, ":f1800o7") {
				want = winKey(want, 30*time.Minute, rdRedisNow(t, rc))
			}
			if !keys[want] {
				t.Errorf("no key %s in Redis; keys: %v", want, keys)
			}
		}
	})
}

// periodTwoSeconds: from the start of a two-second window, fixed, sliding
// and precise rules of 2 s deny past the one-second mark, where one-second
// rules would pass again, and pass in the next window.
func periodTwoSeconds(t *testing.T, p *rlsProc, rc redis.Cmdable) {
	const w = 2 * time.Second
	fill := map[string]int{"fixed2s": 3, "sliding2s": 3, "precise2s": 4}
	for attempt := 1; ; attempt++ {
		// Start within the first 200 ms of a window.
		_, idx := periodPos(t, rc, w)
		periodSleepTo(t, rc, w, idx+1, 0)
		pos, idx := periodPos(t, rc, w)
		if pos > 200*time.Millisecond {
			continue
		}
		var problems []string
		key := fmt.Sprintf("a%d", attempt)
		for rule, n := range fill {
			for i := range n {
				if _, st := periodCall(t, p, desc(rule, key)); st.Code != rdOkCode {
					problems = append(problems, fmt.Sprintf("%s hit %d: %s", rule, i+1, st.Code))
				}
			}
		}
		// The keys hold the whole window, and expire as two-second
		// windows do: a fixed window's a second after its end, a sliding
		// one's a second after the next window's end, a precision
		// window's two windows after its last write.
		at := time.Unix(0, idx*int64(w))
		for k, ttl := range map[string][2]time.Duration{
			winKey("rl:{periods|fixed2s="+key+"}:f2", w, at):   {2 * time.Second, w + time.Second},
			winKey("rl:{periods|sliding2s="+key+"}:s2", w, at): {4 * time.Second, 2*w + time.Second},
			"rl:{periods|precise2s=" + key + "}:s2p4":          {3 * time.Second, 2 * w},
		} {
			if got := periodPTTL(t, rc, k); got <= ttl[0] || got > ttl[1] {
				problems = append(problems, fmt.Sprintf("%s: PTTL %v, want (%v, %v]", k, got, ttl[0], ttl[1]))
			}
		}
		// Past 1.3 s: a one-second fixed window has reset, a one-second
		// sliding window weighs 3 x 0.7 < 3, and a one-second window of
		// precision 4 has dropped the sub-window the hits are in.
		periodSleepTo(t, rc, w, idx, 1300*time.Millisecond)
		for rule := range fill {
			if _, st := periodCall(t, p, desc(rule, key)); st.Code != rdOverCode {
				problems = append(problems, fmt.Sprintf("%s at 1.3 s: %s, want OVER_LIMIT", rule, st.Code))
			}
		}
		if _, now := periodPos(t, rc, w); now != idx {
			if attempt < 3 {
				t.Logf("attempt %d crossed a window boundary (a slow machine); again", attempt)
				continue
			}
			t.Fatalf("three attempts crossed a window boundary")
		}
		for _, pr := range problems {
			t.Error(pr)
		}
		// In the next window, past 1.2 s, each passes again (the sliding
		// window's previous count weighs 3 x 0.4).
		periodSleepTo(t, rc, w, idx+1, 1200*time.Millisecond)
		for rule := range fill {
			if _, st := periodCall(t, p, desc(rule, key)); st.Code != rdOkCode {
				t.Errorf("%s in the next window: %s, want OK", rule, st.Code)
			}
		}
		return
	}
}

// periodOverride: 7 per 30 minutes asked by the request, on a one-minute
// fixed-window rule: the 8th is denied until the end of the 30-minute
// window (a multiple of 1800 s since the epoch), unit_multiplier 30.
func periodOverride(t *testing.T, p *rlsProc, rc redis.Cmdable) {
	d := desc("route", "o")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(30)}
	for i := range 7 {
		if _, st := periodCall(t, p, d); st.Code != rdOkCode {
			t.Fatalf("override request %d: %s", i+1, st.Code)
		}
	}
	before, _ := periodPos(t, rc, 30*time.Minute)
	r, st := periodCall(t, p, d)
	after, _ := periodPos(t, rc, 30*time.Minute)
	ra := st.DurationUntilReset.AsDuration()
	if st.Code != rdOverCode || (after > before && (ra < 30*time.Minute-after-time.Millisecond || ra > 30*time.Minute-before+time.Millisecond)) {
		t.Errorf("8th: %s retry %v, want OVER_LIMIT until the 1800 s window ends (%v..%v)", st.Code, ra, 30*time.Minute-after, 30*time.Minute-before)
	}
	if l := st.CurrentLimit; l.RequestsPerUnit != 7 || l.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE || l.GetUnitMultiplier().GetValue() != 30 {
		t.Errorf("current_limit %v, want 7 per 30 MINUTE", l)
	}
	if h := periodHeaders(r); !strings.Contains(h["RateLimit-Limit"], "7;w=1800") || h["Retry-After"] == "" {
		t.Errorf("headers %v, want a w=1800 policy and Retry-After", h)
	}

	// A multiplier of 0 is InvalidArgument naming it, and counts nothing.
	d.Limit.UnitMultiplier = wrapperspb.UInt32(0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "periods", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
	if err == nil || !strings.Contains(err.Error(), "InvalidArgument") || !strings.Contains(err.Error(), "descriptors[0].limit: unit_multiplier must be at least 1") {
		t.Errorf("multiplier 0: %v, want InvalidArgument naming unit_multiplier", err)
	}
}

// periodPTTL is key's time to live in Redis (negative: none or no key).
func periodPTTL(t *testing.T, rc redis.Cmdable, key string) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := rc.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	return d
}

// periodHeaders returns a response's headers to add, by name.
func periodHeaders(r *rlsv3.RateLimitResponse) map[string]string {
	h := map[string]string{}
	for _, hv := range r.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	return h
}
