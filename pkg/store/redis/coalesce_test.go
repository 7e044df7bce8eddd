package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/lua"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/testkit"
)

// nodeCoalescer returns node's coalescer ("" outside cluster mode).
func nodeCoalescer(t testing.TB, s *Store, node string) *coalescer {
	t.Helper()
	v, ok := s.coalescers.Load(node)
	if !ok {
		t.Fatalf("no coalescer for node %q", node)
	}
	return v.(*coalescer)
}

// waitQueue waits until co has n calls queued and inflight sends in flight.
func waitQueue(t *testing.T, co *coalescer, n, inflight int) {
	t.Helper()
	testkit.WaitFor(t, fmt.Sprintf("%d calls queued, %d in flight", n, inflight), 5*time.Second, func() bool {
		co.mu.Lock()
		defer co.mu.Unlock()
		return len(co.queue) == n && co.inflight == inflight
	})
}

// uniqueCheck is caller i's check: its own key and i+1 hits of a large
// limit, so Remaining tells which caller a reply was meant for.
func uniqueCheck(prefix string, i int) store.Check {
	return store.Check{Key: fmt.Sprintf("rl:{%s}:k%d", prefix, i), Limit: 100_000, Window: time.Hour, Hits: uint64(i + 1)}
}

// TestCoalescing checks the flush policy on one node: sequential calls go
// out alone, at once; 100 calls arriving while the node's sends are busy
// leave as one script call deciding all of them, and every caller gets its
// own result.
func TestCoalescing(t *testing.T) {
	srv := redistest.StartServer(t)
	c, sent := counted(srv.Addr)
	defer c.Close()
	s := mustNew(t, Options{Client: c, Timeout: 5 * time.Second, MaxInFlight: 2, MaxBatch: 128, NoCounters: true})
	ctx := context.Background()
	decide(t, s, uniqueCheck("warm", 0)) // loads the script
	co := nodeCoalescer(t, s, "")

	t.Run("low load: each call alone, at once", func(t *testing.T) {
		before := sent.stats()
		for i := 0; i < 20; i++ {
			start := time.Now()
			r := decide(t, s, uniqueCheck("seq", i))[0]
			// Not held back for a batch: well within the 5 s timeout,
			// however busy the machine (the sends below count the batches).
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("call %d took %v", i, took)
			}
			if r.Remaining != 100_000-uint64(i+1) {
				t.Errorf("call %d: %+v", i, r)
			}
		}
		after := sent.stats()
		if d := after.Sends() - before.Sends(); d != 20 {
			t.Errorf("20 sequential calls made %d sends, want 20", d)
		}
		if d := after.Pipelines - before.Pipelines; d != 0 {
			t.Errorf("20 sequential calls made %d pipelines, want 0", d)
		}
	})

	t.Run("100 concurrent calls", func(t *testing.T) {
		const n = 100
		before, statsBefore := sent.stats(), srv.CommandStats(ctx)
		// Hold the node so that two calls are in flight and 98 queue
		// behind them, then let it answer.
		srv.Pause()
		res := make([]store.Result, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := make([]store.Result, 1)
				errs[i] = s.Decide(ctx, []store.Check{uniqueCheck("conc", i)}, r)
				res[i] = r[0]
			}()
		}
		waitQueue(t, co, n-2, 2)
		srv.Resume()
		wg.Wait()
		for i := range res {
			if errs[i] != nil || !res[i].Allowed || res[i].Remaining != 100_000-uint64(i+1) {
				t.Errorf("caller %d: %+v, %v; want allowed with %d remaining", i, res[i], errs[i], 100_000-(i+1))
			}
		}
		after, statsAfter := sent.stats(), srv.CommandStats(ctx)
		if d := statsAfter["fcall"] - statsBefore["fcall"]; d != 3 {
			t.Errorf("FCALL calls: %d, want 3 (2 alone, then 1 deciding the other %d)", d, n-2)
		}
		sends := after.Sends() - before.Sends()
		if sends != 3 {
			t.Errorf("%d calls made %d round trips, want 3", n, sends)
		}
		if d := after.Merged - before.Merged; d != 1 || after.MaxMerged != n-2 || after.Requests-before.Requests != n {
			t.Errorf("merged script calls %d (largest %d requests, %d in all), want 1 of %d", d, after.MaxMerged, after.Requests-before.Requests, n-2)
		}
		t.Logf("%d concurrent calls: %d round trips, %d FCALL", n, sends, statsAfter["fcall"]-statsBefore["fcall"])
	})

	t.Run("batch cap", func(t *testing.T) {
		c, sent := counted(srv.Addr)
		defer c.Close()
		s := mustNew(t, Options{Client: c, Timeout: 5 * time.Second, MaxInFlight: 1, MaxBatch: 10, NoCounters: true})
		decide(t, s, uniqueCheck("warm", 1))
		co := nodeCoalescer(t, s, "")
		srv.Pause()
		var wg sync.WaitGroup
		var failed atomic.Int64
		for i := 0; i < 31; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := make([]store.Result, 1)
				if err := s.Decide(ctx, []store.Check{uniqueCheck("cap", i)}, r); err != nil || r[0].Remaining != 100_000-uint64(i+1) {
					failed.Add(1)
				}
			}()
		}
		waitQueue(t, co, 30, 1)
		srv.Resume()
		wg.Wait()
		st := sent.stats()
		if failed.Load() != 0 || st.Merged != 3 || st.MaxMerged != 10 || st.Requests != 32 {
			t.Errorf("failed %d, stats %+v; want 0 failed and 3 script calls of 10 requests", failed.Load(), st)
		}
	})
}

