package service

import (
	"context"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// fuzzConfig exercises every rule feature the handler branches on: each
// algorithm, burst, wildcards and share_threshold, replaces, shadow mode,
// unlimited, detailed metrics, response bodies and on_error.
const fuzzConfig = `
domain: fz
descriptors:
  - key: a
    rate_limit: {name: per-a, unit: minute, requests_per_unit: 5}
    descriptors:
      - key: b
        rate_limit: {name: a-b, unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 3}
      - key: b
        value: "x*"
        rate_limit: {name: a-bx, unit: hour, requests_per_unit: 1, algorithm: fixed_window, replaces: [{name: per-a}]}
  - key: t
    value: "e*"
    share_threshold: true
    value_to_metric: true
    rate_limit: {name: shared, unit: second, requests_per_unit: 3}
  - key: t
    value: "*"
    detailed_metric: true
    rate_limit:
      name: any-t
      unit: day
      requests_per_unit: 4294967295
      response_body: "slow down"
      content_type: text/plain
  - key: s
    shadow_mode: true
    rate_limit: {name: shadow, unit: hour, requests_per_unit: 1}
  - key: f
    rate_limit: {unlimited: true}
  - key: z
    rate_limit: {name: zero, unit: second, requests_per_unit: 0, algorithm: token_bucket, on_error: fail_closed}
  - key: y
    rate_limit: {name: yearly, unit: year, requests_per_unit: 1}
`

// fuzzReader hands out fuzz bytes; past the end it returns zeros.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) uint64() uint64 {
	var v uint64
	for i := 0; i < 8; i++ {
		v = v<<8 | uint64(r.byte())
	}
	return v
}

// str returns a short string: a known word, a fuzzed run of bytes or empty.
func (r *fuzzReader) str() string {
	words := []string{"", "a", "b", "t", "s", "f", "z", "x1", "eng", "e", "*", "{", "}", "|", "%", ":", "=", "fz", "other"}
	c := r.byte()
	if c < 0xC0 {
		return words[int(c)%len(words)]
	}
	n := int(c-0xC0) % 24
	if c == 0xFF { // rarely, a long value (over Limits.KeyBytes)
		n = 300
	}
	out := make([]byte, 0, n)
	for i := 0; i < n; i++ {
		out = append(out, r.byte())
	}
	return string(out)
}

// hits decodes a hits count: small, near a bound, or huge.
func (r *fuzzReader) hits() uint64 {
	switch c := r.byte(); c % 8 {
	case 0, 1, 2:
		return uint64(c / 8)
	case 3:
		return DefaultLimits.Hits - 1 + uint64(c/8%3)
	case 4:
		return 1<<53 - 1 + uint64(c/8%3)
	case 5:
		return ^uint64(0) - uint64(c/8)
	default:
		return r.uint64()
	}
}

