package integration

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
)

// The translation of envoyproxy/ratelimit's own tests, at the version
// docs/MIGRATING.md names, to black-box calls against the rls binary:
// test/integration/integration_test.go (TestBasicConfig and its auth,
// local-cache and extra-tags variants, TestBasicReloadConfig,
// TestShareThreshold) and test/config/config_test.go (every fixture, and
// the lookups and stats names of TestBasicConfig, TestConfigLimitOverride,
// TestShadowModeConfig, TestWildcardConfig, TestDetailedMetric, the
// TestValueToMetric_* cases and TestShareThreshold), with upstream's own
// fixtures (testdata/upstream-tests). Each runs against one rls per mode,
// in parallel: "memory" (rls serve), "redis" (rls serve --store redis) and
// "ratelimit" (the binary run as ratelimit with upstream's environment:
// REDIS_URL, REDIS_AUTH, USE_STATSD over TCP, EXTRA_TAGS, RUNTIME_*).
// Upstream's stats are read from a statsd listener, upstream's own way of
// reading them (the tests read its in-process store). Where rls answers
// otherwise, the assertion says what rls answers and docs/MIGRATING.md
// says why (the names in brackets are its sections).
//
// Not translated: the per-second Redis, Memcache, DogStatsD (refused at
// start as ratelimit), Redis Cluster, Sentinel and TLS variants (the same
// requests; integration's cluster, sentinel and TLS tests cover those
// stores), the freecache gauges ratelimit.localcache.* (not sent: [Metrics]),
// and the xDS and mTLS tests (xds_test.go, tls_test.go).

const upstreamTests = "testdata/upstream-tests"

// suiteRLS is one rls under the suite.
type suiteRLS struct {
	mode    string
	p       *rlsProc
	c       rlsv3.RateLimitServiceClient
	stats   *statsdSink
	fixture string // the config fixture in force as fixture.yaml
}

// suitePassword is the Redis password of the redis and ratelimit modes
// (upstream's TestBasicAuthConfig).
const suitePassword = "password123"

// startSuiteRLS starts rls in mode on a config directory holding upstream's
// integration runtime config and the stats-name fixtures.
func startSuiteRLS(t *testing.T, mode string) *suiteRLS {
	t.Helper()
	files := map[string]string{}
	for _, dir := range []string{filepath.Join(upstreamTests, "runtime")} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			files[e.Name()] = string(b)
		}
	}
	for _, c := range statNameCases {
		files["names-"+c.domain+".yaml"] = c.yaml
	}
	s := &suiteRLS{mode: mode}
	const tags = "foo:bar,a:b" // TestBasicConfig_ExtraTags
	switch mode {
	case "ratelimit":
		s.stats = newStatsdSink(t, "tcp") // gostats's default, upstream's
		srv := redistest.StartServer(t, "--requirepass", suitePassword)
		_, port, _ := net.SplitHostPort(s.stats.addr)
		s.p = startRatelimit(t, map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr, "REDIS_AUTH": suitePassword,
			"USE_STATSD": "true", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": port, "STATS_FLUSH_INTERVAL": "100ms",
			"EXTRA_TAGS": tags, "RUNTIME_WATCH_ROOT": "false"}, files, nil)
	default:
		s.stats = newStatsdSink(t, "udp")
		args := []string{"--statsd-addr", "udp://" + s.stats.addr + "?flush_interval=100ms&tags=" + tags}
		var env []string
		if mode == "redis" {
			srv := redistest.StartServer(t, "--requirepass", suitePassword)
			args = append(args, "--store", "redis", "--redis-url", srv.URL())
			env = append(env, "RLS_REDIS_PASSWORD="+suitePassword)
		}
		s.p = startRLSBinEnv(t, rlsBin, env, writeConfig(t, files), args...)
	}
	s.p.waitServing(t, 20*time.Second)
	s.c = s.p.client()
	return s
}

