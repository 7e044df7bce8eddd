package service

import (
	"context"
	"fmt"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/pkg/protoscan"
)

// Envoy copies header bytes into descriptor values as they come, and its
// C++ protobuf does not check that a string field is UTF-8. Go's protobuf
// refuses such a message, which grpc-go answers Internal, which Envoy (with
// failure_mode_deny: false) takes as "let it through": one byte 0xff in a
// header would skip every limit. So rls decodes RateLimitRequest itself,
// field by field with protowire, exactly as proto.Unmarshal does except that
// strings may hold any bytes (a Go string can), and answers a request that
// is not protobuf at all InvalidArgument.

// DecodeRequest decodes b, a serialized envoy.service.ratelimit.v3
// RateLimitRequest, into req, which must be empty. It gives what
// proto.Unmarshal gives for every input proto.Unmarshal accepts, except that
// unknown fields are dropped, and accepts strings (domain, entry keys and
// values) that are not valid UTF-8, byte for byte. Input that is not
// protobuf is an error that names where it broke. The strings of req share
// one copy of b.
func DecodeRequest(b []byte, req *rlsv3.RateLimitRequest) error {
	d := decoder{buf: b, str: string(b)}
	if err := d.request(req); err != nil {
		return fmt.Errorf("invalid RateLimitRequest: %w", err)
	}
	return nil
}

// decoder holds the message being decoded, as bytes and as the one string
// every decoded string is a substring of, and the slabs decoded messages
// are allocated from.
type decoder struct {
	buf     []byte
	str     string
	entries []rlcommon.RateLimitDescriptor_Entry
	descs   []rlcommon.RateLimitDescriptor
}

// field is one decoded field (protoscan.Field).
type field = protoscan.Field

// next decodes the field at buf[i:end] and returns it with the index of the
// field after it (protoscan.Next).
func (d *decoder) next(i, end int) (field, int, error) {
	return protoscan.Next(d.buf[:end], i)
}

// RateLimitRequest: domain = 1 (string), descriptors = 2 (repeated
// RateLimitDescriptor), hits_addend = 3 (uint32).
func (d *decoder) request(req *rlsv3.RateLimitRequest) error {
	for i := 0; i < len(d.buf); {
		f, j, err := d.next(i, len(d.buf))
		if err != nil {
			return err
		}
		i = j
		switch {
		case f.Num == 1 && f.Type == protowire.BytesType:
			req.Domain = d.str[f.Lo:f.Hi]
		case f.Num == 2 && f.Type == protowire.BytesType:
			desc := d.newDescriptor()
			if err := d.descriptor(f.Lo, f.Hi, desc); err != nil {
				return fmt.Errorf("descriptors[%d]: %w", len(req.Descriptors), err)
			}
			req.Descriptors = append(req.Descriptors, desc)
		case f.Num == 3 && f.Type == protowire.VarintType:
			req.HitsAddend = uint32(f.V)
		}
	}
	return nil
}

// RateLimitDescriptor: entries = 1 (repeated Entry), limit = 2
// (RateLimitOverride), hits_addend = 3 (google.protobuf.UInt64Value),
// is_negative_hits = 4 (bool). A message field given twice is merged, as
// protobuf defines.
func (d *decoder) descriptor(lo, hi int, desc *rlcommon.RateLimitDescriptor) error {
	for i := lo; i < hi; {
		f, j, err := d.next(i, hi)
		if err != nil {
			return err
		}
		i = j
		if err := d.descriptorField(f, desc); err != nil {
			return err
		}
	}
	return nil
}

// descriptorField decodes one field of a RateLimitDescriptor into desc.
func (d *decoder) descriptorField(f field, desc *rlcommon.RateLimitDescriptor) error {
	switch {
	case f.Num == 1 && f.Type == protowire.BytesType:
		e := d.newEntry()
		if err := d.entry(f.Lo, f.Hi, e); err != nil {
			return fmt.Errorf("entries[%d]: %w", len(desc.Entries), err)
		}
		desc.Entries = append(desc.Entries, e)
	case f.Num == 2 && f.Type == protowire.BytesType:
		if desc.Limit == nil {
			desc.Limit = new(rlcommon.RateLimitDescriptor_RateLimitOverride)
		}
		if err := d.override(f.Lo, f.Hi, desc.Limit); err != nil {
			return fmt.Errorf("limit: %w", err)
		}
	case f.Num == 3 && f.Type == protowire.BytesType:
		if desc.HitsAddend == nil {
			desc.HitsAddend = new(wrapperspb.UInt64Value)
		}
		v, err := d.wrapper(f.Lo, f.Hi, desc.HitsAddend.Value)
		if err != nil {
			return fmt.Errorf("hits_addend: %w", err)
		}
		desc.HitsAddend.Value = v
	case f.Num == 4 && f.Type == protowire.VarintType:
		desc.IsNegativeHits = protowire.DecodeBool(f.V)
	}
	return nil
}

// Entry: key = 1 (string), value = 2 (string).
func (d *decoder) entry(lo, hi int, e *rlcommon.RateLimitDescriptor_Entry) error {
	for i := lo; i < hi; {
		f, j, err := d.next(i, hi)
		if err != nil {
			return err
		}
		i = j
		if f.Type != protowire.BytesType {
			continue
		}
		switch f.Num {
		case 1:
			e.Key = d.str[f.Lo:f.Hi]
		case 2:
			e.Value = d.str[f.Lo:f.Hi]
		}
	}
	return nil
}

