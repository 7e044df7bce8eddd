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

// Coalescing: one script call per hash slot for every request queued for
// it, so Redis runs one script, not one per request. Every slot group's script call goes through the
// coalescer of the node that owns it (one node outside cluster mode; the
// master owning the slot in cluster mode, keyed by its address).
//
// Flush policy: a node allows MaxInFlight sends (round trips) in flight at a
// time. A call that finds a free slot is sent at once, alone, by the
// caller's own goroutine: no added latency and no goroutine hand-off at low
// load. A call that finds every slot busy is queued; as soon as any send on
// that node returns, everything queued (up to MaxBatch calls) leaves as ONE
// send by one of the node's flusher goroutines (MaxInFlight of them,
// started with the coalescer and stopped by Close): the calls of one hash
// slot (all of them outside cluster mode) are merged into one script call,
// each call one request in it (decide.lua decides them in order, each
// alone: one TIME, one MGET and one SET per key for the lot), and the
// script calls of several slots go as one pipeline. Each caller keeps its
// own result, error and deadline; a script or protocol error of a merged
// call reaches all its callers.
//
// Breaker accounting: the node's circuit breaker counts round trips, not
// callers. Each send (a lone call or a batch) asks the breaker once
// (Allow) before it writes and reports once (Done) when it returns (see
// outcome in errors.go): a failure when the node gave no answer to it (a
// network error, no reply within the send's own deadline, which for a
// batch is the last of its callers' deadlines, or an outage reply such
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
	blob    []byte // the request's checks (decide.lua's ARGV layout)
	args    []any

	// Set while queued.
	ctx   context.Context
	state atomic.Int32
	done  chan struct{} // capacity 1; receives once when state becomes done

	reply string
	err   error

	cs counterState // a counter call (counters.go)
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
	c.checks, c.results, c.keys, c.args, c.blob = c.checks[:0], c.results[:0], c.keys[:0], c.args[:0], c.blob[:0]
	c.ctx, c.reply, c.err = nil, "", nil
	c.cs.reset()
	c.state.Store(callPending)
	callPool.Put(c)
}

// coalescer batches one node's script calls.
type coalescer struct {
	br *breaker.Breaker
	// direct sends a call alone from the caller's goroutine; batch is the
	// node's own client, used for pipelines.
	direct redis.Cmdable
	batch  atomic.Pointer[redis.Client] // nil outside cluster mode: use single
	single redis.UniversalClient
	limit  int
	cap    int

	scripts scripts // FCALL or EVALSHA (scripts.go)

	// clock: the latest TIME the node answered a counter call (Unix
	// microseconds), and when that answer arrived, on rls's monotonic
	// clock (counters.go's earliest).
	clockMu    sync.Mutex
	lastTime   int64
	lastAt     time.Time
	noCounters atomic.Bool // the node refused INCRBY: scripts only (counters.go)
	noProbes   atomic.Bool // the node refused GET: no probes (counters.go)

	mu       sync.Mutex
	inflight int
	queue    []*call
	ahead    int       // queue[:ahead] are script calls after counter calls (enqueue)
	free     [][]*call // spare batch slices
	closed   bool

	work chan []*call
	quit chan struct{}
	wg   sync.WaitGroup
}

func newCoalescer(br *breaker.Breaker, direct redis.Cmdable, single redis.UniversalClient, limit, batch int) *coalescer {
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
func (co *coalescer) do(ctx context.Context, c *call) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	co.mu.Lock()
	if co.closed {
		co.mu.Unlock()
		return "", redis.ErrClosed
	}
	if co.inflight < co.limit {
		co.inflight++
		co.mu.Unlock()
		tk, ok := co.br.Allow()
		if !ok {
			co.release(nil)
			return "", errOpen
		}
		var reply string
		var err error
		if c.cs.counted {
			err = co.runCounts(ctx, []*call{c})
		} else {
			reply, err = co.run(ctx, co.direct, c.keys, c.args)
		}
		co.br.Done(tk, outcome(ctx, err))
		co.release(nil)
		return reply, err
	}
	c.ctx = ctx
	co.enqueue(c)
	co.mu.Unlock()

	select {
	case <-c.done:
		return c.reply, c.err
	case <-ctx.Done():
		if c.state.CompareAndSwap(callPending, callAbandoned) {
			return "", fmt.Errorf("still queued behind the node's %d sends in flight: %w", co.limit, ctx.Err())
		}
		<-c.done // delivered just now: use it
		return c.reply, c.err
	}
}

// enqueue queues c (co.mu held): at the end, or, for the script call that
// follows a counter call, after the other such calls at the head of the
// queue, so that a request's second round trip does not wait behind
// requests that have not made their first (a burst at the limit would
// otherwise wait twice the queue).
func (co *coalescer) enqueue(c *call) {
	if !c.cs.first || co.ahead >= len(co.queue) {
		if c.cs.first {
			co.ahead++
		}
		co.queue = append(co.queue, c)
		return
	}
	co.queue = append(co.queue, nil)
	copy(co.queue[co.ahead+1:], co.queue[co.ahead:])
	co.queue[co.ahead] = c
	co.ahead++
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
		b, co.queue, co.ahead = co.queue, b, 0
		return b
	}
	co.ahead = max(0, co.ahead-co.cap)
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
	var sc scratch
	for {
		select {
		case b := <-co.work:
			for b != nil {
				co.send(b, &sc)
				b = co.finish(b)
			}
		case <-co.quit:
			return
		}
	}
}

