package integration

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/global"
)

// delayProxy forwards TCP to a target, holding every chunk delay in each
// direction (order kept); Stop closes it and every connection (the link is
// cut), Start listens again on the same address.
type delayProxy struct {
	addr, target string
	delay        time.Duration
	mu           sync.Mutex
	ln           net.Listener
	conns        []net.Conn
	wg           sync.WaitGroup
}

func startDelayProxy(t *testing.T, target string, delay time.Duration) *delayProxy {
	p := &delayProxy{addr: freeAddr(t), target: target, delay: delay}
	p.Start(t)
	t.Cleanup(p.Stop)
	return p
}

func (p *delayProxy) Start(t *testing.T) {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); p.pipe(u, c) }()
			go func() { defer p.wg.Done(); p.pipe(c, u) }()
		}
	}()
}

// pipe copies src to dst, each chunk delay after it was read.
func (p *delayProxy) pipe(dst, src net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{b[:n], time.Now().Add(p.delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	for range q { // let the reader end
	}
}

func (p *delayProxy) Stop() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// region is one region of the test: its Redis, its proxy to the global
// store and its rls replicas.
type region struct {
	name  string
	redis *redistest.Server
	proxy *delayProxy
	rls   []*rlsProc
}

// globalWorld starts the global store and three regions of two replicas
// each, on the production build, each region reaching the global store
// through its own proxy 40 ms away each way.
func globalWorld(t *testing.T, yaml string) (*redistest.Server, []*region) {
	g := redistest.StartServer(t)
	return g, globalRegions(t, yaml, func(r *region) string {
		r.proxy = startDelayProxy(t, g.Addr, 40*time.Millisecond)
		return "redis://" + r.proxy.addr
	})
}

// globalRegions starts three regions of two replicas each, each replica
// given the global URL that url returns for its region.
func globalRegions(t *testing.T, yaml string, url func(*region) string) []*region {
	dir := writeConfig(t, map[string]string{"g.yaml": yaml})
	var regions []*region
	for _, name := range []string{"eu", "us", "ap"} {
		r := &region{name: name, redis: redistest.StartServer(t)}
		u := url(r)
		for range 2 { // all six start at once, then are waited for
			r.rls = append(r.rls, startRLSBin(t, rlsFastBin, dir, "--store", "redis", "--redis-url", r.redis.URL(),
				"--region", name, "--global-redis-url", u))
		}
		regions = append(regions, r)
	}
	for _, r := range regions {
		for _, p := range r.rls {
			p.waitServing(t, 30*time.Second)
		}
	}
	return regions
}

// outcome is one decision the load saw: sent when the request left, at
// when its answer arrived (the decision lies between).
type outcome struct {
	sent, at time.Time
	region   int
	allowed  bool
}

// globalLoad sends rate(i)/s requests for key to each region i (spread over
// its replicas) until stop, recording every outcome.
type globalLoad struct {
	mu   sync.Mutex
	outs []outcome
	rate [3]int
	// offered counts the requests sent, by second and region: on a machine
	// as busy as CI's this process may fall behind its rates.
	offered map[int64][3]int
	changes []rateChange
	// compare also sends each request to a regional rule of the same
	// limit, and lat holds both rules' latencies: [0] global, [1] regional.
	compare bool
	lat     [2][]time.Duration
}

func (l *globalLoad) setRates(r [3]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rate = r
	l.changes = append(l.changes, rateChange{time.Now(), r})
}

// rateChange is when the load's rates were set, and to what.
type rateChange struct {
	at   time.Time
	rate [3]int
}

// ratesAt returns the rates in effect at the end of window w.
func (l *globalLoad) ratesAt(w int64) [3]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var r [3]int
	for _, c := range l.changes {
		if c.at.Before(time.Unix(w+1, 0)) {
			r = c.rate
		}
	}
	return r
}

func (l *globalLoad) run(ctx context.Context, regions []*region, key string) *sync.WaitGroup {
	var wg sync.WaitGroup
	// Enough workers that an answer 20 ms late does not cut the busy
	// region's demand (600/s: 37.5 a second each, two calls when compare).
	const workers = 16
	l.mu.Lock()
	if l.offered == nil {
		l.offered = map[int64][3]int{}
	}
	l.mu.Unlock()
	for i, r := range regions {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := r.rls[w%len(r.rls)].client()
				next := time.Now()
				for ctx.Err() == nil {
					l.mu.Lock()
					rate := l.rate[i]
					l.mu.Unlock()
					// Independent arrivals (exponential gaps), as a gateway
					// fleet's requests come: workers paced in step would
					// send their region's demand in bursts of 16.
					next = next.Add(time.Duration(rand.ExpFloat64() * float64(time.Second*workers) / float64(max(rate, 1))))
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					} else if d < -100*time.Millisecond {
						next = time.Now() // behind: do not burst
					}
					if l.compare {
						began := time.Now()
						cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
						_, err := c.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "g", Descriptors: []*rlcommon.RateLimitDescriptor{desc("local_key", key)}})
						cancel()
						if err == nil {
							l.mu.Lock()
							l.lat[1] = append(l.lat[1], time.Since(began))
							l.mu.Unlock()
						}
					}
					began := time.Now()
					l.mu.Lock()
					o := l.offered[began.Unix()]
					o[i]++
					l.offered[began.Unix()] = o
					l.mu.Unlock()
					cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
					resp, err := c.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "g", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key", key)}})
					cancel()
					if err != nil {
						continue
					}
					l.mu.Lock()
					l.outs = append(l.outs, outcome{began, time.Now(), i, resp.OverallCode == rlsv3.RateLimitResponse_OK})
					l.lat[0] = append(l.lat[0], time.Since(began))
					l.mu.Unlock()
				}
			}()
		}
	}
	return &wg
}

