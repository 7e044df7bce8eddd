package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/breaker"
)

// A node sends its calls in pipelines: a call that finds fewer than
// MaxInFlight round trips in flight is sent at once, alone; calls that find
// them all busy leave together (up to MaxBatch) when one returns, sent by
// the node's flushers, until the last of their callers' deadlines; a call
// whose caller is gone is not sent. The node's breaker counts round trips:
// each asks it once and reports whether the node answered; while it is not
// closed, each call is its own probe. Each call is decided alone
// (docs/redis.md, invariant 9).

// Defaults of Options.MaxInFlight and Options.MaxBatch.
const (
	DefaultMaxInFlight = 2
	DefaultMaxBatch    = 128
	// MaxMaxInFlight bounds Options.MaxInFlight (each slot has a flusher
	// goroutine per node).
	MaxMaxInFlight = 64
)

// A queued call is pending until delivered (done) or until its caller
// stops waiting (abandoned), whichever comes first.
const (
	callPending int32 = iota
	callDone
	callAbandoned
)

// call is one round trip's worth of commands for one hash slot: queue adds
// them to a pipeline, and after the round trip the commands hold their
// replies. The caller reads them once the call is delivered.
type call struct {
	queue func(ctx context.Context, p redis.Pipeliner)
	ctx   context.Context
	state atomic.Int32
	done  chan struct{} // capacity 1
	err   error         // the round trip's, when no reply came
}

func newCall(queue func(ctx context.Context, p redis.Pipeliner)) *call {
	return &call{queue: queue, done: make(chan struct{}, 1)}
}

// node is one Redis node as the store sees it: its client, breaker,
// script mode (scripts.go), clock (clock.go) and send queue.
type node struct {
	addr    string
	br      *breaker.Breaker
	client  atomic.Pointer[redis.Client] // cluster mode: the node's own client
	single  redis.UniversalClient        // outside cluster mode
	scripts scripts
	clock   clock
	noPlain atomic.Bool // the node refused a plain command (an ACL): scripts only

	limit, cap int
	mu         sync.Mutex
	inflight   int
	queue      []*call
	closed     bool
	work       chan []*call
	quit       chan struct{}
	wg         sync.WaitGroup
}

func newNode(addr string, br *breaker.Breaker, single redis.UniversalClient, c *redis.Client, limit, batch int) *node {
	n := &node{addr: addr, br: br, single: single, limit: limit, cap: batch,
		work: make(chan []*call, limit), quit: make(chan struct{})}
	if c != nil {
		n.client.Store(c)
	}
	n.scripts.node = addr
	n.wg.Add(limit)
	for range limit {
		go n.flusher()
	}
	return n
}

// cmdable is the client that reaches the node itself.
func (n *node) cmdable() redis.Cmdable {
	if c := n.client.Load(); c != nil {
		return c
	}
	return n.single
}

// do runs calls in one round trip (queued behind the round trips in
// flight when there is no free slot) and returns when each is delivered
// or ctx ends. The error is the round trip's or ctx's; each command holds
// its own reply or error.
func (n *node) do(ctx context.Context, calls ...*call) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if n.br.State() != breaker.Closed {
		tk, ok := n.br.Allow()
		if !ok {
			return errOpen
		}
		err := n.send(ctx, calls)
		n.br.Done(tk, outcome(ctx, err))
		return err
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return redis.ErrClosed
	}
	if n.inflight < n.limit {
		n.inflight++
		n.mu.Unlock()
		err := n.sendChecked(ctx, calls)
		n.release(nil)
		return err
	}
	for _, c := range calls {
		c.ctx = ctx
		n.queue = append(n.queue, c)
	}
	n.mu.Unlock()
	var err error
	for _, c := range calls {
		select {
		case <-c.done:
		case <-ctx.Done():
			if c.state.CompareAndSwap(callPending, callAbandoned) {
				return fmt.Errorf("still queued behind the node's %d round trips in flight: %w", n.limit, ctx.Err())
			}
			<-c.done
		}
		err = cmp(err, c.err)
	}
	return err
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// sendChecked sends calls as one round trip if the breaker allows it.
func (n *node) sendChecked(ctx context.Context, calls []*call) error {
	tk, ok := n.br.Allow()
	if !ok {
		return errOpen
	}
	err := n.send(ctx, calls)
	n.br.Done(tk, outcome(ctx, err))
	return err
}

