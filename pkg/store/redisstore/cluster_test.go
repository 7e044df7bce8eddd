//go:build redis

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/redisclient"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore/lua"
)

// TestCluster runs the store against a real 3-master Redis Cluster: one
// tenant's batch is one EVALSHA on the master that owns its slot; a batch of
// two tenants on different masters is one call on each, decided in
// parallel, and one unavailable master leaves the other's results valid.
func TestCluster(t *testing.T) {
	t.Parallel() // real time on servers of its own
	c := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	s, err := New(Options{Client: urlClient(t, redisclient.Options{URL: c.Seeds(), Mode: redisclient.ModeCluster, Timeout: time.Second}),
		CloseClient: true, Timeout: time.Second, NoPlain: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	// Ping loaded the Function library on every master.
	if got := s.ScriptModes(); got[ScriptFunction] != 3 {
		t.Errorf("ScriptModes() = %v after Ping, want 3 masters on functions", got)
	}
	for _, n := range c.Nodes {
		nc := n.Client()
		libs, err := nc.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: lua.LibraryName}).Result()
		nc.Close()
		if err != nil || len(libs) != 1 {
			t.Errorf("node %s: FUNCTION LIST = %+v, %v; want the library", n.Addr, libs, err)
		}
	}

	// Two tenants whose slots live on different masters.
	keyA := func(k string) string { return "rl:{dom|tenant-a}:" + k }
	ma := c.MasterOf(keyA("x"))
	var keyB func(string) string
	var mb *redistest.Server
	for i := 0; mb == nil || mb == ma; i++ {
		tag := fmt.Sprintf("dom|tenant-b%d", i)
		keyB = func(k string) string { return "rl:{" + tag + "}:" + k }
		mb = c.MasterOf(keyB("x"))
	}
	if ma == nil {
		t.Fatal("no master for tenant a")
	}

	// Slot agrees with the server's CLUSTER KEYSLOT.
	rc := ma.Client()
	defer rc.Close()
	for _, k := range []string{keyA("x"), keyB("y"), "plain", "a{}b", "{}", "{x"} {
		want, err := rc.ClusterKeySlot(ctx, k).Result()
		if err != nil || int64(Slot(k)) != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT = %d, %v", k, Slot(k), want, err)
		}
	}

	sliding := func(key string, limit, hits uint64) store.Check {
		return store.Check{Key: key, Limit: limit, Window: time.Minute, Hits: hits}
	}
	evalshas := func() map[*redistest.Server]int64 {
		m := map[*redistest.Server]int64{}
		for _, n := range c.Nodes {
			st := n.CommandStats(ctx)
			m[n] = st["evalsha"] + st["eval"] + st["fcall"]
		}
		return m
	}
	diff := func(before, after map[*redistest.Server]int64) map[*redistest.Server]int64 {
		d := map[*redistest.Server]int64{}
		for n, v := range after {
			if v != before[n] {
				d[n] = v - before[n]
			}
		}
		return d
	}

	t.Run("one tenant, one call", func(t *testing.T) {
		batch := []store.Check{sliding(keyA("a"), 10, 1), sliding(keyA("b"), 20, 2), sliding(keyA("c"), 30, 3)}
		decide(t, s, batch...) // load the script on ma
		before := evalshas()
		res := decide(t, s, batch...)
		got := diff(before, evalshas())
		if len(got) != 1 || got[ma] != 1 {
			t.Errorf("script calls per node: %v; want 1 on %s only", got, ma.Addr)
		}
		if res[0].Remaining != 8 || res[1].Remaining != 16 || res[2].Remaining != 24 {
			t.Errorf("results %+v", res)
		}
	})

	t.Run("two tenants, one call each", func(t *testing.T) {
		batch := []store.Check{sliding(keyA("p"), 10, 1), sliding(keyB("q"), 20, 2), sliding(keyA("r"), 30, 3), sliding(keyB("s"), 40, 4)}
		decide(t, s, batch...)
		before := evalshas()
		res := decide(t, s, batch...)
		got := diff(before, evalshas())
		if len(got) != 2 || got[ma] != 1 || got[mb] != 1 {
			t.Errorf("script calls per node: %v; want 1 on each of %s and %s", got, ma.Addr, mb.Addr)
		}
		for i, want := range []uint64{8, 16, 24, 32} {
			if !res[i].Allowed || res[i].Remaining != want || res[i].Undecided {
				t.Errorf("check %d: %+v, want allowed with %d remaining", i, res[i], want)
			}
		}
	})

	t.Run("delete across slots", func(t *testing.T) {
		checks := []store.Check{sliding(keyA("a"), 10, 0), sliding(keyB("q"), 20, 0), sliding(keyA("b"), 20, 0)}
		if err := s.Delete(ctx, checks...); err != nil {
			t.Fatal(err)
		}
		for i, r := range decide(t, s, checks...) {
			if r.Remaining != checks[i].Limit {
				t.Errorf("after Delete, %s: %+v, want the whole limit left", checks[i].Key, r)
			}
		}
	})

	t.Run("plain commands on the owning master", func(t *testing.T) {
		ps := mustNew(t, Options{Client: urlClient(t, redisclient.Options{URL: c.Seeds(), Mode: redisclient.ModeCluster, Timeout: time.Second}),
			CloseClient: true, Timeout: time.Second})
		if err := ps.Ping(ctx); err != nil { // learns every master's clock
			t.Fatal(err)
		}
		incrs := func() map[*redistest.Server]int64 {
			m := map[*redistest.Server]int64{}
			for _, n := range c.Nodes {
				m[n] = n.CommandStats(ctx)["incrby"]
			}
			return m
		}
		// On a busy machine a clock measurement can come back wider than
		// clockWidth, and then a call goes to the script (as it should):
		// such an attempt is taken again on fresh keys.
		for attempt := range 3 {
			scripted := func() uint64 { r := ps.Routes(); return r[RoutePlainScript] + r[RouteScript] }
			before, s0 := incrs(), scripted()
			var res []store.Result
			for range 5 {
				res = decide(t, ps, sliding(keyB(fmt.Sprint("plain", attempt)), 10, 1), sliding(keyB(fmt.Sprint("plain2-", attempt)), 10, 2))
			}
			if scripted() != s0 && attempt < 2 {
				t.Logf("attempt %d: a call went to the script (the clock's bounds were too wide); again", attempt)
				continue
			}
			if got := diff(before, incrs()); len(got) != 1 || got[mb] != 10 {
				t.Errorf("INCRBY per node %v, want 10 on %s only", got, mb.Addr)
			}
			if res[0].Remaining != 5 || res[1].Remaining != 0 || ps.Routes()[RoutePlain] == 0 {
				t.Errorf("results %+v, routes %v", res, ps.Routes())
			}
			break
		}
	})

	t.Run("one master hung", func(t *testing.T) {
		const timeout = 100 * time.Millisecond
		batch := []store.Check{sliding(keyA("h"), 10, 1), sliding(keyB("h"), 10, 1)}
		mb.Pause()
		start := time.Now()
		res := make([]store.Result, 2)
		dctx, cancel := context.WithTimeout(ctx, timeout)
		err := s.Decide(dctx, batch, res)
		cancel()
		took := time.Since(start)
		mb.Resume()
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Decide = %v, want ErrUnavailable", err)
		}
		if took > timeout+2*time.Second { // bounded by the deadline, however busy the machine
			t.Errorf("Decide took %v with a %v timeout", took, timeout)
		}
		if !res[0].Allowed || res[0].Remaining != 9 || res[0].Undecided {
			t.Errorf("tenant a on a live master: %+v, want decided", res[0])
		}
		if !res[1].Undecided {
			t.Errorf("tenant b on the hung master: %+v, want Undecided", res[1])
		}
	})
}
