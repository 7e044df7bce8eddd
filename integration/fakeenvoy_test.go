package integration

import (
	"context"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rls-project/rls/pkg/rlqs"
)

// fakeEnvoy models Envoy's rate_limit_quota filter client as read from its
// C++ (docs/rlqs.md, /work/shared/design/rlqs.md §2): one stream per
// domain, opened lazily on the first request that matches a bucket; an
// immediate single-bucket report for a new bucket (time_elapsed 0 s); then
// every interval (5 s in Envoy, shortened here) one report of every bucket
// with whole-second time_elapsed and the domain; token buckets enforced
// locally with continuous refill; whole-second TTLs (0 expires at once);
// requests_per_time_unit and unset strategies skipped; a replaced token
// bucket seeded with the old one's ratio of tokens, an identical one
// carried over; unknown BucketIds ignored; abandon forgets the bucket; on
// expiry the expired fallback, then no_assignment_behavior; a broken stream
// keeps the assignments, drops the report it could not send and retries on
// the next tick (on the next address: a cluster moving it to another rls).
type fakeEnvoy struct {
	addrs    []string
	domain   string
	interval time.Duration
	// noAssignDeny is no_assignment_behavior DENY_ALL (else ALLOW_ALL);
	// expiredDeny is expired_assignment_behavior's fallback DENY_ALL (else
	// the no-assignment behaviour).
	noAssignDeny, expiredDeny bool

	mu      sync.Mutex
	buckets map[string]*fakeBucket
	conn    *grpc.ClientConn
	stream  grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	next    int // the address the next stream opens to
	cancel  context.CancelFunc
	ticker  bool
	stopped chan struct{}
	wg      sync.WaitGroup
	// seen records every response, for conformance tests.
	seen     []*rlqsv3.RateLimitQuotaResponse
	streams  int // streams opened
	recvErrs []error
}

type fakeBucket struct {
	id               map[string]string
	allowed, denied  uint64
	lastReport       time.Time
	strategy         *typev3.RateLimitStrategy // the active assignment's; nil: none
	expires          time.Time
	hadAssignment    bool
	tokens, max, per float64 // per: tokens per second
	refilled         time.Time
}

func newFakeEnvoy(domain string, interval time.Duration, addrs ...string) *fakeEnvoy {
	return &fakeEnvoy{addrs: addrs, domain: domain, interval: interval, buckets: map[string]*fakeBucket{}, stopped: make(chan struct{})}
}

func bucketKey(id map[string]string) string { return rlqs.BucketKey(id) }

// request decides one request of bucket id, as the filter does.
func (e *fakeEnvoy) request(id map[string]string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	k := bucketKey(id)
	b := e.buckets[k]
	if b == nil {
		b = &fakeBucket{id: id, lastReport: now}
		e.buckets[k] = b
		ok := !e.noAssignDeny
		e.count(b, ok)
		if e.stream == nil {
			e.openLocked()
		}
		e.startTicker()
		e.sendLocked([]*fakeBucket{b}, now) // the immediate report of a new bucket
		return ok
	}
	ok := e.decide(b, now)
	e.count(b, ok)
	return ok
}

func (e *fakeEnvoy) count(b *fakeBucket, ok bool) {
	if ok {
		b.allowed++
	} else {
		b.denied++
	}
}

func (e *fakeEnvoy) decide(b *fakeBucket, now time.Time) bool {
	s := b.strategy
	if s == nil || !now.Before(b.expires) {
		if b.hadAssignment && e.expiredDeny {
			return false
		}
		return !e.noAssignDeny
	}
	switch x := s.Strategy.(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return x.BlanketRule == typev3.RateLimitStrategy_ALLOW_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		b.tokens = min(b.max, b.tokens+now.Sub(b.refilled).Seconds()*b.per)
		b.refilled = now
		if b.tokens >= 1 {
			b.tokens--
			return true
		}
		return false
	}
	return true // an RPTU strategy that became active (never, as Envoy skips them) allows
}

