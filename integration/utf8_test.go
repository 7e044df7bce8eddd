package integration

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/rls-project/rls/integration/redistest"
)

// preMarshalled sends a []byte request as it is, as Envoy's C++ protobuf
// writes strings that are not UTF-8 (grpc-go's own codec would refuse to
// marshal them), and decodes responses as protobuf.
type preMarshalled struct{}

func (preMarshalled) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.([]byte)
	if !ok {
		return nil, fmt.Errorf("preMarshalled sends []byte, not %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (preMarshalled) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (preMarshalled) Name() string { return "proto" }

// rawRequest encodes a RateLimitRequest of one descriptor by hand:
// domain = 1, descriptors = 2 {entries = 1 {key = 1, value = 2},
// limit = 2 {requests_per_unit = 1, unit = 2}}.
func rawRequest(domain string, override uint32, kv ...string) []byte {
	var d []byte
	for i := 0; i+1 < len(kv); i += 2 {
		var e []byte
		e = protowire.AppendString(protowire.AppendTag(e, 1, protowire.BytesType), kv[i])
		e = protowire.AppendString(protowire.AppendTag(e, 2, protowire.BytesType), kv[i+1])
		d = protowire.AppendBytes(protowire.AppendTag(d, 1, protowire.BytesType), e)
	}
	if override > 0 {
		var l []byte
		l = protowire.AppendVarint(protowire.AppendTag(l, 1, protowire.VarintType), uint64(override))
		l = protowire.AppendVarint(protowire.AppendTag(l, 2, protowire.VarintType), 3) // HOUR
		d = protowire.AppendBytes(protowire.AppendTag(d, 2, protowire.BytesType), l)
	}
	b := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), domain)
	return protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), d)
}

// TestNonUTF8RequestsAreDecided: Envoy forwards header bytes that are not
// UTF-8. rls decides such requests against their rule (grpc-go's protobuf
// would refuse them as Internal, which Envoy lets through), keeps one
// counter per distinct byte string, shows them escaped in metrics, and
// answers bytes that are not protobuf InvalidArgument.
// On Redis, the keys hold such bytes percent-encoded.
func TestNonUTF8RequestsAreDecided(t *testing.T) {
	light(t) // processes of its own; asserts counts and memory, not time
	dir := writeConfig(t, map[string]string{"utf8.yaml": `
domain: utf8
descriptors:
  - key: api_key
    rate_limit: {name: per-key, unit: hour, requests_per_unit: 2}
  - key: detailed
    detailed_metric: true
    rate_limit: {name: det, unit: hour, requests_per_unit: 100}
`})
	t.Run("memory", func(t *testing.T) { testNonUTF8(t, startRLS(t, dir)) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.StartServer(t)
		testNonUTF8(t, startRLS(t, dir, rdRedisArgs(srv)...))
		keys := rdScanAll(t, srv)
		for _, k := range []string{"rl:{utf8|api_key=abc%FF}:s3600", "rl:{utf8|api_key=abc%FE}:s3600",
			"rl:{utf8|api_key=abc%25FF}:s3600", "rl:{utf8|k%FF=v}:s3600o2"} {
			if k = winKey(k, time.Hour, time.Now()); keys[k] == nil {
				t.Errorf("no Redis key %q; keys: %q", k, slices.Sorted(maps.Keys(keys)))
			}
		}
	})
}

func testNonUTF8(t *testing.T, p *rlsProc) {
	call := func(b []byte) (*rlsv3.RateLimitResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp := new(rlsv3.RateLimitResponse)
		err := p.conn.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, b, resp, grpc.ForceCodecV2(preMarshalled{}))
		return resp, err
	}
	decide := func(t *testing.T, name string, b []byte, want ...rlsv3.RateLimitResponse_Code) {
		t.Helper()
		for i, w := range want {
			resp, err := call(b)
			if err != nil {
				t.Fatalf("%s, call %d: %v", name, i+1, err)
			}
			if resp.OverallCode != w {
				t.Fatalf("%s, call %d: %v, want %v", name, i+1, resp.OverallCode, w)
			}
		}
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT

	// A value: 2 per hour, the third is over; values one byte apart, and
	// the text of the escape, have counters of their own.
	decide(t, "value abc\\xff", rawRequest("utf8", 0, "api_key", "abc\xff"), ok, ok, over)
	decide(t, "value abc\\xfe", rawRequest("utf8", 0, "api_key", "abc\xfe"), ok, ok, over)
	decide(t, "value abc%FF", rawRequest("utf8", 0, "api_key", "abc%FF"), ok, ok, over)
	decide(t, "value abc\\xc3", rawRequest("utf8", 0, "api_key", "abc\xc3"), ok, ok, over)

	// A key: no configured key is one, so only an override limit counts it.
	decide(t, "key k\\xff", rawRequest("utf8", 2, "k\xff", "v"), ok, ok, over)
	decide(t, "key k\\xfe", rawRequest("utf8", 2, "k\xfe", "v"), ok, ok, over)
	decide(t, "key k\\xff without a rule", rawRequest("utf8", 0, "k\xff", "v"), ok, ok, ok)

	// A domain: no configured domain is one: decided, no rule, OK.
	resp, err := call(rawRequest("utf8\xff", 2, "api_key", "abc"))
	if err != nil || resp.OverallCode != ok || len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("domain utf8\\xff: %v, %v; want OK without a limit", resp, err)
	}

	// Bytes that are not protobuf: InvalidArgument, naming the problem.
	for _, b := range [][]byte{{0x0a, 0x05, 'a'}, []byte("not protobuf at all"), {0x12, 0x02, 0x0a, 0x09}} {
		_, err := call(b)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "invalid RateLimitRequest") {
			t.Fatalf("%q: %v, want InvalidArgument", b, err)
		}
	}

	// detailed_metric values are valid label values, the bytes escaped, and
	// the scrape works.
	decide(t, "detailed abc\\xff", rawRequest("utf8", 0, "detailed", "abc\xff"), ok)
	res, err := http.Get("http://" + p.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), `value="detailed=abc\\xff"`) {
		t.Fatalf("/metrics: %s; want a series with value=\"detailed=abc\\\\xff\"\n%s", res.Status, grepLines(string(body), "rls_detailed"))
	}

	// Ordinary clients are unaffected.
	if r := should(t, p.client(), "utf8", desc("api_key", "plain")); r.OverallCode != ok {
		t.Fatalf("plain request: %v", r)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