// fed reports whether the load sent at least 3/4 of want (by region, a
// second) to regions in window w and in the window before, whose demand
// the shares of w follow; else w's lower bounds say nothing of rls, and it
// logs so.
func (l *globalLoad) fed(t *testing.T, w int64, want [3]int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range []int64{w - 1, w} {
		for i := range 3 {
			if got := l.offered[x][i]; got < want[i]*3/4 {
				t.Logf("window %d: the load sent %v in window %d, under 3/4 of %v: its lower bounds are not checked", w, l.offered[x], x, want)
				return false
			}
		}
	}
	return true
}

// sent returns the requests the load sent per region and window (Unix
// second of the send).
func (l *globalLoad) sent() map[int64][3]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.offered)
}

// admitted returns the admitted requests per region and window (Unix
// second of the response).
func (l *globalLoad) admitted() map[int64][3]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[int64][3]int{}
	for _, o := range l.outs {
		if o.allowed {
			w := o.at.Unix()
			x := m[w]
			x[o.region]++
			m[w] = x
		}
	}
	return m
}

// trailing is the most the world admitted in a trailing second (t-1s, t],
// for every t from from+1s to to in 1 ms steps: byAnswer by when each OK
// answer arrived; decided counts only the OKs sent and answered within the
// second, so decided in it: a sound lower bound of the decisions in it,
// which a rule that bounds every trailing second keeps at its limit (an
// answer's time alone moves a decision by its latency, which can carry a
// few into the next second).
func (l *globalLoad) trailing(from, to time.Time) (byAnswer, decided int, atAnswer, atDecided time.Time) {
	l.mu.Lock()
	var oks []outcome
	for _, o := range l.outs {
		if o.allowed && !o.sent.Before(from) && !o.at.After(to) {
			oks = append(oks, o)
		}
	}
	l.mu.Unlock()
	ms := func(t time.Time) int { return int(t.Sub(from) / time.Millisecond) } // bucket i: [from+i ms, from+i+1 ms)
	n := ms(to) + 1
	ans := make([]int, n)     // OKs answered in bucket i
	first := make([][]int, n) // per bucket of the send: the answers' buckets
	for _, o := range oks {
		ans[ms(o.at)]++
		first[ms(o.sent)] = append(first[ms(o.sent)], ms(o.at))
	}
	// A trailing second ending in bucket e holds buckets e-999..e.
	sum := 0
	for e := range n {
		sum += ans[e]
		if e >= 1000 {
			sum -= ans[e-1000]
		}
		if e >= 999 && sum > byAnswer {
			byAnswer, atAnswer = sum, from.Add(time.Duration(e+1)*time.Millisecond)
		}
	}
	for e := 999; e < n; e++ {
		c := 0
		for s := e - 999; s <= e; s++ {
			for _, a := range first[s] {
				if a <= e {
					c++
				}
			}
		}
		if c > decided {
			decided, atDecided = c, from.Add(time.Duration(e+1)*time.Millisecond)
		}
	}
	return byAnswer, decided, atAnswer, atDecided
}