// openLocked opens the stream to the next address and starts reading it.
func (e *fakeEnvoy) openLocked() {
	addr := e.addrs[e.next%len(e.addrs)]
	e.next++
	if e.conn != nil {
		e.conn.Close()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		conn.Close()
		return
	}
	e.conn, e.stream, e.cancel = conn, st, cancel
	e.streams++
	e.wg.Add(1)
	go e.recvLoop(st)
}

func (e *fakeEnvoy) startTicker() {
	if e.ticker {
		return
	}
	e.ticker = true
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		t := time.NewTicker(e.interval)
		defer t.Stop()
		for {
			select {
			case <-e.stopped:
				return
			case <-t.C:
				e.tick()
			}
		}
	}()
}

// tick sends the periodic report of every bucket; with no stream (it
// broke) it opens one and sends the report on it.
func (e *fakeEnvoy) tick() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stream == nil {
		e.openLocked()
	}
	all := make([]*fakeBucket, 0, len(e.buckets))
	for _, b := range e.buckets {
		all = append(all, b)
	}
	sort.Slice(all, func(i, j int) bool { return bucketKey(all[i].id) < bucketKey(all[j].id) })
	if len(all) > 0 {
		e.sendLocked(all, time.Now())
	}
}

// sendLocked reports bs; the counts are swapped to 0 whether or not the
// send succeeds (Envoy drops a report it could not send).
func (e *fakeEnvoy) sendLocked(bs []*fakeBucket, now time.Time) {
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: e.domain}
	for _, b := range bs {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: b.id},
			TimeElapsed:        durationpb.New(now.Sub(b.lastReport).Truncate(time.Second)),
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	if e.stream == nil {
		return
	}
	if err := e.stream.Send(m); err != nil {
		e.breakLocked()
	}
}

func (e *fakeEnvoy) breakLocked() {
	if e.cancel != nil {
		e.cancel()
	}
	e.stream = nil
}

func (e *fakeEnvoy) recvLoop(st grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) {
	defer e.wg.Done()
	for {
		resp, err := st.Recv()
		e.mu.Lock()
		if err != nil {
			e.recvErrs = append(e.recvErrs, err)
			if e.stream == st {
				e.breakLocked()
			}
			e.mu.Unlock()
			return
		}
		e.seen = append(e.seen, resp)
		e.apply(resp, time.Now())
		e.mu.Unlock()
	}
}

// apply takes a response as the filter's onQuotaResponseImpl does.
func (e *fakeEnvoy) apply(resp *rlqsv3.RateLimitQuotaResponse, now time.Time) {
	for _, a := range resp.BucketAction {
		b := e.buckets[bucketKey(a.GetBucketId().GetBucket())]
		if len(a.GetBucketId().GetBucket()) == 0 || b == nil {
			continue // unknown ids are ignored
		}
		if a.GetAbandonAction() != nil {
			delete(e.buckets, bucketKey(b.id))
			continue
		}
		q := a.GetQuotaAssignmentAction()
		s := q.GetRateLimitStrategy()
		if s.GetStrategy() == nil || s.GetRequestsPerTimeUnit() != nil {
			continue // skipped, the bucket keeps its state
		}
		ttl := time.Duration(q.GetAssignmentTimeToLive().GetSeconds()) * time.Second // whole seconds; unset is 0
		if tb := s.GetTokenBucket(); tb != nil {
			e.applyTokenBucket(b, tb, now)
		}
		b.strategy, b.expires, b.hadAssignment = s, now.Add(ttl), true
	}
}

