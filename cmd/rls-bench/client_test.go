package main

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestOverallCode(t *testing.T) {
	for _, resp := range []*rlsv3.RateLimitResponse{
		{},
		{OverallCode: rlsv3.RateLimitResponse_OK},
		{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, RawBody: []byte("slow down"),
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
				LimitRemaining: 3, DurationUntilReset: durationpb.New(1500000000)}}},
		{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}}, OverallCode: rlsv3.RateLimitResponse_OK},
	} {
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		got, err := overallCode(b)
		if err != nil || got != resp.OverallCode {
			t.Errorf("overallCode(%v) = %v, %v; want %v", resp, got, err, resp.OverallCode)
		}
	}
	if _, err := overallCode([]byte{0x08}); err == nil {
		t.Error("a truncated varint parsed")
	}
	if _, err := overallCode([]byte{0xff}); err == nil {
		t.Error("a truncated tag parsed")
	}
}