// RateLimitOverride: requests_per_unit = 1 (uint32), unit = 2 (enum),
// unit_multiplier = 3 (google.protobuf.UInt32Value).
func (d *decoder) override(lo, hi int, l *rlcommon.RateLimitDescriptor_RateLimitOverride) error {
	for i := lo; i < hi; {
		f, j, err := d.next(i, hi)
		if err != nil {
			return err
		}
		i = j
		switch {
		case f.Num == 1 && f.Type == protowire.VarintType:
			l.RequestsPerUnit = uint32(f.V)
		case f.Num == 2 && f.Type == protowire.VarintType:
			l.Unit = typev3.RateLimitUnit(int32(f.V))
		case f.Num == 3 && f.Type == protowire.BytesType:
			if l.UnitMultiplier == nil {
				l.UnitMultiplier = new(wrapperspb.UInt32Value)
			}
			v, err := d.wrapper(f.Lo, f.Hi, uint64(l.UnitMultiplier.Value))
			if err != nil {
				return fmt.Errorf("unit_multiplier: %w", err)
			}
			l.UnitMultiplier.Value = uint32(v)
		}
	}
	return nil
}

// wrapper decodes a UInt64Value or UInt32Value (value = 1, a varint) merged
// into one holding v.
func (d *decoder) wrapper(lo, hi int, v uint64) (uint64, error) {
	for i := lo; i < hi; {
		f, j, err := d.next(i, hi)
		if err != nil {
			return 0, err
		}
		i = j
		if f.Num == 1 && f.Type == protowire.VarintType {
			v = f.V
		}
	}
	return v, nil
}

// newEntry and newDescriptor allocate from slabs, a few messages at a time.
func (d *decoder) newEntry() *rlcommon.RateLimitDescriptor_Entry {
	if len(d.entries) == 0 {
		d.entries = make([]rlcommon.RateLimitDescriptor_Entry, 4)
	}
	e := &d.entries[0]
	d.entries = d.entries[1:]
	return e
}

func (d *decoder) newDescriptor() *rlcommon.RateLimitDescriptor {
	if len(d.descs) == 0 {
		d.descs = make([]rlcommon.RateLimitDescriptor, 2)
	}
	desc := &d.descs[0]
	d.descs = d.descs[1:]
	return desc
}

// Codec returns the gRPC codec of rls's server (grpc.ForceServerCodecV2):
// grpc-go's protobuf codec, except that RateLimitRequests are decoded by
// DecodeRequest. With it, the handler Register installs answers a request
// that is not protobuf InvalidArgument; other services are unchanged.
func Codec() encoding.CodecV2 {
	return codec{base: encoding.GetCodecV2(grpcproto.Name)}
}

type codec struct{ base encoding.CodecV2 }

// RawMessage is a message that decodes its own bytes (another service's
// lenient decoder, such as package rlqs's usage reports): Codec hands it the
// serialized message, which it must copy what it keeps of, and it keeps its
// own decoding error for its handler to answer with a status of its choice.
type RawMessage interface {
	UnmarshalRaw(b []byte)
}

// decodedRequest is what Register's handler asks the codec to decode into:
// the request and DecodeRequest's error, which the handler answers
// InvalidArgument (an error from the codec itself would be Internal).
type decodedRequest struct {
	req rlsv3.RateLimitRequest
	err error
}

// RawMarshaler is a message that encodes itself (package rlqs's responses,
// which echo BucketId bytes that need not be UTF-8).
type RawMarshaler interface {
	MarshalRaw() []byte
}

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(RawMarshaler); ok {
		return mem.BufferSlice{mem.SliceBuffer(m.MarshalRaw())}, nil
	}
	return c.base.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *decodedRequest:
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		m.err = DecodeRequest(buf.ReadOnlyData(), &m.req)
		return nil
	case RawMessage:
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		m.UnmarshalRaw(buf.ReadOnlyData())
		return nil
	case *rlsv3.RateLimitRequest:
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		proto.Reset(m)
		return DecodeRequest(buf.ReadOnlyData(), m)
	}
	return c.base.Unmarshal(data, v)
}

func (codec) Name() string { return grpcproto.Name }

// Register registers s on r as envoy.service.ratelimit.v3.RateLimitService,
// with a handler that decodes requests with DecodeRequest. The server must
// use Codec (grpc.ForceServerCodecV2(service.Codec())).
func (s *Service) Register(r grpc.ServiceRegistrar) {
	desc := rlsv3.RateLimitService_ServiceDesc
	desc.Methods = []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: s.shouldRateLimitHandler}}
	r.RegisterService(&desc, s)
}

// shouldRateLimitHandler is the generated handler of ShouldRateLimit but
// for the decoding: a request that is not protobuf is InvalidArgument.
func (s *Service) shouldRateLimitHandler(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(decodedRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if in.err != nil {
		return nil, s.toStatus(badRequest{in.err})
	}
	if interceptor == nil {
		return s.ShouldRateLimit(ctx, &in.req)
	}
	info := &grpc.UnaryServerInfo{Server: s, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, &in.req, info, func(ctx context.Context, req any) (any, error) {
		return s.ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
	})
}
