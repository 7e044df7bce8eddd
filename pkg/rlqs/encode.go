package rlqs

import (
	"fmt"
	"sort"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
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
	b = protowire.AppendBytes(b, appendBucketID(nil, a.GetBucketId().GetBucket()))
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

func appendBucketID(b []byte, id map[string]string) []byte {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	sort.Strings(keys) // deterministic, as proto.Marshal's Deterministic
	for _, k := range keys {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, id[k])
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
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

// DecodeResponse decodes a serialized RateLimitQuotaResponse as rls sends
// it, keeping BucketId bytes that are not UTF-8 (for clients and tests that
// must read such echoes; Go's protobuf refuses them).
func DecodeResponse(b []byte) (*rlqsv3.RateLimitQuotaResponse, error) {
	resp := &rlqsv3.RateLimitQuotaResponse{}
	err := each(b, func(num protowire.Number, typ protowire.Type, _ uint64, data []byte) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		a, err := decodeAction(data)
		resp.BucketAction = append(resp.BucketAction, a)
		return err
	})
	return resp, err
}

func decodeAction(b []byte) (*rlqsv3.RateLimitQuotaResponse_BucketAction, error) {
	a := &rlqsv3.RateLimitQuotaResponse_BucketAction{}
	err := each(b, func(num protowire.Number, typ protowire.Type, _ uint64, data []byte) error {
		switch num {
		case 1:
			var u usage
			if err := u.bucketID(data); err != nil {
				return err
			}
			a.BucketId = &rlqsv3.BucketId{Bucket: u.bucket}
		case 2:
			q := &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{}
			err := each(data, func(num protowire.Number, _ protowire.Type, _ uint64, d []byte) error {
				switch num {
				case 2:
					q.AssignmentTimeToLive = &durationpb.Duration{}
					return proto.Unmarshal(d, q.AssignmentTimeToLive)
				case 3:
					q.RateLimitStrategy = &typev3.RateLimitStrategy{}
					return proto.Unmarshal(d, q.RateLimitStrategy)
				}
				return nil
			})
			if err != nil {
				return err
			}
			a.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: q}
		case 3:
			a.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}
		}
		return nil
	})
	return a, err
}

// MarshalReports encodes m as protobuf with its strings byte for byte, as
// Envoy's C++ does (Go's protobuf refuses strings that are not UTF-8): for
// Go clients whose BucketId values come from request bytes, and tests.
func MarshalReports(m *rlqsv3.RateLimitQuotaUsageReports) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, m.Domain)
	for _, u := range m.BucketQuotaUsages {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendBytes(e, appendBucketID(nil, u.GetBucketId().GetBucket()))
		if u.TimeElapsed != nil {
			e = protowire.AppendTag(e, 2, protowire.BytesType)
			e = protowire.AppendBytes(e, mustMarshal(u.TimeElapsed))
		}
		e = protowire.AppendTag(e, 3, protowire.VarintType)
		e = protowire.AppendVarint(e, u.NumRequestsAllowed)
		e = protowire.AppendTag(e, 4, protowire.VarintType)
		e = protowire.AppendVarint(e, u.NumRequestsDenied)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	return b
}
