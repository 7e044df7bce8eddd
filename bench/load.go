package main

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const method = rlsv3.RateLimitService_ShouldRateLimit_FullMethodName

// stats is one worker's tally; workers never share one, and the run merges
// them when every worker has stopped.
type stats struct {
	lat, svc      hist
	ok, over, unk uint64
	errs          [codes.Unauthenticated + 1]uint64
	sent          uint64
	lagSum        uint64 // open loop: µs
	lagMax        uint64
	late          uint64
}

func (s *stats) merge(o *stats) {
	s.lat.Merge(&o.lat)
	s.svc.Merge(&o.svc)
	s.ok += o.ok
	s.over += o.over
	s.unk += o.unk
	for i, n := range o.errs {
		s.errs[i] += n
	}
	s.sent += o.sent
	s.lagSum += o.lagSum
	s.lagMax = max(s.lagMax, o.lagMax)
	s.late += o.late
}

func (s *stats) decisions() uint64 { return s.ok + s.over + s.unk }

func (s *stats) errors() uint64 {
	var n uint64
	for _, e := range s.errs {
		n += e
	}
	return n
}

// count tallies one RPC's outcome.
func (s *stats) count(err error, code rlsv3.RateLimitResponse_Code) {
	if err != nil {
		c := status.Code(err)
		if int(c) >= len(s.errs) {
			c = codes.Unknown
		}
		s.errs[c]++
		return
	}
	switch code {
	case rlsv3.RateLimitResponse_OK:
		s.ok++
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		s.over++
	default:
		s.unk++
	}
}

func micros(d time.Duration) uint64 {
	if d < 0 {
		return 0
	}
	return uint64(d / time.Microsecond)
}

// loader drives ShouldRateLimit calls; one loader serves the warm-up and
// the measured phase.
type loader struct {
	conns   []*caller
	reqs    *requestSet
	picker  keyPicker
	keys    int // distinct keys the picker draws from
	workers int
	timeout time.Duration
	seed    uint64
}

// phase bounds one run: until dur has passed or n requests (0: no bound),
// closed loop when rate is 0, else open loop at rate requests/s.
type phase struct {
	dur  time.Duration
	n    uint64
	rate float64
}

type result struct {
	st          stats
	elapsed     time.Duration
	intended    uint64 // open loop: sends due by the end
	interrupted bool
}

func (l *loader) call(ctx context.Context, conn *caller, idx int, sc *callScratch) (rlsv3.RateLimitResponse_Code, error) {
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	return conn.call(ctx, idx, sc)
}

func (l *loader) close() {
	for _, c := range l.conns {
		_ = c.close()
	}
}

// running is one phase in progress, shared by its pacer and workers.
type running struct {
	l        *loader
	ctx      context.Context
	start    time.Time
	interval float64 // open loop: ns between slots
	slots    uint64  // requests due in the phase (MaxUint64: no bound)
	seq      atomic.Uint64
	stopped  atomic.Bool
	stop     chan struct{}
	due      chan uint64 // open loop: slots released by the pacer; nil: closed loop
}

// run runs one phase. ctx cancellation (Ctrl-C) ends it early; the result
// then covers the run so far and says it was interrupted.
func (l *loader) run(ctx context.Context, p phase) result {
	r := &running{l: l, ctx: ctx, stop: make(chan struct{}), slots: phaseSlots(p)}
	var (
		once sync.Once
		wg   sync.WaitGroup
		all  = make([]stats, l.workers)
	)
	halt := func() { once.Do(func() { r.stopped.Store(true); close(r.stop) }) }
	r.start = time.Now()
	end := r.start.Add(p.dur)
	timer := time.AfterFunc(p.dur, halt)
	defer timer.Stop()
	go func() {
		select {
		case <-ctx.Done():
			halt()
		case <-r.stop:
		}
	}()

	// Open loop: one pacer releases slot i at start + i/rate, precisely
	// (see sleepUntil), into a queue that any free worker takes from; the
	// time a slot waits for a worker is latency.
	if p.rate > 0 {
		r.interval = float64(time.Second) / p.rate
		r.due = make(chan uint64, 1<<16)
		wg.Go(r.pace)
	}
	for w := range l.workers {
		wg.Go(func() { r.work(w, &all[w]) })
	}
	wg.Wait()
	res := result{elapsed: time.Since(r.start), interrupted: ctx.Err() != nil}
	for i := range all {
		res.st.merge(&all[i])
	}
	if p.rate > 0 {
		res.intended = r.slots
		if res.interrupted {
			// Only what fell due before the interruption.
			due := min(time.Since(r.start), end.Sub(r.start))
			res.intended = min(r.slots, uint64(math.Ceil(due.Seconds()*p.rate)))
		}
	}
	return res
}

