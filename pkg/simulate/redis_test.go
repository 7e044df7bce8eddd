//go:build redis

package simulate

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore"
	"github.com/rls-project/rls/pkg/store/redisstore/lua"
)

// layouts are the candidates whose Redis state differs in layout: the
// two-counter window, fixed window and token bucket (compact or tagged
// forms), and every precision.
func layouts() []Candidate {
	cs := []Candidate{{Algorithm: store.SlidingWindow}, {Algorithm: store.FixedWindow}, {Algorithm: store.TokenBucket}}
	for p := uint64(2); p <= store.MaxPrecision; p++ {
		cs = append(cs, Candidate{Algorithm: store.SlidingWindow, Precision: p})
	}
	return cs
}

// TestRedisBytes measures RedisBytes's table again on a real redis-server
// with rls's own script (Redis's TIME, so the compact forms): MEMORY USAGE
// of one key of each layout after one admitted request, within 8 bytes of
// the table (another Redis version or allocator may differ by a size
// class; more means the table is wrong). It also checks the value's
// length, and logs the growth of used_memory per key over 10,000 keys
// (what MEMORY USAGE leaves out: the tables' slots, the expiry) for
// the first layouts and precisions 10 and 60.
func TestRedisBytes(t *testing.T) {
	t.Parallel() // a redis-server of its own: it measures that server's memory, not this process's
	srv := redistest.StartServer(t)
	rc := srv.Client()
	defer rc.Close()
	s, err := redisstore.New(redisstore.Options{Client: rc, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	info, _ := rc.Info(ctx, "server").Result()
	t.Logf("redis %s", infoField(info, "redis_version"))

	ballast(t, ctx, rc)
	l := Limit{Requests: 50, Window: time.Second}
	var table []string
	for _, c := range layouts() {
		key := redisExampleKey(c)
		res := make([]store.Result, 1)
		check := c.check(l, key, 1)
		if err := s.Decide(ctx, []store.Check{check}, res); err != nil || !res[0].Allowed {
			t.Fatalf("%s: %v %+v", c.Name(l), err, res[0])
		}
		keys := 1
		if lua.Windowed(&check) {
			key = windowKeyOf(t, ctx, rc, key)
			if c.Algorithm == store.SlidingWindow {
				keys = 2 // the current window's and the previous one's
			}
		}
		got, err := rc.MemoryUsage(ctx, key, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		want, value := RedisBytes(c)
		want /= keys
		if n, _ := rc.StrLen(ctx, key).Result(); value > 0 && int(n) != value {
			t.Errorf("%s: value of %d bytes, RedisBytes says %d", c.Name(l), n, value)
		}
		if v, _ := rc.Get(ctx, key).Result(); value == 0 {
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				t.Errorf("%s: value %q, want the compact integer form", c.Name(l), v)
			}
		}
		if d := int(got) - want; d < -8 || d > 8 {
			t.Errorf("%s (%s): MEMORY USAGE %d bytes, the table says %d", c.Name(l), key, got, want)
		}
		table = append(table, strconv.FormatInt(got, 10))
		if c.Precision > 2 && c.Precision != 10 && c.Precision != store.MaxPrecision {
			continue
		}
		used, usage := usedPerKey(t, ctx, s, rc, c)
		t.Logf("%-30s key %-26q MEMORY USAGE %3d bytes; over 10,000 keys (8 bytes longer): used_memory %5.1f bytes per key, %+5.1f beyond their MEMORY USAGE",
			c.Name(l), key, got, used, used-usage)
	}
	t.Logf("sliding %s, fixed %s, token bucket %s; precision 2..60: {%s}", table[0], table[1], table[2], strings.Join(table[3:], ", "))
}

// windowKeyOf returns the window key of base that Redis holds.
func windowKeyOf(t *testing.T, ctx context.Context, rc *redis.Client, base string) string {
	t.Helper()
	ks, err := rc.Keys(ctx, base+":*").Result()
	if err != nil || len(ks) != 1 {
		t.Fatalf("window keys of %s: %v, %v", base, ks, err)
	}
	return ks[0]
}

// usedPerKey returns the growth of used_memory per key when 10,000 keys of
// c's layout are written (one request each, on a window of an hour so
// that none expires meanwhile) and the mean MEMORY USAGE of those keys,
// then deletes them. ballast must have grown Redis's tables beyond 10,000
// more keys, so that no table grows during the measurement.
func usedPerKey(t *testing.T, ctx context.Context, s *redisstore.Store, rc *redis.Client, c Candidate) (used, usage float64) {
	t.Helper()
	const n = 10_000
	l := Limit{Requests: 50, Window: time.Hour}
	usedMemory := func() float64 {
		info, err := rc.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		v, _ := strconv.ParseFloat(infoField(info, "used_memory"), 64)
		return v
	}
	before := usedMemory()
	checks, res := make([]store.Check, 0, 250), make([]store.Result, 250)
	var keys []string
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("%s|n=%05d", redisExampleKey(c), i)
		keys = append(keys, k)
		checks = append(checks, c.check(l, k, 1))
		if len(checks) == cap(checks) {
			if err := s.Decide(ctx, checks, res); err != nil {
				t.Fatal(err)
			}
			checks = checks[:0]
		}
	}
	after := usedMemory()
	if c.Algorithm != store.TokenBucket && c.Precision < 2 {
		for i := range keys {
			keys[i] = string(lua.WindowKey(nil, keys[i], time.Now().Unix()/3600*3600))
		}
	}
	for i := 0; i < n; i += 100 {
		u, err := rc.MemoryUsage(ctx, keys[i], 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		usage += float64(u) / (n / 100)
	}
	for i := 0; i < len(keys); i += 500 {
		rc.Del(ctx, keys[i:min(i+500, len(keys))]...)
	}
	return (after - before) / n, usage
}

// ballast writes 20,000 keys with a TTL of 10 minutes, so that Redis's
// main and expires tables have room for 10,000 more without growing.
func ballast(t *testing.T, ctx context.Context, rc *redis.Client) {
	t.Helper()
	p := rc.Pipeline()
	for i := 0; i < 20_000; i++ {
		p.Set(ctx, fmt.Sprintf("ballast:%05d", i), "x", 10*time.Minute)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// infoField returns field's value in an INFO reply.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// BenchmarkRedisScript measures what one decision costs Redis for each
// state layout: the script's time as Redis counts it (INFO commandstats,
// usec per EVALSHA call, reported as redis-µs/op), one key, one decision
// per call, every one admitted (10^9 a second: each call reads, decides
// and writes the key) or every one denied (1 an hour, after the first: no
// write).
//
//	go test ./pkg/simulate -run '^$' -bench RedisScript -benchtime 20000x
func BenchmarkRedisScript(b *testing.B) {
	srv := redistest.StartServer(b)
	rc := srv.Client()
	defer rc.Close()
	s, err := redisstore.New(redisstore.Options{Client: rc, Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	cands := []Candidate{{Algorithm: store.SlidingWindow}, {Algorithm: store.FixedWindow}, {Algorithm: store.TokenBucket}}
	for _, p := range DefaultPrecisions {
		cands = append(cands, Candidate{Algorithm: store.SlidingWindow, Precision: p})
	}
	for _, admitted := range []bool{true, false} {
		for _, c := range cands {
			l, what := Limit{Requests: 1, Window: time.Hour}, "denied"
			if admitted {
				l, what = Limit{Requests: 1e9, Window: time.Second}, "admitted"
			}
			b.Run(what+"/"+strings.ReplaceAll(c.Name(l), " ", "_"), func(b *testing.B) {
				key := redisExampleKey(c) + "|" + what
				checks, res := []store.Check{c.check(l, key, 1)}, make([]store.Result, 1)
				if err := s.Decide(ctx, checks, res); err != nil {
					b.Fatal(err)
				}
				rc.ConfigResetStat(ctx)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := s.Decide(ctx, checks, res); err != nil || res[0].Allowed != admitted {
						b.Fatalf("%v %+v", err, res[0])
					}
				}
				b.StopTimer()
				info, err := rc.Info(ctx, "commandstats").Result()
				if err != nil {
					b.Fatal(err)
				}
				// cmdstat_fcall:calls=N,usec=U,usec_per_call=X,... (the store
				// calls decide.lua as a Redis Function where it can)
				field := infoField(info, "cmdstat_fcall")
				if field == "" {
					field = infoField(info, "cmdstat_evalsha")
				}
				for _, f := range strings.Split(field, ",") {
					if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
						x, _ := strconv.ParseFloat(v, 64)
						b.ReportMetric(x, "redis-µs/op")
					}
				}
			})
		}
	}
}

// TestRedisCommands checks RedisCost on a real redis-server: a window is
// plain commands, and when denied their take-back and a script call;
// others one script call (TIME and GET, and SET only when it admits).
func TestRedisCommands(t *testing.T) {
	srv := redistest.StartServer(t)
	rc := srv.Client()
	defer rc.Close()
	s, err := redisstore.New(redisstore.Options{Client: rc, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	l := Limit{Requests: 5, Window: 24 * time.Hour}
	// Load the library and learn Redis's clock first.
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Candidate{{Algorithm: store.SlidingWindow}, {Algorithm: store.SlidingWindow, Precision: 10}, {Algorithm: store.FixedWindow}, {Algorithm: store.TokenBucket}} {
		rc.ConfigResetStat(ctx)
		const n = 12
		admitted := 0
		tr := Trace{}
		allowed := make([]bool, 0, n)
		for range n {
			res := make([]store.Result, 1)
			at := time.Now().UnixMicro() // Redis's clock is this machine's
			if err := s.Decide(ctx, []store.Check{c.check(l, redisExampleKey(c), 1)}, res); err != nil {
				t.Fatal(err)
			}
			tr.Events = append(tr.Events, Event{At: at, Key: redisExampleKey(c), Hits: 1})
			allowed = append(allowed, res[0].Allowed)
			if res[0].Allowed {
				admitted++
			}
		}
		days := tr.Events[n-1].At/l.Window.Microseconds() - tr.Events[0].At/l.Window.Microseconds()
		info, err := rc.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		calls := func(cmd string) int {
			for _, f := range strings.Split(infoField(info, "cmdstat_"+cmd), ",") {
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					n, _ := strconv.Atoi(v)
					return n
				}
			}
			return 0
		}
		got := [6]int{calls("evalsha") + calls("eval") + calls("fcall"), calls("incrby"), calls("pexpire"), calls("time"), calls("get"), calls("set")}
		if admitted != 5 && days == 0 {
			t.Errorf("%s: %d decisions, %d admitted, want 5", c.Name(l), n, admitted)
		}
		callsPer, cmdsPer := RedisCost(tr, l, c, allowed)
		if math.Abs(callsPer-float64(got[0])/n) > 1e-9 || math.Abs(cmdsPer-float64(got[1]+got[2]+got[3]+got[4]+got[5])/n) > 1e-9 {
			t.Errorf("%s: RedisCost says %v calls and %v commands per decision; Redis counted %v (script calls, INCRBY, PEXPIRE, TIME, GET, SET)", c.Name(l), callsPer, cmdsPer, got)
		}
	}
}

// redisExampleKey is the key whose MEMORY USAGE the table holds for c:
// descriptors.AppendKey for domain "sim", descriptor (key=value) and a
// rule of 1 second, e.g. "rl:{sim|key=value}:s1p10" (20 to 24 bytes). A
// longer key costs about one byte more per byte, in steps of the
// allocator's size classes.
func redisExampleKey(c Candidate) string {
	r := &descriptors.Rule{Unit: descriptors.UnitSecond, RequestsPerUnit: 50, Algorithm: c.Algorithm, Precision: uint32(c.Precision), Burst: uint32(c.Burst)}
	return string(descriptors.AppendKey(nil, "sim", []*rlcommon.RateLimitDescriptor_Entry{{Key: "key", Value: "value"}}, r))
}
