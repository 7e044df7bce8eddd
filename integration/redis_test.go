package integration

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store/redisstore"
	"github.com/rls-project/rls/pkg/testkit"
)

// The Redis tests run the real binary against real redis-server processes:
// a single server, a Redis Cluster and a Sentinel group. Flags common to all
// of them: a generous --redis-timeout so that load from parallel tests on a
// small machine does not push decisions into the fallback (which would make
// counts inexact), and a fixed --fleet-size so no heartbeat script runs
// (it would show in EVALSHA counts), except where a test says otherwise.

const (
	rdOkCode   = rlsv3.RateLimitResponse_OK
	rdOverCode = rlsv3.RateLimitResponse_OVER_LIMIT
)

// rdTimeout is the --redis-timeout of tests that do not test timeouts: far
// above the 10ms default, so a loaded machine (parallel test processes,
// the race detector) does not push decisions into the fallback.
const rdTimeout = "1s"

// rdFallbackLog is what the limiter logs (at least once) when it decides
// without the store; a test that needs every decision to come from Redis
// asserts its absence.
const rdFallbackLog = "store unavailable"

// rdRaceConfig has one hourly limit of 100 per algorithm.
const rdRaceConfig = `domain: race
descriptors:
  - key: sliding_window
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: token_bucket
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: token_bucket}
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}
`

// rdBatchConfig limits an API key, and the API key with a route or a method.
const rdBatchConfig = `domain: batch
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: route
        rate_limit: {unit: hour, requests_per_unit: 5}
      - key: method
        rate_limit: {unit: hour, requests_per_unit: 3}
`

// rdKeysConfig serves the key-format checks.
const rdKeysConfig = `domain: keys
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 100}
    descriptors:
      - key: route
        rate_limit: {unit: hour, requests_per_unit: 50}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket}
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}
`

// rdRedisArgs are the flags of an rls replica on a single Redis server.
func rdRedisArgs(s *redistest.Server, extra ...string) []string {
	return append([]string{"--store", "redis", "--redis-url", s.URL(), "--redis-timeout", rdTimeout, "--fleet-size", "4"}, extra...)
}

// rdClusterArgs are the flags of an rls replica on a Redis Cluster.
func rdClusterArgs(c *redistest.Cluster, extra ...string) []string {
	return append([]string{"--store", "redis-cluster", "--redis-url", c.Seeds(),
		"--redis-timeout", rdTimeout, "--fleet-size", "2"}, extra...)
}

// rdStartReplicas starts n rls processes at once and waits until all serve.
func rdStartReplicas(t *testing.T, n int, dir string, args ...string) []*rlsProc {
	t.Helper()
	ps := make([]*rlsProc, n)
	for i := range ps {
		ps[i] = startRLSNoWait(t, dir, args...)
	}
	for _, p := range ps {
		p.waitServing(t, 30*time.Second)
	}
	return ps
}

// rdNoFallback fails the test if any replica decided without the store.
func rdNoFallback(t *testing.T, ps ...*rlsProc) {
	t.Helper()
	for _, p := range ps {
		if strings.Contains(p.Log.String(), rdFallbackLog) {
			t.Errorf("rls %s decided without Redis (fallback), so counts are not Redis's:\n%s", p.GRPCAddr, p.Log.String())
		}
	}
}

// rdCall is ShouldRateLimit with a bounded deadline, returning the error.
func rdCall(c rlsv3.RateLimitServiceClient, domain string, ds ...*rlcommon.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
}

// rdRedisNow is Redis's clock (TIME), the clock rls decides with.
func rdRedisNow(t *testing.T, rc redis.Cmdable) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now, err := rc.Time(ctx).Result()
	if err != nil {
		t.Fatalf("redis TIME: %v", err)
	}
	return now
}

// rdAwayFromWindowEnd waits, if needed, until Redis's clock is at least margin
// before the end of the current window (and past its start), so a test that
// expects exact counts in one window does not straddle a boundary.
func rdAwayFromWindowEnd(t *testing.T, rc redis.Cmdable, window, margin time.Duration) {
	t.Helper()
	now := rdRedisNow(t, rc)
	pos := time.Duration(now.UnixNano() % int64(window))
	if pos > window-margin {
		wait := window - pos + 100*time.Millisecond
		t.Logf("waiting %v for the next %v window", wait, window)
		time.Sleep(wait) // the next window: real time on purpose
	}
}

