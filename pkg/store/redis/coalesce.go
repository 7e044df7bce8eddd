package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/lua"
	"github.com/rls-project/rls/pkg/breaker"
	"github.com/rls-project/rls/pkg/store"
)

// Coalescing (issue #7). Every slot group's script call goes through the
// coalescer of the node that owns it (one node outside cluster mode; the
// master owning the slot in cluster mode, keyed by its address).
//
// Flush policy: a node allows MaxInFlight sends (round trips) in flight at a
// time. A call that finds a free slot is sent at once, alone, by the
// caller's own goroutine: no added latency and no goroutine hand-off at low
// load. A call that finds every slot busy is queued; as soon as any send on
// that node returns, everything queued (up to MaxBatch calls) leaves as ONE
// pipeline (its EVALSHAs in one write), sent by one of the node's flusher
// goroutines (MaxInFlight of them, started with the coalescer and stopped
// by Close). Each caller keeps its own result, error and deadline.
//
// Breaker accounting: the node's circuit breaker counts round trips, not
// callers. Each send (a lone call or a pipeline) asks the breaker once
// (Allow) before it writes and reports once (Done) when it returns (see
// outcome in errors.go): a failure when the node gave no answer to it (a
// network error, no reply within the send's own deadline, which for a
// pipeline is the last of its callers' deadlines, or an outage reply such
// as LOADING), else a success, even if some of its callers had already
// given up, and even if the answer was a script or protocol error (the
// node answered; the bug is ours). So one slow or lost round trip carrying
// 40 calls is one failure, not 40. Waiting in the queue is never a send:
// a call whose caller's deadline passes while it is queued fails (with
// store.ErrUnavailable and context.DeadlineExceeded, so its caller falls
// back) without the breaker hearing of it. While the breaker is not
// closed, callers bypass the coalescer and each call is its own probe (see
// Store.send).

// Defaults of Options.MaxInFlight and Options.MaxBatch.
const (
	// DefaultMaxInFlight is the default of Options.MaxInFlight.
	DefaultMaxInFlight = 2
	// DefaultMaxBatch is the default of Options.MaxBatch.
	DefaultMaxBatch = 128
	// MaxMaxInFlight bounds Options.MaxInFlight (each send slot has a
	// flusher goroutine per node).
	MaxMaxInFlight = 64
)

// Call states: a queued call is pending until the flusher delivers it
// (done) or its caller stops waiting (abandoned), whichever comes first.
const (
	callPending int32 = iota
	callDone
	callAbandoned
)

