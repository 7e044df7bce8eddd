//go:build redis

package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore/lua"
	"github.com/rls-project/rls/pkg/store/storetest"
)

// startNoFunctions starts a redis-server that has no FUNCTION command
// (renamed away, as some managed services do), so stores on it must run
// decide.lua as a script.
func startNoFunctions(t testing.TB) *redistest.Server {
	t.Helper()
	return redistest.StartServer(t, "--rename-command", "FUNCTION", "")
}

// modeLog records OnScriptMode's calls.
type modeLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *modeLog) record(node, mode, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, mode+": "+reason)
}

func (l *modeLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// calls returns INFO commandstats' calls of cmd on c.
func calls(t *testing.T, c *redis.Client, cmd string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n := 0
			for _, ch := range rest {
				if ch < '0' || ch > '9' {
					break
				}
				n = n*10 + int(ch-'0')
			}
			return n
		}
	}
	return 0
}

// decideN decides one sliding-window hit on key (limit 2 per minute) n
// times and returns how many were allowed.
func decideN(t *testing.T, s *Store, key string, n int) int {
	t.Helper()
	allowed := 0
	for range n {
		r := decide(t, s, store.Check{Key: key, Limit: 2, Window: time.Minute, Hits: 1})
		if r[0].Allowed {
			allowed++
		}
	}
	return allowed
}

// TestScriptModeFunction: on the installed Redis (7 or later) the store
// loads the library at its first Ping, says so once, and decides with
// FCALL and FCALL_RO, never EVALSHA.
func TestScriptModeFunction(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	var log modeLog
	s := mustNew(t, Options{Client: c, Timeout: time.Second, OnScriptMode: log.record, NoPlain: true})
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if got := s.ScriptModes(); got[ScriptFunction] != 1 || got[ScriptEval] != 0 {
		t.Fatalf("ScriptModes() = %v, want one node on functions; log:\n%s", got, log.String())
	}
	if got := log.String(); got != "function: library "+lua.LibraryName+" loaded" {
		t.Errorf("mode log %q, want one line saying the library loaded", got)
	}
	if n := decideN(t, s, "rl:{fn}:a", 3); n != 2 {
		t.Errorf("%d of 3 allowed, want 2", n)
	}
	res := make([]store.Result, 1)
	if err := s.Peek(ctx, []store.Check{{Key: "rl:{fn}:a", Limit: 2, Window: time.Minute}}, res); err != nil || res[0].Allowed {
		t.Errorf("Peek = %+v, %v; want denied", res[0], err)
	}
	if fc, ro, es := calls(t, c, "fcall"), calls(t, c, "fcall_ro"), calls(t, c, "evalsha"); fc != 3 || ro != 1 || es != 0 {
		t.Errorf("fcall %d, fcall_ro %d, evalsha %d; want 3, 1, 0", fc, ro, es)
	}
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: lua.LibraryName}).Result()
	if err != nil || len(libs) != 1 || len(libs[0].Functions) != 2 {
		t.Fatalf("FUNCTION LIST = %+v, %v; want the library with its two functions", libs, err)
	}
}

// TestScriptModeReload: a node that lost the library (FUNCTION FLUSH, as
// after a restart without persistence) gets it again, and the call that
// found it missing is retried and decides.
func TestScriptModeReload(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	var log modeLog
	s := mustNew(t, Options{Client: c, Timeout: time.Second, OnScriptMode: log.record, NoPlain: true})
	if n := decideN(t, s, "rl:{re}:a", 1); n != 1 {
		t.Fatalf("first hit denied")
	}
	ctx := context.Background()
	if err := c.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if n := decideN(t, s, "rl:{re}:a", 2); n != 1 {
		t.Errorf("%d of the next 2 allowed after FUNCTION FLUSH, want 1 (limit 2)", n)
	}
	if got := s.ScriptModes(); got[ScriptFunction] != 1 {
		t.Errorf("ScriptModes() = %v after the reload", got)
	}
	if libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: lua.LibraryName}).Result(); err != nil || len(libs) != 1 {
		t.Errorf("FUNCTION LIST = %+v, %v; want the library back", libs, err)
	}
	if es := calls(t, c, "evalsha"); es != 0 {
		t.Errorf("evalsha %d, want 0: the retry is an FCALL", es)
	}
}

// TestScriptModeEvalRenamed: where FUNCTION does not exist the store falls
// back to EVALSHA, says so, and decides alike.
func TestScriptModeEvalRenamed(t *testing.T) {
	srv := startNoFunctions(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	testEvalFallback(t, c)
}

// TestScriptModeEvalACL: a user whose ACL denies FUNCTION gets EVALSHA.
func TestScriptModeEvalACL(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.Client()
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "rls", "on", ">secret", "~*", "&*", "+@all", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "rls", Password: "secret"})
	t.Cleanup(func() { c.Close() })
	testEvalFallback(t, c)
	if err := c.FunctionLoadReplace(ctx, lua.Library).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Errorf("FUNCTION LOAD as the restricted user: %v, want NOPERM (the ACL is not what the test thinks)", err)
	}
}