// windowCounts reads each region's count of window w (its Redis's fixed
// window key, exact: what the regional store counted, leases included)
// and each region's share of w from the global store.
func windowCounts(t *testing.T, regions []*region, g redis.UniversalClient, w int64, limit int) (windowRow, map[int64][3]int64) {
	var counts, shares [3]int64
	demand := map[int64][3]int64{} // by the round the replicas published it in
	ctx := context.Background()
	suffix := ":" + strconv.FormatInt(w, 10)
	for i, r := range regions {
		c := r.redis.Client()
		keys, _, err := c.Scan(ctx, 0, "*api_key*"+suffix, 1000).Result() // a window's counters (none for a strict window)
		if err != nil {
			t.Errorf("scan %s: %v", r.name, err)
		}
		for _, k := range keys {
			n, _ := c.Get(ctx, k).Int64()
			counts[i] += n
		}
		c.Close()
	}
	// The shares, from the global store: each global key's window hash,
	// else the region's floor from its first window on.
	var mu sync.Mutex
	var metas []string
	scan := func(ctx context.Context, n *redis.Client) error {
		keys, _, err := n.Scan(ctx, 0, global.MetaKey("*api_key*", uint64(limit), time.Second), 1000).Result()
		mu.Lock()
		metas = append(metas, keys...)
		mu.Unlock()
		return err
	}
	var err error
	switch c := g.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	}
	if err != nil {
		t.Errorf("scan the global store: %v", err)
	}
	for _, meta := range metas {
		win, _ := g.HGetAll(ctx, meta+"|"+strconv.FormatInt(w, 10)).Result()
		fields, _ := g.HGetAll(ctx, meta).Result()
		for i, r := range regions {
			s, ok := win[r.name]
			if from, _ := strconv.ParseInt(fields["ff|"+r.name], 10, 64); !ok && w >= from {
				s = fields["f|"+r.name]
			}
			n, _ := strconv.ParseInt(s, 10, 64)
			shares[i] += n
			for k, v := range fields { // its replicas' demands: 'd|R|P' = 'round:hits'
				round, hits, ok := strings.Cut(v, ":")
				if ok && strings.HasPrefix(k, "d|"+r.name+"|") {
					n, _ := strconv.ParseInt(round, 10, 64)
					d, _ := strconv.ParseInt(hits, 10, 64)
					x := demand[n]
					x[i] += d
					demand[n] = x
				}
			}
		}
	}
	return windowRow{w: w, counts: counts, shares: shares}, demand
}

// globalPhase is how long each phase runs: 8 s in CI, 20 s (the issue's)
// with RLSTEST_GLOBAL_FULL=1.
func globalPhase() time.Duration {
	if os.Getenv("RLSTEST_GLOBAL_FULL") == "1" {
		return 20 * time.Second
	}
	return 8 * time.Second
}

// untilNextSecond sleeps to the start of the next second.
func untilNextSecond() time.Time {
	now := time.Now()
	next := now.Truncate(time.Second).Add(time.Second)
	time.Sleep(next.Sub(now))
	return next
}

