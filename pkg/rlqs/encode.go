package rlqs

import (
	"fmt"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/rls-project/rls/pkg/protoscan"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// rawResponse is a response encoded with its BucketIds byte for byte
// (service.RawMarshaler): Go's protobuf refuses to marshal a string that is
// not UTF-8, and a BucketId must be echoed exactly as Envoy sent it.
type rawResponse struct {
	b []byte
}

// MarshalRaw returns r's bytes.
func (r rawResponse) MarshalRaw() []byte { return r.b }

// appendResponseAction appends a as one bucket_action of a
// RateLimitQuotaResponse: a response is the concatenation of its actions.
func appendResponseAction(b []byte, a *rlqsv3.RateLimitQuotaResponse_BucketAction) []byte {
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	return protowire.AppendBytes(b, appendAction(nil, a))
}

func appendAction(b []byte, a *rlqsv3.RateLimitQuotaResponse_BucketAction) []byte {
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, protoscan.AppendStringMap(nil, 1, a.GetBucketId().GetBucket()))
	switch x := a.BucketAction.(type) {
	case *rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_:
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, nil)
	case *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_:
		var q []byte
		if ttl := x.QuotaAssignmentAction.AssignmentTimeToLive; ttl != nil {
			q = protowire.AppendTag(q, 2, protowire.BytesType)
			q = protowire.AppendBytes(q, mustMarshal(ttl))
		}
		if s := x.QuotaAssignmentAction.RateLimitStrategy; s != nil {
			q = protowire.AppendTag(q, 3, protowire.BytesType)
			q = protowire.AppendBytes(q, mustMarshal(s))
		}
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, q)
	}
	return b
}

// mustMarshal marshals a message without strings (a Duration, a
// RateLimitStrategy), which cannot fail.
func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("rlqs: marshal %T: %v", m, err))
	}
	return b
}
