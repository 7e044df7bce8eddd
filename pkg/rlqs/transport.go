package rlqs

import (
	"errors"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxResponseBytes bounds one response: the actions due at one tick are
// sent in as many responses as they need (gRPC clients refuse messages
// over 4 MiB by default).
const maxResponseBytes = 1 << 20

// recvLoop decodes reports and hands them to the actor; it returns once
// RecvMsg fails (after serve returns at the latest) and handles nothing.
func (st *stream) recvLoop() {
	o := &st.srv.o
	for {
		r := &report{maxBytes: o.MaxReportBytes, budget: st.srv.budget, held: &st.held}
		err := st.ss.RecvMsg(r)
		if err == nil && r.err != nil {
			err = r.err
			switch {
			case status.Code(err) == codes.ResourceExhausted:
				o.Metrics.refuse("budget")
			case errors.Is(err, errTooBig):
				o.Metrics.refuse("too_big")
				err = status.Error(codes.ResourceExhausted, err.Error())
			default:
				o.Metrics.refuse("invalid")
				err = status.Error(codes.InvalidArgument, err.Error())
			}
		}
		if err != nil {
			r.release()
			st.recvErr <- err
			return
		}
		select {
		case st.reports <- r:
		case <-st.done:
			r.release()
			return
		}
	}
}

// sendLoop sends the queued responses in order until the stream ends. A
// message the client does not take within SendWait cuts the stream.
func (st *stream) sendLoop() {
	for {
		st.qmu.Lock()
		if len(st.queue) == 0 {
			st.sending = false
			st.qmu.Unlock()
			select {
			case st.emptied <- struct{}{}:
			default:
			}
			select {
			case <-st.queued:
				continue
			case <-st.done:
				st.dropQueue()
				return
			}
		}
		b := st.queue[0]
		st.queue[0] = nil
		st.queue = st.queue[1:]
		st.sending = true
		st.qmu.Unlock()
		slow := time.AfterFunc(st.srv.o.SendWait, func() { st.cutOnce.Do(func() { close(st.cut) }) })
		err := st.ss.SendMsg(rawResponse{b: b})
		slow.Stop()
		st.srv.budget.give(&st.held, int64(len(b)))
		if err != nil {
			st.sendErr <- err
			st.dropQueue()
			return
		}
	}
}

// dropQueue gives back the budget of the responses never sent.
func (st *stream) dropQueue() {
	st.qmu.Lock()
	q := st.queue
	st.queue = nil
	st.qmu.Unlock()
	for _, b := range q {
		st.srv.budget.give(&st.held, int64(len(b)))
	}
}

// flush queues the actions pending as responses of at most
// maxResponseBytes, each counted in the budget first.
func (st *stream) flush() error {
	var b []byte
	for i, a := range st.pending {
		if a == nil {
			continue
		}
		st.pending[i] = nil
		n := len(b)
		b = appendResponseAction(b, a)
		if n > 0 && len(b) > maxResponseBytes {
			if err := st.enqueue(b[:n:n]); err != nil {
				return err
			}
			b = append([]byte(nil), b[n:]...)
		}
	}
	st.pending = st.pending[:0]
	if len(b) == 0 {
		return nil
	}
	return st.enqueue(b)
}

// enqueue counts b in the budget and queues it for the sender.
func (st *stream) enqueue(b []byte) error {
	if err := st.srv.budget.take(&st.held, int64(len(b))); err != nil {
		st.pending = st.pending[:0]
		st.srv.o.Metrics.refuse("budget")
		return err
	}
	st.qmu.Lock()
	st.queue = append(st.queue, b)
	st.qmu.Unlock()
	select {
	case st.queued <- struct{}{}:
	default:
	}
	return nil
}

// drain waits, at most drainWait, for the sender to send what is queued.
func (st *stream) drain() {
	t := time.NewTimer(drainWait)
	defer t.Stop()
	for {
		st.qmu.Lock()
		empty := len(st.queue) == 0 && !st.sending
		st.qmu.Unlock()
		if empty {
			return
		}
		select {
		case <-st.emptied:
		case <-st.sendErr:
			return
		case <-st.cut:
			return
		case <-t.C:
			return
		}
	}
}

// act appends a to the next response.
func (st *stream) act(a *rlqsv3.RateLimitQuotaResponse_BucketAction) {
	if a != nil {
		st.pending = append(st.pending, a)
	}
}

// slot keeps a place in the next response for an action decided later
// (a grant reserved with the others of its report or tick), so that
// actions go out in the order of the report's buckets; a place left
// empty is skipped.
func (st *stream) slot() int {
	st.pending = append(st.pending, nil)
	return len(st.pending) - 1
}
