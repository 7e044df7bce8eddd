package service

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
	adminv1 "github.com/rls-project/rls/proto/rls/admin/v1"
)

const splitConfig = `
domain: test
descriptors:
  - key: hot
    rate_limit: {unit: minute, requests_per_unit: 10, split: 3}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 30, algorithm: token_bucket, burst: 12, split: 3}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window, split: 3}
  - key: open
    rate_limit: {unit: hour, requests_per_unit: 30, split: 3}
  - key: open_plain
    rate_limit: {unit: hour, requests_per_unit: 30}
`

// recordingStore records the keys and limits of the checks it is asked to
// decide, in front of a real store.
type recordingStore struct {
	store.Store
	mu     sync.Mutex
	checks []store.Check
}

func (r *recordingStore) Decide(ctx context.Context, checks []store.Check, results []store.Result) error {
	r.mu.Lock()
	r.checks = append(r.checks, checks...)
	r.mu.Unlock()
	return r.Store.Decide(ctx, checks, results)
}

func newSplitService(t *testing.T, st store.Store, opts limiter.Options) (*Service, *limiter.Limiter, *testkit.Clock) {
	t.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"split.yaml": []byte(splitConfig)})
	if err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	if st == nil {
		st = memory.New(memory.Options{Now: clk.Now})
	}
	opts.Now = clk.Now
	lim := limiter.New(st, opts)
	return New(cfg, lim, Options{}), lim, clk
}

// TestSplitSharesAndRoundRobin: a split of 10 over 3 sub-keys counts the
// requests of one replica on each sub-key in turn, each sub-key enforcing
// its share (4, 3, 3), so exactly the limit passes, whatever the algorithm;
// each check carries its sub-key's share.
func TestSplitSharesAndRoundRobin(t *testing.T) {
	for _, key := range []string{"hot", "fixed"} {
		t.Run(key, func(t *testing.T) {
			rec := &recordingStore{}
			clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
			rec.Store = memory.New(memory.Options{Now: clk.Now})
			s, _, _ := newSplitService(t, rec, limiter.Options{})
			ok := 0
			for range 30 {
				if call(t, s, 1, d(key, "k")).OverallCode == rlsv3.RateLimitResponse_OK {
					ok++
				}
			}
			if ok != 10 {
				t.Errorf("%d of 30 requests OK on a split limit of 10, want exactly 10", ok)
			}
			keys := map[string]uint64{}
			for i, c := range rec.checks[:3] {
				keys[c.Key] = c.Limit
				if want := []uint64{4, 3, 3}[i]; c.Limit != want {
					t.Errorf("check %d (%s): limit %d, want the share %d", i, c.Key, c.Limit, want)
				}
				if !strings.Contains(c.Key, fmt.Sprintf("|%d/3.", i)) {
					t.Errorf("check %d counts on %s, want sub-key %d", i, c.Key, i)
				}
			}
			if len(keys) != 3 {
				t.Errorf("the first 3 requests went to %d sub-keys, want 3: %v", len(keys), keys)
			}
		})
	}
}

// TestSplitRemaining: limit_remaining is the chosen sub-key's remaining
// scaled to the whole limit (its share of the burst for a token bucket);
// a request for more hits than its sub-key's share is over the limit with
// duration_until_reset to the end of the window.
func TestSplitRemaining(t *testing.T) {
	s, _, _ := newSplitService(t, nil, limiter.Options{})
	// hot: shares 4, 3, 3 of 10. Sub-key 0: 4-1 = 3 left, 3*10/4 = 7.
	// Sub-key 1: 3-1 = 2, 2*10/3 = 6. Sub-key 2: likewise. Then 2*10/4 = 5.
	var got []uint32
	for range 4 {
		got = append(got, call(t, s, 1, d("hot", "r")).Statuses[0].LimitRemaining)
	}
	if fmt.Sprint(got) != "[7 6 6 5]" {
		t.Errorf("remaining %v, want [7 6 6 5]", got)
	}
	// A fresh key, checked without consuming: the whole limit.
	r, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test",
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: d("hot", "fresh").Entries, HitsAddend: wrapperspb.UInt64(0)}}})
	if err != nil || r.Statuses[0].LimitRemaining != 10 {
		t.Errorf("check-only on a fresh key: %v %v, want remaining 10", r, err)
	}
	// bucket: burst 12 over 3 sub-keys (4 each); 2 hits leave 2 of 4: 2*12/4 = 6.
	if got := call(t, s, 2, d("bucket", "b")).Statuses[0].LimitRemaining; got != 6 {
		t.Errorf("token bucket: remaining %d, want 6", got)
	}
	// 5 hits are more than any sub-key's share of 10 (4, 3, 3): never OK.
	for range 3 {
		r := call(t, s, 5, d("hot", "big"))
		if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("5 hits on shares of at most 4: %s", brief(r))
		}
		if got := r.Statuses[0].DurationUntilReset.AsDuration(); got != time.Minute {
			t.Errorf("5 hits: duration_until_reset %v, want the window's end, 1m", got)
		}
	}
	if r := call(t, s, 4, d("hot", "big")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("4 hits on sub-key 0 (share 4): %s", brief(r))
	}
}

