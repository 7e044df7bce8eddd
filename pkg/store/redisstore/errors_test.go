//go:build redis

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/breaker"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore/lua"
	"github.com/rls-project/rls/pkg/testkit"
)

// TestDeadlineBudget: a call whose context has a deadline is bounded by it,
// even when it is longer than the store's timeout; a call without one is
// bounded by the store's timeout. Errors say which.
func TestDeadlineBudget(t *testing.T) {
	t.Parallel() // real time on servers of its own
	const timeout = 50 * time.Millisecond
	const deadline = 400 * time.Millisecond
	srv := redistest.StartServer(t)
	c := srv.Client()
	defer c.Close()
	// A breaker that never opens: every call here fails.
	s := mustNew(t, Options{Client: c, Timeout: timeout, Breaker: breaker.Options{Threshold: 1 << 30}})
	check := []store.Check{{Key: "rl:{budget}:x", Limit: 10, Window: time.Second, Hits: 1}}
	decide(t, s, check...) // warm the pool and the script cache
	srv.Pause()
	defer srv.Resume()

	ops := map[string]func(context.Context) error{
		"decide": func(ctx context.Context) error { return s.Decide(ctx, check, make([]store.Result, 1)) },
		"peek":   func(ctx context.Context) error { return s.Peek(ctx, check, make([]store.Result, 1)) },
		"delete": func(ctx context.Context) error { return s.Delete(ctx, check...) },
	}
	for name, op := range ops {
		start := time.Now()
		err := op(context.Background())
		took := time.Since(start)
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(fmt.Sprint(err), "the store timeout (50ms)") {
			t.Errorf("%s without a deadline: %v; want ErrUnavailable, DeadlineExceeded, the store timeout", name, err)
		}
		// Not before the store timeout; the error names which bound ran
		// out, so the upper bound only catches a hang.
		if took < timeout || took > timeout+2*time.Second {
			t.Errorf("%s without a deadline took %v; want about the store timeout %v", name, took, timeout)
		}

		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start = time.Now()
		err = op(ctx)
		took = time.Since(start)
		cancel()
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(fmt.Sprint(err), "the caller's deadline") {
			t.Errorf("%s with a deadline: %v; want ErrUnavailable, DeadlineExceeded, the caller's deadline", name, err)
		}
		if took < deadline-10*time.Millisecond || took > deadline+2*time.Second {
			t.Errorf("%s with a %v deadline took %v; want the deadline, not the store timeout %v", name, deadline, took, timeout)
		}
	}
}

// TestQueueWaitsAreNotFailures: calls whose caller's deadline passes while
// they are queued behind a slow send fail (ErrUnavailable, DeadlineExceeded:
// their callers fall back), but the breaker does not count them: only the
// send itself could be a failure, and it succeeds.
func TestQueueWaitsAreNotFailures(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	defer c.Close()
	var mu sync.Mutex
	var changes []string
	// Two failures 1 ns apart would open this breaker.
	s := mustNew(t, Options{Client: c, Timeout: 5 * time.Second, MaxInFlight: 1,
		Breaker: breaker.Options{Threshold: 1, FailWindow: time.Nanosecond},
		OnBreakerChange: func(node string, from, to breaker.State) {
			mu.Lock()
			changes = append(changes, from.String()+">"+to.String())
			mu.Unlock()
		}})
	decide(t, s, uniqueCheck("warm", 0))
	n := nodeOf(t, s, "")

	srv.Pause()
	slow := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		slow <- s.Decide(ctx, []store.Check{uniqueCheck("q", 0)}, make([]store.Result, 1))
	}()
	waitQueue(t, n, 0, 1)
	const queued = 10
	errs := make([]error, queued)
	res := make([]store.Result, queued)
	var wg sync.WaitGroup
	for i := range queued {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			r := make([]store.Result, 1)
			errs[i] = s.Decide(ctx, []store.Check{uniqueCheck("q", i+1)}, r)
			res[i] = r[0]
		})
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !res[i].Undecided ||
			!strings.Contains(err.Error(), "still queued") {
			t.Errorf("queued caller %d: %+v, %v; want Undecided, ErrUnavailable, DeadlineExceeded, still queued", i, res[i], err)
		}
	}
	srv.Resume()
	if err := <-slow; err != nil {
		t.Errorf("the call in flight: %v", err)
	}
	decide(t, s, uniqueCheck("after", 0))
	mu.Lock()
	defer mu.Unlock()
	if st := s.BreakerStates()[""]; st != breaker.Closed || len(changes) != 0 {
		t.Errorf("breaker %v after changes %v; want closed throughout", st, changes)
	}
}

