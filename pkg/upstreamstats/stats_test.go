package upstreamstats

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	gostats "github.com/lyft/gostats"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// The cases of upstream's TestNearLimit (test/redis/fixed_cache_impl_test.go):
// its Redis mock answers the count after the increment, from which the
// count before follows; each case asserts the stats one call adds.
func TestAccountUpstreamCases(t *testing.T) {
	for _, c := range []struct {
		d    Decision
		want Counts
	}{
		{Decision{Limit: 15, Before: 10, Hits: 1}, Counts{TotalHits: 1, WithinLimit: 1}},
		{Decision{Limit: 15, Before: 12, Hits: 1}, Counts{TotalHits: 1, WithinLimit: 1, NearLimit: 1}},
		{Decision{Limit: 15, Before: 15, Hits: 1, Over: true}, Counts{TotalHits: 1, OverLimit: 1}},
		{Decision{Limit: 20, Before: 2, Hits: 3}, Counts{TotalHits: 3, WithinLimit: 3}},
		{Decision{Limit: 8, Before: 5, Hits: 2}, Counts{TotalHits: 2, WithinLimit: 2, NearLimit: 1}},
		{Decision{Limit: 20, Before: 16, Hits: 3}, Counts{TotalHits: 3, WithinLimit: 3, NearLimit: 3}},
		{Decision{Limit: 20, Before: 19, Hits: 3, Over: true}, Counts{TotalHits: 3, OverLimit: 2, NearLimit: 1}},
		{Decision{Limit: 20, Before: 15, Hits: 7, Over: true}, Counts{TotalHits: 7, OverLimit: 2, NearLimit: 4}},
		{Decision{Limit: 10, Before: 27, Hits: 3, Over: true}, Counts{TotalHits: 3, OverLimit: 3}},
		// TestOverLimitWithLocalCache and its shadow-rule twin.
		{Decision{Limit: 15, Before: 15, Hits: 1, Over: true, LocalCache: true}, Counts{TotalHits: 1, OverLimit: 1, OverLimitWithLocalCache: 1}},
		{Decision{Limit: 15, Before: 15, Hits: 1, Over: true, LocalCache: true, Shadow: true},
			Counts{TotalHits: 1, OverLimit: 1, OverLimitWithLocalCache: 1, ShadowMode: 1}},
		{Decision{Limit: 15, Before: 14, Hits: 2, Over: true, Shadow: true}, Counts{TotalHits: 2, OverLimit: 1, NearLimit: 1, ShadowMode: 1}},
	} {
		if got := Account(c.d, 0.8); got != c.want {
			t.Errorf("%+v: %+v, want %+v", c.d, got, c.want)
		}
	}
}

const testConfig = `
domain: rl
descriptors:
  - key: key4
    value: value4
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: shady
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: unspec
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: vtm
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: source
    value: proxy
    descriptors:
      - key: dest
        rate_limit: {unit: hour, requests_per_unit: 5}
`

// newService is a Service on the memory store telling st.
func newService(t *testing.T, st *Stats) *service.Service {
	t.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"rl.yaml": []byte(testConfig)})
	if err != nil {
		t.Fatal(err)
	}
	lim := limiter.New(memory.New(memory.Options{}), limiter.Options{DisableOverLimitCache: true})
	return service.New(cfg, lim, service.Options{Observer: st})
}

// call sends one request with entries kv and hits.
func call(t *testing.T, svc *service.Service, st *Stats, domain string, hits uint32, kv ...string) rlsv3.RateLimitResponse_Code {
	t.Helper()
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	start := time.Now()
	resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{d}, HitsAddend: hits})
	st.Call(time.Since(start), err)
	if err != nil {
		t.Fatal(err)
	}
	return resp.OverallCode
}

