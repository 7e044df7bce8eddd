//go:build redis

package global

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
)

const sec = int64(time.Second / time.Microsecond)

// snapshotScript reads a key's meta hash and its windows' hashes from
// window lo to hi in one atomic call.
var snapshotScript = redis.NewScript(`
local out = {redis.call('HGETALL', KEYS[1])}
for v = tonumber(ARGV[1]), tonumber(ARGV[2]) do table.insert(out, redis.call('HGETALL', KEYS[1] .. '|' .. v)) end
return out`)

// held returns, per window from lo to hi, each region's share as the
// script counts it: its stored share, else its floor from its first
// window on.
func held(t *testing.T, c redis.UniversalClient, meta string, lo, hi int64) []map[string]int64 {
	t.Helper()
	res, err := snapshotScript.Run(context.Background(), c, []string{meta}, lo, hi).Slice()
	if err != nil {
		t.Fatal(err)
	}
	pairs := func(x any) map[string]string {
		l := x.([]any)
		m := map[string]string{}
		for i := 0; i+1 < len(l); i += 2 {
			m[l[i].(string)] = l[i+1].(string)
		}
		return m
	}
	m := pairs(res[0])
	floors, from := map[string]int64{}, map[string]int64{}
	for k, v := range m {
		n, _ := strconv.ParseInt(v, 10, 64)
		switch {
		case len(k) > 2 && k[:2] == "f|":
			floors[k[2:]] = n
		case len(k) > 3 && k[:3] == "ff|":
			from[k[3:]] = n
		}
	}
	out := make([]map[string]int64, 0, hi-lo+1)
	for i, v := 1, lo; v <= hi; i, v = i+1, v+1 {
		h := map[string]int64{}
		for q, f := range floors {
			if v >= from[q] {
				h[q] = f
			}
		}
		for q, s := range pairs(res[i]) {
			h[q], _ = strconv.ParseInt(s, 10, 64)
		}
		out = append(out, h)
	}
	return out
}

// checkSums fails t when any window's shares (a sliding window: the
// larger of each region's for the window and the one before) sum over
// limit.
func checkSums(t *testing.T, h []map[string]int64, lo, limit int64, sliding bool) {
	t.Helper()
	if err := sumsError(h, lo, limit, sliding); err != nil {
		t.Fatal(err)
	}
}

// sumsError is checkSums' error.
func sumsError(h []map[string]int64, lo, limit int64, sliding bool) error {
	for i := range h {
		var sum int64
		for q, s := range h[i] {
			if sliding && i > 0 {
				s = max(s, h[i-1][q])
			}
			sum += s
		}
		if sum > limit {
			return fmt.Errorf("window %d: shares %v (before: %v) sum to %d, over the limit %d", lo+int64(i), h[i], h[max(i-1, 0)], sum, limit)
		}
	}
	return nil
}

// testEpoch is the start of the current second, in µs: a test clock
// near Redis's, whose keys expire on its own.
func testEpoch() int64 { return time.Now().Unix() * sec }

func settings(region, replica string) Settings {
	return Settings{Region: region, Replica: replica, Interval: time.Second, Lease: 2 * time.Second, Floor: 0.1, Margin: DefaultMargin}
}

func exchange1(t *testing.T, c redis.UniversalClient, s Settings, a Ask) Grant {
	t.Helper()
	g, errs := Exchange(context.Background(), c, s, []Ask{a})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	return g[0]
}

// roundSettings is settings with a lease of one interval, as a replica
// runs by default.
func roundSettings(region, replica string) Settings {
	s := settings(region, replica)
	s.Lease = s.Interval
	return s
}

// roundCall makes a's call of a round's phase: 0 publishes its demand (no
// grant), 1 asks for its grant.
func roundCall(t *testing.T, c redis.UniversalClient, s Settings, a Ask, phase int64) Grant {
	t.Helper()
	if phase == 0 {
		if err := Publish(context.Background(), c, s, []Ask{a})[0]; err != nil {
			t.Fatal(err)
		}
		return Grant{}
	}
	return exchange1(t, c, s, a)
}

