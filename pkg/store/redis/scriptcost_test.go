package redisstore

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/lua"
	"github.com/rls-project/rls/pkg/store"
)

// BenchmarkScriptCost measures what Redis spends on one script call of one
// check (a sliding window hit on one of 1,000 keys, as in make bench's
// scenario (c) when nothing coalesces), by FCALL and by EVALSHA, next to
// the two commands envoyproxy/ratelimit sends per decision (INCRBY and
// EXPIRE). Calls go 50 to a pipeline; the figure is INFO commandstats'
// usec of the outer commands (a script's includes the commands it runs)
// per call: redis-us/call. RLS_OLD_DECIDE_LUA, when set, names another
// decide.lua to time by EVALSHA too (a version before a change).
//
//	go test -run '^$' -bench ScriptCost -count 5 ./pkg/store/redis/
func BenchmarkScriptCost(b *testing.B) {
	srv := redistest.StartServer(b)
	c := srv.Client()
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
	if err := c.FunctionLoadReplace(ctx, lua.Library).Err(); err != nil {
		b.Fatal(err)
	}
	old := ""
	if p := os.Getenv("RLS_OLD_DECIDE_LUA"); p != "" {
		src, err := os.ReadFile(p)
		if err != nil {
			b.Fatal(err)
		}
		old = c.ScriptLoad(ctx, string(src)).Val()
	}
	if err := c.ScriptLoad(ctx, lua.DecideSource).Err(); err != nil {
		b.Fatal(err)
	}
	blob := lua.AppendCheck(nil, &store.Check{Limit: 1_000_000_000, Window: time.Second, Hits: 1})
	modes := []struct {
		name string
		cmds []string // the outer commands timed
		add  func(p redis.Pipeliner, key string)
	}{
		{"fcall", []string{"fcall"}, func(p redis.Pipeliner, key string) {
			p.FCall(ctx, lua.DecideFunction, []string{key}, "", lua.ModeDecide, blob)
		}},
		{"evalsha", []string{"evalsha"}, func(p redis.Pipeliner, key string) {
			p.EvalSha(ctx, lua.Decide.Hash(), []string{key}, "", lua.ModeDecide, blob)
		}},
		{"incrby+expire", []string{"incrby", "expire"}, func(p redis.Pipeliner, key string) {
			p.IncrBy(ctx, key, 1)
			p.Expire(ctx, key, 301e9)
		}},
	}
	if old != "" {
		modes = append(modes, struct {
			name string
			cmds []string
			add  func(p redis.Pipeliner, key string)
		}{"evalsha-old", []string{"evalsha"}, func(p redis.Pipeliner, key string) {
			p.EvalSha(ctx, old, []string{key}, "", lua.ModeDecide, blob)
		}})
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			resetStat(b, c)
			n := 0
			for b.Loop() {
				p := c.Pipeline()
				for range 50 {
					m.add(p, "rl:{cost}:"+m.name+strconv.Itoa(n%1000))
					n++
				}
				if _, err := p.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
			usec := 0.0
			for _, cmd := range m.cmds {
				usec += float64(usecOf(b, c, cmd))
			}
			b.ReportMetric(usec/float64(n), "redis-us/call")
		})
	}
}

// resetStat zeroes Redis's commandstats (CONFIG RESETSTAT).
func resetStat(b *testing.B, c *redis.Client) {
	if err := c.ConfigResetStat(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
}

// usecOf returns INFO commandstats' usec of cmd.
func usecOf(b *testing.B, c *redis.Client, cmd string) int64 {
	info := c.Info(context.Background(), "commandstats").Val()
	var calls, usec int64
	for line := range strings.Lines(info) {
		if _, err := fmt.Sscanf(line, "cmdstat_"+cmd+":calls=%d,usec=%d", &calls, &usec); err == nil {
			return usec
		}
	}
	b.Fatalf("no commandstats for %s", cmd)
	return 0
}

// BenchmarkScriptCostCold is BenchmarkScriptCost's calls one at a time,
// with 2 MiB of other memory touched between two calls: the regime of make bench's scenario (e) (5,000 decisions/s on a
// shared machine), where each call finds Redis's caches cold. It times a
// function that does nothing, one that runs TIME, GET and SET (the least a
// window's roll needs), decide.lua's rls_decide on one check, a plain
// INCRBY, and rls_decide rolling a key after a counter call's INCRBY, by
// INFO commandstats' usec per call.
//
//	go test -run '^$' -bench ScriptCostCold -benchtime 2000x ./pkg/store/redis/
func BenchmarkScriptCostCold(b *testing.B) {
	srv := redistest.StartServer(b)
	c := srv.Client()
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
	for _, lib := range []string{lua.Library,
		"#!lua name=costnop\nredis.register_function('cost_nop', function() return 1 end)",
		"#!lua name=costroll\nredis.register_function('cost_roll', function(k) local t = redis.call('TIME'); redis.call('GET', k[1]); redis.call('SET', k[1], t[1], 'PX', '2000'); return 1 end)",
	} {
		if err := c.FunctionLoadReplace(ctx, lib).Err(); err != nil {
			b.Fatal(err)
		}
	}
	blob := lua.AppendCheck(nil, &store.Check{Limit: 1_000_000_000, Window: time.Second, Hits: 1})
	modes := []struct {
		name, cmd string
		call      func(key string) error
	}{
		{"nop", "fcall", func(key string) error { return c.FCall(ctx, "cost_nop", []string{key}).Err() }},
		{"time+get+set", "fcall", func(key string) error { return c.FCall(ctx, "cost_roll", []string{key}).Err() }},
		{"decide", "fcall", func(key string) error {
			return c.FCall(ctx, lua.DecideFunction, []string{key}, "", lua.ModeDecide, blob).Err()
		}},
		{"incrby", "incrby", func(key string) error { return c.IncrBy(ctx, key, 8).Err() }},
		// A window's roll as scenario (e) makes it: a counter call's INCRBY
		// finds the previous window's value, and rls_decide takes it back
		// and decides (the SET and INCRBY that prepare it are not FCALL's).
		{"roll", "fcall", func(key string) error {
			check := store.Check{Limit: 1_000_000_000, Window: time.Second, Hits: 1}
			prev := time.Now().UnixMicro()/1_000_000 - 1
			if err := c.Set(ctx, key, (5*lua.CompactCounts)*8+prev%4, 2*time.Second).Err(); err != nil {
				return err
			}
			reply, err := c.IncrBy(ctx, key, lua.CounterStep(check.Algorithm)).Result()
			if err != nil {
				return err
			}
			return c.FCall(ctx, lua.DecideFunction, []string{key}, "", lua.ModeDecide, lua.AppendUndo(nil, &check, reply)).Err()
		}},
	}
	other := make([]byte, 2<<20)
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			resetStat(b, c)
			n := 0
			for b.Loop() {
				if err := m.call("rl:{cold}:" + m.name + strconv.Itoa(n%1000)); err != nil && err != redis.Nil {
					b.Fatal(err)
				}
				n++
				for i := range other { // the other work between two calls
					other[i]++
				}
			}
			b.ReportMetric(float64(usecOf(b, c, m.cmd))/float64(n), "redis-us/call")
		})
	}
}