// run sends the requests of the stats tests: OK, near the limit, over it,
// shadow mode, detailed_metric, value_to_metric, a nested rule and an
// unknown domain.
func run(t *testing.T, svc *service.Service, st *Stats) {
	for i := 1; i <= 16; i++ {
		want := rlsv3.RateLimitResponse_OK
		if i == 16 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if got := call(t, svc, st, "rl", 1, "key4", "value4"); got != want {
			t.Fatalf("key4 call %d: %v, want %v", i, got, want)
		}
	}
	for i := range 3 {
		if got := call(t, svc, st, "rl", 1, "shady", "s"); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("shadow call %d: %v", i, got)
		}
	}
	call(t, svc, st, "rl", 1, "unspec", "a")
	call(t, svc, st, "rl", 1, "unspec", "b")
	call(t, svc, st, "rl", 3, "vtm", "x")
	call(t, svc, st, "rl", 1, "source", "proxy", "dest", "d1")
	call(t, svc, st, "nope", 1, "a", "b")
	st.ConfigLoaded(true)
}

// wantStatsd are the counters run gives, by name, as upstream names and
// counts them.
var wantStatsd = map[string]uint64{
	"ratelimit.service.rate_limit.rl.key4_value4.total_hits":         16,
	"ratelimit.service.rate_limit.rl.key4_value4.within_limit":       15,
	"ratelimit.service.rate_limit.rl.key4_value4.near_limit":         3, // hits 13, 14 and 15 are beyond floor(15 × 0.8)
	"ratelimit.service.rate_limit.rl.key4_value4.over_limit":         1,
	"ratelimit.service.rate_limit.rl.shady.total_hits":               3,
	"ratelimit.service.rate_limit.rl.shady.within_limit":             2,
	"ratelimit.service.rate_limit.rl.shady.near_limit":               1,
	"ratelimit.service.rate_limit.rl.shady.over_limit":               1,
	"ratelimit.service.rate_limit.rl.shady.shadow_mode":              1,
	"ratelimit.service.rate_limit.rl.unspec_a.total_hits":            1,
	"ratelimit.service.rate_limit.rl.unspec_a.within_limit":          1,
	"ratelimit.service.rate_limit.rl.unspec_b.total_hits":            1,
	"ratelimit.service.rate_limit.rl.unspec_b.within_limit":          1,
	"ratelimit.service.rate_limit.rl.vtm_x.total_hits":               3,
	"ratelimit.service.rate_limit.rl.vtm_x.within_limit":             3,
	"ratelimit.service.rate_limit.rl.source_proxy.dest.total_hits":   1,
	"ratelimit.service.rate_limit.rl.source_proxy.dest.within_limit": 1,
	"ratelimit.service.rate_limit.nope.domain_not_found":             1,
	"ratelimit.service.config_load_success":                          1,
	"ratelimit_server.ShouldRateLimit.total_requests":                24,
}

// readStatsd reads statsd lines from conn until the counters reach want
// (or 10 s pass), and returns the counters and the timers' sample counts.
func readStatsd(t *testing.T, conn net.PacketConn, want map[string]uint64, suffix string) (map[string]uint64, map[string]int) {
	t.Helper()
	counters, timers := map[string]uint64{}, map[string]int{}
	buf := make([]byte, 65536)
	deadline := time.Now().Add(10 * time.Second)
	done := func() bool {
		for k, v := range want {
			if counters[k+suffix] < v {
				return false
			}
		}
		return true
	}
	for !done() && time.Now().Before(deadline) {
		_ = conn.SetReadDeadline(deadline)
		n, _, err := conn.ReadFrom(buf)
		if err != nil {
			break
		}
		for _, line := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
			name, rest, ok := strings.Cut(line, ":")
			val, typ, ok2 := strings.Cut(rest, "|")
			if !ok || !ok2 {
				t.Fatalf("statsd line %q", line)
			}
			switch typ {
			case "c":
				v, err := strconv.ParseUint(val, 10, 64)
				if err != nil {
					t.Fatalf("statsd line %q: %v", line, err)
				}
				counters[name] += v
			case "ms":
				timers[name]++
			default:
				t.Fatalf("statsd line %q: type %q", line, typ)
			}
		}
	}
	return counters, timers
}