// windowRow is one window w: each region's count and share of it, and
// the demand its replicas published in round w (a quarter into w), which
// the shares of window w+1 follow.
type windowRow struct {
	w                      int64
	counts, shares, demand [3]int64
}

// sampleWindows reads every window's counts 300 ms after it ends, until ctx ends.
func sampleWindows(ctx context.Context, t *testing.T, regions []*region, g redis.UniversalClient, limit int) func() []windowRow {
	var mu sync.Mutex
	var rows []windowRow
	demands := map[int64][3]int64{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			next := time.Now().Truncate(time.Second).Add(time.Second + 300*time.Millisecond)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(next)):
			}
			w := next.Unix() - 1
			row, d := windowCounts(t, regions, g, w, limit)
			mu.Lock()
			rows = append(rows, row)
			for n, x := range d { // a read may find a replica a round behind
				y := demands[n]
				for i := range y {
					y[i] = max(y[i], x[i])
				}
				demands[n] = y
			}
			mu.Unlock()
		}
	}()
	return func() []windowRow {
		<-done
		mu.Lock()
		defer mu.Unlock()
		out := slices.Clone(rows)
		for i := range out {
			out[i].demand = demands[out[i].w]
		}
		return out
	}
}

func sum3[T int | int64](x [3]T) T { return x[0] + x[1] + x[2] }

// TestGlobalShift: a scope: global fixed-window rule of 300/s over three
// regions (each its own Redis and two replicas, the global store 40 ms away
// each way): with demand 600/s in one region and 150/s in the others, then
// the busy region moved, no window admits more than 300 across the world,
// each region within its share, and every window from 3 s after each shift
// admits at least 270, the most of it in the busy region.
//
// The global tests are not parallel (sched_test.go): their load is 900
// requests a second from this process, and beside other tests it fell
// behind its demand (a window where 300 could be admitted admitted 202).
func TestGlobalShift(t *testing.T) {
	testGlobalShift(t, "fixed_window")
}

// TestGlobalShiftSliding is TestGlobalShift on a sliding window (the
// default two-counter estimate, which bounds each window's count, not every
// trailing second: its trailing maximum is logged).
func TestGlobalShiftSliding(t *testing.T) {
	testGlobalShift(t, "sliding_window")
}

// TestGlobalShiftStrict is TestGlobalShift on a strict sliding window of
// precision 60, which bounds every trailing second: no trailing second (in
// 1 ms steps) admits more than 300 across the world. Its state is one key
// per region (no window's count to read: its rows' counts show 0).
func TestGlobalShiftStrict(t *testing.T) {
	testGlobalShift(t, globalStrict)
}

// globalStrict is the rule that bounds every trailing second (docs/global.md).
const globalStrict = "sliding_window, precision: 60, strict: true"

const globalYAML = "domain: g\ndescriptors:\n  - key: api_key\n    rate_limit: {name: world, unit: second, requests_per_unit: 300, algorithm: %[1]s, scope: global}\n" +
	"  - key: local_key\n    rate_limit: {name: here, unit: second, requests_per_unit: 300, algorithm: %[1]s}\n"