// TestCoalescedDeadline checks that a caller whose deadline passes stops
// waiting, with ErrUnavailable and Undecided, whether its call is still
// queued or already in a pipeline, and that the others' results are right.
func TestCoalescedDeadline(t *testing.T) {
	srv := redistest.StartServer(t)
	c, sent := counted(srv.Addr)
	defer c.Close()
	s := mustNew(t, Options{Client: c, Timeout: 10 * time.Second, MaxInFlight: 1, MaxBatch: 128, NoCounters: true})
	decide(t, s, uniqueCheck("warm", 0))
	co := nodeCoalescer(t, s, "")

	type outcome struct {
		res  store.Result
		err  error
		took time.Duration
	}
	start := func(i int, timeout time.Duration) chan outcome {
		ch := make(chan outcome, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			r := make([]store.Result, 1)
			begin := time.Now()
			err := s.Decide(ctx, []store.Check{uniqueCheck("dl", i)}, r)
			ch <- outcome{r[0], err, time.Since(begin)}
		}()
		return ch
	}
	expectTimeout := func(name string, o outcome, timeout time.Duration) {
		t.Helper()
		if !errors.Is(o.err, store.ErrUnavailable) || !errors.Is(o.err, context.DeadlineExceeded) || !o.res.Undecided {
			t.Errorf("%s: %+v, %v; want Undecided and an ErrUnavailable, DeadlineExceeded timeout", name, o.res, o.err)
		}
		if !strings.Contains(fmt.Sprint(o.err), "the caller's deadline") {
			t.Errorf("%s: %v; want it to say the caller's deadline ran out", name, o.err)
		}
		if o.took > timeout+2*time.Second {
			t.Errorf("%s took %v with a %v deadline", name, o.took, timeout)
		}
	}

	// A is in flight alone on a hung node; B (long) and C (short) queue.
	srv.Pause()
	a := start(0, 400*time.Millisecond)
	waitQueue(t, co, 0, 1)
	b := start(1, 10*time.Second)
	cc := start(2, 900*time.Millisecond)
	waitQueue(t, co, 2, 1)
	// A times out; B and C then leave as one script call, which hangs too:
	// C's deadline passes while it is in that call.
	expectTimeout("A (in flight alone)", <-a, 400*time.Millisecond)
	waitQueue(t, co, 0, 1)
	expectTimeout("C (in a merged call)", <-cc, 900*time.Millisecond)
	// D queues and gives up before anything returns.
	d := start(3, 200*time.Millisecond)
	expectTimeout("D (queued)", <-d, 200*time.Millisecond)
	srv.Resume()
	ob := <-b
	if ob.err != nil || !ob.res.Allowed || ob.res.Remaining != 100_000-2 {
		t.Errorf("B: %+v, %v; want allowed with %d remaining", ob.res, ob.err, 100_000-2)
	}
	if st := sent.stats(); st.Merged != 1 || st.MaxMerged != 2 {
		t.Errorf("stats %+v, want one script call deciding B and C", st)
	}
	// The store still works, and D (abandoned while queued) was not sent:
	// its key was never written.
	decide(t, s, uniqueCheck("after", 0))
	if n, _ := c.Exists(context.Background(), uniqueCheck("dl", 3).Key).Result(); n != 0 {
		t.Errorf("D's call was sent after its caller gave up")
	}
}