// maxMergedChecks bounds the checks of one merged script call, so that no
// single evaluation holds Redis for long.
const maxMergedChecks = 512

// unit is one script call of a batch: the calls it decides, one request
// each, and their keys and request arguments concatenated behind the first
// call's header.
type unit struct {
	calls []*call
	keys  []string
	args  []any
	slot  int // cluster mode: the calls' hash slot
}

// scratch is a flusher's reusable memory.
type scratch struct {
	units   []unit
	cmds    []*redis.Cmd
	counted []*call
}

// merge groups b's calls into units: calls of the same mode and clock
// (and, in cluster mode, the same hash slot) share a script call, up to
// maxMergedChecks checks each.
func (co *coalescer) merge(b []*call, sc *scratch, cluster bool) []unit {
	us := sc.units[:0]
	for _, c := range b {
		slot := 0
		if cluster {
			slot = Slot(c.keys[0])
		}
		k := -1
		for i := range us {
			u := &us[i]
			if u.slot == slot && u.args[0] == c.args[0] && u.args[1] == c.args[1] &&
				len(u.keys)+len(c.keys) <= maxMergedChecks {
				k = i
				break
			}
		}
		if k < 0 {
			if len(us) < cap(us) {
				us = us[:len(us)+1]
			} else {
				us = append(us, unit{})
			}
			k = len(us) - 1
			u := &us[k]
			u.calls, u.keys, u.args, u.slot = u.calls[:0], u.keys[:0], u.args[:0], slot
			u.args = append(u.args, c.args[:lua.HeaderArgs]...)
		}
		u := &us[k]
		u.calls = append(u.calls, c)
		u.keys = append(u.keys, c.keys...)
		u.args = append(u.args, c.args[lua.HeaderArgs:]...)
	}
	sc.units = us
	return us
}

// release clears us's references so that delivered calls can be recycled.
func releaseUnits(us []unit) {
	for i := range us {
		clear(us[i].calls)
		clear(us[i].keys)
		clear(us[i].args)
	}
}

// send runs a batch (a batch of one as a plain call; else its calls merged
// into as few script calls as the slots allow, pipelined when more than
// one) and delivers every call's reply. Calls whose caller is gone are not
// sent.
func (co *coalescer) send(b []*call, sc *scratch) {
	b, deadline := co.live(b)
	if len(b) == 0 {
		return
	}
	tk, ok := co.br.Allow()
	if !ok {
		for _, c := range b {
			co.deliver(c, "", errOpen)
		}
		return
	}
	// The batch serves callers with different deadlines: it runs until the
	// last of them, its own deadline.
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	b, counts := splitCounted(b, sc)
	if len(counts) == 0 {
		co.br.Done(tk, co.sendScripts(ctx, b, sc))
		return
	}
	if len(b) == 0 {
		co.br.Done(tk, outcome(ctx, co.sendCounts(ctx, counts)))
		return
	}
	// Both kinds: the counter calls' pipeline beside the scripts'.
	var oc breaker.Outcome
	var wg sync.WaitGroup
	wg.Go(func() { oc = outcome(ctx, co.sendCounts(ctx, counts)) })
	o := co.sendScripts(ctx, b, sc)
	wg.Wait()
	co.br.Done(tk, worse(o, oc))
}

// splitCounted moves b's counter calls (in place) to sc.counted and
// returns the script calls and the counter calls.
func splitCounted(b []*call, sc *scratch) (scripts, counts []*call) {
	counts = sc.counted[:0]
	n := 0
	for _, c := range b {
		if c.cs.counted {
			counts = append(counts, c)
			continue
		}
		b[n] = c
		n++
	}
	clear(b[n:])
	sc.counted = counts
	return b[:n], counts
}