func testEvalFallback(t *testing.T, c *redis.Client) {
	t.Helper()
	var log modeLog
	s := mustNew(t, Options{Client: c, Timeout: time.Second, OnScriptMode: log.record, NoPlain: true})
	if n := decideN(t, s, "rl:{ev}:a", 3); n != 2 {
		t.Errorf("%d of 3 allowed, want 2", n)
	}
	if got := s.ScriptModes(); got[ScriptEval] != 1 || got[ScriptFunction] != 0 {
		t.Fatalf("ScriptModes() = %v, want one node on eval; log:\n%s", got, log.String())
	}
	if got := log.String(); !strings.HasPrefix(got, "eval: FUNCTION LOAD refused: ") || strings.Contains(got, "\n") {
		t.Errorf("mode log %q, want one line saying FUNCTION LOAD was refused", got)
	}
	if fc, es := calls(t, c, "fcall"), calls(t, c, "evalsha"); fc != 0 || es != 3 {
		t.Errorf("fcall %d, evalsha %d; want 0, 3", fc, es)
	}
}

// TestConformanceEval runs the shared store vectors where FUNCTION is
// refused: the script path gives the memory store's numbers too.
// (TestConformance covers the Function path.)
func TestConformanceEval(t *testing.T) {
	srv := startNoFunctions(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	storetest.Run(t, func(t *testing.T, now func() time.Time) store.Store {
		s := mustNew(t, Options{Client: c, Clock: now, Timeout: time.Second})
		if err := s.Ping(context.Background()); err != nil || s.ScriptModes()[ScriptEval] != 1 {
			t.Fatalf("Ping: %v; ScriptModes() = %v, want eval", err, s.ScriptModes())
		}
		return s
	})
}

// TestPipelineFunctionMissing: script calls sent in one pipeline that
// find the library gone (FUNCTION FLUSH) load it again and are sent again,
// and every call decides.
func TestPipelineFunctionMissing(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	defer c.Close()
	s := mustNew(t, Options{Client: c, Timeout: 5 * time.Second, NoPlain: true})
	ctx := context.Background()
	decide(t, s, uniqueCheck("warm", 0))
	if err := c.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := srv.CommandStats(ctx)
	reqs := make([]store.Request, 20)
	for i := range reqs {
		ch := uniqueCheck("fnmissing", i)
		ch.Limit, ch.Window, ch.Hits = 100_000, time.Hour, uint64(i+1)
		reqs[i] = store.Request{Checks: []store.Check{ch}, Results: make([]store.Result, 1)}
	}
	s.DecideBatch(ctx, reqs)
	for i, r := range reqs {
		if r.Err != nil || !r.Results[0].Allowed || r.Results[0].Remaining != 100_000-uint64(i+1) {
			t.Errorf("request %d: %+v, %v", i, r.Results[0], r.Err)
		}
	}
	after := srv.CommandStats(ctx)
	if d := after["function|load"] - before["function|load"]; d != 1 {
		t.Errorf("%d FUNCTION LOADs, want 1", d)
	}
	if d := after["fcall"] - before["fcall"]; d > 60 || d < 20 {
		t.Errorf("%d FCALLs for 20 requests, want each sent one to three times", d)
	}
}

// uniqueCheck returns a one-hit check of a key of its own.
func uniqueCheck(name string, i int) store.Check {
	return store.Check{Key: "rl:{" + name + "}:" + strconv.Itoa(i), Limit: 10, Window: time.Minute, Hits: 1}
}

// ACLRules are the ACL rules docs/redis.md gives for rls's Redis user:
// every command the store sends or its scripts run, and nothing else.
var ACLRules = []string{"~*", "resetchannels", "-@all",
	"+fcall", "+fcall_ro", "+function|load", // the Function library
	"+evalsha", "+eval", // the script fallback, and the fleet's heartbeat script
	"+time", "+get", "+set", "+pttl", "+pexpire", // run by decide.lua
	"+incrby",                                       // plain commands (with +get, +pexpire and +time)
	"+zremrangebyscore", "+zadd", "+zcard", "+zrem", // the fleet's heartbeats
	"+hset", "+hdel", "+hgetall", // RLQS demand shared by the replicas
	"+del", "+ping", "+hello", "+info", "+cluster|slots", "+cluster|shards"} // +info: telemetry's eviction watch

// TestACLRules: a user with just ACLRules decides, peeks, deletes and
// beats on the Function path; without +function|load it falls back to
// EVALSHA and does the same.
func TestACLRules(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.Client()
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	for _, tc := range []struct {
		user  string
		extra []string
		mode  string
	}{{"rls", nil, ScriptFunction}, {"rlsnofn", []string{"-function|load"}, ScriptEval}} {
		args := []any{"ACL", "SETUSER", tc.user, "reset", "on", ">secret"}
		for _, r := range append(append([]string(nil), ACLRules...), tc.extra...) {
			args = append(args, r)
		}
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: tc.user, Password: "secret"})
		t.Cleanup(func() { c.Close() })
		s := mustNew(t, Options{Client: c, Timeout: time.Second})
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("%s: Ping: %v", tc.user, err)
		}
		if got := s.ScriptModes()[tc.mode]; got != 1 {
			t.Fatalf("%s: ScriptModes() = %v, want %s", tc.user, s.ScriptModes(), tc.mode)
		}
		key := "rl:{acl}:" + tc.user
		if n := decideN(t, s, key, 3); n != 2 { // the third is denied
			t.Errorf("%s: %d of 3 allowed, want 2", tc.user, n)
		}
		if r := s.Routes(); r[RoutePlain] == 0 {
			t.Errorf("%s: routes %v, want plain commands to decide", tc.user, r)
		}
		res := make([]store.Result, 1)
		if err := s.Peek(ctx, []store.Check{{Key: key, Limit: 2, Window: time.Minute}}, res); err != nil {
			t.Errorf("%s: Peek: %v", tc.user, err)
		}
		if n, err := s.Heartbeat(ctx, "r1", time.Second); err != nil || n != 1 {
			t.Errorf("%s: Heartbeat = %d, %v", tc.user, n, err)
		}
		if err := s.Leave(ctx, "r1"); err != nil {
			t.Errorf("%s: Leave: %v", tc.user, err)
		}
		if d, err := s.ShareDemand(ctx, key, 5, time.Second); err != nil || d != 5 {
			t.Errorf("%s: ShareDemand = %v, %v", tc.user, d, err)
		}
		if err := s.Delete(ctx, store.Check{Key: key, Limit: 2, Window: time.Minute}); err != nil {
			t.Errorf("%s: Delete: %v", tc.user, err)
		}
		// A key without a TTL denied: PEXPIRE gives it one.
		empty := state{Algorithm: store.TokenBucket, Tokens: 0, LastRefill: 1e18}.encode()
		if err := admin.Set(ctx, key, empty, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if r := decide(t, s, store.Check{Key: key, Algorithm: store.TokenBucket, Limit: 2, Window: time.Minute, Hits: 1}); r[0].Allowed {
			t.Errorf("%s: an empty bucket allowed a hit", tc.user)
		}
		if ttl := admin.PTTL(ctx, key).Val(); ttl <= 0 {
			t.Errorf("%s: PTTL %v after the denial, want the TTL restored", tc.user, ttl)
		}
	}
}