// TestUpstreamSuite runs the translation in each mode.
func TestUpstreamSuite(t *testing.T) {
	light(t)
	t.Run("fixtures", testUpstreamFixtures)
	for _, mode := range []string{"memory", "redis", "ratelimit"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := startSuiteRLS(t, mode)
			// upstream's DurationUntilReset check: key4 now, again at the
			// end, at least 2 s later (upstream sleeps 2 s in between).
			durStart := time.Now()
			dur1 := s.status(t, "another", desc(localKey("key4", false), "durTest")).GetDurationUntilReset()
			for _, local := range []bool{false, true} {
				t.Run(fmt.Sprintf("BasicConfig/local=%v", local), func(t *testing.T) { s.basicConfig(t, local) })
			}
			t.Run("ExtraTags", s.extraTags)
			t.Run("ShareThreshold", s.shareThreshold)
			t.Run("ConfigReload", s.configReload)
			t.Run("ConfigBasic", s.configBasic)
			t.Run("ConfigLimitOverride", s.configOverride)
			t.Run("ConfigShadowMode", s.configShadowMode)
			t.Run("ConfigWildcard", s.configWildcard)
			t.Run("ConfigStatNames", s.configStatNames)
			time.Sleep(time.Until(durStart.Add(2 * time.Second))) // into the window: real time on purpose
			dur2 := s.status(t, "another", desc(localKey("key4", false), "durTest")).GetDurationUntilReset()
			if dur2.GetSeconds() >= dur1.GetSeconds() {
				t.Errorf("DurationUntilReset 2 s apart: %v then %v, want fewer seconds", dur1.AsDuration(), dur2.AsDuration())
			}
		})
	}
}

// localKey is upstream's getCacheKey: the key, or its _local twin.
func localKey(k string, local bool) string {
	if local {
		return k + "_local"
	}
	return k
}

// status calls ShouldRateLimit with one descriptor and returns its status.
func (s *suiteRLS) status(t *testing.T, domain string, d *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse_DescriptorStatus {
	t.Helper()
	return should(t, s.c, domain, d).Statuses[0]
}

// wantResponse compares a response with upstream's expectation, built as
// upstream's newDescriptorStatus does: the durations are the response's
// own seconds. As ratelimit they must be whole seconds, as upstream's;
// run as rls they carry sub-seconds ([What a status says]).
func (s *suiteRLS) wantResponse(t *testing.T, got *rlsv3.RateLimitResponse, code rlsv3.RateLimitResponse_Code, statuses ...*rlsv3.RateLimitResponse_DescriptorStatus) {
	t.Helper()
	want := &rlsv3.RateLimitResponse{OverallCode: code, Statuses: statuses}
	got = proto.Clone(got).(*rlsv3.RateLimitResponse)
	for i, st := range got.Statuses {
		if d := st.DurationUntilReset; d != nil {
			if s.mode == "ratelimit" && d.Nanos != 0 {
				t.Errorf("status %d: duration %v as ratelimit, want whole seconds as upstream's", i, d.AsDuration())
			}
			d.Nanos = 0
		}
		if i < len(statuses) && statuses[i].DurationUntilReset != nil && st.DurationUntilReset != nil {
			statuses[i].DurationUntilReset.Seconds = st.DurationUntilReset.Seconds
		}
	}
	if !proto.Equal(got, want) {
		t.Errorf("response\n got %v\nwant %v", got, want)
	}
}

// limited is upstream's newDescriptorStatus (its duration filled in by
// wantResponse).
func limited(code rlsv3.RateLimitResponse_Code, rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, remaining uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: unit},
		LimitRemaining: remaining}
	st.DurationUntilReset = &durationpb.Duration{} // its seconds: the response's (wantResponse)
	return st
}

const (
	sOK     = rlsv3.RateLimitResponse_OK
	sOver   = rlsv3.RateLimitResponse_OVER_LIMIT
	uSecond = rlsv3.RateLimitResponse_RateLimit_SECOND
	uMinute = rlsv3.RateLimitResponse_RateLimit_MINUTE
	uHour   = rlsv3.RateLimitResponse_RateLimit_HOUR
	uDay    = rlsv3.RateLimitResponse_RateLimit_DAY
)