// TestStatsd: against a UDP listener playing statsd, the stats of OK,
// near-limit, over-limit and shadow requests have upstream's names and
// counts, with EXTRA_TAGS as gostats names tags, and no other counter.
func TestStatsd(t *testing.T) {
	for _, tags := range []map[string]string{nil, {"env": "prod"}} {
		conn, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		target, err := ParseTarget("udp://" + conn.LocalAddr().String() + "?flush_interval=1s")
		if err != nil {
			t.Fatal(err)
		}
		st := New(Options{Sinks: []gostats.Sink{NewStatsdSink(target, nil)}, Tags: tags, Flush: target.Flush})
		svc := newService(t, st)
		run(t, svc, st)
		st.Flush()
		suffix := ""
		if tags != nil {
			suffix = ".__env=prod"
		}
		counters, timers := readStatsd(t, conn, wantStatsd, suffix)
		for k, v := range wantStatsd {
			if counters[k+suffix] != v {
				t.Errorf("tags %v: %s = %d, want %d", tags, k+suffix, counters[k+suffix], v)
			}
		}
		for k := range counters {
			if _, ok := wantStatsd[strings.TrimSuffix(k, suffix)]; !ok {
				t.Errorf("tags %v: unexpected counter %s = %d", tags, k, counters[k])
			}
		}
		if timers["ratelimit_server.ShouldRateLimit.response_time"+suffix] != 24 {
			t.Errorf("tags %v: timers %v, want 24 response_time samples", tags, timers)
		}
	}
}

