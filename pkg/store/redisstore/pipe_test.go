//go:build redis

package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/testkit"
)

// nodeOf returns the store's node at addr ("" outside cluster mode).
func nodeOf(t testing.TB, s *Store, addr string) *node {
	t.Helper()
	v, ok := s.nodes.Load(addr)
	if !ok {
		t.Fatalf("no node %q", addr)
	}
	return v.(*node)
}

// waitQueue waits until n calls are queued at the node and inflight round
// trips are in flight.
func waitQueue(t *testing.T, n *node, queued, inflight int) {
	t.Helper()
	testkit.WaitFor(t, fmt.Sprintf("%d calls queued, %d in flight", queued, inflight), 5*time.Second, func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return len(n.queue) == queued && n.inflight == inflight
	})
}

func isScript(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "evalsha", "eval", "fcall", "fcall_ro":
		return true
	}
	return false
}

// tripCounter is a go-redis hook counting round trips (a command alone or
// a pipeline), script calls, and commands answered MOVED or ASK.
type tripCounter struct {
	trips, scripts, redirects atomic.Int64
}

func (h *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count([]redis.Cmder{cmd})
		return err
	}
}

func (h *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.count(cmds)
		return err
	}
}

func (h *tripCounter) count(cmds []redis.Cmder) {
	h.trips.Add(1)
	for _, c := range cmds {
		if isScript(c) {
			h.scripts.Add(1)
		}
		if err := c.Err(); err != nil && (redis.HasErrorPrefix(err, "MOVED ") || redis.HasErrorPrefix(err, "ASK ")) {
			h.redirects.Add(1)
		}
	}
}

// counted returns a client for addr that honours context deadlines, does
// not retry, and counts its round trips.
func counted(addr string) (*redis.Client, *tripCounter) {
	h := &tripCounter{}
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	c.AddHook(h)
	return c, h
}

// TestPipelining: at low load each call is its own round trip, sent at
// once; calls that arrive while the node's round trips are all in flight
// leave together, in one pipeline per MaxBatch calls.
func TestPipelining(t *testing.T) {
	srv := redistest.StartServer(t)
	c, trips := counted(srv.Addr)
	defer c.Close()
	s := mustNew(t, Options{Client: c, Timeout: 5 * time.Second, MaxInFlight: 2, MaxBatch: 40})
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	n := nodeOf(t, s, "")

	before := trips.trips.Load()
	for i := range 20 {
		if r := decide(t, s, uniqueCheck("seq", i))[0]; !r.Allowed || r.Remaining != 9 {
			t.Errorf("call %d: %+v", i, r)
		}
	}
	if d := trips.trips.Load() - before; d != 20 {
		t.Errorf("20 sequential calls made %d round trips, want 20", d)
	}

	const calls = 100
	before = trips.trips.Load()
	srv.Pause()
	errs := make([]error, calls)
	res := make([]store.Result, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			r := make([]store.Result, 1)
			errs[i] = s.Decide(ctx, []store.Check{uniqueCheck("conc", i)}, r)
			res[i] = r[0]
		})
	}
	waitQueue(t, n, calls-2, 2)
	srv.Resume()
	wg.Wait()
	for i := range res {
		if errs[i] != nil || !res[i].Allowed || res[i].Remaining != 9 {
			t.Errorf("caller %d: %+v, %v", i, res[i], errs[i])
		}
	}
	// 2 alone, then the 98 queued in pipelines of at most 40. The pause
	// may have outlasted the clock's measurement: the calls sent meanwhile
	// could not be sure of their window, and took their hits back and
	// asked the script in one more round trip each.
	if d := trips.trips.Load() - before; d < 5 || d > 8 {
		t.Errorf("%d concurrent calls made %d round trips, want 5 (2 alone, 3 pipelines) to 8", calls, d)
	}
}

// TestPipelineNoScript: where FUNCTION is refused, SCRIPT FLUSH under
// traffic fails no decision: a call that meets NOSCRIPT in a pipeline is
// sent again with EVAL.
func TestPipelineNoScript(t *testing.T) {
	srv := startNoFunctions(t)
	c := srv.Client()
	defer c.Close()
	s := mustNew(t, Options{Client: c, Timeout: 5 * time.Second, MaxInFlight: 1, NoPlain: true})
	ctx := context.Background()
	var decided atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Go(func() {
			r := make([]store.Result, 1)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ch := uniqueCheck(fmt.Sprintf("flush%d", g), 0)
				ch.Limit = 1 << 40
				if err := s.Decide(ctx, []store.Check{ch}, r); err != nil {
					t.Errorf("goroutine %d call %d: %v", g, i, err)
					return
				}
				decided.Add(1)
			}
		})
	}
	for range 5 {
		waitProgress(t, &decided, 100)
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitProgress(t, &decided, 100)
	close(stop)
	wg.Wait()
	if ev := srv.CommandStats(ctx)["eval"]; ev < 5 {
		t.Errorf("%d EVAL calls after 5 SCRIPT FLUSH, want at least 5", ev)
	}
}