// call is one slot group's script call: the group's checks, where their
// results go, and the script's keys and arguments, one of each per check
// (checks[j], results[j], keys[j]). Calls are pooled: a caller that got its
// result puts the call back; an abandoned call is left to the GC since the
// flusher may still hold it.
type call struct {
	checks  []*store.Check  // in batch order
	results []*store.Result // results[j] receives checks[j]'s result
	keys    []string
	args    []any

	// Set while queued.
	ctx   context.Context
	state atomic.Int32
	done  chan struct{} // capacity 1; receives once when state becomes done

	reply []any
	err   error
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func getCall() *call { return callPool.Get().(*call) }

// putCall recycles c; only a caller that owns c (never queued, or
// delivered) may call it.
func putCall(c *call) {
	clear(c.checks)
	clear(c.results)
	clear(c.keys)
	clear(c.args)
	c.checks, c.results, c.keys, c.args = c.checks[:0], c.results[:0], c.keys[:0], c.args[:0]
	c.ctx, c.reply, c.err = nil, nil, nil
	c.state.Store(callPending)
	callPool.Put(c)
}

// coalescer batches one node's script calls.
type coalescer struct {
	br *breaker.Breaker
	// direct sends a call alone from the caller's goroutine; batch is the
	// node's own client, used for pipelines.
	direct redis.Scripter
	batch  atomic.Pointer[redis.Client] // nil outside cluster mode: use single
	single redis.UniversalClient
	limit  int
	cap    int

	mu       sync.Mutex
	inflight int
	queue    []*call
	free     [][]*call // spare batch slices
	closed   bool

	work chan []*call
	quit chan struct{}
	wg   sync.WaitGroup
}

func newCoalescer(br *breaker.Breaker, direct redis.Scripter, single redis.UniversalClient, limit, batch int) *coalescer {
	co := &coalescer{
		br:     br,
		direct: direct,
		single: single,
		limit:  limit,
		cap:    batch,
		work:   make(chan []*call, limit),
		quit:   make(chan struct{}),
	}
	co.wg.Add(limit)
	for i := 0; i < limit; i++ {
		go co.flusher()
	}
	return co
}

// do runs c's script call and returns its reply. It returns when the reply
// arrives or ctx ends, whichever is first; the error then wraps ctx's.
func (co *coalescer) do(ctx context.Context, c *call) ([]any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	co.mu.Lock()
	if co.closed {
		co.mu.Unlock()
		return nil, redis.ErrClosed
	}
	if co.inflight < co.limit {
		co.inflight++
		co.mu.Unlock()
		tk, ok := co.br.Allow()
		if !ok {
			co.release(nil)
			return nil, errOpen
		}
		reply, err := runDecide(ctx, co.direct, c.keys, c.args)
		co.br.Done(tk, outcome(ctx, err))
		co.release(nil)
		return reply, err
	}
	c.ctx = ctx
	co.queue = append(co.queue, c)
	co.mu.Unlock()

	select {
	case <-c.done:
		return c.reply, c.err
	case <-ctx.Done():
		if c.state.CompareAndSwap(callPending, callAbandoned) {
			return nil, fmt.Errorf("still queued behind the node's %d sends in flight: %w", co.limit, ctx.Err())
		}
		<-c.done // delivered just now: use it
		return c.reply, c.err
	}
}

// release frees the send slot held by a send that returned (and recycles
// its batch slice), and starts the next pipeline if calls are queued.
func (co *coalescer) release(spent []*call) {
	if next := co.finish(spent); next != nil {
		co.work <- next // never blocks: at most limit batches exist
	}
}

// finish frees a send slot and, when calls are queued, takes the slot again
// for a batch of them, which it returns.
func (co *coalescer) finish(spent []*call) []*call {
	co.mu.Lock()
	defer co.mu.Unlock()
	co.inflight--
	if spent != nil {
		clear(spent)
		co.free = append(co.free, spent[:0])
	}
	if len(co.queue) == 0 || co.closed {
		return nil
	}
	co.inflight++
	var b []*call
	if n := len(co.free); n > 0 {
		b, co.free = co.free[n-1], co.free[:n-1]
	}
	if len(co.queue) <= co.cap {
		// Swap buffers: the queue continues in the spare slice.
		b, co.queue = co.queue, b
		return b
	}
	b = append(b, co.queue[:co.cap]...)
	n := copy(co.queue, co.queue[co.cap:])
	clear(co.queue[n:])
	co.queue = co.queue[:n]
	return b
}

// flusher sends the batches finish hands it, and the next ones while calls
// keep queueing.
func (co *coalescer) flusher() {
	defer co.wg.Done()
	var cmds []*redis.Cmd
	for {
		select {
		case b := <-co.work:
			for b != nil {
				cmds = co.send(b, cmds)
				b = co.finish(b)
			}
		case <-co.quit:
			return
		}
	}
}

// send runs a batch as one pipeline (a batch of one as a plain call) and
// delivers every call's reply. Calls whose caller is gone are not sent.
func (co *coalescer) send(b []*call, cmds []*redis.Cmd) []*redis.Cmd {
	b, deadline := co.live(b)
	if len(b) == 0 {
		return cmds
	}
	tk, ok := co.br.Allow()
	if !ok {
		for _, c := range b {
			co.deliver(c, nil, errOpen)
		}
		return cmds
	}
	// The pipeline serves callers with different deadlines: it runs until
	// the last of them, its own deadline.
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var cl redis.Scripter = co.single
	if p := co.batch.Load(); p != nil {
		cl = p
	}
	if len(b) == 1 {
		c := b[0]
		reply, err := runDecide(ctx, cl, c.keys, c.args)
		co.br.Done(tk, outcome(ctx, err))
		co.deliver(c, reply, err)
		return cmds
	}
	var o breaker.Outcome
	cmds, o = co.sendPipeline(ctx, b, cmds)
	co.br.Done(tk, o)
	clear(cmds)
	return cmds[:0]
}

// live drops from b (in place) the calls whose caller is gone, failing
// those whose ctx ended, and returns the rest with the latest of their
// deadlines.
func (co *coalescer) live(b []*call) ([]*call, time.Time) {
	n := 0
	var deadline time.Time
	for _, c := range b {
		if c.state.Load() != callPending {
			continue
		}
		if err := c.ctx.Err(); err != nil {
			co.deliver(c, nil, err)
			continue
		}
		b[n] = c
		n++
		if d, ok := c.ctx.Deadline(); !ok {
			deadline = time.Now().Add(time.Minute)
		} else if d.After(deadline) {
			deadline = d
		}
	}
	clear(b[n:])
	return b[:n], deadline
}

// sendPipeline sends b (two calls or more) as one pipeline, re-sends once
// the calls that met NOSCRIPT (the script cache was flushed or the node is
// new: the first as EVAL, which caches the script, and the rest as EVALSHA
// behind it in the same pipeline), delivers every reply and returns the
// round trip's outcome for the breaker.
func (co *coalescer) sendPipeline(ctx context.Context, b []*call, cmds []*redis.Cmd) ([]*redis.Cmd, breaker.Outcome) {
	o := breaker.Success
	cmds = co.pipeline(ctx, b, cmds, false)
	retry := 0
	for i, c := range b {
		if err := cmds[i].Err(); !noScript(err) {
			o = worse(o, outcome(ctx, err))
		} else {
			b[retry], b[i] = c, b[retry]
			cmds[retry], cmds[i] = cmds[i], cmds[retry]
			retry++
		}
	}
	for i := retry; i < len(b); i++ {
		reply, err := scriptReply(cmds[i])
		co.deliver(b[i], reply, err)
	}
	if retry > 0 {
		cmds = co.pipeline(ctx, b[:retry], cmds, true)
		for i := 0; i < retry; i++ {
			reply, err := scriptReply(cmds[i])
			o = worse(o, outcome(ctx, err))
			co.deliver(b[i], reply, err)
		}
	}
	return cmds, o
}

// worse returns the outcome of a round trip made of two: refused if either
// was, else a failure if either failed, else unknown if either is, else a
// success.
func worse(a, b breaker.Outcome) breaker.Outcome {
	switch {
	case a == breaker.Refused || b == breaker.Refused:
		return breaker.Refused
	case a == breaker.Failure || b == breaker.Failure:
		return breaker.Failure
	case a == breaker.Unknown || b == breaker.Unknown:
		return breaker.Unknown
	}
	return breaker.Success
}

// pipeline sends b's script calls in one pipeline (the first as EVAL when
// eval is set) and returns their commands, in b's order, in cmds.
func (co *coalescer) pipeline(ctx context.Context, b []*call, cmds []*redis.Cmd, eval bool) []*redis.Cmd {
	var p redis.Pipeliner
	if cl := co.batch.Load(); cl != nil {
		p = cl.Pipeline()
	} else {
		p = co.single.Pipeline()
	}
	cmds = cmds[:0]
	for i, c := range b {
		if i == 0 && eval {
			cmds = append(cmds, p.Eval(ctx, lua.DecideSource, c.keys, c.args...))
		} else {
			cmds = append(cmds, p.EvalSha(ctx, lua.Decide.Hash(), c.keys, c.args...))
		}
	}
	_, _ = p.Exec(ctx) // every command carries its own error
	return cmds
}

// deliver hands a queued call its outcome unless its caller is gone.
func (co *coalescer) deliver(c *call, reply []any, err error) {
	if !c.state.CompareAndSwap(callPending, callDone) {
		return
	}
	c.reply, c.err = reply, err
	c.done <- struct{}{}
}

// close stops the flushers and fails the queued calls.
func (co *coalescer) close() {
	co.mu.Lock()
	if co.closed {
		co.mu.Unlock()
		return
	}
	co.closed = true
	q := co.queue
	co.queue = nil
	co.mu.Unlock()
	for _, c := range q {
		co.deliver(c, nil, redis.ErrClosed)
	}
	close(co.quit)
	co.wg.Wait()
	for {
		select {
		case b := <-co.work:
			for _, c := range b {
				co.deliver(c, nil, redis.ErrClosed)
			}
		default:
			return
		}
	}
}

// errOpen is delivered to calls whose send the node's breaker refused;
// Store.send turns it into store.ErrCircuitOpen naming the node.
var errOpen = errors.New("circuit open")

// redirected reports whether a cluster node's error means the slot is
// elsewhere or moving (MOVED, ASK, TRYAGAIN) or the node's client went away
// with a topology change, so the call must go through the cluster client.
func redirected(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	return redis.HasErrorPrefix(err, "MOVED ") || redis.HasErrorPrefix(err, "ASK ") ||
		redis.IsTryAgainError(err) || errors.Is(err, redis.ErrClosed)
}

// runDecide runs decide.lua by its SHA, sending the source only when the
// node answers NOSCRIPT, as redis.Script.Run does, without its allocation
// per call for an error that is nil.
func runDecide(ctx context.Context, c redis.Scripter, keys []string, args []any) ([]any, error) {
	cmd := c.EvalSha(ctx, lua.Decide.Hash(), keys, args...)
	if noScript(cmd.Err()) {
		cmd = c.Eval(ctx, lua.DecideSource, keys, args...)
	}
	return scriptReply(cmd)
}

// scriptReply returns a script call's reply, which must be an array; any
// other reply is a protocol error.
func scriptReply(cmd *redis.Cmd) ([]any, error) {
	v, err := cmd.Result()
	if err != nil {
		return nil, err
	}
	reply, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: the script replied %T, not an array", store.ErrProtocol, v)
	}
	return reply, nil
}

// noScript reports whether err is Redis's NOSCRIPT (script not cached).
func noScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}
