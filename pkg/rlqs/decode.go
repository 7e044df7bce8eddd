package rlqs

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/rls-project/rls/pkg/protoscan"
)

// Envoy's C++ protobuf does not check that strings are UTF-8, and a
// BucketId value can come from a request header. Go's protobuf refuses such
// a message, which would fail Recv and kill the Envoy's whole stream for one
// bad byte. So reports are decoded here with protoscan, strings taken byte
// for byte, as package service decodes RateLimitRequest.

// usage is one decoded BucketQuotaUsage.
type usage struct {
	bucket   map[string]string
	elapsed  time.Duration // Envoy's whole seconds; 0 on a bucket's first report
	allowed  uint64
	denied   uint64
	hasBktID bool
}

// report is one decoded RateLimitQuotaUsageReports: the message that
// service.Codec hands its bytes (service.RawMessage). err is the reason it
// is refused: tooBig for a message over the size bound, otherwise a
// decoding error naming where it broke.
type report struct {
	maxBytes int
	budget   *budget       // nil: none
	held     *atomic.Int64 // the stream's bytes of the budget
	cost     int64         // bytes of the budget this report holds until handled
	domain   string
	usages   []usage
	err      error
	size     int
}

// release returns the budget r holds.
func (r *report) release() {
	if r.budget != nil {
		r.budget.give(r.held, r.cost)
		r.cost = 0
	}
}

// errTooBig marks a report over the size bounds (ResourceExhausted).
var errTooBig = errors.New("report over the bound")

// UnmarshalRaw decodes b (service.RawMessage), once the budget has taken
// what decoding and handling it costs (reportCost); r.err is a status
// error when it does not fit.
func (r *report) UnmarshalRaw(b []byte) {
	r.size = len(b)
	if r.maxBytes > 0 && len(b) > r.maxBytes {
		r.err = fmt.Errorf("%w: %d bytes, over the limit of %d bytes per report", errTooBig, len(b), r.maxBytes)
		return
	}
	if r.budget != nil {
		cost := reportCost(b)
		if err := r.budget.take(r.held, cost); err != nil {
			r.err = err
			return
		}
		r.cost = cost
	}
	if err := r.decode(b); err != nil {
		r.err = fmt.Errorf("invalid RateLimitQuotaUsageReports: %w", err)
	}
}

// each calls f for every field of b, with its number, wire type, varint
// value and (for length-delimited fields) bytes (protoscan.Each).
func each(b []byte, f func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error) error {
	return protoscan.Each(b, func(fl protoscan.Field, data []byte) error { return f(fl.Num, fl.Type, fl.V, data) })
}

func (r *report) decode(b []byte) error {
	return each(b, func(num protowire.Number, typ protowire.Type, _ uint64, data []byte) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			r.domain = string(data)
		case num == 2 && typ == protowire.BytesType:
			var u usage
			if err := u.decode(data); err != nil {
				return fmt.Errorf("bucket_quota_usages[%d]: %w", len(r.usages), err)
			}
			r.usages = append(r.usages, u)
		}
		return nil
	})
}

func (u *usage) decode(b []byte) error {
	return each(b, func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			u.hasBktID = true
			return u.bucketID(data)
		case num == 2 && typ == protowire.BytesType:
			return u.duration(data)
		case num == 3 && typ == protowire.VarintType:
			u.allowed = v
		case num == 4 && typ == protowire.VarintType:
			u.denied = v
		}
		return nil
	})
}

func (u *usage) bucketID(b []byte) error {
	if u.bucket == nil {
		u.bucket = map[string]string{}
	}
	return each(b, func(num protowire.Number, typ protowire.Type, _ uint64, data []byte) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		k, v, err := protoscan.MapEntry(data)
		if err != nil {
			return fmt.Errorf("bucket_id: %w", err)
		}
		u.bucket[k] = v
		return nil
	})
}

func (u *usage) duration(b []byte) error {
	var sec, nanos int64
	err := each(b, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) error {
		if typ == protowire.VarintType && num == 1 {
			sec = int64(v)
		} else if typ == protowire.VarintType && num == 2 {
			nanos = int64(int32(v))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("time_elapsed: %w", err)
	}
	if sec < 0 || nanos < 0 || sec > 1<<31 {
		return fmt.Errorf("time_elapsed %ds %dns is negative or too large", sec, nanos)
	}
	u.elapsed = time.Duration(sec)*time.Second + time.Duration(nanos)
	return nil
}
