package xds

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/logthrottle"
	"github.com/rls-project/rls/pkg/testkit"
)

// chain is a resource whose descriptors nest n deep, one per level.
func chain(name string, n int) *rlsconf.RateLimitConfig {
	c := &rlsconf.RateLimitConfig{Name: name, Domain: name}
	level := &c.Descriptors
	for range n {
		d := &rlsconf.RateLimitDescriptor{Key: "k"}
		*level = append(*level, d)
		level = &d.Descriptors
	}
	return c
}

// flat is a resource of n descriptors side by side, each with a limit.
func flat(name string, n int) *rlsconf.RateLimitConfig {
	c := &rlsconf.RateLimitConfig{Name: name, Domain: name}
	for i := range n {
		c.Descriptors = append(c.Descriptors, &rlsconf.RateLimitDescriptor{Key: "tenant", Value: fmt.Sprint("t", i),
			RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 10}})
	}
	return c
}

// nestedMeta is metadata nested n levels: {a: {a: ... {a: "x"}}}.
func nestedMeta(n int) *structpb.Struct {
	s := &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStringValue("x")}}
	for range n - 1 {
		s = &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStructValue(s)}}
	}
	return s
}

func anys(t testing.TB, cs ...*rlsconf.RateLimitConfig) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, len(cs))
	for i, c := range cs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