// rdHammer sends total requests for ds from goroutines client goroutines spread
// round-robin over the replicas, released together, and returns how many
// were OK and OVER_LIMIT. Any RPC error or other code fails the test.
func rdHammer(t *testing.T, ps []*rlsProc, goroutines, total int, domain string, ds ...*rlcommon.RateLimitDescriptor) (ok, over int) {
	t.Helper()
	var sent, nOK, nOver, nErr atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		c := ps[g%len(ps)].client()
		wg.Go(func() {
			<-start
			for sent.Add(1) <= int64(total) {
				r, err := rdCall(c, domain, ds...)
				switch {
				case err != nil:
					if nErr.Add(1) <= 5 {
						t.Errorf("ShouldRateLimit: %v", err)
					}
				case r.OverallCode == rdOkCode:
					nOK.Add(1)
				case r.OverallCode == rdOverCode:
					nOver.Add(1)
				default:
					t.Errorf("overall code %v", r.OverallCode)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if nErr.Load() > 0 {
		t.Errorf("%d of %d RPCs failed", nErr.Load(), total)
	}
	return int(nOK.Load()), int(nOver.Load())
}

// rdScanAll returns every key on the servers, with the server holding it.
func rdScanAll(t *testing.T, servers ...*redistest.Server) map[string]*redistest.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys := map[string]*redistest.Server{}
	for _, s := range servers {
		rc := s.Client()
		var cursor uint64
		for {
			ks, next, err := rc.Scan(ctx, cursor, "*", 1000).Result()
			if err != nil {
				rc.Close()
				t.Fatalf("SCAN %s: %v", s.Addr, err)
			}
			for _, k := range ks {
				keys[k] = s
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
		rc.Close()
	}
	return keys
}

// rdEvalCalls returns the summed script calls (EVALSHA, and FCALL where rls
// runs decide.lua as a Redis Function) and script loads (EVAL, FUNCTION
// LOAD) of the servers.
func rdEvalCalls(t *testing.T, servers ...*redistest.Server) (evalsha, eval int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		st := s.CommandStats(ctx)
		if st == nil {
			t.Fatalf("INFO commandstats on %s failed", s.Addr)
		}
		evalsha += st["evalsha"] + st["fcall"] + st["fcall_ro"]
		eval += st["eval"] + st["function|load"]
	}
	return evalsha, eval
}

// rdCheckStatuses compares a response's overall code and per-descriptor
// (code, limit_remaining) with the expected ones.
func rdCheckStatuses(t *testing.T, what string, r *rlsv3.RateLimitResponse, overall rlsv3.RateLimitResponse_Code, want ...any) {
	t.Helper()
	if r.OverallCode != overall || len(r.Statuses) != len(want)/2 {
		t.Fatalf("%s: got %v, want overall %v with %d statuses", what, r, overall, len(want)/2)
	}
	for i, st := range r.Statuses {
		code, rem := want[2*i].(rlsv3.RateLimitResponse_Code), uint32(want[2*i+1].(int))
		if st.Code != code || st.LimitRemaining != rem {
			t.Errorf("%s: status %d is %v remaining %d, want %v remaining %d", what, i, st.Code, st.LimitRemaining, code, rem)
		}
	}
}

// TestRedisSingleNode runs four rls replicas on one Redis server.
func TestRedisSingleNode(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	dir := writeConfig(t, map[string]string{"race.yaml": rdRaceConfig, "batch.yaml": rdBatchConfig, "keys.yaml": rdKeysConfig})
	ps := rdStartReplicas(t, 4, dir, rdRedisArgs(srv)...)
	rc := srv.Client()
	defer rc.Close()
	defer rdNoFallback(t, ps...)

	t.Run("race", func(t *testing.T) { rdTestRace(t, ps, rc) })
	t.Run("one_round_trip_all_or_nothing", func(t *testing.T) { rdTestBatch(t, ps[0], rc, []*redistest.Server{srv}) })
	t.Run("keys", func(t *testing.T) { rdTestKeys(t, ps[1], nil, srv) })
	t.Run("every_key_has_ttl", func(t *testing.T) { rdTestAllKeysHaveTTL(t, srv) })
}

// TestRedisCluster runs two rls replicas on a 3-master Redis Cluster with a
// replica per master.
func TestRedisCluster(t *testing.T) {
	light(t)
	c := redistest.StartCluster(t, 3, 1)
	masters := c.Nodes[:3]
	dir := writeConfig(t, map[string]string{"race.yaml": rdRaceConfig, "batch.yaml": rdBatchConfig, "keys.yaml": rdKeysConfig})
	ps := rdStartReplicas(t, 2, dir, rdClusterArgs(c)...)
	cc := c.Client()
	defer cc.Close()
	defer rdNoFallback(t, ps...)

	t.Run("race", func(t *testing.T) { rdTestRace(t, ps, cc) })
	t.Run("one_round_trip_all_or_nothing", func(t *testing.T) { rdTestBatch(t, ps[1], cc, masters) })
	t.Run("keys", func(t *testing.T) { rdTestKeys(t, ps[0], c, masters...) })
	t.Run("every_key_has_ttl", func(t *testing.T) { rdTestAllKeysHaveTTL(t, masters...) })
}

// rdTestRace: 200 concurrent clients over all replicas send 300 requests for
// one fresh key limited to 100 per hour; exactly 100 pass, per algorithm.
func rdTestRace(t *testing.T, ps []*rlsProc, rc redis.Cmdable) {
	for _, alg := range []string{"sliding_window", "token_bucket", "fixed_window"} {
		t.Run(alg, func(t *testing.T) {
			rdAwayFromWindowEnd(t, rc, time.Hour, 20*time.Second)
			start := time.Now()
			ok, over := rdHammer(t, ps, 200, 300, "race", desc(alg, fmt.Sprintf("k-%d", time.Now().UnixNano())))
			if ok != 100 || over != 200 {
				t.Errorf("%d OK and %d OVER_LIMIT of 300 from %d replicas, want exactly 100 and 200", ok, over, len(ps))
			}
			t.Logf("300 requests in %v", time.Since(start))
		})
	}
}

// rdTestBatch: a request with three descriptors of one tenant is one EVALSHA,
// and a request that one descriptor denies consumes nothing from the others
// (whether the store or the local over-limit cache denied it).
func rdTestBatch(t *testing.T, p *rlsProc, rc redis.Cmdable, nodes []*redistest.Server) {
	rdAwayFromWindowEnd(t, rc, time.Hour, 20*time.Second)
	c := p.client()
	tenant := fmt.Sprintf("A-%d", time.Now().UnixNano())
	key := desc("api_key", tenant)
	route := desc("api_key", tenant, "route", "/x")
	method := desc("api_key", tenant, "method", "GET")

	// The first request may load the script (EVALSHA, NOSCRIPT, EVAL).
	r := should(t, c, "batch", key, route, method)
	rdCheckStatuses(t, "request 1", r, rdOkCode, rdOkCode, 9, rdOkCode, 4, rdOkCode, 2)

	// Far from their limits: plain commands, no script call; the denied
	// request takes them back and asks the script, once. Summed over every
	// node, and no EVAL.
	measured := func(what string, scripts int64, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		sha0, eval0 := rdEvalCalls(t, nodes...)
		r := should(t, c, "batch", ds...)
		sha1, eval1 := rdEvalCalls(t, nodes...)
		if sha1-sha0 != scripts || eval1 != eval0 {
			t.Errorf("%s (%d descriptors) cost %d script calls and %d EVAL, want %d and 0", what, len(ds), sha1-sha0, eval1-eval0, scripts)
		}
		return r
	}
	r = measured("request 2", 1, key, route, method) // near the method's limit (2 of 3 left): the script
	rdCheckStatuses(t, "request 2", r, rdOkCode, rdOkCode, 8, rdOkCode, 3, rdOkCode, 1)
	r = measured("request 3", 1, key, route, method)
	rdCheckStatuses(t, "request 3", r, rdOkCode, rdOkCode, 7, rdOkCode, 2, rdOkCode, 0)

	// The method limit (3) is spent: Redis denies the request, and each
	// passing status reports what it found (nothing was consumed).
	r = measured("request 4 (denied by Redis)", 1, key, route, method)
	rdCheckStatuses(t, "request 4", r, rdOverCode, rdOkCode, 7, rdOkCode, 2, rdOverCode, 0)
	// All or nothing: the denied request took nothing from api_key and route.
	r = measured("request 5", 1, key, route)
	rdCheckStatuses(t, "request 5 after a denied request", r, rdOkCode, rdOkCode, 6, rdOkCode, 1)

	// Denied again, now by the local over-limit cache: still nothing taken.
	r = should(t, c, "batch", key, route, method)
	if r.OverallCode != rdOverCode || r.Statuses[2].Code != rdOverCode {
		t.Fatalf("request 6: %v, want OVER_LIMIT by method", r)
	}
	r = should(t, c, "batch", key)
	rdCheckStatuses(t, "request 7 after a denied request", r, rdOkCode, rdOkCode, 5)
}

// rdKeyCase is one request of the key-format test and the key it must write.
type rdKeyCase struct {
	d      *rlcommon.RateLimitDescriptor
	key    string // the store key
	tenant string // its hash tag
}

func rdKeyCases(suffix string) []rdKeyCase {
	a := "a" + suffix
	ta := "keys|api_key=" + a
	return []rdKeyCase{
		{desc("api_key", a), "rl:{" + ta + "}:s3600", ta},
		{desc("api_key", a, "route", "}b"), "rl:{" + ta + "}:s3600|route=%7Db", ta},
		{desc("api_key", a, "route", "b|c"), "rl:{" + ta + "}:s3600|route=b%7Cc", ta},
		{desc("api_key", a, "route", "b"), "rl:{" + ta + "}:s3600|route=b", ta},
		{desc("api_key", a, "route", "x{y}:z=w"), "rl:{" + ta + "}:s3600|route=x%7By%7D%3Az%3Dw", ta},
		// Would be tenant a's slot (and keys) without escaping.
		{desc("api_key", a+"}b"), "rl:{" + ta + "%7Db}:s3600", ta + "%7Db"},
		{desc("api_key", a+"}:s3600|route=b"), "rl:{" + ta + "%7D%3As3600%7Croute%3Db}:s3600", ta + "%7D%3As3600%7Croute%3Db"},
		{desc("api_key", a+"{b"), "rl:{" + ta + "%7Bb}:s3600", ta + "%7Bb"},
		{desc("api_key", a+":b"), "rl:{" + ta + "%3Ab}:s3600", ta + "%3Ab"},
		{desc("api_key", a+"=b"), "rl:{" + ta + "%3Db}:s3600", ta + "%3Db"},
		{desc("api_key", a+"|b"), "rl:{" + ta + "%7Cb}:s3600", ta + "%7Cb"},
		{desc("api_key", a+"%7Db"), "rl:{" + ta + "%257Db}:s3600", ta + "%257Db"},
		{desc("api_key", "}"+a), "rl:{keys|api_key=%7D" + a + "}:s3600", "keys|api_key=%7D" + a},
		{desc("api_key", a+" b\x01"), "rl:{" + ta + "%20b%01}:s3600", ta + "%20b%01"},
		{desc("bucket", a+"}b"), "tb:{keys|bucket=" + a + "%7Db}:t60", "keys|bucket=" + a + "%7Db"},
		{desc("fixed", a+"}b"), "rl:{keys|fixed=" + a + "%7Db}:f3600", "keys|fixed=" + a + "%7Db"},
	}
}

// rdTestKeys: SCAN shows exactly the documented keys, distinct for distinct
// descriptors even when values hold the key's separators, each key hashing
// by its tenant's tag, so one tenant's keys share a slot (and, on a
// Cluster, a node) and a value cannot move a key to another tenant's slot.
func rdTestKeys(t *testing.T, p *rlsProc, cluster *redistest.Cluster, nodes ...*redistest.Server) {
	suffix := fmt.Sprintf("-%d", time.Now().UnixNano())
	cases := rdKeyCases(suffix)
	c := p.client()
	want := map[string]bool{}
	names := map[string]string{} // a case's key -> the key Redis holds
	for _, kc := range cases {
		at := time.Now()
		if r := should(t, c, "keys", kc.d); r.OverallCode != rdOkCode {
			t.Fatalf("%v: %v", kc.d, r)
		}
		k := kc.key
		if strings.HasPrefix(k, "rl:") { // a window's key: named by its hour
			k = winKey(k, time.Hour, at)
		}
		if want[k] {
			t.Fatalf("test bug: duplicate key %q", k)
		}
		want[k], names[kc.key] = true, k
	}
	got := map[string]*redistest.Server{}
	for k, s := range rdScanAll(t, nodes...) {
		if strings.Contains(k, "keys|") && strings.Contains(k, suffix) {
			got[k] = s
		}
	}
	for k := range want {
		if got[k] == nil {
			t.Errorf("key %q missing", k)
		}
	}
	for k := range got {
		if !want[k] {
			t.Errorf("unexpected key %q", k)
		}
	}
	if t.Failed() {
		t.Logf("keys found: %q", slices.Sorted(func(yield func(string) bool) {
			for k := range got {
				if !yield(k) {
					return
				}
			}
		}))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc := nodes[0].Client()
	defer rc.Close()
	for _, kc := range cases {
		// The hash tag (first "{" to the next "}") is exactly the tenant.
		open := strings.IndexByte(kc.key, '{')
		end := strings.IndexByte(kc.key[open+1:], '}')
		if tag := kc.key[open+1 : open+1+end]; tag != kc.tenant {
			t.Errorf("key %q hashes by %q, want the tenant %q", kc.key, tag, kc.tenant)
		}
		slot, tenantSlot := redisstore.Slot(kc.key), redisstore.Slot(kc.tenant)
		if slot != tenantSlot {
			t.Errorf("key %q is in slot %d, its tenant %q in %d", kc.key, slot, kc.tenant, tenantSlot)
		}
		if cluster == nil {
			continue
		}
		// Redis agrees on the slot, and the key lives on the slot's master.
		rs, err := rc.ClusterKeySlot(ctx, kc.key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if int(rs) != slot {
			t.Errorf("CLUSTER KEYSLOT %q = %d, redisstore.Slot = %d", kc.key, rs, slot)
		}
		if m := cluster.MasterOf(kc.tenant); m == nil || got[names[kc.key]] != m {
			t.Errorf("key %q is on %v, its tenant's slot on %v", names[kc.key], got[names[kc.key]], m)
		}
	}
}

// rdTestAllKeysHaveTTL: every key on the nodes has a TTL.
func rdTestAllKeysHaveTTL(t *testing.T, nodes ...*redistest.Server) {
	keys := rdScanAll(t, nodes...)
	if len(keys) == 0 {
		t.Fatal("no keys at all")
	}
	rdCheckTTLs(t, keys, nil)
}

// rdCheckTTLs asserts PTTL > 0 for every key (a key that vanished meanwhile
// is fine) and, when max is set, at most max(key).
// winKey is the Redis key of base's count in the window of length w that
// holds at (a fixed window's or a two-counter sliding window's: its key,
// ':', the window's start in Unix seconds).
func winKey(base string, w time.Duration, at time.Time) string {
	secs := int64(w / time.Second)
	return base + ":" + strconv.FormatInt(at.Unix()/secs*secs, 10)
}

func rdCheckTTLs(t *testing.T, keys map[string]*redistest.Server, max func(string) time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for k, s := range keys {
		rc := s.Client()
		ttl, err := rc.PTTL(ctx, k).Result()
		rc.Close()
		if err != nil {
			t.Fatalf("PTTL %q: %v", k, err)
		}
		switch {
		case ttl == -2*time.Nanosecond || ttl == -2*time.Millisecond: // expired meanwhile
		case ttl <= 0:
			t.Errorf("key %q has no TTL (PTTL %v)", k, ttl)
		case max != nil && ttl > max(k):
			t.Errorf("key %q has TTL %v, want at most %v", k, ttl, max(k))
		}
	}
}

// TestRedisKeysExpire: with heartbeats on (no --fleet-size), every key rls
// writes has a TTL bounded as the design says, and per-second keys vanish
// once idle (sliding window after 2 windows).
func TestRedisKeysExpire(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	dir := writeConfig(t, map[string]string{"ttl.yaml": `domain: ttl
descriptors:
  - key: sw
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: token_bucket}
  - key: fw
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: fixed_window}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 3}
`})
	p := startRLS(t, dir, "--store", "redis", "--redis-url", srv.URL(), "--redis-timeout", rdTimeout)
	c := p.client()
	rc := srv.Client()
	defer rc.Close()
	// The fixed window's key lives to the end of its second, so its writes
	// start early in a second of Redis's clock, and its absence is an error
	// only when the scan still fell in that second (a busy CI machine took
	// over a second between the writes and the scan once).
	rdAwayFromWindowEnd(t, rc, time.Second, 700*time.Millisecond)
	writeSec := rdRedisNow(t, rc).Unix()
	for _, k := range []string{"fw", "sw", "tb", "hour"} {
		for i := 0; i < 5; i++ { // some allowed, some denied
			should(t, c, "ttl", desc(k, "v"))
		}
	}
	lastWrite := time.Now()
	written := time.Unix(writeSec, 0)
	fwKey := winKey("rl:{ttl|fw=v}:f1", time.Second, written)
	perSecond := []string{winKey("rl:{ttl|sw=v}:s1", time.Second, written), "tb:{ttl|tb=v}:t1", fwKey}
	hourKey := winKey("rl:{ttl|hour=v}:s3600", time.Hour, written)
	keys := rdScanAll(t, srv)
	scanSec := rdRedisNow(t, rc).Unix()
	for _, k := range append([]string{hourKey}, perSecond...) {
		if keys[k] != nil {
			continue
		}
		if k == fwKey && scanSec != writeSec {
			t.Logf("fixed-window key %q gone: the scan ended in second %d, after its window %d", k, scanSec, writeSec)
			continue
		}
		t.Errorf("key %q missing; keys: %v", k, keys)
	}
	rdCheckTTLs(t, keys, func(k string) time.Duration {
		switch {
		case strings.Contains(k, ":s1:"):
			return 3 * time.Second // to the next window's end, and a second
		case strings.HasSuffix(k, ":t1"):
			return 2 * time.Second // ceil(B/r)+1s = 2s
		case strings.Contains(k, ":f1:"):
			return 2 * time.Second // to the end of the window, and a second
		case k == hourKey:
			return 2*time.Hour + time.Second
		case k == redisstore.FleetKey:
			return 12 * time.Second // 2 heartbeat TTLs
		}
		t.Errorf("unexpected key %q", k)
		return 0
	})

	// Idle per-second keys vanish by themselves: a sliding window's a
	// second after the next window's end, a token bucket's 2 s after its
	// last write, a fixed window's a second after its window's end.
	deadline := lastWrite.Add(6 * time.Second)
	for {
		n, err := rc.Exists(context.Background(), perSecond...).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Logf("idle per-second keys gone %v after the last write", time.Since(lastWrite).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %q still exist %v after the last write", n, perSecond, time.Since(lastWrite))
		}
		time.Sleep(50 * time.Millisecond) // the poll's interval
	}
	if n, _ := rc.Exists(context.Background(), hourKey).Result(); n != 1 {
		t.Errorf("hourly key %q gone after seconds", hourKey)
	}

	// The fleet's heartbeat set (written at start-up, refreshed every 2 s,
	// expiring after 12 s) exists too, with its TTL.
	keys = rdScanAll(t, srv)
	if keys[redisstore.FleetKey] == nil {
		t.Errorf("no heartbeat key %q without --fleet-size: the fleet size is not learnt from Redis (keys: %v)", redisstore.FleetKey, keys)
	}
	rdCheckTTLs(t, keys, func(k string) time.Duration {
		if k == redisstore.FleetKey {
			return 12 * time.Second
		}
		return 2*time.Hour + time.Second
	})
	rdNoFallback(t, p)
}

// TestRedisSlidingWindowBoundary is the seed's walk-through on a 10/s
// limit: 10 requests late in one second, then 10 early in the next. The
// sliding window still counts most of the first 10 and allows 1 to 3; a
// fixed window starts from zero and allows all 10. Timing is Redis's clock
// (TIME), the one rls decides with; an attempt the machine was too slow
// for is retried with fresh keys.
func TestRedisSlidingWindowBoundary(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	dir := writeConfig(t, map[string]string{"walk.yaml": `domain: walk
descriptors:
  - key: sw
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: fw
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: fixed_window}
`})
	p := startRLS(t, dir, rdRedisArgs(srv)...)
	c := p.client()
	rc := srv.Client()
	defer rc.Close()

	// waitFrac sleeps until Redis's clock is in [lo, hi) of a second and
	// returns that second, or -1 if it overshot.
	waitFrac := func(lo, hi float64) int64 {
		for i := 0; i < 3; i++ {
			now := rdRedisNow(t, rc)
			frac := float64(now.Nanosecond()) / 1e9
			if frac >= lo && frac < hi {
				return now.Unix()
			}
			d := lo - frac
			if d < 0 {
				d++
			}
			time.Sleep(time.Duration(d * float64(time.Second))) // to a part of the second: real time on purpose
		}
		return -1
	}
	// burst sends n requests for each of the two keys at once and returns
	// how many of each were allowed.
	burst := func(sw, fw *rlcommon.RateLimitDescriptor, n int) (swOK, fwOK int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := 0; i < 2*n; i++ {
			d := sw
			if i%2 == 1 {
				d = fw
			}
			wg.Go(func() {
				r, err := rdCall(c, "walk", d)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					t.Errorf("ShouldRateLimit: %v", err)
				case r.OverallCode == rdOkCode && d == sw:
					swOK++
				case r.OverallCode == rdOkCode:
					fwOK++
				}
			})
		}
		wg.Wait()
		return swOK, fwOK
	}

	for attempt := 1; attempt <= 5; attempt++ {
		sw, fw := desc("sw", fmt.Sprint("k", attempt)), desc("fw", fmt.Sprint("k", attempt))
		sec := waitFrac(0.85, 0.9)
		if sec < 0 {
			continue
		}
		swOK, fwOK := burst(sw, fw, 10)
		if t.Failed() {
			return
		}
		if rdRedisNow(t, rc).Unix() != sec {
			t.Logf("attempt %d: the first 10 did not fit in one second; retrying", attempt)
			continue
		}
		if swOK != 10 || fwOK != 10 {
			t.Fatalf("first second: sliding allowed %d, fixed %d; want 10 each", swOK, fwOK)
		}
		if waitFrac(0.1, 0.2) != sec+1 {
			t.Logf("attempt %d: missed the start of the next second; retrying", attempt)
			continue
		}
		swOK, fwOK = burst(sw, fw, 10)
		after := rdRedisNow(t, rc)
		if after.Unix() != sec+1 || after.Nanosecond() > 300e6 {
			t.Logf("attempt %d: the second 10 took until %v into the second; retrying", attempt, time.Duration(after.Nanosecond()))
			continue
		}
		if swOK < 1 || swOK > 3 {
			t.Errorf("sliding window allowed %d of 10 early in the next second, want 1..3 (the previous 10 still weigh ~8.5)", swOK)
		}
		if fwOK != 10 {
			t.Errorf("fixed window allowed %d of 10 in the new window, want 10 (the boundary burst)", fwOK)
		}
		t.Logf("attempt %d: sliding allowed %d, fixed %d in the next second", attempt, swOK, fwOK)
		rdNoFallback(t, p)
		return
	}
	t.Fatal("the machine was too slow for every attempt to fit the timing")
}

// TestRedisScriptFlush: SCRIPT FLUSH while traffic flows costs no decision:
// every RPC succeeds, rls reloads the script (EVAL after NOSCRIPT) and the
// count stays exact.
func TestRedisScriptFlush(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	dir := writeConfig(t, map[string]string{"flush.yaml": `domain: flush
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1000}
`})
	ps := rdStartReplicas(t, 2, dir, rdRedisArgs(srv)...)
	rc := srv.Client()
	defer rc.Close()
	rdAwayFromWindowEnd(t, rc, time.Hour, 30*time.Second)
	d := desc("api_key", "flushed")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var sent, nOK, nOver atomic.Int64
	const total = 1500
	var wg sync.WaitGroup
	for g := 0; g < 40; g++ {
		c := ps[g%2].client()
		wg.Go(func() {
			for sent.Add(1) <= total {
				r, err := rdCall(c, "flush", d)
				switch {
				case err != nil:
					t.Errorf("ShouldRateLimit: %v", err)
				case r.OverallCode == rdOkCode:
					nOK.Add(1)
				default:
					nOver.Add(1)
				}
			}
		})
	}
	defer wg.Wait()
	var flushes int
	var evalBefore, evalAfter int64
	for _, at := range []int64{300, 600, 800} {
		for sent.Load() < at && ctx.Err() == nil {
			time.Sleep(time.Millisecond) // the poll's interval
		}
		_, e := rdEvalCalls(t, srv)
		if evalBefore == 0 {
			evalBefore = e
		}
		if err := rc.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		// rls runs decide.lua as a Function on this Redis: that library
		// goes too (the fleet's heartbeat script is still an EVALSHA).
		if err := rc.FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		flushes++
	}
	wg.Wait()
	_, evalAfter = rdEvalCalls(t, srv)
	if nOK.Load() != 1000 || nOver.Load() != 500 {
		t.Errorf("%d OK, %d OVER_LIMIT of %d with %d SCRIPT FLUSHes, want exactly 1000 and 500", nOK.Load(), nOver.Load(), total, flushes)
	}
	if evalAfter <= evalBefore {
		t.Errorf("no EVAL after SCRIPT FLUSH (%d before, %d after): the flush did not hit traffic", evalBefore, evalAfter)
	}
	rdNoFallback(t, ps...)
}

// TestRedisClusterReshard moves the hash slot of a key in use to another
// master by hand (SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE), as
// redis-cli --cluster reshard does, while two replicas send traffic: no RPC
// fails, no decision falls back, and exactly the limit is allowed.
func TestRedisClusterReshard(t *testing.T) {
	light(t)
	c := redistest.StartCluster(t, 3, 0)
	dir := writeConfig(t, map[string]string{"reshard.yaml": `domain: reshard
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1000}
`})
	// No over-limit cache: every request, allowed or denied, goes to Redis.
	ps := rdStartReplicas(t, 2, dir, rdClusterArgs(c, "--over-limit-cache=false")...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cc := c.Client()
	defer cc.Close()
	rdAwayFromWindowEnd(t, cc, time.Hour, 30*time.Second)

	const tenant = "reshard|api_key=hot"
	key := "rl:{" + tenant + "}:s3600"
	slot := redisstore.Slot(key)
	src := c.MasterOf(key)
	var dst, other *redistest.Server
	for _, n := range c.Nodes {
		switch {
		case n == src:
		case dst == nil:
			dst = n
		default:
			other = n
		}
	}
	id := func(s *redistest.Server) string {
		rc := s.Client()
		defer rc.Close()
		v, err := rc.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	srcID, dstID := id(src), id(dst)
	do := func(s *redistest.Server, args ...any) any {
		t.Helper()
		rc := s.Client()
		defer rc.Close()
		v, err := rc.Do(ctx, args...).Result()
		if err != nil {
			t.Fatalf("%v on %s: %v", args, s.Addr, err)
		}
		return v
	}

	d := desc("api_key", "hot")
	var sent, nOK, nOver, nErr atomic.Int64
	var limit atomic.Int64 // requests may be sent up to this count
	limit.Store(200)
	const total = 1500
	var wg sync.WaitGroup
	for g := 0; g < 20; g++ {
		cl := ps[g%2].client()
		wg.Go(func() {
			for ctx.Err() == nil {
				n := sent.Add(1)
				if n > total {
					return
				}
				for n > limit.Load() && ctx.Err() == nil {
					time.Sleep(time.Millisecond) // the poll's interval
				}
				r, err := rdCall(cl, "reshard", d)
				switch {
				case err != nil:
					if nErr.Add(1) <= 5 {
						t.Errorf("ShouldRateLimit: %v", err)
					}
				case r.OverallCode == rdOkCode:
					nOK.Add(1)
				default:
					nOver.Add(1)
				}
			}
		})
	}
	defer func() { cancel(); wg.Wait() }()
	done := func() int64 { return nOK.Load() + nOver.Load() + nErr.Load() }
	// step waits until at requests were answered, runs f while the next
	// 100 flow, then lets traffic go on to the next phase.
	step := func(at int64, name string, f func()) {
		for done() < at && ctx.Err() == nil {
			time.Sleep(time.Millisecond) // the poll's interval
		}
		t.Logf("%s after %d answers (slot %d, %s -> %s)", name, done(), slot, src.Addr, dst.Addr)
		f()
		limit.Add(200)
	}
	step(100, "SETSLOT IMPORTING/MIGRATING", func() {
		do(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID)
		do(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID)
	})
	step(300, "MIGRATE", func() {
		for {
			keys := do(src, "CLUSTER", "GETKEYSINSLOT", slot, 100).([]any)
			if len(keys) == 0 {
				return
			}
			args := []any{"MIGRATE", "127.0.0.1", dst.Port, "", 0, 5000, "KEYS"}
			do(src, append(args, keys...)...)
		}
	})
	step(500, "SETSLOT NODE", func() {
		for _, n := range []*redistest.Server{dst, src, other} {
			do(n, "CLUSTER", "SETSLOT", slot, "NODE", dstID)
		}
	})
	limit.Store(total)
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatal("traffic did not finish in time")
	}
	if nOK.Load() != 1000 || nOver.Load() != 500 || nErr.Load() != 0 {
		t.Errorf("%d OK, %d OVER_LIMIT, %d errors of %d across a slot migration; want exactly 1000, 500, 0",
			nOK.Load(), nOver.Load(), nErr.Load(), total)
	}
	if m := c.MasterOf(key); m != dst {
		t.Errorf("slot %d is served by %v after the move, want %s", slot, m, dst.Addr)
	}
	keys := rdScanAll(t, c.Nodes...)
	if wk := winKey(key, time.Hour, time.Now()); keys[wk] != dst {
		t.Errorf("key %q is on %v, want %s (keys: %v)", wk, keys[wk], dst.Addr, keys)
	}
	rdNoFallback(t, ps...)
}

// TestRedisSentinelFailover: one master, one replica, three sentinels; rls
// follows SENTINEL FAILOVER to the promoted replica. Background traffic
// never sees an error (fail_open answers during the switch are answers);
// before and after, decisions are Redis's and exact.
func TestRedisSentinelFailover(t *testing.T) {
	light(t)
	const name = "rlsmaster"
	t0 := time.Now()
	// No diskless-sync delay (5 s by default): the replica syncs at once.
	master := redistest.StartServer(t, "--repl-diskless-sync-delay", "0")
	replica := redistest.StartServer(t, "--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	info := func(s *redistest.Server, section string) string {
		rc := s.Client()
		defer rc.Close()
		v, _ := rc.Info(ctx, section).Result()
		return v
	}
	testkit.WaitForEvery(t, "replica in sync", 10*time.Second, pollEvery, func() bool {
		return strings.Contains(info(replica, "replication"), "master_link_status:up")
	})
	var sentinels []*redistest.Server
	for i := 0; i < 3; i++ {
		sentinels = append(sentinels, redistest.StartSentinel(t, name, master))
	}
	sdo := func(s *redistest.Server, args ...any) (any, error) {
		rc := s.Client()
		defer rc.Close()
		return rc.Do(ctx, args...).Result()
	}
	for _, s := range sentinels {
		testkit.WaitForEvery(t, "sentinel "+s.Addr+" knows the replica and the other sentinels", 20*time.Second, pollEvery, func() bool {
			r, err := sdo(s, "SENTINEL", "REPLICAS", name)
			if err != nil || len(r.([]any)) != 1 {
				return false
			}
			o, err := sdo(s, "SENTINEL", "SENTINELS", name)
			return err == nil && len(o.([]any)) == 2
		})
	}

	dir := writeConfig(t, map[string]string{"sent.yaml": `domain: sent
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: bg
    rate_limit: {unit: hour, requests_per_unit: 1000000}
`})
	url := "redis://" + sentinels[0].Addr + "?addr=" + sentinels[1].Addr + "&addr=" + sentinels[2].Addr + "&master_name=" + name
	p := startRLS(t, dir, "--store", "redis-sentinel", "--redis-url", url,
		"--redis-timeout", rdTimeout, "--fleet-size", "2")
	c := p.client()
	mrc := master.Client()
	defer mrc.Close()
	rdAwayFromWindowEnd(t, mrc, time.Hour, 60*time.Second)

	// exact sends requests from..6 of a fresh key's seven: numbers 0-4 are
	// OK counting down from 4 remaining, 5 and 6 OVER_LIMIT.
	exact := func(what, v string, from int) {
		t.Helper()
		for i := from; i < 7; i++ {
			r := should(t, c, "sent", desc("api_key", v))
			want, rem := rdOverCode, uint32(0)
			if i < 5 {
				want, rem = rdOkCode, uint32(4-i)
			}
			if r.OverallCode != want || r.Statuses[0].LimitRemaining != rem {
				t.Errorf("%s request %d: %v remaining %d, want %v remaining %d", what, i+1, r.OverallCode, r.Statuses[0].LimitRemaining, want, rem)
			}
		}
	}

	// Background traffic before, during and after the failover.
	stop := make(chan struct{})
	var bgN, bgErr atomic.Int64
	var bg sync.WaitGroup
	for g := 0; g < 4; g++ {
		bg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := rdCall(c, "sent", desc("bg", "x"))
				bgN.Add(1)
				if err != nil || r.OverallCode != rdOkCode {
					if bgErr.Add(1) <= 5 {
						t.Errorf("background request during failover: %v %v", r, err)
					}
				}
				time.Sleep(2 * time.Millisecond) // paced: real time on purpose
			}
		})
	}
	defer func() { close(stop); bg.Wait() }()

	exact("before failover", "before", 0)
	if n, _ := mrc.Exists(ctx, winKey("rl:{sent|api_key=before}:s3600", time.Hour, time.Now())).Result(); n != 1 {
		t.Fatalf("the key is not on the master before the failover")
	}

	t.Logf("SENTINEL FAILOVER %s at %d background answers, %v after the start", name, bgN.Load(), time.Since(t0).Round(time.Millisecond))
	if _, err := sdo(sentinels[0], "SENTINEL", "FAILOVER", name); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	role := func(s *redistest.Server) string {
		rc := s.Client()
		defer rc.Close()
		v, err := rc.Do(ctx, "ROLE").Slice()
		if err != nil || len(v) == 0 {
			return ""
		}
		r, _ := v[0].(string)
		return r
	}
	// The promoted replica no longer replicates from the old master, so a
	// key that appears on it from now on was written there. (Sentinel
	// demotes the old master only some seconds later.)
	testkit.WaitForEvery(t, "the replica promoted", 20*time.Second, pollEvery, func() bool { return role(replica) == "master" })
	for _, s := range sentinels {
		testkit.WaitForEvery(t, "sentinel "+s.Addr+" names the new master", 20*time.Second, pollEvery, func() bool {
			a, err := sdo(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
			return err == nil && len(a.([]any)) == 2 && a.([]any)[1] == strconv.Itoa(replica.Port)
		})
	}
	t.Logf("failover done at %d background answers, %v after the start", bgN.Load(), time.Since(t0).Round(time.Millisecond))

	// rls writes to the new master: a fresh key's first request lands there
	// (the demoted master is read-only, so it can only have been written on
	// the new one). Allow a short window of fallback answers.
	nrc := replica.Client()
	defer nrc.Close()
	var v string
	testkit.WaitForEvery(t, "rls writes to the new master", 20*time.Second, pollEvery, func() bool {
		v = fmt.Sprintf("after-%d", time.Now().UnixNano())
		should(t, c, "sent", desc("api_key", v))
		n, _ := nrc.Exists(ctx, winKey("rl:{sent|api_key="+v+"}:s3600", time.Hour, time.Now())).Result()
		return n == 1
	})
	t.Logf("rls writes to the new master %v after the start", time.Since(t0).Round(time.Millisecond))
	exact("after failover", v, 1)
	time.Sleep(200 * time.Millisecond) // background traffic after the switch
	t.Logf("background: %d answers, %d errors; fallback answers during the switch: %v",
		bgN.Load(), bgErr.Load(), strings.Contains(p.Log.String(), rdFallbackLog))
}