// share returns g's share of window v: its stored share, else its floor.
func share(g Grant, v int64) uint64 {
	if i := v - g.Current; i >= 0 && i < int64(len(g.Shares)) {
		return g.Shares[i]
	}
	if v >= g.FloorFrom {
		return g.Floor
	}
	return 0
}

// TestExchangeFollowsDemand: three regions get shares by demand (600, 150,
// 150 of 300: 200, 50, 50; the busy one alone: all but the others' floors),
// never lowered in a window they were granted, and the shares of every
// window never sum over the limit.
func TestExchangeFollowsDemand(t *testing.T) {
	c := redistest.StartServer(t).Client()
	t0 := testEpoch()
	a := Ask{Key: "rl:{d:k=x}:k", Limit: 300, Window: time.Second}
	call := func(region string, demand uint64, at int64) Grant {
		a := a
		a.Demand, a.Now = demand, at
		return exchange1(t, c, settings(region, "p1"), a)
	}
	// Each joins with its floor, then grows by demand.
	for i := 0; i < 4; i++ {
		at := t0 + int64(i)*sec
		call("eu", 600, at+100_000)
		call("us", 150, at+200_000)
		call("ap", 150, at+300_000)
	}
	at := t0 + 4*sec + 100_000
	g := call("eu", 600, at)
	if s := share(g, g.Current+2); s != 200 {
		t.Errorf("eu's share of its last window with demands 600, 150, 150: %d, want 200, in proportion (grant %+v)", s, g)
	}
	if g.Floor != 30 {
		t.Errorf("floor %d, want 30 (0.1 of 300)", g.Floor)
	}
	// us and ap go quiet: eu grows into what they no longer hold, only
	// past their leases (their shares of granted windows never fall).
	gu := call("us", 0, at+100_000)
	ga := call("ap", 0, at+200_000)
	before := share(gu, gu.Current+2)
	for i := 1; i <= 4; i++ {
		g = call("eu", 600, at+int64(i)*sec)
		if gu2 := call("us", 0, at+int64(i)*sec+100_000); gu.Current+2 >= gu2.Current && share(gu2, gu.Current+2) < before {
			t.Fatalf("us's share of window %d fell from %d to %d", gu.Current+2, before, share(gu2, gu.Current+2))
		}
		call("ap", 0, at+int64(i)*sec+200_000)
	}
	if s := share(g, g.LeaseEnd); s < 240 {
		t.Errorf("eu alone with demand: share %d of its last window, want 300 less the others' shares (at least 240)", s)
	}
	_ = ga
	checkSums(t, held(t, c, MetaKey(a.Key, 300, time.Second), g.Current-8, g.LeaseEnd+3), g.Current-8, 300, false)
}

// TestExchangeSlidingShareIgnoresWobble: on a sliding window, a region's
// share does not drop when its demand wobbles by less than a twentieth of
// the limit (each drop would idle that capacity for a window), and still
// follows a shift of demand.
func TestExchangeSlidingShareIgnoresWobble(t *testing.T) {
	c := redistest.StartServer(t).Client()
	t0 := testEpoch()
	a := Ask{Key: "rl:{d:k=w}:k", Limit: 300, Window: time.Second, Sliding: true}
	round := func(i int, eu, us, ap uint64) Grant {
		at := t0 + int64(i)*sec
		var g Grant
		for j, d := range []uint64{eu, us, ap} {
			a := a
			a.Demand, a.Now = d, at+int64(j+1)*100_000
			r := exchange1(t, c, settings([]string{"eu", "us", "ap"}[j], "p1"), a)
			if j == 0 {
				g = r
			}
		}
		return g
	}
	for i := range 6 {
		round(i, 600, 150, 150)
	}
	settled := round(6, 600, 150, 150)
	want := share(settled, settled.LeaseEnd)
	for i := 7; i < 13; i++ {
		eu, small := uint64(570), uint64(160)
		if i%2 == 0 {
			eu, small = 630, 140
		}
		g := round(i, eu, small, small)
		if s := share(g, g.LeaseEnd); s != want {
			t.Errorf("round %d: demand %d against 2x%d: eu's share of window %d is %d, want %d as before the wobble", i, eu, small, g.LeaseEnd, s, want)
		}
	}
	var g Grant
	for i := 13; i < 18; i++ {
		g = round(i, 150, 600, 150)
	}
	if s := share(g, g.LeaseEnd); s > 60 {
		t.Errorf("eu's share %d of window %d after its demand fell to 150 of 900, want at most 60", s, g.LeaseEnd)
	}
	checkSums(t, held(t, c, MetaKey(a.Key, 300, time.Second), settled.Current-6, g.LeaseEnd+2), settled.Current-6, 300, true)
}

