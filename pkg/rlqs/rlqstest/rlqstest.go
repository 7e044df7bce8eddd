// Package rlqstest is the client's side of RLQS's wire for tests: reports
// encoded and responses decoded with their strings byte for byte, as
// Envoy's C++ protobuf does (Go's protobuf refuses strings that are not
// UTF-8, which a BucketId may hold).
package rlqstest

import (
	"fmt"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rls-project/rls/pkg/protoscan"
)

// MarshalReports encodes m as protobuf with its strings byte for byte.
func MarshalReports(m *rlqsv3.RateLimitQuotaUsageReports) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, m.Domain)
	for _, u := range m.BucketQuotaUsages {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendBytes(e, protoscan.AppendStringMap(nil, 1, u.GetBucketId().GetBucket()))
		if u.TimeElapsed != nil {
			d, err := proto.Marshal(u.TimeElapsed)
			if err != nil {
				panic(fmt.Sprintf("rlqstest: marshal a Duration: %v", err))
			}
			e = protowire.AppendTag(e, 2, protowire.BytesType)
			e = protowire.AppendBytes(e, d)
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

// DecodeResponse decodes a serialized RateLimitQuotaResponse as rls sends
// it, keeping BucketId bytes that are not UTF-8.
func DecodeResponse(b []byte) (*rlqsv3.RateLimitQuotaResponse, error) {
	resp := &rlqsv3.RateLimitQuotaResponse{}
	err := protoscan.Each(b, func(f protoscan.Field, data []byte) error {
		if f.Num != 1 || f.Type != protowire.BytesType {
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
	err := protoscan.Each(b, func(f protoscan.Field, data []byte) error {
		switch f.Num {
		case 1:
			id, err := decodeBucketID(data)
			a.BucketId = &rlqsv3.BucketId{Bucket: id}
			return err
		case 2:
			q, err := decodeAssignment(data)
			a.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: q}
			return err
		case 3:
			a.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}
		}
		return nil
	})
	return a, err
}

func decodeAssignment(b []byte) (*rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction, error) {
	q := &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{}
	err := protoscan.Each(b, func(f protoscan.Field, d []byte) error {
		switch f.Num {
		case 2:
			q.AssignmentTimeToLive = &durationpb.Duration{}
			return proto.Unmarshal(d, q.AssignmentTimeToLive)
		case 3:
			q.RateLimitStrategy = &typev3.RateLimitStrategy{}
			return proto.Unmarshal(d, q.RateLimitStrategy)
		}
		return nil
	})
	return q, err
}

// decodeBucketID decodes a BucketId's entries byte for byte.
func decodeBucketID(b []byte) (map[string]string, error) {
	id := map[string]string{}
	err := protoscan.Each(b, func(f protoscan.Field, entry []byte) error {
		if f.Num != 1 || f.Type != protowire.BytesType {
			return nil
		}
		k, v, err := protoscan.MapEntry(entry)
		id[k] = v
		return err
	})
	return id, err
}