// TestPipelineNoScript checks that a pipeline meeting NOSCRIPT (SCRIPT FLUSH,
// a new node) re-sends those script calls once, loading the script with one
// EVAL, and that flushing the script cache mid-traffic fails no decision.
func TestPipelineNoScript(t *testing.T) {
	srv := startNoFunctions(t)
	c, sent := counted(srv.Addr)
	defer c.Close()
	s := mustNew(t, Options{Client: c, Timeout: 5 * time.Second, MaxInFlight: 1, MaxBatch: 128, NoCounters: true})
	ctx := context.Background()
	decide(t, s, uniqueCheck("warm", 0))
	co := nodeCoalescer(t, s, "")

	t.Run("one pipeline", func(t *testing.T) {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		before, sentBefore := srv.CommandStats(ctx), sent.stats()
		// Drive the pipeline path directly: 20 queued calls, one batch, in
		// two script calls (calls with another clock argument are not
		// merged), so one pipeline.
		const n = 20
		clock := strconv.FormatInt(time.Now().UnixMicro(), 10)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		batch := make([]*call, n)
		for i := range batch {
			cl := getCall()
			ch := uniqueCheck("noscript", i)
			cl.keys = append(cl.keys, ch.Key)
			now := ""
			if i%2 == 1 {
				now = clock
			}
			cl.args = append(cl.args, now, lua.ModeDecide, lua.AppendCheck(nil, &store.Check{Algorithm: store.SlidingWindow, Limit: 100_000, Window: time.Hour, Hits: uint64(i + 1)}))
			cl.ctx = cctx
			batch[i] = cl
		}
		calls := append([]*call(nil), batch...)
		co.send(batch, &scratch{})
		for i, cl := range calls {
			select {
			case <-cl.done:
			default:
				t.Fatalf("call %d not delivered", i)
			}
			if cl.err != nil || len(cl.reply) != lua.ResultBytes {
				t.Fatalf("call %d: %q, %v", i, cl.reply, cl.err)
			}
			r := decodeResult(lua.ResultAt(cl.reply, 0))
			if !r.Allowed || r.Remaining != 100_000-uint64(i+1) {
				t.Errorf("call %d: %+v", i, r)
			}
		}
		after := srv.CommandStats(ctx)
		if d := after["eval"] - before["eval"]; d != 1 {
			t.Errorf("%d EVAL calls, want 1", d)
		}
		if st := sent.stats(); st.NoScript-sentBefore.NoScript != 1 || st.Pipelines-sentBefore.Pipelines != 2 {
			t.Errorf("%d pipelines (%d re-sent after NOSCRIPT), want 2 (1)", st.Pipelines-sentBefore.Pipelines, st.NoScript-sentBefore.NoScript)
		}
	})

	t.Run("SCRIPT FLUSH mid-traffic", func(t *testing.T) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var decided, failed atomic.Int64
		for g := 0; g < 50; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := make([]store.Result, 1)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if err := s.Decide(ctx, []store.Check{uniqueCheck(fmt.Sprintf("flush%d", g), 0)}, r); err != nil {
						failed.Add(1)
						t.Errorf("goroutine %d call %d: %v", g, i, err)
						return
					}
					decided.Add(1)
				}
			}()
		}
		halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
		defer halt()
		before := sent.stats()
		// Flush the script cache ten times, each time once the callers
		// have made 100 more decisions, then let them make 100 more.
		for i := 0; i <= 10; i++ {
			waitProgress(t, &decided, 100)
			if i == 10 {
				break
			}
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		halt()
		after := sent.stats()
		t.Logf("%d decisions, %d failed, %d round trips, %d merged script calls, %d re-sent after NOSCRIPT", decided.Load(), failed.Load(),
			after.Sends()-before.Sends(), after.Merged-before.Merged, after.NoScript-before.NoScript)
		if after.Merged == before.Merged {
			t.Errorf("50 callers made no merged script call")
		}
	})
}