// TestExchangeRoundIgnoresOrder: three regions of two replicas each (their
// demand split 60/40) publish their demand a quarter into each round and
// ask for grants half into it, each in an order drawn at random; the demand
// shifts from eu to us at round 6's boundary, as round 6 publishes it.
// Every grant of a round reads the same demands, so two keys exchanged in
// different orders get the same shares of every window once the key has
// settled, and the shift is followed whole and at once: a fixed window's
// shares are 200/50/50 up to window 6 and 50/200/50 from window 7; a
// sliding window, which counts eu's hits of window 6 in window 7's
// estimate, reaches 50/200/50 at window 8.
func TestExchangeRoundIgnoresOrder(t *testing.T) {
	c := redistest.StartServer(t).Client()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	for _, sliding := range []bool{false, true} {
		t0 := testEpoch()
		run := func(key string, rng *rand.Rand) []map[string]int64 {
			a := Ask{Key: key, Limit: 300, Window: time.Second, Sliding: sliding}
			for i := range int64(13) {
				demand := map[string]uint64{"eu": 600, "us": 150, "ap": 150}
				if i >= 6 {
					demand = map[string]uint64{"eu": 150, "us": 600, "ap": 150}
				}
				for phase := range int64(2) {
					for pos, j := range rng.Perm(6) {
						region, p := []string{"eu", "us", "ap"}[j/2], j%2
						a := a
						a.Demand = demand[region] * []uint64{60, 40}[p] / 100
						a.Now = t0 + i*sec + (1+phase)*sec/4 + int64(pos)*20_000
						roundCall(t, c, roundSettings(region, "p"+strconv.Itoa(p)), a, phase)
					}
				}
			}
			meta := MetaKey(key, 300, time.Second)
			h := held(t, c, meta, t0/sec, t0/sec+13)
			checkSums(t, h, t0/sec, 300, sliding)
			return h
		}
		k1, k2 := fmt.Sprintf("rl:{d:k=o1%v}:k", sliding), fmt.Sprintf("rl:{d:k=o2%v}:k", sliding)
		h1 := run(k1, rand.New(rand.NewPCG(seed, 1)))
		h2 := run(k2, rand.New(rand.NewPCG(seed, 2)))
		before, after, from := map[string]int64{"eu": 200, "us": 50, "ap": 50}, map[string]int64{"eu": 50, "us": 200, "ap": 50}, 7
		if sliding {
			from = 8
		}
		for v := 3; v <= 13; v++ {
			if !maps.Equal(h1[v], h2[v]) {
				t.Errorf("sliding=%v: window %d's shares %v in one order, %v in another", sliding, v, h1[v], h2[v])
			}
			switch {
			case v <= 6 && !maps.Equal(h1[v], before):
				t.Errorf("sliding=%v: window %d's shares %v, want %v (the demand before the shift)", sliding, v, h1[v], before)
			case v >= from && !maps.Equal(h1[v], after):
				t.Errorf("sliding=%v: window %d's shares %v, want %v (the demand after the shift)", sliding, v, h1[v], after)
			}
		}
	}
}

