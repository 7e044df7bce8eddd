//go:build redis

package redisstore

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore/lua"
)

// BenchmarkScriptCost measures what Redis spends on one decision of one
// check (a sliding window hit on one of 1,000 keys) by FCALL and by
// EVALSHA, and by plain commands (INCRBY, PEXPIRE and GET of the previous
// window), next to the two commands envoyproxy/ratelimit sends per
// decision (INCRBY and EXPIRE). Calls go 50 to a pipeline; the figure is INFO commandstats'
// usec of the outer commands (a script's includes the commands it runs)
// per call: redis-us/call. RLS_OLD_DECIDE_LUA, when set, names another
// decide.lua to time by EVALSHA too (a version before a change, of the
// same check layout: CheckBytes).
//
//	go test -run '^$' -bench ScriptCost -count 5 ./pkg/store/redisstore/
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
	hour := time.Now().Unix() / 3600 * 3600 // an hour's window: no call crosses its end
	blob := lua.AppendCheck(nil, &store.Check{Limit: 1_000_000_000, Window: time.Hour, Hits: 1}, hour, -1)
	wkeys := func(key string) []string {
		return lua.Keys(nil, &store.Check{Key: key, Window: time.Hour}, hour, false)
	}
	modes := []struct {
		name string
		cmds []string // the outer commands timed
		add  func(p redis.Pipeliner, key string)
	}{
		{"fcall", []string{"fcall"}, func(p redis.Pipeliner, key string) {
			p.FCall(ctx, lua.DecideFunction, wkeys(key), "", lua.ModeDecide, blob)
		}},
		{"evalsha", []string{"evalsha"}, func(p redis.Pipeliner, key string) {
			p.EvalSha(ctx, lua.Decide.Hash(), wkeys(key), "", lua.ModeDecide, blob)
		}},
		{"incrby+expire", []string{"incrby", "expire"}, func(p redis.Pipeliner, key string) {
			p.IncrBy(ctx, key, 1)
			p.Expire(ctx, key, 301e9)
		}},
		{"plain", []string{"incrby", "pexpire", "get"}, func(p redis.Pipeliner, key string) {
			p.IncrBy(ctx, key+":2", 1)
			p.PExpire(ctx, key+":2", 3*time.Second)
			p.Get(ctx, key+":1")
		}},
	}
	if old != "" {
		modes = append(modes, struct {
			name string
			cmds []string
			add  func(p redis.Pipeliner, key string)
		}{"evalsha-old", []string{"evalsha"}, func(p redis.Pipeliner, key string) {
			p.EvalSha(ctx, old, wkeys(key), "", lua.ModeDecide, blob)
		}})
	}
	for i := range 1000 { // the previous windows' counts the plain commands read
		c.Set(ctx, "rl:{cost}:plain"+strconv.Itoa(i)+":1", 5, time.Hour)
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
				u, ok := srv.CommandUsec(ctx)[cmd]
				if !ok {
					b.Fatalf("no commandstats for %s", cmd)
				}
				usec += float64(u)
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
