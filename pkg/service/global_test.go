package service

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
	adminv1 "github.com/rls-project/rls/proto/rls/admin/v1"
)

// fixedShares gives every global check the same share and records what it
// was told.
type fixedShares struct {
	share    uint64
	told     []string
	hits     uint64
	deadline time.Time // the last one told
}

func (f *fixedShares) Share(domain, rule string, c *store.Check, deadline time.Time) {
	f.told = append(f.told, domain+"/"+rule)
	f.hits += c.Hits
	f.deadline = deadline
	c.Limit = f.share
}

// TestGlobalRuleDecidesOnShare: a scope: global rule's request is decided
// against the share Shares gives it (3 of 10 here), not the limit, and its
// hits reach Shares as demand; a regional rule is untouched; without
// Shares a global rule admits nothing; over RLQS a global bucket's check
// admits nothing.
func TestGlobalRuleDecidesOnShare(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"g.yaml": []byte(`domain: test
descriptors:
  - key: world
    rate_limit: {name: world, unit: second, requests_per_unit: 10, algorithm: fixed_window, scope: global}
  - key: here
    rate_limit: {name: here, unit: second, requests_per_unit: 10, algorithm: fixed_window}
`)}, descriptors.ParseOptions{Global: true})
	if err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	newSvc := func(sh Shares) *Service {
		return New(cfg, limiter.New(memory.New(memory.Options{Now: clk.Now}), limiter.Options{Now: clk.Now}), Options{Shares: sh})
	}
	sh := &fixedShares{share: 3}
	s := newSvc(sh)
	admitted := map[string]int{}
	for range 10 {
		for _, k := range []string{"world", "here"} {
			if r := call(t, s, 0, d(k, "x")); r.OverallCode == rlsv3.RateLimitResponse_OK {
				admitted[k]++
			}
		}
	}
	if admitted["world"] != 3 || admitted["here"] != 10 {
		t.Errorf("admitted %v, want world 3 (its share) and here 10", admitted)
	}
	if len(sh.told) != 10 || sh.told[0] != "test/world" || sh.hits != 10 {
		t.Errorf("Shares told %v with %d hits, want test/world 10 times", sh.told, sh.hits)
	}
	if !sh.deadline.IsZero() {
		t.Errorf("a request without a deadline: Shares told %v", sh.deadline)
	}
	// A request's deadline reaches Shares (the window its Redis may count
	// the hit in runs to it).
	dl := time.Now().Add(20 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), dl)
	defer cancel()
	if _, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{d("world", "x")}}); err != nil || !sh.deadline.Equal(dl) {
		t.Errorf("Shares told deadline %v (%v), want the request's %v", sh.deadline, err, dl)
	}
	if r := call(t, newSvc(nil), 0, d("world", "y")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("without Shares: %v, want OVER_LIMIT", r.OverallCode)
	}
	c, rule, _, err := s.BucketCheck("test", d("world", "z").Entries)
	if err != nil || rule == nil || c.Limit != 0 {
		t.Errorf("RLQS bucket of a global rule: limit %d, rule %v, %v; want 0", c.Limit, rule, err)
	}
}

func (f *fixedShares) Describe(key string, limit uint64, window time.Duration) string {
	return fmt.Sprintf("share %d of %d per %v for %s", f.share, limit, window, key)
}

// TestExplainGlobalShares: the admin API's Explain of a global rule's key
// says its region's share (Shares.Describe), and its remaining counts
// against that share.
func TestExplainGlobalShares(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"g.yaml": []byte("domain: test\ndescriptors:\n  - key: world\n    rate_limit: {name: world, unit: second, requests_per_unit: 10, algorithm: fixed_window, scope: global}\n")},
		descriptors.ParseOptions{Global: true})
	if err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	st := memory.New(memory.Options{Now: clk.Now})
	lim := limiter.New(st, limiter.Options{Now: clk.Now})
	s := New(cfg, lim, Options{Shares: &fixedShares{share: 3}})
	resp, err := NewAdmin(s, st, lim).Explain(context.Background(), &adminv1.ExplainRequest{Domain: "test", Descriptors: []*adminv1.Descriptor{{Entries: []*adminv1.Entry{{Key: "world", Value: "x"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	e := resp.Explanations[0]
	if !strings.HasPrefix(e.Note, "share 3 of 10 per 1s for ") || e.State.GetRemaining() != 3 {
		t.Errorf("note %q, remaining %d; want the share 3 of 10", e.Note, e.State.GetRemaining())
	}
}