// TestClusterReshard: on a 3-master Cluster, moving tenants' slots between
// masters under traffic (MIGRATING, ASK, MOVED), on plain commands and the
// script alike, fails no decision and loses or doubles no hit.
func TestClusterReshard(t *testing.T) {
	t.Parallel() // real time on servers of its own
	c := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	var addrs []string
	for _, n := range c.Nodes {
		addrs = append(addrs, n.Addr)
	}
	h := &tripCounter{}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, MaxRedirects: 16, // as redisclient makes it
		NewClient: func(o *redis.Options) *redis.Client {
			nc := redis.NewClient(o)
			nc.AddHook(h)
			return nc
		}})
	defer cc.Close()
	s := mustNew(t, Options{Client: cc, Timeout: 10 * time.Second})
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// A second replica, scripts only: its sliding window's script call
	// declares the previous window's key, which does not exist, so a
	// MIGRATING slot answers TRYAGAIN until it has read the count alone.
	s2 := mustNew(t, Options{Client: cc, Timeout: 10 * time.Second, NoPlain: true})
	const tenants = 12
	check := func(tenant int, k string, hits uint64, alg store.Algorithm) store.Check {
		return store.Check{Key: fmt.Sprintf("rl:{t%d}:%s", tenant, k), Algorithm: alg, Limit: 1_000_000_000, Window: time.Hour, Hits: hits}
	}
	var total, totalZ [tenants]atomic.Int64
	var decided atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			r := make([]store.Result, 2)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				tenant, hits := (g+i)%tenants, uint64(1+(g+i)%5)
				// A fixed window and a token bucket (the script) of one tenant.
				batch := []store.Check{check(tenant, "x", hits, store.FixedWindow), check(tenant, "y", 1, store.TokenBucket)}
				st, count := s, &total[tenant]
				switch g % 4 {
				case 0, 2:
					batch = batch[:1] // plain commands alone
				case 1:
					batch, st, count = []store.Check{check(tenant, "z", hits, store.SlidingWindow)}, s2, &totalZ[tenant]
				}
				if err := st.Decide(ctx, batch, r[:len(batch)]); err != nil {
					t.Errorf("caller %d call %d (tenant %d): %v", g, i, tenant, err)
					return
				}
				if !r[0].Allowed {
					t.Errorf("tenant %d denied: %+v", tenant, r[0])
				}
				count.Add(int64(hits))
				decided.Add(1)
			}
		})
	}
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt()
	ids := map[*redistest.Server]string{}
	for _, n := range c.Nodes {
		rc := n.Client()
		id, err := rc.ClusterMyID(ctx).Result()
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		ids[n] = id
	}
	progressed := func() { waitProgress(t, &decided, 20) }
	progressed()
	for tenant := 0; tenant < tenants; tenant += 2 {
		key := check(tenant, "x", 0, 0).Key
		src := c.MasterOf(key)
		var dst *redistest.Server
		for i, n := range c.Nodes {
			if n == src {
				dst = c.Nodes[(i+1)%len(c.Nodes)]
			}
		}
		if err := migrateSlot(ctx, c, ids, Slot(key), src, dst, progressed); err != nil {
			t.Errorf("migrate tenant %d: %v", tenant, err)
			break
		}
		progressed()
	}
	halt()
	res := make([]store.Result, 1)
	for tenant := range tenants {
		if err := s.Peek(ctx, []store.Check{check(tenant, "x", 0, store.FixedWindow)}, res); err != nil {
			t.Fatal(err)
		}
		if want := uint64(1_000_000_000 - total[tenant].Load()); res[0].Remaining != want {
			t.Errorf("tenant %d: remaining %d, want %d (hits lost or doubled)", tenant, res[0].Remaining, want)
		}
		if err := s.Peek(ctx, []store.Check{check(tenant, "z", 0, store.SlidingWindow)}, res); err != nil {
			t.Fatal(err)
		}
		if want := uint64(1_000_000_000 - totalZ[tenant].Load()); res[0].Remaining != want {
			t.Errorf("tenant %d: sliding window remaining %d, want %d (hits lost or doubled)", tenant, res[0].Remaining, want)
		}
	}
	t.Logf("%d decisions, %d commands met MOVED or ASK, routes %v", decided.Load(), h.redirects.Load(), s.Routes())
	if h.redirects.Load() == 0 {
		t.Errorf("no command met MOVED or ASK")
	}
}

// migrateSlot moves slot from src to dst as redis-cli --cluster reshard
// does: IMPORTING/MIGRATING, MIGRATE the keys, then assign the slot. It
// calls progressed, which waits until traffic made progress, while the
// slot is MIGRATING and while its keys are on dst but the slot is not.
func migrateSlot(ctx context.Context, c *redistest.Cluster, ids map[*redistest.Server]string, slot int, src, dst *redistest.Server, progressed func()) error {
	client := func(n *redistest.Server) *redis.Client {
		return redis.NewClient(&redis.Options{Addr: n.Addr, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second})
	}
	sc, dc := client(src), client(dst)
	defer sc.Close()
	defer dc.Close()
	if err := dc.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src]).Err(); err != nil {
		return err
	}
	if err := sc.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst]).Err(); err != nil {
		return err
	}
	progressed() // traffic meets the MIGRATING state
	for {
		keys, err := sc.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		host, port, _ := strings.Cut(dst.Addr, ":")
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := sc.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("MIGRATE: %w", err)
		}
	}
	progressed() // traffic meets ASK
	// The new owner first, so that no node sends a client to one that
	// does not own the slot yet.
	order := []*redistest.Server{dst, src}
	for _, n := range c.Nodes {
		if n != src && n != dst {
			order = append(order, n)
		}
	}
	for i, n := range order {
		nc := client(n)
		err := nc.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[dst]).Err()
		nc.Close()
		if err != nil && i < 2 {
			return err
		}
	}
	return nil
}