// send runs calls as one pipeline on the node, with a TIME for the node's
// clock when it is stale. It returns the error of a round trip that got
// no answer; error replies stay with their commands.
func (n *node) send(ctx context.Context, calls []*call) error {
	p := n.cmdable().Pipeline()
	for _, c := range calls {
		c.queue(ctx, p)
	}
	s := localUS()
	var tc *redis.TimeCmd
	if n.clock.stale(s) {
		tc = p.Time(ctx)
	}
	cmds, err := p.Exec(ctx)
	if tc != nil && tc.Err() == nil {
		n.clock.observe(tc.Val().UnixMicro(), s, localUS())
	}
	var re redis.Error
	if err != nil && errors.As(err, &re) {
		for _, c := range cmds {
			if c.Err() != nil {
				return nil // an error reply: its command holds it
			}
		}
	}
	return err // no answer, or the connection's own (a refused password)
}

// release frees the slot of a round trip that returned (and recycles its
// batch slice) and starts the next batch if calls are queued.
func (n *node) release(spent []*call) {
	if next := n.finish(spent); next != nil {
		n.work <- next // never blocks: at most limit batches exist
	}
}

// finish frees a slot and, when calls are queued, takes it again for a
// batch of them, which it returns.
func (n *node) finish(spent []*call) []*call {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.inflight--
	if len(n.queue) == 0 || n.closed {
		return nil
	}
	n.inflight++
	k := min(len(n.queue), n.cap)
	b := make([]*call, k)
	copy(b, n.queue)
	m := copy(n.queue, n.queue[k:])
	clear(n.queue[m:])
	n.queue = n.queue[:m]
	return b
}

// flusher sends the batches finish hands it, and the next ones while
// calls keep queueing.
func (n *node) flusher() {
	defer n.wg.Done()
	for {
		select {
		case b := <-n.work:
			for b != nil {
				n.flush(b)
				b = n.finish(b)
			}
		case <-n.quit:
			return
		}
	}
}

// flush sends a batch of queued calls whose callers still wait, until the
// last of their deadlines, and delivers them.
func (n *node) flush(b []*call) {
	live := b[:0]
	var deadline time.Time
	for _, c := range b {
		if c.state.Load() != callPending {
			continue
		}
		if err := c.ctx.Err(); err != nil {
			deliver(c, err)
			continue
		}
		live = append(live, c)
		if d, ok := c.ctx.Deadline(); !ok {
			deadline = time.Now().Add(time.Minute)
		} else if d.After(deadline) {
			deadline = d
		}
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	err := n.sendChecked(ctx, live)
	for _, c := range live {
		deliver(c, err)
	}
}

// deliver hands a queued call its round trip's outcome unless its caller
// is gone.
func deliver(c *call, err error) {
	if c.state.CompareAndSwap(callPending, callDone) {
		c.err = err
		c.done <- struct{}{}
	}
}

// close stops the flushers and fails the queued calls.
func (n *node) close() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	q := n.queue
	n.queue = nil
	n.mu.Unlock()
	for _, c := range q {
		deliver(c, redis.ErrClosed)
	}
	close(n.quit)
	n.wg.Wait()
	for {
		select {
		case b := <-n.work:
			for _, c := range b {
				deliver(c, redis.ErrClosed)
			}
		default:
			return
		}
	}
}

// errOpen is the error of a round trip the node's breaker refused;
// Store.decide turns it into store.ErrCircuitOpen naming the node.
var errOpen = errors.New("circuit open")