// TestCoalescedCluster checks coalescing on a 3-master cluster: concurrent
// callers of many tenants get their own results from the masters that own
// their slots, and moving slots between masters under traffic (MIGRATING,
// ASK, MOVED) fails no decision and loses or doubles no hit.
func TestCoalescedCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	clk := testkit.NewClock(time.UnixMicro(t0))
	var addrs []string
	for _, n := range c.Nodes {
		addrs = append(addrs, n.Addr)
	}
	cc, sent := countedCluster(addrs)
	defer cc.Close()
	s := mustNew(t, Options{Client: cc, Clock: clk.Now, Timeout: 10 * time.Second, MaxInFlight: 1})

	const tenants = 24
	check := func(tenant int, hits uint64) store.Check {
		return store.Check{Key: fmt.Sprintf("rl:{t%d}:x", tenant), Limit: 1_000_000_000, Window: time.Hour, Hits: hits}
	}
	var total [tenants]atomic.Int64 // hits decided per tenant
	var decided atomic.Int64        // calls decided
	run := func(stop <-chan struct{}, callers, calls int) {
		var wg sync.WaitGroup
		for g := 0; g < callers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := make([]store.Result, 2)
				for i := 0; calls == 0 || i < calls; i++ {
					select {
					case <-stop:
						return
					default:
					}
					tenant, hits := (g+i)%tenants, uint64(1+(g+i)%5)
					// Two checks of one tenant: one slot, one call.
					batch := []store.Check{check(tenant, hits), {Key: fmt.Sprintf("rl:{t%d}:y", tenant), Limit: 1_000_000_000, Window: time.Hour, Hits: 1}}
					if err := s.Decide(ctx, batch, r); err != nil {
						t.Errorf("caller %d call %d (tenant %d): %v", g, i, tenant, err)
						return
					}
					total[tenant].Add(int64(hits))
					decided.Add(1)
					if !r[0].Allowed {
						t.Errorf("tenant %d denied: %+v", tenant, r[0])
					}
				}
			}()
		}
		wg.Wait()
	}
	verify := func() {
		t.Helper()
		res := make([]store.Result, 1)
		for tenant := 0; tenant < tenants; tenant++ {
			if err := s.Peek(ctx, []store.Check{check(tenant, 0)}, res); err != nil {
				t.Fatal(err)
			}
			if want := uint64(1_000_000_000 - total[tenant].Load()); res[0].Remaining != want {
				t.Errorf("tenant %d: remaining %d, want %d (hits lost or doubled)", tenant, res[0].Remaining, want)
			}
		}
	}

	t.Run("concurrent tenants", func(t *testing.T) {
		run(nil, 50, 40)
		verify()
		st := sent.stats()
		t.Logf("sent: %+v", st)
		if st.Sends() >= st.Calls {
			t.Errorf("%d calls took %d round trips; want fewer", st.Calls, st.Sends())
		}
	})

	t.Run("resharding", func(t *testing.T) {
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			run(stop, 20, 0)
		}()
		halt := sync.OnceFunc(func() { close(stop); <-done })
		defer halt()
		progressed := func() { waitProgress(t, &decided, 20) }
		// Move every tenant's slot to the next master, one slot at a time.
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
		moved := 0
		for tenant := 0; tenant < tenants; tenant += 2 {
			key := check(tenant, 0).Key
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
			moved++
			progressed()
		}
		waitProgress(t, &decided, 100)
		halt()
		verify()
		st := sent.stats()
		t.Logf("moved %d slots under traffic; %d script calls met MOVED or ASK; sent: %+v", moved, st.Redirects, st)
		if st.Redirects == 0 {
			t.Errorf("no call met MOVED or ASK")
		}
	})
}