// basicConfig is upstream's testBasicBaseConfig.
func (s *suiteRLS) basicConfig(t *testing.T, local bool) {
	k := func(key string) string { return localKey(key, local) }
	s.wantResponse(t, should(t, s.c, "foo", desc(k("hello"), "world")), sOK, &rlsv3.RateLimitResponse_DescriptorStatus{Code: sOK})
	s.wantResponse(t, should(t, s.c, "basic", desc(k("key1"), "foo")), sOK, limited(sOK, 50, uSecond, 49))
	s.stats.want(t, "ratelimit.service.rate_limit.basic."+k("key1")+".total_hits", 1)

	// Over a minute limit with a random value.
	v := strconv.Itoa(rand.Int())
	for i := range 25 {
		code, remaining := sOK, uint32(20-(i+1))
		if i >= 20 {
			code, remaining = sOver, 0
		}
		s.wantResponse(t, should(t, s.c, "another", desc(k("key2"), v)), code, limited(code, 20, uMinute, remaining))
	}
	s.stats.want(t, "ratelimit.service.rate_limit.another."+k("key2")+".total_hits", 25)
	s.stats.want(t, "ratelimit.service.rate_limit.another."+k("key2")+".over_limit", 5)

	// Two keys of one domain: key3 (10 an hour) denies from the 11th call.
	v = strconv.Itoa(rand.Int())
	for i := range 15 {
		code, remaining1, remaining2 := sOK, uint32(20-(i+1)), uint32(10-(i+1))
		resp := should(t, s.c, "another", desc(k("key2"), v), desc(k("key3"), v))
		if i >= 10 {
			// rls never counts a denied request, as upstream with
			// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (its variant of this
			// test): key2 stays at 10 left ([Counting denied requests]),
			// and reports the 10 it found.
			code, remaining2, remaining1 = sOver, 0, 10
		}
		s.wantResponse(t, resp, code, limited(sOK, 20, uMinute, remaining1), limited(code, 10, uHour, remaining2))
	}
	s.stats.want(t, "ratelimit.service.rate_limit.another."+k("key2")+".total_hits", 40)
	s.stats.want(t, "ratelimit.service.rate_limit.another."+k("key2")+".over_limit", 5)
	s.stats.want(t, "ratelimit.service.rate_limit.another."+k("key3")+".total_hits", 15)
	s.stats.want(t, "ratelimit.service.rate_limit.another."+k("key3")+".over_limit", 5)
}

// extraTags is TestBasicConfig_ExtraTags: every stat carries the tags, as
// gostats names them.
func (s *suiteRLS) extraTags(t *testing.T) {
	should(t, s.c, "basic", desc("key1", "tags"))
	s.stats.want(t, "ratelimit.service.config_load_success", 1)
	for _, name := range []string{"ratelimit.service.rate_limit.basic.key1.total_hits", "ratelimit.service.config_load_success"} {
		if tags := s.stats.tagsOf(name); tags != ".__a=b.__foo=bar" {
			t.Errorf("%s: tags %q, want .__a=b.__foo=bar", name, tags)
		}
	}
}

// shareThreshold is upstream's testShareThreshold.
func (s *suiteRLS) shareThreshold(t *testing.T) {
	const domain = "share-threshold-test"
	for range 10 {
		if c := should(t, s.c, domain, desc("files", "files/a.pdf")).OverallCode; c != sOK && c != sOver {
			t.Fatalf("files/a.pdf: %v", c)
		}
	}
	s.wantResponse(t, should(t, s.c, domain, desc("files", "files/b.csv")), sOver, limited(sOver, 10, uHour, 0))
	base := time.Now().UnixNano()
	for range 10 {
		v := fmt.Sprintf("files_no_share/%d-%d", base, rand.Int64())
		s.wantResponse(t, should(t, s.c, domain, desc("files_no_share", v)), sOK, limited(sOK, 10, uHour, 9))
	}
}