// TestPrometheusNames: the Prometheus sink names the same stats as
// upstream's default mapper does (src/stats/prom/default_mapper.yaml).
func TestPrometheusNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	sink, err := NewPrometheusSink(reg)
	if err != nil {
		t.Fatal(err)
	}
	st := New(Options{Sinks: []gostats.Sink{sink}})
	run(t, newService(t, st), st)
	st.Flush()
	want := []string{
		`ratelimit_service_config_load_success`,
		`ratelimit_service_rate_limit_near_limit{domain="rl",key1="key4_value4"}`,
		`ratelimit_service_rate_limit_over_limit{domain="rl",key1="key4_value4"}`,
		`ratelimit_service_rate_limit_shadow_mode{domain="rl",key1="shady"}`,
		`ratelimit_service_rate_limit_total_hits{domain="rl",key1="key4_value4"}`,
		`ratelimit_service_rate_limit_total_hits{domain="rl",key1="source_proxy",key2="dest"}`,
		`ratelimit_service_rate_limit_total_hits{domain="rl",key1="unspec_a"}`,
		`ratelimit_service_rate_limit_within_limit{domain="rl",key1="key4_value4"}`,
		`ratelimit_service_response_time_seconds{grpc_method="ShouldRateLimit"}`,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`,
	}
	var got map[string]bool
	testkit.WaitFor(t, "the exporter's series", 10*time.Second, func() bool {
		got = series(t, reg)
		for _, w := range want {
			if !got[w] {
				return false
			}
		}
		return true
	})
}

// series returns the registry's series as name{labels}.
func series(t *testing.T, reg *prometheus.Registry) map[string]bool {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+`="`+l.GetValue()+`"`)
			}
			sort.Strings(ls)
			s := mf.GetName()
			if len(ls) > 0 {
				s += "{" + strings.Join(ls, ",") + "}"
			}
			out[s] = true
		}
	}
	return out
}

// TestDetailedCap: a detailed_metric rule names at most MaxDetailed values;
// the rest count under the rule's own name.
func TestDetailedCap(t *testing.T) {
	st := New(Options{Sinks: []gostats.Sink{gostats.NewNullSink()}, MaxDetailed: 3})
	svc := newService(t, st)
	for i := range 10 {
		call(t, svc, st, "rl", 1, "unspec", strconv.Itoa(i))
	}
	g := st.gen.Load()
	n := 0
	g.rules.Range(func(_, v any) bool {
		n += int(v.(*ruleEntry).names.Load())
		return true
	})
	if n != 3 {
		t.Errorf("%d detailed names, want 3", n)
	}
}

func TestParseTarget(t *testing.T) {
	for _, bad := range []string{"", "nohost", "udp://", "http://h:1", "udp://h:1?flush_interval=1ms", "udp://h:1?x=1", "udp://h:1?tags=novalue", "h:99999"} {
		if _, err := ParseTarget(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	tg, err := ParseTarget("udp://agent:9125?flush_interval=2s&tags=env:prod,team:a")
	if err != nil || tg.Addr != "agent:9125" || tg.Protocol != "udp" || tg.Flush != 2*time.Second || tg.Tags["env"] != "prod" || tg.Tags["team"] != "a" {
		t.Errorf("%+v %v", tg, err)
	}
	for s, want := range map[string]string{"agent:9125": "udp", "tcp://agent:9125": "tcp"} {
		if tg, err := ParseTarget(s); err != nil || tg.Protocol != want || tg.Addr != "agent:9125" {
			t.Errorf("%s: %+v %v, want protocol %s", s, tg, err, want)
		}
	}
}

// TestStatsdTCP: over TCP, upstream's default statsd protocol (gostats's
// STATSD_PROTOCOL), a listener gets the same stats.
func TestStatsdTCP(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	target, err := ParseTarget("tcp://" + lis.Addr().String() + "?flush_interval=100ms")
	if err != nil {
		t.Fatal(err)
	}
	st := New(Options{Sinks: []gostats.Sink{NewStatsdSink(target, nil)}, Flush: target.Flush})
	svc := newService(t, st)
	run(t, svc, st)
	st.Flush()
	_ = lis.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	conn, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	counters := map[string]uint64{}
	sc := bufio.NewScanner(conn)
	for counters["ratelimit.service.rate_limit.rl.key4_value4.total_hits"] < 16 && sc.Scan() {
		name, rest, _ := strings.Cut(sc.Text(), ":")
		if v, ok := strings.CutSuffix(rest, "|c"); ok {
			n, _ := strconv.ParseUint(v, 10, 64)
			counters[name] += n
		}
	}
	if got := counters["ratelimit.service.rate_limit.rl.key4_value4.total_hits"]; got != 16 {
		t.Errorf("total_hits over TCP %d, want 16", got)
	}
}

// TestStatNamesKeepSlashes: a configured value with '/' (a URL path) keeps
// it in the stats key, as upstream's does ("files_files/*", not
// "files_files.*"), in the rule's key and in a detailed_metric name, whose
// request values keep '/' and '=' too.
func TestStatNamesKeepSlashes(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"s.yaml": []byte(`
domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: route
    value: /v1/a
    descriptors:
      - key: path
        detailed_metric: true
        rate_limit: {unit: hour, requests_per_unit: 10}
`)})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, r := range cfg.Rules() {
		names[r.Path] = RuleKey(r)
	}
	if got := names["files=files/*"]; got != "d.files_files/*" {
		t.Errorf("RuleKey of files/* = %q, want d.files_files/*", got)
	}
	if got := names["route=/v1/a/path"]; got != "d.route_/v1/a.path" {
		t.Errorf("RuleKey of /v1/a/path = %q, want d.route_/v1/a.path", got)
	}
	entries := []*rlcommon.RateLimitDescriptor_Entry{{Key: "route", Value: "/v1/a"}, {Key: "path", Value: "/x/y=z"}}
	r := cfg.Match("d", entries)
	if got := r.StatsName(entries); got != "route_/v1/a.path_/x/y=z" {
		t.Errorf("detailed name %q, want route_/v1/a.path_/x/y=z", got)
	}
}

// TestRunShutdownBounded: with a TCP statsd that nothing answers, the last
// flush at shutdown gives up after Options.LastFlush instead of holding the
// shutdown (gostats's TCP sink retries its connection).
func TestRunShutdownBounded(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // refused from now on
	target, err := ParseTarget("tcp://" + addr + "?flush_interval=100ms")
	if err != nil {
		t.Fatal(err)
	}
	var sinkLog testkit.Buffer
	st := New(Options{Sinks: []gostats.Sink{NewStatsdSink(target, slog.New(slog.NewTextHandler(&sinkLog, nil)))}, Flush: target.Flush, LastFlush: 200 * time.Millisecond})
	st.ConfigLoaded(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := st.Start(ctx)
	// Cancel once a flush has met the refused sink, so it lands mid-retry.
	testkit.WaitFor(t, "the sink's warning of the refused statsd", 5*time.Second, func() bool {
		return strings.Contains(sinkLog.String(), "statsd: ")
	})
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run still flushing long after its bound")
	}
}
