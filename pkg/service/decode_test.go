package service

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store/memory"
	adminv1 "github.com/rls-project/rls/proto/rls/admin/v1"
)

// Wire builders: a field of each kind, and a message field of fields.
func wStr(num protowire.Number, s string) []byte {
	return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), s)
}

func wVarint(num protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
}

func wMsg(num protowire.Number, fields ...[]byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), bytes.Join(fields, nil))
}

func wFixed32(num protowire.Number, v uint32) []byte {
	return protowire.AppendFixed32(protowire.AppendTag(nil, num, protowire.Fixed32Type), v)
}

func wFixed64(num protowire.Number, v uint64) []byte {
	return protowire.AppendFixed64(protowire.AppendTag(nil, num, protowire.Fixed64Type), v)
}

func wGroup(num protowire.Number, fields ...[]byte) []byte {
	b := protowire.AppendTag(nil, num, protowire.StartGroupType)
	b = append(b, bytes.Join(fields, nil)...)
	return protowire.AppendTag(b, num, protowire.EndGroupType)
}

func wire(fields ...[]byte) []byte { return bytes.Join(fields, nil) }

// wEntry is a descriptor entry field (entries = 1).
func wEntry(k, v string) []byte { return wMsg(1, wStr(1, k), wStr(2, v)) }

// dropUnknown clears the unknown fields of m and every message in it:
// DecodeRequest drops them, proto.Unmarshal keeps them.
func dropUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				dropUnknown(v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			dropUnknown(v.Message())
		}
		return true
	})
}

// checkAgainstProto decodes b with both decoders: when proto.Unmarshal
// accepts b, DecodeRequest must give the same message (unknown fields
// aside); when only DecodeRequest accepts it, proto.Unmarshal's reason must
// be UTF-8. It returns DecodeRequest's result.
func checkAgainstProto(t *testing.T, b []byte) (*rlsv3.RateLimitRequest, error) {
	t.Helper()
	got := new(rlsv3.RateLimitRequest)
	err := DecodeRequest(b, got)
	want := new(rlsv3.RateLimitRequest)
	werr := proto.Unmarshal(b, want)
	switch {
	case werr == nil && err != nil:
		t.Fatalf("DecodeRequest(%x): %v; proto.Unmarshal accepts it: %v", b, err, want)
	case werr == nil:
		dropUnknown(want.ProtoReflect())
		if !proto.Equal(got, want) {
			t.Fatalf("DecodeRequest(%x) =\n%v\nproto.Unmarshal =\n%v", b, got, want)
		}
	case err == nil && !strings.Contains(werr.Error(), "UTF-8"):
		t.Fatalf("DecodeRequest(%x) accepts what proto.Unmarshal refuses: %v", b, werr)
	}
	if err != nil && !strings.HasPrefix(err.Error(), "invalid RateLimitRequest: ") {
		t.Fatalf("error %q does not say what it is about", err)
	}
	return got, err
}

// validMessages are serialized requests proto.Unmarshal accepts, covering
// every field, merges, repeats, unknown fields of every wire type and known
// field numbers with the wrong wire type.
func validMessages() map[string][]byte {
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			panic(err)
		}
		return b
	}
	full := &rlsv3.RateLimitRequest{Domain: "example", HitsAddend: 3, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "api_key", Value: "k1"}, {Key: "route", Value: "/v1/search?q=é"}}},
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.7"}},
			Limit:      &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(30)},
			HitsAddend: wrapperspb.UInt64(1 << 40), IsNegativeHits: true},
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k"}}, HitsAddend: wrapperspb.UInt64(0), Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{}},
		{},
	}}
	return map[string][]byte{
		"empty":         nil,
		"full":          marshal(full),
		"one":           marshal(&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{d("api_key", "demo")}}),
		"empty strings": wire(wStr(1, ""), wMsg(2, wMsg(1, wStr(1, ""), wStr(2, "")))),
		"last scalar wins": wire(wStr(1, "a"), wVarint(3, 1), wStr(1, "b"), wVarint(3, 1<<33+5),
			wMsg(2, wEntry("k", "v"), wVarint(4, 1), wVarint(4, 0), wMsg(1, wStr(2, "x"), wStr(2, "y"), wStr(1, "kk")))),
		"messages merge": wire(wStr(1, "d"), wMsg(2,
			wMsg(2, wVarint(1, 5)), wMsg(2, wVarint(2, 3)), wMsg(2, wMsg(3, wVarint(1, 9))), wMsg(2, wMsg(3)),
			wMsg(3, wVarint(1, 4)), wMsg(3), wMsg(3, wVarint(1, 0)))),
		"truncating varints": wire(wVarint(3, 1<<40|7), wMsg(2, wMsg(2, wVarint(1, 1<<35|9), wVarint(2, 1<<63|42), wMsg(3, wVarint(1, 1<<36|2))))),
		"unknown enum":       wire(wMsg(2, wEntry("k", "v"), wMsg(2, wVarint(2, 99)))),
		"unknown fields": wire(wStr(9, "x"), wStr(1, "d"), wVarint(100, 1), wFixed32(4, 1), wFixed64(5, 2), wGroup(6, wVarint(1, 1)),
			wMsg(2, wStr(7, "?"), wEntry("k", "v"), wFixed64(9, 1), wMsg(1, wStr(1, "k2"), wVarint(3, 1), wStr(2, "v2"), wGroup(4)),
				wMsg(2, wVarint(1, 2), wStr(5, "u"), wMsg(3, wVarint(1, 2), wFixed32(2, 0))), wMsg(3, wVarint(1, 1), wStr(2, "u")))),
		"wrong wire types": wire(wVarint(1, 5), wStr(3, "x"), wFixed32(2, 1), wStr(1, "d"),
			wMsg(2, wVarint(1, 1), wVarint(2, 1), wVarint(3, 1), wStr(4, "t"), wEntry("k", "v"),
				wMsg(1, wVarint(1, 1), wFixed64(2, 1)), wMsg(2, wStr(1, "x"), wStr(2, "y"), wVarint(3, 1)), wMsg(3, wStr(1, "x")))),
		"max field number": wire(wVarint(protowire.MaxValidNumber, 1), wStr(1, "d")),
	}
}

