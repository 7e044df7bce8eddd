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

// run runs one phase. ctx cancellation (Ctrl-C) ends it early; the result
// then covers the run so far and says it was interrupted.
func (l *loader) run(ctx context.Context, p phase) result {
	var (
		seq     atomic.Uint64
		stopped atomic.Bool
		stop    = make(chan struct{})
		once    sync.Once
		wg      sync.WaitGroup
		all     = make([]stats, l.workers)
	)
	halt := func() { once.Do(func() { stopped.Store(true); close(stop) }) }
	start := time.Now()
	end := start.Add(p.dur)
	timer := time.AfterFunc(p.dur, halt)
	defer timer.Stop()
	go func() {
		select {
		case <-ctx.Done():
			halt()
		case <-stop:
		}
	}()

	var interval float64
	slots := uint64(math.MaxUint64)
	if p.rate > 0 {
		interval = float64(time.Second) / p.rate
		slots = uint64(math.Ceil(p.dur.Seconds() * p.rate)) // due before end
		if p.n > 0 {
			slots = min(slots, p.n)
		}
	} else if p.n > 0 {
		slots = p.n
	}

	// Open loop: one pacer releases slot i at start + i/rate, precisely
	// (see sleepUntil), into a queue that any free worker takes from; the
	// time a slot waits for a worker is latency.
	var due chan uint64
	if p.rate > 0 {
		due = make(chan uint64, 1<<16)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(due)
			runtime.LockOSThread() // sleepUntil may block this thread
			defer runtime.UnlockOSThread()
			for i := uint64(0); i < slots; i++ {
				if !sleepUntil(start.Add(time.Duration(float64(i)*interval)), stop) {
					return
				}
				select {
				case due <- i:
				case <-stop:
					return
				}
			}
		}()
	}

	for w := range l.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := &all[w]
			r := rand.New(rand.NewPCG(l.seed, uint64(w)))
			sc := new(callScratch)
			for j := 0; ; j++ {
				if stopped.Load() {
					return
				}
				var i uint64
				if due == nil {
					if i = seq.Add(1) - 1; i >= slots {
						return
					}
				} else {
					var ok bool
					select {
					case i, ok = <-due:
						if !ok {
							return
						}
					case <-stop:
						return
					}
				}
				idx := l.picker.Pick(i, r)
				conn := l.conns[(w+j)%len(l.conns)]
				if due == nil {
					t0 := time.Now()
					code, err := l.call(ctx, conn, idx, sc)
					el := time.Since(t0)
					if err != nil && ctx.Err() != nil {
						return // cut short by Ctrl-C: not a server error
					}
					st.count(err, code)
					st.lat.Record(micros(el))
					continue
				}
				if stopped.Load() {
					return // the run ended while this slot waited for a worker
				}
				intended := start.Add(time.Duration(float64(i) * interval))
				t0 := time.Now()
				code, err := l.call(ctx, conn, idx, sc)
				done := time.Now()
				if err != nil && ctx.Err() != nil {
					return
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
			}
		}()
	}
	wg.Wait()
	res := result{elapsed: time.Since(start), interrupted: ctx.Err() != nil}
	for i := range all {
		res.st.merge(&all[i])
	}
	if p.rate > 0 {
		res.intended = slots
		if res.interrupted {
			// Only what fell due before the interruption.
			due := time.Since(start)
			if e := end.Sub(start); due > e {
				due = e
			}
			res.intended = min(slots, uint64(math.Ceil(due.Seconds()*p.rate)))
		}
	}
	return res
}

func codeName(c int) string { return codes.Code(c).String() }