// TestExchangeShiftLiftsTheBand: a shift's demand is a quarter's (here eu's
// 600 published as 200 where 150 was true), and the next round's, a whole
// interval's, corrects it at once on a sliding window, though by less than
// the band a steady demand's wobble keeps: eu's share falls from 63 to 50
// at the window after, not a window later, where the drop would idle the
// capacity us asks for.
func TestExchangeShiftLiftsTheBand(t *testing.T) {
	c := redistest.StartServer(t).Client()
	t0 := testEpoch()
	a := Ask{Key: "rl:{d:k=b}:k", Limit: 300, Window: time.Second, Sliding: true}
	var last [3]Grant
	round := func(i int64, demand [3]uint64, shift bool) {
		for phase := range int64(2) {
			for j, region := range []string{"eu", "us", "ap"} {
				a := a
				a.Demand, a.Shift, a.Now = demand[j], shift && j < 2, t0+i*sec+(1+phase)*sec/4+int64(j)*20_000
				if g := roundCall(t, c, roundSettings(region, "p1"), a, phase); phase == 1 {
					last[j] = g
				}
			}
		}
	}
	for i := range int64(5) {
		round(i, [3]uint64{600, 150, 150}, false)
	}
	round(5, [3]uint64{200, 600, 150}, true) // the shift, measured on a quarter
	w := t0 / sec
	if s := share(last[0], w+6); s != 63 {
		t.Fatalf("eu's share of window 6 after the shift's round: %d, want 63 (300·200/950)", s)
	}
	for i := int64(6); i < 9; i++ {
		round(i, [3]uint64{150, 600, 150}, false)
		if s := share(last[0], w+i+1); s != 50 {
			t.Errorf("eu's share of window %d: %d, want 50 (300·150/900) from the round after the shift's", i+1, s)
		}
	}
	if s := share(last[1], w+8); s != 200 {
		t.Errorf("us's share of window 8: %d, want 200", s)
	}
	checkSums(t, held(t, c, MetaKey(a.Key, 300, time.Second), w, w+9), w, 300, true)
}

// TestExchangeFloorAfterLeases: a region joining while another holds the
// whole limit gets its whole floor, from the window after the other's
// lease; the shares of every window stay within the limit.
func TestExchangeFloorAfterLeases(t *testing.T) {
	c := redistest.StartServer(t).Client()
	t0 := testEpoch()
	a := Ask{Key: "rl:{d:k=f}:k", Limit: 300, Window: time.Second, Demand: 600, Now: t0 + 100_000}
	g := exchange1(t, c, settings("eu", "p1"), a)
	if s := share(g, g.LeaseEnd); s != 300 {
		t.Fatalf("eu alone: %d, want 300", s)
	}
	a.Now = t0 + 200_000
	u := exchange1(t, c, settings("us", "p1"), a)
	if u.Floor != 30 || u.FloorFrom <= g.LeaseEnd {
		t.Errorf("us's floor %d from window %d, want 30 after eu's lease end %d", u.Floor, u.FloorFrom, g.LeaseEnd)
	}
	checkSums(t, held(t, c, MetaKey(a.Key, 300, time.Second), g.Current-1, g.LeaseEnd+5), g.Current-1, 300, false)
}