// phaseSlots is the number of requests p may send: those due before its
// end in the open loop, at most p.n.
func phaseSlots(p phase) uint64 {
	slots := uint64(math.MaxUint64)
	if p.rate > 0 {
		slots = uint64(math.Ceil(p.dur.Seconds() * p.rate)) // due before end
	}
	if p.n > 0 {
		slots = min(slots, p.n)
	}
	return slots
}

// intended is when slot i is due in the open loop.
func (r *running) intended(i uint64) time.Time {
	return r.start.Add(time.Duration(float64(i) * r.interval))
}

// pace releases the open loop's slots on time until they are all out or
// the phase stops.
func (r *running) pace() {
	defer close(r.due)
	runtime.LockOSThread() // sleepUntil may block this thread
	defer runtime.UnlockOSThread()
	for i := uint64(0); i < r.slots; i++ {
		if !sleepUntil(r.intended(i), r.stop) {
			return
		}
		select {
		case r.due <- i:
		case <-r.stop:
			return
		}
	}
}

// next returns the next slot for a worker, or false when the phase is over.
func (r *running) next() (uint64, bool) {
	if r.stopped.Load() {
		return 0, false
	}
	if r.due == nil {
		i := r.seq.Add(1) - 1
		return i, i < r.slots
	}
	select {
	case i, ok := <-r.due:
		return i, ok
	case <-r.stop:
		return 0, false
	}
}

// work is worker w: it takes slots and calls until the phase is over,
// tallying into st.
func (r *running) work(w int, st *stats) {
	rnd := rand.New(rand.NewPCG(r.l.seed, uint64(w)))
	sc := new(callScratch)
	for j := 0; ; j++ {
		i, ok := r.next()
		if !ok {
			return
		}
		idx := r.l.picker.Pick(i, rnd)
		conn := r.l.conns[(w+j)%len(r.l.conns)]
		if r.due == nil {
			ok = r.closedCall(conn, idx, sc, st)
		} else {
			ok = r.openCall(conn, i, idx, sc, st)
		}
		if !ok {
			return
		}
	}
}

// closedCall makes one closed-loop call, its latency measured from its
// send. It returns false when Ctrl-C cut the call short.
func (r *running) closedCall(conn *caller, idx int, sc *callScratch, st *stats) bool {
	t0 := time.Now()
	code, err := r.l.call(r.ctx, conn, idx, sc)
	el := time.Since(t0)
	if err != nil && r.ctx.Err() != nil {
		return false // cut short by Ctrl-C: not a server error
	}
	st.count(err, code)
	st.lat.Record(micros(el))
	return true
}

// openCall makes the call of open-loop slot i, its latency measured from
// the slot's intended send time. It returns false when the phase ended
// while the slot waited for a worker, or when Ctrl-C cut the call short.
func (r *running) openCall(conn *caller, i uint64, idx int, sc *callScratch, st *stats) bool {
	if r.stopped.Load() {
		return false // the run ended while this slot waited for a worker
	}
	intended := r.intended(i)
	t0 := time.Now()
	code, err := r.l.call(r.ctx, conn, idx, sc)
	done := time.Now()
	if err != nil && r.ctx.Err() != nil {
		return false
	}
	st.count(err, code)
	st.sent++
	lag := micros(t0.Sub(intended))
	st.lagSum += lag
	st.lagMax = max(st.lagMax, lag)
	if lag > 1000 {
		st.late++
	}
	st.lat.Record(micros(done.Sub(intended)))
	st.svc.Record(micros(done.Sub(t0)))
	return true
}

func codeName(c int) string { return codes.Code(c).String() }