func (e *fakeEnvoy) applyTokenBucket(b *fakeBucket, tb *typev3.TokenBucket, now time.Time) {
	fill := tb.GetFillInterval().GetSeconds()
	per := 0.0 // an unset tokens_per_fill reads as rate 0
	if fill > 0 {
		per = float64(tb.GetTokensPerFill().GetValue()) / float64(fill)
	}
	old := b.strategy.GetTokenBucket()
	live := old != nil && now.Before(b.expires)
	if live && old.MaxTokens == tb.MaxTokens && old.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() &&
		old.GetFillInterval().GetNanos() == tb.GetFillInterval().GetNanos() {
		return // the same bucket: carried over, only the TTL restarts
	}
	newMax := float64(tb.MaxTokens)
	tokens := newMax
	if live && b.max > 0 { // the newest Envoy seeds a replaced bucket with the old one's ratio
		b.tokens = min(b.max, b.tokens+now.Sub(b.refilled).Seconds()*b.per)
		tokens = newMax * b.tokens / b.max
	}
	b.tokens, b.max, b.per, b.refilled = tokens, newMax, per, now
}

// close ends the fake Envoy.
func (e *fakeEnvoy) close() {
	close(e.stopped)
	e.mu.Lock()
	e.breakLocked()
	if e.conn != nil {
		e.conn.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// responses returns copies of the responses seen so far.
func (e *fakeEnvoy) responses() []*rlqsv3.RateLimitQuotaResponse {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*rlqsv3.RateLimitQuotaResponse, len(e.seen))
	for i, r := range e.seen {
		out[i] = proto.Clone(r).(*rlqsv3.RateLimitQuotaResponse)
	}
	return out
}

// fleetLoad drives fake Envoys at given rates (requests per second) and
// counts what they admitted per second of the Unix clock (the store's
// windows).
type fleetLoad struct {
	mu       sync.Mutex
	admitted map[int64]int
	byEnvoy  map[[2]int64]int // admitted by (Envoy, second)
	offered  map[int64]int    // requests sent, by second: the generator may fall behind on a busy machine
	times    []time.Time      // when each admitted request was decided
	total    atomic.Int64
	rates    []atomic.Int64
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func startLoad(envoys []*fakeEnvoy, id map[string]string, rates ...int64) *fleetLoad {
	l := &fleetLoad{admitted: map[int64]int{}, byEnvoy: map[[2]int64]int{}, offered: map[int64]int{}, rates: make([]atomic.Int64, len(envoys)), stop: make(chan struct{})}
	for i, e := range envoys {
		l.rates[i].Store(rates[i])
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			const tick = 10 * time.Millisecond
			t := time.NewTicker(tick)
			defer t.Stop()
			owed := 0.0
			for {
				select {
				case <-l.stop:
					return
				case <-t.C:
				}
				owed += float64(l.rates[i].Load()) * tick.Seconds()
				for ; owed >= 1; owed-- {
					ok := e.request(id)
					now := time.Now()
					sec := now.Unix()
					l.mu.Lock()
					l.offered[sec]++
					if ok {
						l.admitted[sec]++
						l.byEnvoy[[2]int64{int64(i), sec}]++
						l.times = append(l.times, now)
					}
					l.mu.Unlock()
					if ok {
						l.total.Add(1)
					}
				}
			}
		}()
	}
	return l
}

func (l *fleetLoad) end() {
	l.stopOnce.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// envoys returns the admitted of each Envoy in second sec.
func (l *fleetLoad) envoys(sec int64) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := make([]int, len(l.rates))
	for i := range n {
		n[i] = l.byEnvoy[[2]int64{int64(i), sec}]
	}
	return n
}

func (l *fleetLoad) window(sec int64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.admitted[sec]
}

// maxRolling returns the most requests admitted within any span of d
// that starts at or after from.
func (l *fleetLoad) maxRolling(d time.Duration, from time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := slices.Clone(l.times)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	most, j := 0, 0
	for i, t := range ts {
		if t.Before(from) {
			j = i + 1
			continue
		}
		for t.Sub(ts[j]) >= d {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// offeredIn returns the requests sent in second sec.
func (l *fleetLoad) offeredIn(sec int64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.offered[sec]
}

// waitSecond sleeps until the Unix second after now begins and returns it.
func waitSecond() int64 {
	now := time.Now()
	next := now.Truncate(time.Second).Add(time.Second)
	time.Sleep(next.Sub(now)) // the next second's start: real time on purpose
	return next.Unix()
}