// TestLimits: each limit lets exactly its maximum through and refuses one
// more, with an error naming the limit and the resource.
func TestLimits(t *testing.T) {
	withMeta := func(values int) *rlsconf.RateLimitConfig {
		// metadata {a: 1, b: [x, y, ...]}: 2 fields, values-2 elements.
		list := make([]any, values-2)
		for i := range list {
			list[i] = "x"
		}
		meta, err := structpb.NewStruct(map[string]any{"a": 1, "b": list})
		if err != nil {
			t.Fatal(err)
		}
		return &rlsconf.RateLimitConfig{Name: "m", Domain: "m", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", Metadata: meta}}}
	}
	withReplaces := func(n int) *rlsconf.RateLimitConfig {
		c := flat("r", 1)
		for range n {
			c.Descriptors[0].RateLimit.Replaces = append(c.Descriptors[0].RateLimit.Replaces, &rlsconf.RateLimitReplace{Name: "x"})
		}
		return c
	}
	// Strings: name "s" and domain "s" (2), descriptor k=v (path 0+2+1+1 = 4),
	// its child c (path 4+2+1 = 7), the policy's name "p" (1): 14 bytes.
	strs := &rlsconf.RateLimitConfig{Name: "s", Domain: "s", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", Value: "v",
		RateLimit:   &rlsconf.RateLimitPolicy{Name: "p"},
		Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "c"}}}}}
	withNote := func(v string) *rlsconf.RateLimitConfig {
		meta, err := structpb.NewStruct(map[string]any{"note": v})
		if err != nil {
			t.Fatal(err)
		}
		return &rlsconf.RateLimitConfig{Name: "n", Domain: "n", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", Metadata: meta}}}
	}
	note := strings.Repeat("y", 100)
	metaSize := proto.Size(withNote(note).Descriptors[0].Metadata)
	sized := anys(t, flat("b", 3))
	size := len(sized[0].GetValue()) + len(sized[0].GetTypeUrl())

	for _, c := range []struct {
		name       string
		lim        Limits
		ok, over   []*rlsconf.RateLimitConfig
		limit, msg string
	}{
		{"depth", Limits{MaxDepth: 5}, []*rlsconf.RateLimitConfig{chain("d", 5)}, []*rlsconf.RateLimitConfig{chain("d", 6)},
			"depth", "xds:d: over the xDS depth limit: descriptors nested deeper than 5 levels"},
		{"metadata depth", Limits{MaxDepth: 5},
			[]*rlsconf.RateLimitConfig{{Name: "m", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", Metadata: nestedMeta(5)}}}},
			[]*rlsconf.RateLimitConfig{{Name: "m", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", Metadata: nestedMeta(6)}}}},
			"depth", "xds:m: over the xDS depth limit: metadata nested deeper than 5 levels"},
		{"descriptors", Limits{MaxDescriptors: 10}, []*rlsconf.RateLimitConfig{flat("a", 4), flat("b", 6)},
			[]*rlsconf.RateLimitConfig{flat("a", 4), flat("b", 7)},
			"descriptors", "xds:b: over the xDS descriptors limit: more than 10 descriptors in one response"},
		{"nested descriptors", Limits{MaxDescriptors: 10}, []*rlsconf.RateLimitConfig{chain("c", 10)}, []*rlsconf.RateLimitConfig{chain("c", 11)},
			"descriptors", "xds:c: over the xDS descriptors limit: more than 10 descriptors in one response"},
		{"metadata values", Limits{MaxValues: 6}, []*rlsconf.RateLimitConfig{withMeta(6)}, []*rlsconf.RateLimitConfig{withMeta(7)},
			"values", "xds:m: over the xDS values limit: more than 6 replaces entries and metadata values in one response"},
		{"replaces", Limits{MaxValues: 6}, []*rlsconf.RateLimitConfig{withReplaces(6)}, []*rlsconf.RateLimitConfig{withReplaces(7)},
			"values", "xds:r: over the xDS values limit: more than 6 replaces entries and metadata values in one response"},
		{"string bytes", Limits{MaxStringBytes: 14}, []*rlsconf.RateLimitConfig{strs}, nil,
			"", ""},
		{"string bytes over", Limits{MaxStringBytes: 13}, nil, []*rlsconf.RateLimitConfig{strs},
			"string bytes", "xds:s: over the xDS string bytes limit: more than 13 bytes of strings (paths of descriptors included) in one response"},
		{"metadata bytes", Limits{MaxMetadataBytes: metaSize}, []*rlsconf.RateLimitConfig{withNote(note)}, []*rlsconf.RateLimitConfig{withNote(note + "x")},
			"metadata bytes", fmt.Sprintf("xds:n: over the xDS metadata bytes limit: a descriptor's metadata of %d bytes, more than %d", metaSize+1, metaSize)},
		{"bytes", Limits{MaxBytes: size}, []*rlsconf.RateLimitConfig{flat("b", 3)}, nil, "", ""},
		{"bytes over", Limits{MaxBytes: size - 1}, nil, []*rlsconf.RateLimitConfig{flat("b", 3)},
			"bytes", fmt.Sprintf("over the xDS bytes limit: resources of %d bytes in one response, more than %d", size, size-1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			lim := c.lim.withDefaults(0)
			if c.ok != nil {
				if err := checkResources(anys(t, c.ok...), lim); err != nil {
					t.Errorf("at the limit: %v", err)
				}
			}
			if c.over == nil {
				return
			}
			err := checkResources(anys(t, c.over...), lim)
			var le *LimitError
			if !errors.As(err, &le) || le.Limit != c.limit || err.Error() != c.msg {
				t.Errorf("one past the limit: %v\nwant %s", err, c.msg)
			}
		})
	}
}

// TestLimitsDefaults: the limits a Client uses when none are set.
func TestLimitsDefaults(t *testing.T) {
	got := Limits{}.withDefaults(0)
	want := Limits{MaxDepth: 64, MaxDescriptors: 100_000, MaxValues: 100_000, MaxStringBytes: 32 << 20, MaxBytes: 4 << 20, MaxMetadataBytes: 4096}
	if got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
	if got := (Limits{}).withDefaults(16 << 20).MaxBytes; got != 16<<20 {
		t.Errorf("MaxBytes follows MaxRecvBytes: %d", got)
	}
	if got := (Limits{MaxBytes: 10}).withDefaults(16 << 20).MaxBytes; got != 10 {
		t.Errorf("MaxBytes set: %d", got)
	}
}

// TestLimitsStopAtOnce: a resource nested 9,000 deep is refused at the
// first level past the limit, without allocating for the levels it walked,
// and so is the 100,001st of 180,000 descriptors.
func TestLimitsStopAtOnce(t *testing.T) {
	lim := Limits{MaxBytes: 8 << 20}.withDefaults(0)
	for _, c := range []struct {
		res   []*anypb.Any
		limit string
	}{
		{anys(t, chain("deep", 9000)), "depth"},
		{anys(t, flat("wide", 180_000)), "descriptors"},
	} {
		var err error
		allocs := testing.AllocsPerRun(3, func() { err = checkResources(c.res, lim) })
		var le *LimitError
		if !errors.As(err, &le) || le.Limit != c.limit {
			t.Fatalf("%v, want over the %s limit", err, c.limit)
		}
		if allocs > 10 { // the error and the resource's name
			t.Errorf("%s: %v allocations to refuse it, want a few", c.limit, allocs)
		}
	}
}

// TestLimitsMalformed: bytes that are not a message are refused, not
// walked past their end.
func TestLimitsMalformed(t *testing.T) {
	good := anys(t, flat("f", 2))[0]
	for cut := 1; cut < len(good.Value); cut++ {
		a := &anypb.Any{TypeUrl: TypeURL, Value: good.Value[:cut]}
		if err := checkResources([]*anypb.Any{a}, Limits{}.withDefaults(0)); err == nil {
			// A cut between two fields is a valid, shorter message.
			continue
		} else if !strings.Contains(err.Error(), "not a valid protobuf message") {
			t.Fatalf("cut at %d: %v", cut, err)
		}
	}
}

// TestDecodeWithinLimits: a response within the limits decodes to the
// resources it holds; the parser's own bounds still apply to them.
func TestDecodeWithinLimits(t *testing.T) {
	res, err := decode(&discoveryv3.DiscoveryResponse{TypeUrl: TypeURL, Resources: anys(t, chain("a", 64), flat("b", 3))}, Limits{}.withDefaults(0))
	if err != nil || len(res) != 2 || res[0].GetName() != "a" || len(res[1].GetDescriptors()) != 3 {
		t.Fatalf("decode: %v, %v", res, err)
	}
	meta := &rlsconf.RateLimitConfig{Name: "m", Domain: "m", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", Metadata: nestedMeta(40),
		RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 1}}}}
	res, err = decode(&discoveryv3.DiscoveryResponse{TypeUrl: TypeURL, Resources: anys(t, meta)}, Limits{}.withDefaults(0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Build(res, descriptors.ParseOptions{}); err == nil || !strings.Contains(err.Error(), "xds:m: descriptors[0].metadata") ||
		!strings.Contains(err.Error(), "nested deeper than 32 levels") {
		t.Errorf("metadata 40 deep: %v, want the parser's bound", err)
	}
}

// TestDescribeBounded: a NACK's message and its log line hold the first
// errors, each cut short at a rune boundary, then how many more there are.
func TestDescribeBounded(t *testing.T) {
	var list descriptors.Errors
	for i := range 1000 {
		list = append(list, &descriptors.ConfigError{File: "xds:x", Field: fmt.Sprintf("descriptors[%d].key", i), Msg: strings.Repeat("é", 400)})
	}
	got := describe(list, 5, 100)
	lines := strings.Split(got, "\n")
	if len(lines) != 6 || lines[5] != "... and 995 more errors" || !strings.HasPrefix(lines[0], "xds:x: descriptors[0].key: é") {
		t.Fatalf("describe:\n%s", got)
	}
	for _, l := range lines[:5] {
		if len(l) > 100+len("... (9999 more bytes)") || !strings.HasSuffix(l, "more bytes)") || !strings.Contains(l, "é...") {
			t.Errorf("a line of %d bytes: %q", len(l), l)
		}
	}
	if got := describe(list[:2], 5, 1000); got != list[0].Error()+"\n"+list[1].Error() {
		t.Errorf("two short errors: %q", got)
	}
	if got := describe(errors.New(strings.Repeat("x", 50)), 5, 10); got != "xxxxxxxxxx... (40 more bytes)" {
		t.Errorf("a plain error: %q", got)
	}
	if n := errorCount(list); n != 1000 {
		t.Errorf("errorCount %d", n)
	}
}

// TestNACKLogThrottled: NACKs are logged at most once per interval, each
// line bounded and counting the NACKs it did not log.
func TestNACKLogThrottled(t *testing.T) {
	logs := &testkit.Buffer{}
	clk := testkit.NewClock(time.Unix(1000, 0))
	c, err := New(Options{Server: "x:1", NodeID: "n", Log: slog.New(slog.NewTextHandler(logs, nil)),
		Update: func(string, []*rlsconf.RateLimitConfig) error {
			var list descriptors.Errors
			for i := range 50 {
				list = append(list, &descriptors.ConfigError{File: "xds:x", Field: "key", Msg: fmt.Sprint("bad ", i, " ", strings.Repeat("y", 10_000))})
			}
			return list
		}})
	if err != nil {
		t.Fatal(err)
	}
	c.nackLog = logthrottle.New(time.Minute, clk.Now)
	send := func(version string) *discoveryv3.DiscoveryRequest {
		req, _ := c.answer(&discoveryv3.DiscoveryResponse{VersionInfo: version, Nonce: version, TypeUrl: TypeURL, Resources: anys(t, flat("x", 1))})
		return req
	}
	for i := range 20 {
		if d := send(fmt.Sprint(i)).GetErrorDetail().GetMessage(); len(d) > maxDetail+100 || !strings.Contains(d, "more") {
			t.Fatalf("NACK detail of %d bytes", len(d))
		}
	}
	if n := strings.Count(logs.String(), "config rejected (NACK)"); n != 1 {
		t.Fatalf("%d NACK lines for 20 NACKs within the interval, want 1", n)
	}
	if n := logs.Len(); n > 5*(maxLogErrorBytes+100)+1000 {
		t.Errorf("the NACK line is %d bytes", n)
	}
	if !strings.Contains(logs.String(), "errors=50") || !strings.Contains(logs.String(), "and 45 more errors") {
		t.Errorf("the line does not count the errors:\n%s", logs.String())
	}
	clk.Advance(time.Minute)
	send("next")
	if n := strings.Count(logs.String(), "config rejected (NACK)"); n != 2 || !strings.Contains(logs.String(), "nacks_not_logged=19") {
		t.Errorf("after the interval: %d lines, want 2, the second counting 19 not logged:\n%s", n, logs.String())
	}
}

// TestRejectedBeforeUpdate: a response over the limits is NACKed without
// Update, and Rejected is told.
func TestRejectedBeforeUpdate(t *testing.T) {
	var updates, rejected int
	c, err := New(Options{Server: "x:1", NodeID: "n",
		Update:   func(string, []*rlsconf.RateLimitConfig) error { updates++; return nil },
		Rejected: func(v string, err error) { rejected++ }})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := c.answer(&discoveryv3.DiscoveryResponse{VersionInfo: "1", Nonce: "a", TypeUrl: TypeURL, Resources: anys(t, chain("deep", 9000))})
	if d := req.GetErrorDetail().GetMessage(); updates != 0 || rejected != 1 || !strings.Contains(d, "depth limit") {
		t.Errorf("%d updates, %d rejected, NACK %q", updates, rejected, d)
	}
	if req, _ := c.answer(&discoveryv3.DiscoveryResponse{VersionInfo: "2", Nonce: "b", TypeUrl: TypeURL, Resources: anys(t, flat("ok", 1))}); req.GetErrorDetail() != nil || updates != 1 || rejected != 1 {
		t.Errorf("a good response: %v, %d updates, %d rejected", req.GetErrorDetail(), updates, rejected)
	}
}
