package integration

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/integration/redistest"
)

// The envoyproxy/ratelimit switches on the real binary and a real Redis:
// a domain merged from two files, quota_mode, descriptor metadata returned
// as dynamic metadata, renamed headers and the global shadow mode.

var compatFiles = map[string]string{
	"a.yaml": `
domain: shop
descriptors:
  - key: regular
    rate_limit: {unit: hour, requests_per_unit: 100000}
    metadata: {service: {name: regular, tier: 1}}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 20}
    metadata: {service: {name: quota_a}, plan: gold}
`,
	"b.yaml": `
domain: shop
descriptors:
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 30}
    metadata: {plan: silver}
  - key: tiny
    rate_limit: {unit: hour, requests_per_unit: 1}
`,
}

func TestCompatQuotaModeOnRedis(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	p := startRLS(t, writeConfig(t, compatFiles), "--store", "redis", "--redis-url", srv.URL(),
		"--merge-domains", "--response-metadata", "--response-headers")
	c := p.client()

	// Metadata of the passing descriptors, merged in request order (first
	// wins; nested mappings merge), and the headers.
	r := should(t, c, "shop", desc("regular", "u1"), desc("quota_a", "u1"))
	md := r.DynamicMetadata.GetFields()
	if md["domain"].GetStringValue() != "shop" {
		t.Fatalf("dynamic metadata %v", r.DynamicMetadata)
	}
	meta := md["metadata"].GetStructValue().GetFields()
	svc := meta["service"].GetStructValue().GetFields()
	if svc["name"].GetStringValue() != "regular" || svc["tier"].GetNumberValue() != 1 || meta["plan"].GetStringValue() != "gold" {
		t.Errorf("merged metadata %v", md["metadata"])
	}
	hdr := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		hdr[h.Key] = h.Value
	}
	if hdr["RateLimit-Limit"] == "" || hdr["RateLimit-Remaining"] != "19" || hdr["RateLimit-Reset"] == "" {
		t.Errorf("headers %v", hdr)
	}

	// 200 clients race requests with two quotas (20 and 30 an hour) and a
	// large regular limit. Exactly 30 pass: a request passes while either
	// quota has room and consumes on each that has, so the first 20 take
	// from both and 10 more from quota_b alone.
	// The rest are denied, and the regular counter ends where the admitted
	// requests put it: the denied ones, refunded, consumed nothing.
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "shop",
				Descriptors: []*rlcommon.RateLimitDescriptor{desc("regular", "u2"), desc("quota_a", "u2"), desc("quota_b", "u2")}})
			if err != nil {
				t.Error(err)
				return
			}
			if r.OverallCode == rlsv3.RateLimitResponse_OK {
				admitted.Add(1)
			} else {
				denied.Add(1)
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 30 || denied.Load() != 170 {
		t.Fatalf("admitted %d, denied %d; want 30 and 170 (quotas of 20 and 30)", admitted.Load(), denied.Load())
	}
	// Refunds run before each answer leaves, so the count is final now.
	r = should(t, c, "shop", desc("regular", "u2"))
	if got, want := r.Statuses[0].LimitRemaining, uint32(100000-30-1); got != want {
		t.Errorf("regular remaining %d after 30 admitted and 170 quota-denied requests (and this one); want %d", got, want)
	}
	// Both quotas over: OVER_LIMIT with both statuses over, no metadata
	// from them.
	r = should(t, c, "shop", desc("quota_a", "u2"), desc("quota_b", "u2"))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
		r.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("both quotas over: %v", r)
	}
	if r.DynamicMetadata.GetFields()["metadata"] != nil {
		t.Errorf("metadata from descriptors that are over: %v", r.DynamicMetadata)
	}
}

func TestCompatGlobalShadowMode(t *testing.T) {
	light(t)
	p := startRLS(t, writeConfig(t, compatFiles), "--merge-domains", "--shadow-mode")
	c := p.client()
	should(t, c, "shop", desc("tiny", "x"))
	for i := 0; i < 3; i++ {
		r := should(t, c, "shop", desc("tiny", "x"), desc("regular", "x"))
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
			r.Statuses[1].Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("--shadow-mode: %v", r)
		}
	}
	// The shadowed denials did not stop the regular descriptor counting
	// the admitted requests: 3 of them.
	if got := should(t, c, "shop", desc("regular", "x")).Statuses[0].LimitRemaining; got != 100000-4 {
		t.Errorf("regular remaining %d, want %d", got, 100000-4)
	}
}