// configReload is upstream's testConfigReload: a file added, then removed,
// each counted in config_load_success.
func (s *suiteRLS) configReload(t *testing.T) {
	s.wantResponse(t, should(t, s.c, "reload", desc("block", "foo")), sOK, &rlsv3.RateLimitResponse_DescriptorStatus{Code: sOK})
	b, err := os.ReadFile(filepath.Join(upstreamTests, "reload.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	before := s.stats.wait(t, "ratelimit.service.config_load_success", 1)
	path := filepath.Join(s.p.ConfigDir, "reload.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	after := s.stats.wait(t, "ratelimit.service.config_load_success", before+1)
	s.wantResponse(t, should(t, s.c, "reload", desc("key1", "foo")), sOK, limited(sOK, 50, uSecond, 49))
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	s.stats.wait(t, "ratelimit.service.config_load_success", after+1)
}

// useFixture puts one of upstream's config fixtures in force as
// fixture.yaml and waits for the reload.
func (s *suiteRLS) useFixture(t *testing.T, name string) {
	t.Helper()
	if s.fixture == name {
		return
	}
	s.fixture = name
	b, err := os.ReadFile(filepath.Join(upstreamTests, "config", name))
	if err != nil {
		t.Fatal(err)
	}
	before := s.stats.wait(t, "ratelimit.service.config_load_success", 1)
	if err := os.WriteFile(filepath.Join(s.p.ConfigDir, "fixture.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	s.stats.wait(t, "ratelimit.service.config_load_success", before+1)
}

// limitOf asks for entries (key, value pairs) in test-domain and returns
// the status's limit as upstream's GetLimit would: "nil" for none,
// "unlimited", else "rpu/UNIT name".
func (s *suiteRLS) limitOf(t *testing.T, domain string, d *rlcommon.RateLimitDescriptor) string {
	t.Helper()
	st := s.status(t, domain, d)
	switch l := st.GetCurrentLimit(); {
	case l == nil && st.LimitRemaining == math.MaxUint32:
		return "unlimited"
	case l == nil:
		return "nil"
	default:
		return strings.TrimSpace(fmt.Sprintf("%d/%s %s", l.RequestsPerUnit, l.Unit, l.Name))
	}
}

// configBasic is upstream's config TestBasicConfig: lookups, and one hit
// on each rule counted under upstream's stats key.
func (s *suiteRLS) configBasic(t *testing.T) {
	s.useFixture(t, "basic_config.yaml")
	if got := s.limitOf(t, "foo_domain", desc("k", "v")); got != "nil" {
		t.Errorf("foo_domain: %s, want no limit", got)
	}
	s.stats.want(t, "ratelimit.service.rate_limit.foo_domain.domain_not_found", 1)
	for _, c := range []struct {
		kv    []string
		want  string
		stats string
	}{
		{[]string{"key1", "something"}, "nil", ""},
		{[]string{"key1", "value1"}, "nil", ""},
		{[]string{"key2", "value2", "subkey", "subvalue"}, "nil", ""},
		{[]string{"key5", "value5", "subkey5", "subvalue"}, "nil", ""},
		{[]string{"key1", "value1", "subkey1", "something"}, "5/SECOND", "test-domain.key1_value1.subkey1"},
		{[]string{"key1", "value1", "subkey1", "subvalue1"}, "10/SECOND", "test-domain.key1_value1.subkey1_subvalue1"},
		{[]string{"key2", "something"}, "20/MINUTE", "test-domain.key2"},
		{[]string{"key2", "value2"}, "30/MINUTE", "test-domain.key2_value2"},
		{[]string{"key2", "value3"}, "nil", ""},
		{[]string{"key3", "foo"}, "1/HOUR", "test-domain.key3"},
		{[]string{"key4", "foo"}, "1/DAY key4_rate_limit", "test-domain.key4"},
		// Upstream's test counts the unlimited rule's stats by hand; its
		// service never does (an unlimited rule reaches no cache), nor rls.
		{[]string{"key6", "foo"}, "unlimited", ""},
		{[]string{"key7", "unspecified_value"}, "70/MINUTE", "test-domain.key7_unspecified_value"},
		{[]string{"key7", "another_value"}, "70/MINUTE", "test-domain.key7_another_value"},
	} {
		if got := s.limitOf(t, "test-domain", desc(c.kv...)); got != c.want {
			t.Errorf("%v: %s, want %s", c.kv, got, c.want)
		}
		if c.stats != "" {
			s.stats.want(t, "ratelimit.service.rate_limit."+c.stats+".total_hits", 1)
			s.stats.want(t, "ratelimit.service.rate_limit."+c.stats+".within_limit", 1)
		}
	}
}

// override returns a descriptor with a limit override.
func override(rpu uint32, unit typev3.RateLimitUnit, kv ...string) *rlcommon.RateLimitDescriptor {
	d := desc(kv...)
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return d
}

// configOverride is upstream's TestConfigLimitOverride: an override is
// counted under the request's own stats key, whatever its limit.
func (s *suiteRLS) configOverride(t *testing.T) {
	s.useFixture(t, "basic_config.yaml")
	if got := s.limitOf(t, "foo_domain", override(10, typev3.RateLimitUnit_DAY, "k", "v")); got != "nil" {
		t.Errorf("override in an unknown domain: %s, want no limit", got)
	}
	for _, c := range []struct {
		rpu   uint32
		unit  typev3.RateLimitUnit
		value string
		want  string
		hits  uint64
	}{
		{10, typev3.RateLimitUnit_DAY, "something", "10/DAY", 1},
		{42, typev3.RateLimitUnit_HOUR, "something", "42/HOUR", 2},
		{42, typev3.RateLimitUnit_HOUR, "something_else", "42/HOUR", 1},
	} {
		if got := s.limitOf(t, "test-domain", override(c.rpu, c.unit, "key1", "value1", "subkey1", c.value)); got != c.want {
			t.Errorf("override %d/%v: %s, want %s", c.rpu, c.unit, got, c.want)
		}
		s.stats.want(t, "ratelimit.service.rate_limit.test-domain.key1_value1.subkey1_"+c.value+".total_hits", c.hits)
	}
}

// configShadowMode is upstream's TestShadowModeConfig, by requests: a
// shadow rule over its limit answers OK and counts shadow_mode; the rule
// without it counts none.
func (s *suiteRLS) configShadowMode(t *testing.T) {
	s.useFixture(t, "shadowmode_config.yaml")
	awayFromMinuteEdge()
	v := strconv.Itoa(rand.Int())
	for i := range 21 { // key2: 20 a minute, shadow
		if c := should(t, s.c, "test-domain", desc("key2", v)).OverallCode; c != sOK {
			t.Fatalf("shadow rule, call %d: %v, want OK", i+1, c)
		}
	}
	s.stats.want(t, "ratelimit.service.rate_limit.test-domain.key2.shadow_mode", 1)
	s.stats.want(t, "ratelimit.service.rate_limit.test-domain.key2.over_limit", 1)
	for _, c := range []struct {
		kv   []string
		want string
	}{
		{[]string{"key1", "value1", "subkey1", "something"}, "5/SECOND"},
		{[]string{"key1", "value1", "subkey1", "subvalue1"}, "10/SECOND"},
		{[]string{"key2", "value2"}, "30/MINUTE"},
	} {
		if got := s.limitOf(t, "test-domain", desc(c.kv...)); got != c.want {
			t.Errorf("%v: %s, want %s", c.kv, got, c.want)
		}
	}
	s.stats.want(t, "ratelimit.service.rate_limit.test-domain.key2_value2.shadow_mode", 0)
}

// configWildcard is upstream's TestWildcardConfig.
func (s *suiteRLS) configWildcard(t *testing.T) {
	s.useFixture(t, "wildcard.yaml")
	for _, c := range []struct {
		kv    []string
		want  string
		stats string
	}{
		{[]string{"noVal", "foo1"}, "20/MINUTE", "test-domain.noVal"},
		{[]string{"noVal", "foo2"}, "20/MINUTE", "test-domain.noVal"},
		{[]string{"wild", "foo1"}, "20/MINUTE", "test-domain.wild_foo*"},
		{[]string{"wild", "foo2"}, "20/MINUTE", "test-domain.wild_foo*"},
		{[]string{"nestedWild", "val1", "wild", "goo2"}, "20/MINUTE", "test-domain.nestedWild_val1.wild_goo*"},
		{[]string{"wild", "bar"}, "nil", ""},
		{[]string{"noWild", "foo1"}, "nil", ""},
		// Upstream takes only a trailing * as a wildcard; rls takes one
		// anywhere, so bar*b matches barab ([Matching differences]).
		{[]string{"midWild", "barab"}, "20/MINUTE", "test-domain.midWild_bar*b"},
	} {
		if got := s.limitOf(t, "test-domain", desc(c.kv...)); got != c.want {
			t.Errorf("%v: %s, want %s", c.kv, got, c.want)
		}
	}
	s.stats.want(t, "ratelimit.service.rate_limit.test-domain.noVal.total_hits", 2)
	s.stats.want(t, "ratelimit.service.rate_limit.test-domain.wild_foo*.total_hits", 2)
	s.stats.want(t, "ratelimit.service.rate_limit.test-domain.nestedWild_val1.wild_goo*.total_hits", 1)
}

// statNameCase is one of upstream's stats-key expectations (config tests
// TestDetailedMetric, TestValueToMetric_*, TestShareThreshold,
// TestWildcardStatsBehavior): a config, a request, and the key its stats
// are counted under. Domains are renamed where two of upstream's cases
// share one, since rls loads them all at once.
type statNameCase struct {
	name, yaml, domain string
	kv                 []string
	key                string
}

var statNameCases = []statNameCase{
	{"ValueToMetric_UsesRuntimeValuesInStats", `domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
`, "domain", []string{"route", "draw", "http_method", "GET", "subject_id", "123"}, "domain.route_draw.http_method_GET.subject_id"},
	{"ValueToMetric_DefaultKeyIncludesValueAtThatLevel", `domain: d1
descriptors:
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {requests_per_unit: 1, unit: second}
`, "d1", []string{"k1", "A", "k2", "foo"}, "d1.k1_A.k2"},
	{"ValueToMetric_MidLevelOnly", `domain: d2
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {requests_per_unit: 1, unit: second}
`, "d2", []string{"k1", "X", "k2", "Y", "k3", "Z"}, "d2.k1.k2_Y.k3"},
	{"ValueToMetric_NoFlag_Unchanged", `domain: d3
descriptors:
  - key: k1
    descriptors:
      - key: k2
        rate_limit: {requests_per_unit: 1, unit: second}
`, "d3", []string{"k1", "X", "k2", "Y"}, "d3.k1.k2"},
	{"ValueToMetric_DoesNotOverrideDetailedMetric", `domain: domain4
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            detailed_metric: true
            rate_limit: {requests_per_unit: 60, unit: minute}
`, "domain4", []string{"route", "draw", "http_method", "GET", "subject_id", "123"}, "domain4.route_draw.http_method_GET.subject_id_123"},
	{"ValueToMetric_WithConfiguredValues", `domain: test-domain5
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
`, "test-domain5", []string{"route", "api", "http_method", "GET", "subject_id", "user123"}, "test-domain5.route_api.http_method_GET.subject_id"},
	{"DetailedMetric_NestedTopLevelOnly", `domain: nested
descriptors:
  - key: key-1
    detailed_metric: true
    rate_limit: {requests_per_unit: 5, unit: minute}
    descriptors:
      - key: key-2
        rate_limit: {requests_per_unit: 5, unit: minute}
`, "nested", []string{"key-1", "value-1"}, "nested.key-1_value-1"},
	{"DetailedMetric_NestedFully", `domain: nested2
descriptors:
  - key: key-1
    detailed_metric: true
    rate_limit: {requests_per_unit: 5, unit: minute}
    descriptors:
      - key: key-2
        detailed_metric: true
        rate_limit: {requests_per_unit: 5, unit: minute}
`, "nested2", []string{"key-1", "value-1", "key-2", "value-2"}, "nested2.key-1_value-1.key-2_value-2"},
	{"DetailedMetric_NestedFullyWithout", `domain: nested3
descriptors:
  - key: key-1
    rate_limit: {requests_per_unit: 5, unit: minute}
    descriptors:
      - key: key-2
        rate_limit: {requests_per_unit: 5, unit: minute}
`, "nested3", []string{"key-1", "value-1", "key-2", "value-2"}, "nested3.key-1.key-2"},
	{"ShareThreshold_Basic", shareThresholdYAML, "share-names", []string{"files", "files/a.pdf"}, "share-names.files_files/*"},
	{"ShareThreshold_WithValueToMetric", shareThresholdYAML, "share-names", []string{"route", "api/v1", "method", "GET"}, "share-names.route_api/*.method"},
	{"ShareThreshold_WithDetailedMetric", shareThresholdYAML, "share-names", []string{"service", "svc/a", "endpoint", "get"}, "share-names.service_svc/*.endpoint_get"},
	{"ShareThreshold_Nested", shareThresholdYAML, "share-names", []string{"nested", "parent", "files", "nested/x"}, "share-names.nested_parent.files_nested/*"},
	{"ShareThreshold_Both", shareThresholdYAML, "share-names", []string{"files", "top/a", "files", "nested/b"}, "share-names.files_top/*.files_nested/*"},
	{"ShareThreshold_ChildWithout", shareThresholdYAML, "share-names", []string{"path", "path/a", "file", "file/b", "type", "t"}, "share-names.path_path/*.file_file/*.type"},
	{"ShareThreshold_ExplicitWins", shareThresholdYAML, "share-names", []string{"file", "test1"}, "share-names.file_test1"},
	{"ShareThreshold_WildcardShared", shareThresholdYAML, "share-names", []string{"file", "test2"}, "share-names.file_test*"},
}

// shareThresholdYAML is upstream's share_threshold.yaml config fixture in
// a domain of its own.
var shareThresholdYAML = func() string {
	b, err := os.ReadFile(filepath.Join(upstreamTests, "config", "share_threshold.yaml"))
	if err != nil {
		return ""
	}
	return strings.Replace(string(b), "domain: test-domain", "domain: share-names", 1)
}()

// configStatNames asks each stats-name case once and finds its hit under
// upstream's key.
func (s *suiteRLS) configStatNames(t *testing.T) {
	for _, c := range statNameCases {
		if st := s.status(t, c.domain, desc(c.kv...)); st.GetCurrentLimit() == nil {
			t.Errorf("%s: %v matched no rule", c.name, c.kv)
		}
	}
	hits := map[string]uint64{}
	for _, c := range statNameCases {
		hits[c.key]++
	}
	for _, c := range statNameCases {
		if got := s.stats.wait(t, "ratelimit.service.rate_limit."+c.key+".total_hits", hits[c.key]); got != hits[c.key] {
			t.Errorf("%s: %s.total_hits = %d, want %d", c.name, c.key, got, hits[c.key])
		}
	}
}

// testUpstreamFixtures runs rls validate on each of upstream's config
// fixtures: upstream's refusals are refused, naming the file, and the
// others accepted; merge_domain_key1 and 2 need --merge-domains
// (MERGE_DOMAIN_CONFIG), with which one file twice is still refused.
func testUpstreamFixtures(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		files []string
		merge bool
		ok    bool
	}{
		{[]string{"basic_config.yaml"}, false, true},
		{[]string{"shadowmode_config.yaml"}, false, true},
		{[]string{"share_threshold.yaml"}, false, true},
		{[]string{"wildcard.yaml"}, false, true},
		{[]string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"}, true, true},
		{[]string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"}, false, false},
		{[]string{"merge_domain_key1.yaml", "merge_domain_key1.yaml#again-"}, true, false},
		{[]string{"basic_config.yaml", "duplicate_domain.yaml"}, false, false},
		{[]string{"empty_domain.yaml"}, false, false},
		{[]string{"empty_key.yaml"}, false, false},
		{[]string{"duplicate_key.yaml"}, false, false},
		{[]string{"bad_limit_unit.yaml"}, false, false},
		{[]string{"replaces_self.yaml"}, false, false},
		{[]string{"replaces_empty.yaml"}, false, false},
		{[]string{"bad_yaml.yaml"}, false, false},
		{[]string{"misspelled_key.yaml"}, false, false},
		{[]string{"misspelled_key2.yaml"}, false, false},
		{[]string{"non_string_key.yaml"}, false, false},
		{[]string{"non_map_list.yaml"}, false, false},
		{[]string{"unlimited_with_unit.yaml"}, false, false},
	} {
		dir := t.TempDir()
		for _, f := range c.files {
			src, prefix, _ := strings.Cut(f, "#") // the same file twice: under a prefixed name
			b, err := os.ReadFile(filepath.Join(upstreamTests, "config", src))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, prefix+src), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		args := []string{"validate"}
		if c.merge {
			args = append(args, "--merge-domains")
		}
		out, err := exec.Command(rlsFastBin, append(args, dir)...).CombinedOutput() // no race detector: 20 starts
		switch {
		case c.ok && err != nil:
			t.Errorf("%v: refused, upstream accepts it:\n%s", c.files, out)
		case !c.ok && err == nil:
			t.Errorf("%v: accepted, upstream refuses it:\n%s", c.files, out)
		case !c.ok && !strings.Contains(string(out), strings.Split(c.files[len(c.files)-1], "#")[0]):
			t.Errorf("%v: refused without naming the file:\n%s", c.files, out)
		}
	}
}

// awayFromMinuteEdge waits out the last two seconds of a minute, so that a
// burst of a minute's limit falls in one fixed window.
func awayFromMinuteEdge() {
	if into := time.Now().Second(); into >= 58 {
		time.Sleep(time.Duration(61-into) * time.Second) // the next minute: real time on purpose
	}
}

// statsdSink plays statsd over UDP or TCP, summing counters by name
// without tags (gostats appends them as .__k=v).
type statsdSink struct {
	addr     string
	mu       sync.Mutex
	counters map[string]uint64
	tags     map[string]string
}

var tagSuffix = regexp.MustCompile(`(\.__[^.=]+=[^.]*)+$`)

func newStatsdSink(t *testing.T, network string) *statsdSink {
	t.Helper()
	s := &statsdSink{counters: map[string]uint64{}, tags: map[string]string{}}
	if network == "udp" {
		conn, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		s.addr = conn.LocalAddr().String()
		go func() {
			buf := make([]byte, 65536)
			for {
				n, _, err := conn.ReadFrom(buf)
				if err != nil {
					return
				}
				s.add(string(buf[:n]))
			}
		}()
		return s
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	t.Cleanup(func() { lis.Close(); conns.Wait() })
	s.addr = lis.Addr().String()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			conns.Go(func() {
				defer c.Close()
				context.AfterFunc(t.Context(), func() { c.Close() })
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					s.add(sc.Text())
				}
			})
		}
	}()
	return s
}

// add counts the counter lines of a statsd packet.
func (s *statsdSink) add(packet string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, line := range strings.Split(strings.TrimSpace(packet), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		v, isCounter := strings.CutSuffix(rest, "|c")
		if !ok || !isCounter {
			continue
		}
		n, _ := strconv.ParseUint(v, 10, 64)
		tags := tagSuffix.FindString(name)
		name = strings.TrimSuffix(name, tags)
		s.counters[name] += n
		s.tags[name] = tags
	}
}

func (s *statsdSink) count(name string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counters[name]
}

func (s *statsdSink) tagsOf(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tags[name]
}

// wait returns name's count once it reaches least (or after 5 s).
func (s *statsdSink) wait(t *testing.T, name string, least uint64) uint64 {
	t.Helper()
	testkit.EventuallyEvery(5*time.Second, 20*time.Millisecond, func() bool { return s.count(name) >= least })
	return s.count(name)
}

// want checks that name's count reaches exactly n (counted hits arrive
// with the next flush, 100 ms at most).
func (s *statsdSink) want(t *testing.T, name string, n uint64) {
	t.Helper()
	if n == 0 {
		time.Sleep(200 * time.Millisecond) // two flushes
	}
	if got := s.wait(t, name, n); got != n {
		t.Errorf("%s = %d, want %d", name, got, n)
	}
}
