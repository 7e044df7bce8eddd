package service

import (
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/store/redisstore"
)

// TestKeyPrefix: KeyPrefix begins every counter's key, and the key keeps its
// hash tag: the prefixed key is in the Redis Cluster slot of the key
// without it.
func TestKeyPrefix(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"p.yaml": []byte("domain: shop\ndescriptors:\n  - key: api\n    descriptors:\n      - key: path\n        rate_limit: {unit: minute, requests_per_unit: 5}\n")})
	if err != nil {
		t.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{
		{Key: "api", Value: "k1"}, {Key: "path", Value: "/a"}}}}}
	key := func(prefix string) string {
		s := New(cfg, limiter.New(memory.New(memory.Options{}), limiter.Options{}), Options{KeyPrefix: prefix})
		var res resolution
		if err := s.resolve(cfg, req, &res); err != nil || len(res.items) != 1 {
			t.Fatalf("resolve: %v, %d items", err, len(res.items))
		}
		return res.items[0].Check.Key
	}
	plain, prefixed := key(""), key("team-a:")
	if prefixed != "team-a:"+plain || !strings.Contains(plain, "{") {
		t.Fatalf("key %q, prefixed %q", plain, prefixed)
	}
	if redisstore.Slot(prefixed) != redisstore.Slot(plain) {
		t.Errorf("slot of %q is %d, of %q %d: the prefix moved the key", prefixed, redisstore.Slot(prefixed), plain, redisstore.Slot(plain))
	}
}