func testGlobalShift(t *testing.T, alg string) {
	g, regions := globalWorld(t, fmt.Sprintf(globalYAML, alg))
	gc := g.Client()
	defer gc.Close()
	phase := globalPhase()
	ctx, cancel := context.WithCancel(context.Background())
	load := &globalLoad{compare: alg == "fixed_window"}
	load.setRates([3]int{600, 150, 150})
	wg := load.run(ctx, regions, "k1")
	rows := sampleWindows(ctx, t, regions, gc, 300)
	time.Sleep(3 * time.Second) // the key's first exchanges: its shares settle (with 1 s here, a run read 264 at 3 s after shift1)
	shift1 := untilNextSecond()
	shift2 := shift1.Add(phase)
	time.Sleep(time.Until(shift2))
	load.setRates([3]int{150, 600, 150})
	time.Sleep(time.Until(shift2.Add(phase)))
	cancel()
	wg.Wait()
	// busy is the region with 600/s in a window at least 3 s after a shift; -1 otherwise.
	busy := func(w int64) int {
		at := time.Unix(w, 0)
		switch {
		case !at.Before(shift1.Add(3*time.Second)) && at.Before(shift2):
			return 0
		case !at.Before(shift2.Add(3 * time.Second)):
			return 1
		}
		return -1
	}
	all := rows()
	checkGlobalWindows(t, load, all, alg, func(w int64) (lo int) {
		if busy(w) >= 0 {
			return 270
		}
		return 0
	}, shift1.Unix(), shift2.Add(phase).Unix())
	if load.compare { // a figure, not asserted: docs/bench/global.md
		p := func(d []time.Duration, q float64) time.Duration {
			slices.Sort(d)
			return d[min(len(d)-1, int(q*float64(len(d))))]
		}
		t.Logf("latency, global rule: p50 %v p99 %v (%d calls); regional rule: p50 %v p99 %v (%d calls)",
			p(load.lat[0], 0.5), p(load.lat[0], 0.99), len(load.lat[0]), p(load.lat[1], 0.5), p(load.lat[1], 0.99), len(load.lat[1]))
	}
	// Every trailing second from the first shift's to the end: a figure on
	// the fixed and the two-counter window, a bound on the strict one.
	byAnswer, decided, atA, atD := load.trailing(shift1, shift2.Add(phase))
	t.Logf("%s: most admitted in a trailing second across the world: %d by answer time (ending %s), %d sent and answered in it (ending %s)",
		alg, byAnswer, atA.Format("15:04:05.000"), decided, atD.Format("15:04:05.000"))
	if alg == globalStrict && decided > 300 {
		t.Errorf("a trailing second ending %s admitted %d across the world, over 300", atD.Format("15:04:05.000"), decided)
	}
	adm := load.admitted()
	for _, r := range all {
		if b := busy(r.w); b >= 0 && r.w < shift2.Add(phase).Unix() && (adm[r.w][b] <= adm[r.w][(b+1)%3] || adm[r.w][b] <= adm[r.w][(b+2)%3]) &&
			load.fed(t, r.w, load.ratesAt(r.w)) {
			t.Errorf("window %d: the busy region admitted %d of %v, want the most", r.w, adm[r.w][b], adm[r.w])
		}
	}
}

// checkGlobalWindows checks each window from first to last (exclusive):
// the world's count at most 300, each region's count within its share (a
// sliding window: the larger of its shares of w-1 and w), and at least
// lo(w) admitted; and logs the table.
func checkGlobalWindows(t *testing.T, load *globalLoad, rows []windowRow, alg string, lo func(int64) int, first, last int64) {
	adm := load.admitted()
	var b strings.Builder
	fmt.Fprintf(&b, "window  counts(eu us ap) sum  shares(eu us ap) sum  admitted(eu us ap) sum  demand published(eu us ap)  sent(eu us ap)\n")
	sent := load.sent()
	prev := map[int64][3]int64{}
	for _, r := range rows {
		prev[r.w] = r.shares
	}
	checked := 0
	for _, r := range rows {
		a := adm[r.w]
		if r.w < first-2 || r.w > last {
			continue
		}
		mark := " "
		if r.w < first || r.w >= last {
			mark = "-" // shown, not checked
		}
		fmt.Fprintf(&b, "%s%d  %v %d  %v %d  %v %d  %v  %v\n", mark, r.w, r.counts, sum3(r.counts), r.shares, sum3(r.shares), a, sum3(a), r.demand, sent[r.w])
		if mark == "-" {
			continue
		}
		checked++
		if n := sum3(r.counts); n > 300 {
			t.Errorf("window %d: the regions counted %v = %d, over 300", r.w, r.counts, n)
		}
		for i := range 3 {
			s := r.shares[i]
			if p, ok := prev[r.w-1]; ok && strings.HasPrefix(alg, "sliding_window") {
				s = max(s, p[i])
			}
			if r.counts[i] > s {
				t.Errorf("window %d: region %d counted %d, over its share %d", r.w, i, r.counts[i], s)
			}
		}
		if n := sum3(a); n < lo(r.w) && load.fed(t, r.w, load.ratesAt(r.w)) {
			t.Errorf("window %d: %v = %d admitted, want at least %d", r.w, a, n, lo(r.w))
		}
	}
	if checked < int(last-first)-2 {
		t.Errorf("%d windows sampled of %d", checked, last-first)
	}
	t.Logf("%s", b.String())
}