// TestScriptErrorIsProtocol: a script error (here the script refusing a
// request argument that a hook cut short, as corrupt data would be) is
// ErrProtocol, not ErrUnavailable, marks no result Undecided, and leaves
// the breaker closed however often it happens, alone or in pipelines.
func TestScriptErrorIsProtocol(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	defer c.Close()
	c.AddHook(argCutter{})
	s := mustNew(t, Options{Client: c, Timeout: 5 * time.Second, MaxInFlight: 1, NoPlain: true,
		Breaker: breaker.Options{Threshold: 1, FailWindow: time.Nanosecond}})
	ctx := context.Background()
	bad := store.Check{Key: "rl:{bad}:x", Limit: 10, Window: time.Second, Hits: 3}
	expect := func(name string, err error, r store.Result) {
		t.Helper()
		if !errors.Is(err, store.ErrProtocol) || errors.Is(err, store.ErrUnavailable) || r.Undecided ||
			!strings.Contains(fmt.Sprint(err), "decide.lua: "+strconv.Itoa(lua.CheckBytes-1)+" bytes of checks") {
			t.Errorf("%s: %+v, %v; want the script's error as ErrProtocol, not ErrUnavailable, not Undecided", name, r, err)
		}
	}
	for i := 0; i < 5; i++ {
		r := make([]store.Result, 1)
		expect(fmt.Sprintf("call %d", i), s.Decide(ctx, []store.Check{bad}, r), r[0])
	}
	// In a pipeline: one call in flight on a paused node, five queued.
	n := nodeOf(t, s, "")
	srv.Pause()
	errs := make([]error, 6)
	res := make([]store.Result, 6)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			r := make([]store.Result, 1)
			errs[i] = s.Decide(ctx, []store.Check{bad}, r)
			res[i] = r[0]
		})
		if i == 0 {
			waitQueue(t, n, 0, 1)
		}
	}
	waitQueue(t, n, 5, 1)
	srv.Resume()
	wg.Wait()
	for i := range errs {
		expect(fmt.Sprintf("pipelined call %d", i), errs[i], res[i])
	}
	if st := s.BreakerStates()[""]; st != breaker.Closed {
		t.Errorf("breaker %v after script errors; want closed", st)
	}
	// A good check still decides.
	decide(t, s, store.Check{Key: "rl:{bad}:y", Limit: 10, Window: time.Second, Hits: 1})
}

// argCutter is a go-redis hook that cuts the last byte off the last
// argument of script calls whose checks ask for 3 hits.
type argCutter struct{}

func (argCutter) cut(cmd redis.Cmder) {
	if !isScript(cmd) {
		return
	}
	args := cmd.Args()
	three := lua.AppendCheck(nil, &store.Check{Hits: 3}, 0, -1)[27:35] // the hits field
	if b, ok := args[len(args)-1].([]byte); ok && len(b) == lua.CheckBytes && string(b[27:35]) == string(three) {
		args[len(args)-1] = b[:len(b)-1]
	}
}
func (argCutter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h argCutter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cut(cmd)
		return next(ctx, cmd)
	}
}
func (h argCutter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.cut(c)
		}
		return next(ctx, cmds)
	}
}

// replyRewriter is a go-redis hook that replaces the reply of every script
// call with rewrite's.
type replyRewriter struct{ rewrite func(any) any }

func (h replyRewriter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h replyRewriter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok && err == nil && isScript(cmd) {
			c.SetVal(h.rewrite(c.Val()))
		}
		return err
	}
}
func (h replyRewriter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if c, ok := cmd.(*redis.Cmd); ok && c.Err() == nil && isScript(cmd) {
				c.SetVal(h.rewrite(c.Val()))
			}
		}
		return err
	}
}