// TestScriptLoadBackoff: a node that cannot load the library for an outage
// (here out of memory: FUNCTION LOAD and every write are refused with OOM)
// is not asked again on every call: one load, then EVALSHA until
// loadRetry has passed.
func TestScriptLoadBackoff(t *testing.T) {
	srv := redistest.StartServer(t, "--maxmemory", "1", "--maxmemory-policy", "noeviction")
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	s := mustNew(t, Options{Client: c, Timeout: time.Second})
	ctx := context.Background()
	check := []store.Check{{Key: "rl:{oom}:a", Limit: 2, Window: time.Minute, Hits: 1}}
	start := time.Now()
	for range 5 {
		if err := s.Decide(ctx, check, make([]store.Result, 1)); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Decide on an out-of-memory Redis: %v, want ErrUnavailable", err)
		}
	}
	if time.Since(start) >= loadRetry {
		t.Skip("the machine was too slow to make 5 calls within loadRetry")
	}
	info := c.Info(ctx, "commandstats").Val()
	rejected := -1
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(line, "cmdstat_function|load:"); ok {
			for kv := range strings.SplitSeq(strings.TrimSpace(rest), ",") {
				if v, ok := strings.CutPrefix(kv, "rejected_calls="); ok {
					rejected, _ = strconv.Atoi(v)
				}
			}
		}
	}
	if rejected != 1 {
		t.Errorf("FUNCTION LOAD refused %d times for 5 calls, want 1; commandstats:\n%s", rejected, info)
	}
	if got := s.ScriptModes(); got[ScriptFunction]+got[ScriptEval] != 0 {
		t.Errorf("ScriptModes() = %v, want the mode still unknown", got)
	}
}
