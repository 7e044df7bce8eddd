package xds

import (
	"errors"
	"strings"
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
)

// TestPolicyWithUnknownFieldRefused: RateLimitPolicy has no period
// multiplier; a resource whose nested rate_limit carries a field this
// build does not know (as a newer control plane's multiplier would be,
// field 6 here), decoded from the wire as the client decodes it, is
// refused naming the place, rather than counted over one unit.
func TestPolicyWithUnknownFieldRefused(t *testing.T) {
	policy := &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 5}
	res := &rlsconf.RateLimitConfig{Name: "api", Domain: "api", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 1}},
		{Key: "k2", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "n", RateLimit: policy}}},
	}}
	// A multiplier of 30 as field 6, a UInt32Value wrapper.
	wrapper := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 30)
	policy.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 6, protowire.BytesType), wrapper))
	a, err := anypb.New(res)
	if err != nil {
		t.Fatal(err)
	}
	decoded := new(rlsconf.RateLimitConfig)
	if err := a.UnmarshalTo(decoded); err != nil {
		t.Fatal(err)
	}
	_, err = Build([]*rlsconf.RateLimitConfig{decoded}, descriptors.ParseOptions{})
	var list descriptors.Errors
	if !errors.As(err, &list) || len(list) != 1 ||
		!strings.HasPrefix(list[0].Error(), "xds:api: descriptors[1].descriptors[0].rate_limit: has protobuf field(s) [6] that this rls does not know") {
		t.Fatalf("got %v, want the nested rate_limit refused", err)
	}

	// Without the unknown field it builds, and a period is one unit.
	clean := proto.Clone(decoded).(*rlsconf.RateLimitConfig)
	clean.Descriptors[1].Descriptors[0].RateLimit.ProtoReflect().SetUnknown(nil)
	cfg, err := Build([]*rlsconf.RateLimitConfig{clean}, descriptors.ParseOptions{DefaultAlgorithm: store.FixedWindow})
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Match("api", entries("k2", "x", "n", "y"))
	if r == nil || r.Window().Minutes() != 1 || r.Algorithm != store.FixedWindow {
		t.Errorf("clean policy: %+v, want a one-minute fixed window (the default algorithm)", r)
	}
}