// TestSplitFailOpenShare: with the store down, each sub-key's fail-open
// bucket holds its share over the fleet, so a replica admits about
// limit/fleet in all, as without split.
func TestSplitFailOpenShare(t *testing.T) {
	down := failingStore{fmt.Errorf("connection refused: %w", store.ErrUnavailable)}
	for key, want := range map[string]int{"open": 15, "open_plain": 15} {
		s, _, _ := newSplitService(t, down, limiter.Options{FleetSize: func() int { return 2 }})
		ok := 0
		for range 40 {
			if call(t, s, 1, d(key, "k")).OverallCode == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		if ok != want {
			t.Errorf("%s: %d of 40 OK in fail-open on 30/hour over a fleet of 2, want %d", key, ok, want)
		}
	}
}

// TestSplitOverLimitCachePerSubKey: the over-limit cache remembers each
// sub-key's denial alone: a spent sub-key is denied locally, the next
// request goes to the next sub-key (and to the store).
func TestSplitOverLimitCachePerSubKey(t *testing.T) {
	rec := &recordingStore{}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	rec.Store = memory.New(memory.Options{Now: clk.Now})
	s, lim, _ := newSplitService(t, rec, limiter.Options{})
	for range 10 {
		call(t, s, 1, d("hot", "c")) // every sub-key spent
	}
	for range 3 {
		call(t, s, 1, d("hot", "c")) // each sub-key denied by the store once
	}
	stored := len(rec.checks)
	for range 6 {
		if r := call(t, s, 1, d("hot", "c")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("spent key: %s", brief(r))
		}
	}
	if len(rec.checks) != stored || lim.Count(limiter.FromCache) != 6 {
		t.Errorf("%d store checks and %d cached denials for 6 requests on 3 spent sub-keys, want 0 and 6",
			len(rec.checks)-stored, lim.Count(limiter.FromCache))
	}
}

// TestSplitAdmin: Explain reads every sub-key (remaining is their sum) and
// ResetCounters deletes every one.
func TestSplitAdmin(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"split.yaml": []byte(splitConfig)})
	if err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	st := memory.New(memory.Options{Now: clk.Now})
	lim := limiter.New(st, limiter.Options{Now: clk.Now})
	svc := New(cfg, lim, Options{})
	a := NewAdmin(svc, st, lim)
	ctx := context.Background()
	for range 4 {
		call(t, svc, 1, d("hot", "a")) // sub-key 0 twice, 1 and 2 once: 10-4 = 6 left
	}
	explain := func() *adminv1.Explanation {
		r, err := a.Explain(ctx, &adminv1.ExplainRequest{Domain: "test", Descriptors: []*adminv1.Descriptor{adminDesc("hot", "a")}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Explanations[0]
	}
	e := explain()
	if e.State.GetRemaining() != 6 || e.State.GetOverLimit() || !strings.Contains(e.Note, "3 sub-keys") || !strings.Contains(e.Key, "|0/3.") {
		t.Errorf("after 4 of 10: %v", e)
	}
	// Explain's own resolution took a turn of the round robin (sub-key 1):
	// the next four go to 2, 0, 1, 2, leaving 4-3 = 1, 3-2 = 1, 3-3 = 0.
	for range 4 {
		call(t, svc, 1, d("hot", "a"))
	}
	if e := explain(); e.State.GetRemaining() != 2 || e.State.GetOverLimit() || !strings.Contains(e.Note, "1 of 3 over") {
		t.Errorf("after 8 of 10, one sub-key with room: %v", e)
	}
	for range 4 {
		call(t, svc, 1, d("hot", "a"))
	}
	if e := explain(); e.State.GetRemaining() != 0 || !e.State.GetOverLimit() || !strings.Contains(e.Note, "3 of 3 over") {
		t.Errorf("after 10 of 10: %v", e)
	}
	rr, err := a.ResetCounters(ctx, &adminv1.ResetCountersRequest{Domain: "test", Descriptors: []*adminv1.Descriptor{adminDesc("hot", "a")}})
	if err != nil || len(rr.Keys) != 3 {
		t.Fatalf("reset: %v %v, want 3 keys", rr, err)
	}
	ok := 0
	for range 12 {
		if call(t, svc, 1, d("hot", "a")).OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	if ok != 10 {
		t.Errorf("after reset: %d of 12 OK, want 10", ok)
	}
}

// TestSplitRefundToChargedSubKey: a refund after a charge goes back to the
// sub-key that charge counted on, and the next charge goes there again, so
// charge-and-refund pairs leave every sub-key as it was; without that, the
// refund would land on the next sub-key in rotation, lifting it above its
// share and leaving the charged one spent.
func TestSplitRefundToChargedSubKey(t *testing.T) {
	rec := &recordingStore{}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	rec.Store = memory.New(memory.Options{Now: clk.Now})
	s, _, _ := newSplitService(t, rec, limiter.Options{DisableOverLimitCache: true})
	sub := func(c store.Check) string { _, after, _ := strings.Cut(c.Key, "|"); return after }
	for i := range 9 {
		call(t, s, 1, d("hot", "k"))
		call(t, s, 0, refund(1, "hot", "k"))
		charge, back := rec.checks[2*i], rec.checks[2*i+1]
		if !back.Refund || back.Key != charge.Key {
			t.Fatalf("pair %d: charge on %s, refund (%v) on %s; want the same sub-key", i, sub(charge), back.Refund, sub(back))
		}
		if want := fmt.Sprintf("|%d/3.", 0); !strings.Contains(charge.Key, want) {
			t.Errorf("pair %d: charge on %s, want sub-key 0 every time (each refund steps the rotation back)", i, sub(charge))
		}
	}
	// Every sub-key has its whole share left: 10 requests pass, then none.
	ok := 0
	for range 12 {
		if call(t, s, 1, d("hot", "k")).OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	if ok != 10 {
		t.Errorf("%d of 12 OK after 9 charge-and-refund pairs, want the whole limit of 10", ok)
	}
}