// migrateSlot moves slot from src to dst as redis-cli --cluster reshard
// does: IMPORTING/MIGRATING, MIGRATE the keys, then assign the slot. It
// calls progressed, which waits until traffic made progress, while the
// slot is MIGRATING and while its keys are on dst but the slot is not.
func migrateSlot(ctx context.Context, c *redistest.Cluster, ids map[*redistest.Server]string, slot int, src, dst *redistest.Server, progressed func()) error {
	// Generous socket timeouts: the machine may be loaded.
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
	for _, n := range []*redistest.Server{dst, src} {
		nc := client(n)
		err := nc.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[dst]).Err()
		nc.Close()
		if err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		if n == src || n == dst {
			continue
		}
		nc := client(n)
		_ = nc.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[dst]).Err()
		nc.Close()
	}
	return nil
}

// TestMergedRequestsStayApart checks that requests merged into one script
// call are decided one by one, in order, each all-or-nothing: a denied
// request consumes nothing even from a key that the requests before and
// after it consume.
func TestMergedRequestsStayApart(t *testing.T) {
	srv := redistest.StartServer(t)
	c, sent := counted(srv.Addr)
	defer c.Close()
	s := mustNew(t, Options{Client: c, Timeout: 5 * time.Second, MaxInFlight: 1, MaxBatch: 128, NoCounters: true})
	ctx := context.Background()
	x := store.Check{Key: "rl:{apart}:x", Algorithm: store.FixedWindow, Limit: 4, Window: time.Hour}
	y := store.Check{Key: "rl:{apart}:y", Algorithm: store.FixedWindow, Limit: 1, Window: time.Hour}
	hits := func(c store.Check, h uint64) store.Check { c.Hits = h; return c }
	decide(t, s, hits(y, 1)) // y is used up

	srv.Pause()
	reqs := [][]store.Check{
		{hits(x, 2)},             // allowed: x 2 of 4
		{hits(x, 1), hits(y, 1)}, // denied by y: x (itself within its limit) not consumed
		{hits(x, 2)},             // allowed: x 4 of 4
		{hits(x, 1)},             // denied
	}
	blocker := make(chan error, 1)
	go func() { blocker <- s.Decide(ctx, []store.Check{hits(x, 0)}, make([]store.Result, 1)) }()
	co := nodeCoalescer(t, s, "")
	waitQueue(t, co, 0, 1)
	res := make([][]store.Result, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		res[i] = make([]store.Result, len(r))
		wg.Go(func() { errs[i] = s.Decide(ctx, r, res[i]) })
		waitQueue(t, co, i+1, 1) // queued in this order
	}
	srv.Resume()
	wg.Wait()
	if err := <-blocker; err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	got := fmt.Sprint(res[0][0].Allowed, res[0][0].Remaining, res[1][0].Allowed, res[1][1].Allowed,
		res[2][0].Allowed, res[2][0].Remaining, res[3][0].Allowed, res[3][0].Remaining)
	if want := "true 2 true false true 0 false 0"; got != want {
		t.Errorf("results %s, want %s: %+v", got, want, res)
	}
	if st := sent.stats(); st.Merged != 1 || st.MaxMerged != int64(len(reqs)) {
		t.Errorf("stats %+v, want the %d requests in one script call", st, len(reqs))
	}
	if n := stateOf(t, c, x.Key).Count; n != 4 {
		t.Errorf("x count %v, want 4", n)
	}
}