// TestGlobalPartition: the busy region is cut off from the global store
// (its proxy stopped) for a phase: no window admits more than 300 across
// the world; it admits within the shares it holds, then within its floor
// (30); once its lease has ended (and its demand gone stale), the other
// two admit at least 80 % of the rest (216 of 270).
func TestGlobalPartition(t *testing.T) {
	g, regions := globalWorld(t, fmt.Sprintf(globalYAML, "fixed_window"))
	gc := g.Client()
	defer gc.Close()
	phase := globalPhase()
	ctx, cancel := context.WithCancel(context.Background())
	load := &globalLoad{}
	load.setRates([3]int{600, 150, 150})
	wg := load.run(ctx, regions, "k2")
	rows := sampleWindows(ctx, t, regions, gc, 300)
	time.Sleep(3 * time.Second)
	cut := untilNextSecond()
	regions[0].proxy.Stop()
	time.Sleep(phase)
	regions[0].proxy.Start(t)
	time.Sleep(2 * time.Second)
	cancel()
	wg.Wait()
	all := rows()
	// The cut region's last exchange (a quarter into the second before the
	// cut) leased it the cut's window: its floor from the next. Its demand
	// goes stale two intervals after that exchange, and the others' next
	// exchange grants them the rest from the window after.
	checkGlobalWindows(t, load, all, "fixed_window", func(int64) int { return 0 }, cut.Unix(), cut.Add(phase).Unix())
	adm := load.admitted()
	for _, r := range all {
		if r.w < cut.Unix()+2 || r.w >= cut.Add(phase).Unix() {
			continue
		}
		if r.counts[0] > 30 {
			t.Errorf("window %d: the cut-off region counted %d past its lease, over its floor 30", r.w, r.counts[0])
		}
		if n := adm[r.w][1] + adm[r.w][2]; r.w >= cut.Unix()+3 && n < 216 && load.fed(t, r.w, load.ratesAt(r.w)) {
			t.Errorf("window %d: the other regions admitted %d, want at least 216 (80 %% of 270)", r.w, n)
		}
	}
}

// TestGlobalCluster: TestGlobalShift's first phase with the global store a
// 3-master Redis Cluster (mode=cluster; reached directly, as a Cluster's
// nodes announce their own addresses): no window admits more than 300
// across the world, each region within its share, every window from 3 s
// after the start at least 270.
func TestGlobalCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	gc := c.Client()
	defer gc.Close()
	regions := globalRegions(t, fmt.Sprintf(globalYAML, "fixed_window"), func(*region) string {
		return c.Seeds() + "&mode=cluster"
	})
	ctx, cancel := context.WithCancel(context.Background())
	load := &globalLoad{}
	load.setRates([3]int{600, 150, 150})
	wg := load.run(ctx, regions, "k3")
	rows := sampleWindows(ctx, t, regions, gc, 300)
	start := untilNextSecond()
	time.Sleep(3*time.Second + globalPhase()/2)
	cancel()
	wg.Wait()
	checkGlobalWindows(t, load, rows(), "fixed_window", func(w int64) int {
		if w >= start.Unix()+3 {
			return 270
		}
		return 0
	}, start.Unix(), start.Add(3*time.Second+globalPhase()/2).Unix())
}