// fuzzRequest decodes a RateLimitRequest from data.
func fuzzRequest(data []byte) *rlsv3.RateLimitRequest {
	r := &fuzzReader{b: data}
	req := &rlsv3.RateLimitRequest{}
	switch c := r.byte(); c % 4 {
	case 0, 1:
		req.Domain = "fz"
	case 2:
		req.Domain = r.str()
	default:
		req.Domain = ""
	}
	if c := r.byte(); c%4 == 0 {
		req.HitsAddend = uint32(r.hits())
	} else {
		req.HitsAddend = uint32(c / 4 % 4)
	}
	nd := int(r.byte()) % 7 // 0..6: none and over the usual handful
	for i := 0; i < nd; i++ {
		flags := r.byte()
		d := &rlcommon.RateLimitDescriptor{}
		if flags&0x10 != 0 { // a nil descriptor is invalid, not a panic
			if flags&0x20 != 0 && flags&0x40 != 0 && flags&0x80 != 0 {
				req.Descriptors = append(req.Descriptors, nil)
				continue
			}
		}
		ne := int(r.byte()) % 6 // 0..5 entries
		for j := 0; j < ne; j++ {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: r.str(), Value: r.str()})
		}
		if flags&1 != 0 {
			d.HitsAddend = wrapperspb.UInt64(r.hits())
		}
		if flags&2 != 0 {
			d.IsNegativeHits = true
		}
		if flags&4 != 0 {
			d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{
				RequestsPerUnit: uint32(r.uint64()),
				Unit:            typev3.RateLimitUnit(int32(r.byte()) - 2), // -2..253: valid and invalid
			}
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// FuzzShouldRateLimit sends fuzzed requests to a Service on the memory store:
// it must never panic or answer codes.Unknown; a request is either
// InvalidArgument or answered with one status per descriptor, none UNKNOWN,
// overall OVER_LIMIT exactly when some status is.
func FuzzShouldRateLimit(f *testing.F) {
	f.Add([]byte{0, 1, 1, 0, 1, 1, 1})                                                       // one descriptor a=a
	f.Add([]byte{0, 1, 2, 0, 2, 1, 1, 1, 2, 0, 1, 1})                                        // a, a/b
	f.Add([]byte{0, 1, 1, 1, 1, 1, 1, 5})                                                    // per-descriptor hits_addend
	f.Add([]byte{0, 1, 1, 3, 1, 1, 1, 5})                                                    // and is_negative_hits
	f.Add([]byte{0, 1, 1, 4, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 7, 4})                            // override: 7 per minute
	f.Add([]byte{0, 1, 1, 4, 1, 1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}) // override with a bad unit
	f.Add([]byte{0, 1, 1, 0, 1, 3, 8})                                                       // t=eng (share threshold)
	f.Add([]byte{0, 1, 3, 0, 1, 4, 1, 0, 1, 6, 1, 0, 1, 5, 1})                               // s, z, f
	f.Add([]byte{0, 1, 1, 1, 1, 1, 1, 13})                                                   // hits over Limits.Hits
	f.Add([]byte{3, 1, 1, 0, 1, 1, 1})                                                       // empty domain
	f.Add([]byte{0, 1, 1, 0xf0, 1, 1})                                                       // nil descriptor
	f.Add([]byte{0, 1, 1, 0, 0})                                                             // no entries
	f.Add([]byte{0, 1, 1, 0, 1, 0, 1})                                                       // empty key

	cfg, err := descriptors.Parse(map[string][]byte{"fz.yaml": []byte(fuzzConfig)})
	if err != nil {
		f.Fatal(err)
	}
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	st := memory.New(memory.Options{Now: clk.Now, MaxKeys: 10000})
	lim := limiter.New(st, limiter.Options{Now: clk.Now, OverLimitCacheSize: 1000, BucketsSize: 1000})
	svcs := []*Service{
		New(cfg, lim, Options{}),
		New(cfg, lim, Options{ResponseHeaders: true, FailClosed: true, Metrics: NewMetrics(prometheus.NewRegistry(), 5)}),
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := fuzzRequest(data)
		if len(data) > 0 {
			clk.Advance(time.Duration(data[len(data)-1]) * 10 * time.Millisecond)
		}
		svc := svcs[len(data)%2]
		// Twice: the second call sees the first one's counters (and the
		// over-limit cache).
		for range 2 {
			resp, err := svc.ShouldRateLimit(context.Background(), req)
			checkResponse(t, req, resp, err)
		}
	})
}

func checkResponse(t *testing.T, req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse, err error) {
	t.Helper()
	if err != nil {
		s, ok := status.FromError(err)
		if !ok || s.Code() != codes.InvalidArgument {
			t.Fatalf("error %v (code %v), want InvalidArgument\nrequest %v", err, status.Code(err), req)
		}
		if resp != nil {
			t.Fatalf("a response with the error %v", err)
		}
		return
	}
	if resp == nil {
		t.Fatal("nil response and nil error")
	}
	if c := resp.OverallCode; c != rlsv3.RateLimitResponse_OK && c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("overall_code %v\nrequest %v", c, req)
	}
	if len(resp.Statuses) != len(req.Descriptors) {
		t.Fatalf("%d statuses for %d descriptors\nrequest %v", len(resp.Statuses), len(req.Descriptors), req)
	}
	over := false
	for i, st := range resp.Statuses {
		switch st.GetCode() {
		case rlsv3.RateLimitResponse_OK:
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			over = true
		default:
			t.Fatalf("status %d code %v\nrequest %v", i, st.GetCode(), req)
		}
	}
	if over != (resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT) {
		t.Fatalf("overall_code %v but some status over limit: %v\nrequest %v\nresponse %v", resp.OverallCode, over, req, resp)
	}
}

// TestFuzzRequestDecodes keeps the decoder honest: the seeds above must
// reach both outcomes.
func TestFuzzRequestDecodes(t *testing.T) {
	req := fuzzRequest([]byte{0, 1, 2, 0, 1, 1, 1, 0, 2, 1, 1, 2, 2})
	if req.Domain != "fz" || len(req.Descriptors) != 2 || len(req.Descriptors[1].Entries) != 2 {
		t.Fatalf("decoded %v", req)
	}
	if err := validateRequest(fuzzRequest([]byte{3, 1, 1, 0, 1, 1, 1}), &DefaultLimits); err == nil {
		t.Fatal("an empty domain validates")
	}
}