// sendScripts sends a batch's script calls (a batch of one as a plain
// call; else merged into as few script calls as the slots allow,
// pipelined when more than one), delivers every call's reply and returns
// the round trip's outcome for the breaker.
func (co *coalescer) sendScripts(ctx context.Context, b []*call, sc *scratch) breaker.Outcome {
	var cl redis.Cmdable = co.single
	batch := co.batch.Load()
	if batch != nil {
		cl = batch
	}
	if len(b) == 1 {
		c := b[0]
		reply, err := co.run(ctx, cl, c.keys, c.args)
		co.deliver(c, reply, err)
		return outcome(ctx, err)
	}
	us := co.merge(b, sc, batch != nil)
	defer releaseUnits(us)
	if len(us) == 1 {
		u := &us[0]
		reply, err := co.run(ctx, cl, u.keys, u.args)
		co.split(u, reply, err)
		return outcome(ctx, err)
	}
	return co.sendPipeline(ctx, us, sc)
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
			co.deliver(c, "", err)
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

// split delivers a unit's reply (or error) to its calls: each call's
// replies follow the previous call's, in the unit's order.
func (co *coalescer) split(u *unit, reply string, err error) {
	if err == nil && len(reply) != lua.ResultBytes*len(u.keys) {
		err = fmt.Errorf("%w: the script replied %d bytes for %d checks", store.ErrProtocol, len(reply), len(u.keys))
	}
	off := 0
	for _, c := range u.calls {
		if err != nil {
			co.deliver(c, "", err)
			continue
		}
		n := lua.ResultBytes * len(c.keys)
		co.deliver(c, reply[off:off+n], nil)
		off += n
	}
}

// sendPipeline sends us (two units or more) as one pipeline, in the
// node's script mode, re-sends once the units that met NOSCRIPT (the script
// cache was flushed or the node is new: the first as EVAL, which caches the
// script, and the rest as EVALSHA behind it in the same pipeline) or
// "Function not found" (after loading the library again), delivers every
// reply and returns the round trip's outcome for the breaker.
func (co *coalescer) sendPipeline(ctx context.Context, us []unit, sc *scratch) breaker.Outcome {
	o := breaker.Success
	functions := co.scripts.mode.Load() == modeFunction
	cmds := co.pipeline(ctx, us, sc.cmds, functions, false)
	retry, missing := 0, false
	for i := range us {
		err := cmds[i].Err()
		if fcallRefused(err) {
			co.scripts.set(modeEval, "FCALL refused: "+err.Error())
		}
		if !noScript(err) && !functionMissing(err) && !fcallRefused(err) {
			o = worse(o, outcome(ctx, err))
		} else {
			missing = missing || functionMissing(err)
			us[retry], us[i] = us[i], us[retry]
			cmds[retry], cmds[i] = cmds[i], cmds[retry]
			retry++
		}
	}
	for i := retry; i < len(us); i++ {
		reply, err := scriptReply(cmds[i])
		co.split(&us[i], reply, err)
	}
	if retry > 0 {
		if missing {
			functions = co.scripts.reload(ctx, co.loader())
		} else {
			functions = co.scripts.mode.Load() == modeFunction
		}
		cmds = co.pipeline(ctx, us[:retry], cmds, functions, true)
		for i := 0; i < retry; i++ {
			reply, err := scriptReply(cmds[i])
			o = worse(o, outcome(ctx, err))
			co.split(&us[i], reply, err)
		}
	}
	clear(cmds)
	sc.cmds = cmds[:0]
	return o
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

// pipeline sends us's script calls in one pipeline, as FCALLs when
// functions is set, else as EVALSHAs (the first as EVAL when again is set,
// to cache the script), and returns their commands, in us's order, in cmds.
func (co *coalescer) pipeline(ctx context.Context, us []unit, cmds []*redis.Cmd, functions, again bool) []*redis.Cmd {
	var p redis.Pipeliner
	if cl := co.batch.Load(); cl != nil {
		p = cl.Pipeline()
	} else {
		p = co.single.Pipeline()
	}
	cmds = cmds[:0]
	for i := range us {
		u := &us[i]
		switch {
		case functions:
			cmds = append(cmds, fcall(ctx, p, u.keys, u.args))
		case i == 0 && again:
			cmds = append(cmds, p.Eval(ctx, lua.DecideSource, u.keys, u.args...))
		default:
			cmds = append(cmds, p.EvalSha(ctx, lua.Decide.Hash(), u.keys, u.args...))
		}
	}
	_, _ = p.Exec(ctx) // every command carries its own error
	return cmds
}

// deliver hands a queued call its outcome unless its caller is gone.
func (co *coalescer) deliver(c *call, reply string, err error) {
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
		co.deliver(c, "", redis.ErrClosed)
	}
	close(co.quit)
	co.wg.Wait()
	for {
		select {
		case b := <-co.work:
			for _, c := range b {
				co.deliver(c, "", redis.ErrClosed)
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

// runEval runs decide.lua by its SHA, sending the source only when the
// node answers NOSCRIPT, as redis.Script.Run does, without its allocation
// per call for an error that is nil.
func runEval(ctx context.Context, c redis.Scripter, keys []string, args []any) (string, error) {
	cmd := c.EvalSha(ctx, lua.Decide.Hash(), keys, args...)
	if noScript(cmd.Err()) {
		cmd = c.Eval(ctx, lua.DecideSource, keys, args...)
	}
	return scriptReply(cmd)
}

// scriptReply returns a script call's reply, which must be a string; any
// other reply is a protocol error.
func scriptReply(cmd *redis.Cmd) (string, error) {
	v, err := cmd.Result()
	if err != nil {
		return "", err
	}
	reply, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%w: the script replied %T, not a string", store.ErrProtocol, v)
	}
	return reply, nil
}

// noScript reports whether err is Redis's NOSCRIPT (script not cached).
func noScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}