// decisionReply rewrites a decision's reply (a string of lua.ResultBytes)
// with f, and leaves another script's as it is.
func decisionReply(f func(string) string) func(any) any {
	return func(v any) any {
		if s, ok := v.(string); ok && len(s) == lua.ResultBytes {
			return f(s)
		}
		return v
	}
}

// TestBadReplyIsProtocol: a reply of the wrong type or length is
// ErrProtocol, and the breaker does not count it as a failure.
func TestBadReplyIsProtocol(t *testing.T) {
	srv := redistest.StartServer(t)
	check := []store.Check{{Key: "rl:{reply}:x", Limit: 10, Window: time.Second, Hits: 1}}
	for name, rewrite := range map[string]func(any) any{
		"not a string": func(any) any { return int64(1) },
		"an array":     func(v any) any { return []any{v} },
		"too short":    decisionReply(func(s string) string { return s[:lua.ResultBytes-1] }),
		"too long":     decisionReply(func(s string) string { return s + "x" }),
	} {
		t.Run(name, func(t *testing.T) {
			c := srv.Client()
			defer c.Close()
			c.AddHook(replyRewriter{rewrite})
			s := mustNew(t, Options{Client: c, Timeout: 5 * time.Second, NoPlain: true, Breaker: breaker.Options{Threshold: 1, FailWindow: time.Nanosecond}})
			for i := 0; i < 3; i++ {
				r := make([]store.Result, 1)
				err := s.Decide(context.Background(), check, r)
				if !errors.Is(err, store.ErrProtocol) || errors.Is(err, store.ErrUnavailable) || r[0].Undecided {
					t.Fatalf("call %d: %+v, %v; want ErrProtocol, not ErrUnavailable, not Undecided", i, r[0], err)
				}
			}
			if st := s.BreakerStates()[""]; st != breaker.Closed {
				t.Errorf("breaker %v; want closed", st)
			}
		})
	}
}

// TestCircuitOpen: a node that keeps failing opens its breaker; calls then
// fail at once with ErrCircuitOpen (an ErrUnavailable) and Undecided
// results; once the node is back, a probe closes it.
func TestCircuitOpen(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	defer c.Close()
	var mu sync.Mutex
	var changes []string
	s := mustNew(t, Options{Client: c, Timeout: time.Second,
		Breaker: breaker.Options{Threshold: 2, FailWindow: 20 * time.Millisecond, Cooldown: 100 * time.Millisecond},
		OnBreakerChange: func(node string, from, to breaker.State) {
			mu.Lock()
			changes = append(changes, fmt.Sprintf("%q:%v>%v", node, from, to))
			mu.Unlock()
		}})
	check := []store.Check{{Key: "rl:{open}:x", Limit: 10, Window: time.Second, Hits: 1}}
	decide(t, s, check...)
	srv.Stop()

	var err error
	var r []store.Result
	testkit.WaitFor(t, "the breaker open with Redis down", 10*time.Second, func() bool {
		r = make([]store.Result, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		err = s.Decide(ctx, check, r)
		if !errors.Is(err, store.ErrUnavailable) || !r[0].Undecided {
			t.Fatalf("Redis down: %+v, %v; want Undecided, ErrUnavailable", r[0], err)
		}
		return errors.Is(err, store.ErrCircuitOpen)
	})
	start := time.Now()
	err = s.Decide(context.Background(), check, r)
	// ErrCircuitOpen is the proof that no call was tried; the bound only
	// catches a wait for a dial or a deadline, however busy the machine.
	if took := time.Since(start); !errors.Is(err, store.ErrCircuitOpen) || took > 2*time.Second {
		t.Errorf("open breaker: %v after %v; want ErrCircuitOpen without waiting", err, took)
	}
	t.Logf("open breaker: %v", err)

	srv.Restart(t)
	testkit.WaitFor(t, "a decision once Redis is back", 10*time.Second, func() bool {
		return s.Decide(context.Background(), check, make([]store.Result, 1)) == nil
	})
	mu.Lock()
	defer mu.Unlock()
	want := []string{`"":closed>open`, `"":open>half_open`}
	if len(changes) < 3 || changes[0] != want[0] || changes[1] != want[1] || changes[len(changes)-1] != `"":half_open>closed` {
		t.Errorf("breaker changes %v; want closed>open>half_open ... half_open>closed", changes)
	}
}