// TestExchangeLeaseThenFloorThenNothing: a region that stops calling keeps
// its shares to its lease end and its floor for 10 leases; others grow
// into its share only after its lease end, into its floor only after that.
func TestExchangeLeaseThenFloorThenNothing(t *testing.T) {
	c := redistest.StartServer(t).Client()
	t0 := testEpoch()
	a := Ask{Key: "rl:{d:k=y}:k", Limit: 300, Window: time.Second}
	call := func(region string, demand uint64, at int64) Grant {
		a := a
		a.Demand, a.Now = demand, at
		return exchange1(t, c, settings(region, "p1"), a)
	}
	var cut Grant
	for i := int64(0); i < 4; i++ {
		call("eu", 300, t0+i*sec)
		cut = call("us", 300, t0+i*sec+500_000)
	}
	// us is cut off from here: it holds its shares to cut.LeaseEnd.
	var g Grant
	for i := int64(4); i < 40; i++ {
		g = call("eu", 600, t0+i*sec)
		for v := g.Current; v <= g.LeaseEnd; v++ {
			if v <= cut.LeaseEnd && share(g, v)+share(cut, v) > 300 {
				t.Fatalf("window %d: eu %d + cut-off us %d > 300", v, share(g, v), share(cut, v))
			}
		}
		if g.Current > cut.LeaseEnd+1 && g.Now < cut.Now+20*sec {
			if s := share(g, g.LeaseEnd); s != 300-cut.Floor {
				t.Fatalf("window %d after us's lease: eu %d, want 300 - us's floor %d", g.LeaseEnd, s, cut.Floor)
			}
		}
	}
	if s := share(g, g.LeaseEnd); s != 300 {
		t.Errorf("us gone for 10 leases: eu's share %d, want 300", s)
	}
}

// TestExchangeRacingRegionsNeverOverLimit: many regions and replicas
// racing on one key with random demands, clocks and absences never make
// any window's shares sum over the limit, fixed or sliding, on a single
// Redis and on a 3-master Cluster (there with a key of no hash tag of its
// own: MetaKey's braces keep its window hashes in its meta hash's slot).
func TestExchangeRacingRegionsNeverOverLimit(t *testing.T) {
	stores := []struct {
		name, key string
		c         redis.UniversalClient
	}{
		{"single", "rl:{d:k=%v}:k", redistest.StartServer(t).Client()},
		{"cluster", "plain:k=%v", redistest.StartCluster(t, 3, 0).Client()},
	}
	for _, st := range stores {
		for _, sliding := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sliding=%v", st.name, sliding), func(t *testing.T) {
				racingRegions(t, st.c, fmt.Sprintf(st.key, sliding), sliding)
			})
		}
	}
}

// racingRegions is TestExchangeRacingRegionsNeverOverLimit on one store and key.
func racingRegions(t *testing.T, c redis.UniversalClient, key string, sliding bool) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var clock atomic.Int64
	clock.Store(testEpoch())
	a := Ask{Key: key, Limit: 97, Window: time.Second, Sliding: sliding}
	meta := MetaKey(a.Key, a.Limit, a.Window)
	var wg sync.WaitGroup
	var failed atomic.Bool
	for r := 0; r < 6; r++ {
		for p := 0; p < 2; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(r*10+p)))
				s := settings("r"+strconv.Itoa(r), "p"+strconv.Itoa(p))
				s.Floor = []float64{0, 0.05, 0.2}[rng.IntN(3)]
				for i := 0; i < 150 && !failed.Load(); i++ {
					a := a
					a.Demand = uint64(rng.IntN(200))
					a.Now = clock.Add(rng.Int64N(sec / 2))
					if rng.IntN(10) == 0 {
						clock.Add(5 * sec) // a long silence: leases end, floors go
					}
					if _, errs := Exchange(context.Background(), c, s, []Ask{a}); errs[0] != nil {
						t.Error(errs[0])
						failed.Store(true)
					}
				}
			}()
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for checking := true; checking; {
		select {
		case <-done:
			checking = false
		default:
		}
		now := clock.Load() / sec
		if err := sumsError(held(t, c, meta, now-3, now+6), now-3, 97, sliding); err != nil && !failed.Swap(true) {
			t.Error(err)
		}
	}
	if failed.Load() {
		t.FailNow()
	}
	now := clock.Load() / sec
	checkSums(t, held(t, c, meta, now-60, now+6), now-60, 97, sliding)
}

// readDoc returns docs/global.md.
func readDoc() (string, error) {
	b, err := os.ReadFile("../../docs/global.md")
	return string(b), err
}