func TestDecodeRequestAgreesWithProto(t *testing.T) {
	for name, b := range validMessages() {
		t.Run(name, func(t *testing.T) {
			if err := proto.Unmarshal(b, new(rlsv3.RateLimitRequest)); err != nil {
				t.Fatalf("not a valid message: %v", err)
			}
			if _, err := checkAgainstProto(t, b); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Strings that are not UTF-8 are decoded byte for byte, where
// proto.Unmarshal refuses the message.
func TestDecodeRequestInvalidUTF8(t *testing.T) {
	b := wire(wStr(1, "dom\xff"), wMsg(2, wEntry("key\xc3", "abc\xff"), wEntry("k", "\x80\xe6\x97é")), wVarint(3, 2))
	if err := proto.Unmarshal(b, new(rlsv3.RateLimitRequest)); err == nil {
		t.Fatal("proto.Unmarshal accepts invalid UTF-8: this decoder is no longer needed")
	}
	got, err := checkAgainstProto(t, b)
	if err != nil {
		t.Fatal(err)
	}
	want := &rlsv3.RateLimitRequest{Domain: "dom\xff", HitsAddend: 2, Descriptors: []*rlcommon.RateLimitDescriptor{d("key\xc3", "abc\xff", "k", "\x80\xe6\x97é")}}
	if got.Domain != want.Domain || got.HitsAddend != 2 || len(got.Descriptors) != 1 || len(got.Descriptors[0].Entries) != 2 {
		t.Fatalf("got %q", got)
	}
	for i, e := range got.Descriptors[0].Entries {
		if w := want.Descriptors[0].Entries[i]; e.Key != w.Key || e.Value != w.Value {
			t.Errorf("entry %d = %q=%q, want %q=%q", i, e.Key, e.Value, w.Key, w.Value)
		}
	}
}

func TestDecodeRequestGarbage(t *testing.T) {
	valid := validMessages()["full"]
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"truncated", valid[:len(valid)-1], "unexpected EOF"},
		{"truncated length", []byte{0x0a, 0x05, 'a'}, "byte 0: field 1 (wire type 2): unexpected EOF"},
		{"field number 0", []byte{0x00, 0x01}, "invalid field number"},
		{"text", []byte("hello, world"), "invalid RateLimitRequest"},
		{"varint overflow", wire(wStr(1, "d"), []byte{0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}), "byte 3: field 3"},
		{"stray end group", wire(wStr(1, "d"), protowire.AppendTag(nil, 5, protowire.EndGroupType)), "invalid RateLimitRequest"},
		{"reserved wire type", []byte{0x0f}, "invalid RateLimitRequest"},
		{"bad entry", wire(wStr(1, "d"), wMsg(2, wEntry("k", "v"), wMsg(1, []byte{0x12, 0x09}))), "descriptors[0]: entries[1]: byte 15: field 2 (wire type 2): unexpected EOF"},
		{"bad limit", wire(wMsg(2, wMsg(2, []byte{0x08}))), "descriptors[0]: limit: byte 4"},
		{"bad hits_addend", wire(wMsg(2), wMsg(2, wMsg(3, []byte{0x08, 0x80}))), "descriptors[1]: hits_addend"},
		{"bad unit_multiplier", wire(wMsg(2, wMsg(2, wMsg(3, []byte{0x0d, 1})))), "descriptors[0]: limit: unit_multiplier"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := checkAgainstProto(t, tc.b)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// FuzzDecodeRequest feeds arbitrary bytes to DecodeRequest: it never
// panics, and agrees with proto.Unmarshal wherever that accepts the input.
func FuzzDecodeRequest(f *testing.F) {
	for _, b := range validMessages() {
		f.Add(b)
	}
	f.Add(wire(wStr(1, "dom\xff"), wMsg(2, wEntry("key\xc3", "abc\xff"))))
	f.Add([]byte("hello, world"))
	f.Add([]byte{0x0a, 0x05, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		checkAgainstProto(t, b)
	})
}

// rawCodec sends []byte as they are (a client that writes what Envoy
// writes) and decodes responses as protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return nil, fmt.Errorf("rawCodec: %T", v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (rawCodec) Name() string { return "proto" }

// The server as cmd/rls builds it (Codec, Register) decides requests that
// are not UTF-8, answers garbage InvalidArgument and still serves
// ordinary clients and other services.
func TestServerDecodesInvalidUTF8(t *testing.T) {
	s, _ := newTestService(t)
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.ForceServerCodecV2(Codec()), grpc.ChainUnaryInterceptor(RecoverUnary(nil, slog.New(slog.DiscardHandler))))
	s.Register(srv)
	adminv1.RegisterAdminServiceServer(srv, NewAdmin(s, memory.New(memory.Options{}), limiter.New(memory.New(memory.Options{}), limiter.Options{})))
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	raw := func(b []byte) (*rlsv3.RateLimitResponse, error) {
		resp := new(rlsv3.RateLimitResponse)
		err := conn.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, b, resp, grpc.ForceCodecV2(rawCodec{}))
		return resp, err
	}
	// small: 1 per hour. Two values one invalid byte apart count apart.
	for _, v := range []string{"abc\xff", "abc\xfe"} {
		b := wire(wStr(1, "test"), wMsg(2, wEntry("small", v)))
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
			resp, err := raw(b)
			if err != nil {
				t.Fatalf("%q call %d: %v", v, i+1, err)
			}
			if resp.OverallCode != want {
				t.Fatalf("%q call %d: %v, want %v", v, i+1, resp.OverallCode, want)
			}
		}
	}
	_, err = raw([]byte{0x0a, 0x05, 'a'})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "invalid RateLimitRequest") {
		t.Fatalf("garbage: %v, want InvalidArgument", err)
	}
	// An ordinary client, and the admin API, on the same codec.
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{d("small", "plain")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ordinary client: %v, %v", resp, err)
	}
	ex, err := adminv1.NewAdminServiceClient(conn).Explain(ctx, &adminv1.ExplainRequest{Domain: "test", Descriptors: []*adminv1.Descriptor{adminDesc("small", "plain")}})
	if err != nil || len(ex.Explanations) != 1 || !ex.Explanations[0].Matched {
		t.Fatalf("admin: %v, %v", ex, err)
	}
}

// A detailed_metric value that is not UTF-8 is a valid label value, its
// bytes written \xNN.
func TestDetailedMetricInvalidUTF8(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"test.yaml": []byte(testConfig + `
  - key: detailed
    detailed_metric: true
    rate_limit: {name: det, unit: hour, requests_per_unit: 1000}
`)})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := New(cfg, limiter.New(memory.New(memory.Options{}), limiter.Options{}), Options{Metrics: NewMetrics(reg, 10)})
	call(t, s, 0, d("detailed", "abc\xff"))
	call(t, s, 0, d("detailed", "é\xc3"))
	_, detailed := decisionSeries(t, reg)
	for _, v := range []string{`detailed=abc\xff`, `detailed=é\xc3`} {
		if got := detailed["test/det/"+v+"/ok"]; got != 1 {
			t.Errorf("rls_detailed_decisions_total{value=%q} = %v, want 1", v, got)
		}
	}
}

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{"": "", "abc": "abc", "Zoë": "Zoë", "a\xffb": `a\xffb`, "\xe6\x97": `\xe6\x97`, `a\b"`: `a\b"`} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// The admin API's answers are valid protobuf (UTF-8 strings) even for a
// request that is not UTF-8 (possible in process), and its key is the one
// ShouldRateLimit counts.
func TestExplainInvalidUTF8(t *testing.T) {
	a, svc := newTestAdmin(t, Options{})
	call(t, svc, 0, d("small", "abc\xff"))
	ex, err := a.Explain(context.Background(), &adminv1.ExplainRequest{Domain: "test", Descriptors: []*adminv1.Descriptor{adminDesc("small", "abc\xff")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proto.Marshal(ex); err != nil {
		t.Fatalf("Explain's answer does not marshal: %v", err)
	}
	if e := ex.Explanations[0]; e.Key != "rl:{test|small=abc%FF}:s3600" || !e.State.OverLimit {
		t.Fatalf("explanation %v", e)
	}
}

// BenchmarkDecodeRequest decodes the request of BenchmarkHandler's
// two_descriptors case: DecodeRequest against proto.Unmarshal (what grpc-go's
// codec does).
func BenchmarkDecodeRequest(b *testing.B) {
	req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{
		d("api_key", "customer-42"), d("api_key", "customer-42", "route", "/v1/search")}}
	buf, err := proto.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("DecodeRequest", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := DecodeRequest(buf, new(rlsv3.RateLimitRequest)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(buf, new(rlsv3.RateLimitRequest)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
