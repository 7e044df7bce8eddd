package breaker

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/testkit"
)

// transitions records OnChange calls.
type transitions struct {
	mu  sync.Mutex
	got []string
}

func (tr *transitions) record(from, to State) {
	tr.mu.Lock()
	tr.got = append(tr.got, from.String()+">"+to.String())
	tr.mu.Unlock()
}

func (tr *transitions) list() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.got)
}

// call lets one call through b (failing the test if it is refused) and
// reports o.
func call(t *testing.T, b *Breaker, o Outcome) {
	t.Helper()
	tk, ok := b.Allow()
	if !ok {
		t.Fatalf("breaker (%v) refused a call", b.State())
	}
	b.Done(tk, o)
}

func TestDefaults(t *testing.T) {
	b := New(Options{})
	want := Options{Threshold: 5, FailWindow: 250 * time.Millisecond, Cooldown: 250 * time.Millisecond, Probes: 1}
	got := b.opts
	if got.Threshold != want.Threshold || got.FailWindow != want.FailWindow || got.Cooldown != want.Cooldown || got.Probes != want.Probes || got.Now == nil {
		t.Errorf("defaults %+v, want %+v and a clock", got, want)
	}
}

// TestBurstDoesNotOpen: concurrent failures of one short stall are one
// burst, not an outage.
func TestBurstDoesNotOpen(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1000, 0))
	b := New(Options{Now: clk.Now})
	// Five (and then fifty) calls in flight when the backend stalls for
	// 30 ms: all of them time out within those 30 ms.
	for _, n := range []int{5, 50} {
		tickets := make([]Ticket, n)
		for i := range tickets {
			tk, ok := b.Allow()
			if !ok {
				t.Fatal("closed breaker refused a call")
			}
			tickets[i] = tk
		}
		for _, tk := range tickets {
			clk.Advance(30 * time.Millisecond / time.Duration(n))
			b.Done(tk, Failure)
		}
		if b.State() != Closed {
			t.Fatalf("%d failures within 30 ms opened the breaker", n)
		}
		call(t, b, Success) // the backend is back
	}
}

// TestSustainedFailureOpens: Threshold failures with no success for
// FailWindow open it, and not a moment earlier.
func TestSustainedFailureOpens(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1000, 0))
	b := New(Options{Now: clk.Now})
	for i := 0; i < 5; i++ { // at 0, 60, 120, 180, 240 ms
		call(t, b, Failure)
		clk.Advance(60 * time.Millisecond)
	}
	clk.Advance(-50 * time.Millisecond) // 250 ms after the first failure
	if b.State() != Closed {
		t.Fatal("opened before FailWindow passed")
	}
	call(t, b, Failure)
	if b.State() != Open {
		t.Fatalf("state %v after failures spanning 250 ms, want open", b.State())
	}
	if _, ok := b.Allow(); ok {
		t.Fatal("open breaker let a call through")
	}

	// Failures spanning the window, but fewer than Threshold, do not.
	b = New(Options{Now: clk.Now})
	for i := 0; i < 4; i++ {
		call(t, b, Failure)
		clk.Advance(time.Second)
	}
	if b.State() != Closed {
		t.Fatal("4 failures opened a breaker with Threshold 5")
	}
}

// TestSuccessResetsRun: a success ends the run; the next run is timed from
// its own first failure.
func TestSuccessResetsRun(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1000, 0))
	b := New(Options{Now: clk.Now})
	for i := 0; i < 5; i++ { // 0 to 200 ms
		call(t, b, Failure)
		clk.Advance(50 * time.Millisecond)
	}
	call(t, b, Success) // at 250 ms
	clk.Advance(10 * time.Millisecond)
	for i := 0; i < 5; i++ { // 260 to 500 ms: a run of 240 ms
		call(t, b, Failure)
		clk.Advance(60 * time.Millisecond)
	}
	if b.State() != Closed {
		t.Fatal("a success did not reset the run")
	}
	clk.Advance(-50 * time.Millisecond) // 510 ms: 250 ms into the second run
	call(t, b, Failure)
	if b.State() != Open {
		t.Fatalf("state %v, want open", b.State())
	}

	// An Unknown outcome (a caller that gave up) neither ends a run nor
	// extends it.
	b = New(Options{Now: clk.Now, Threshold: 2})
	call(t, b, Failure)
	clk.Advance(300 * time.Millisecond)
	call(t, b, Unknown)
	call(t, b, Failure)
	if b.State() != Open {
		t.Fatalf("Unknown reset the run: state %v", b.State())
	}
}

func TestBreakerCycle(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1000, 0))
	tr := &transitions{}
	b := New(Options{Threshold: 3, FailWindow: 100 * time.Millisecond, Cooldown: time.Second, Now: clk.Now, OnChange: tr.record})
	for i := 0; i < 3; i++ {
		call(t, b, Failure)
		clk.Advance(50 * time.Millisecond)
	}
	if b.State() != Open {
		t.Fatalf("state %v, want open", b.State())
	}
	if _, ok := b.Allow(); ok {
		t.Fatal("open breaker allowed a call before its cooldown")
	}
	clk.Advance(time.Second)
	probe, ok := b.Allow()
	if !ok {
		t.Fatal("no probe after the cooldown")
	}
	if _, ok := b.Allow(); ok {
		t.Fatal("second concurrent probe allowed with Probes 1")
	}
	b.Done(probe, Failure) // the probe failed: open again for a new cooldown
	if _, ok := b.Allow(); b.State() != Open || ok {
		t.Fatalf("state %v after a failed probe, want open and refusing", b.State())
	}
	clk.Advance(time.Second)
	probe, ok = b.Allow()
	if !ok {
		t.Fatal("no probe after the second cooldown")
	}
	b.Done(probe, Unknown) // its caller gave up: the next call probes
	if b.State() != HalfOpen {
		t.Fatalf("state %v after an Unknown probe, want half_open", b.State())
	}
	call(t, b, Success)
	if b.State() != Closed {
		t.Fatalf("state %v after a successful probe, want closed", b.State())
	}
	want := []string{"closed>open", "open>half_open", "half_open>open", "open>half_open", "half_open>closed"}
	if got := tr.list(); !slices.Equal(got, want) {
		t.Fatalf("changes %v, want %v", got, want)
	}
}

// TestStaleOutcomes: an outcome counts only in the state that let its call
// through.
func TestStaleOutcomes(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1000, 0))
	b := New(Options{Threshold: 1, FailWindow: time.Millisecond, Cooldown: time.Second, Now: clk.Now})
	slow, _ := b.Allow() // let through while closed, returns much later
	call(t, b, Failure)
	clk.Advance(time.Millisecond)
	call(t, b, Failure)
	if b.State() != Open {
		t.Fatalf("state %v, want open", b.State())
	}
	clk.Advance(time.Second)
	probe, ok := b.Allow()
	if !ok {
		t.Fatal("no probe")
	}
	b.Done(slow, Success) // neither closes it nor frees the probe's place
	if _, ok := b.Allow(); b.State() != HalfOpen || ok {
		t.Fatalf("a stale success changed the half-open breaker: state %v, second probe %v", b.State(), ok)
	}
	// A probe of an earlier half-open spell returning in this one neither
	// decides it nor frees a place.
	b.Done(probe, Failure) // open again
	clk.Advance(time.Second)
	probe2, ok := b.Allow()
	if !ok {
		t.Fatal("no probe after the second cooldown")
	}
	b.Done(probe, Success)
	if _, ok := b.Allow(); b.State() != HalfOpen || ok {
		t.Fatalf("a stale probe changed the half-open breaker: state %v, second probe %v", b.State(), ok)
	}
	b.Done(probe2, Success)
	b.Done(probe2, Failure) // a second Done for one ticket changes nothing
	if b.State() != Closed {
		t.Fatalf("state %v, want closed", b.State())
	}

	// A failure let through before the breaker opened does not count
	// towards the run that follows its closing.
	b = New(Options{Threshold: 2, FailWindow: time.Millisecond, Cooldown: time.Second, Now: clk.Now})
	old, _ := b.Allow()
	call(t, b, Failure)
	clk.Advance(time.Millisecond)
	call(t, b, Failure)
	clk.Advance(time.Second)
	call(t, b, Success) // the probe closes it
	call(t, b, Failure) // a new run
	clk.Advance(time.Millisecond)
	b.Done(old, Failure)
	if b.State() != Closed {
		t.Fatal("a failure from before the breaker opened counted in the next run")
	}
}

// TestBreakerConcurrent races Allow and Done with random outcomes and a
// moving clock, and checks the invariants: probes in flight never exceed
// Probes; every state change is a legal transition and they chain from
// closed to the final state; no probe is left counted once every call is
// done; and the breaker still follows the rules afterwards.
func TestBreakerConcurrent(t *testing.T) {
	const probes = 2
	clk := testkit.NewClock(time.Unix(1000, 0))
	tr := &transitions{}
	b := New(Options{Threshold: 3, FailWindow: 2 * time.Millisecond, Cooldown: 3 * time.Millisecond, Probes: probes, Now: clk.Now, OnChange: tr.record})

	var mu sync.Mutex
	inFlight := map[uint64]int{} // probes in flight per half-open epoch, as the callers see them
	var wg sync.WaitGroup
	probeDone := func(tk Ticket) {
		if tk.probe {
			mu.Lock()
			inFlight[tk.epoch]--
			mu.Unlock()
		}
	}
	for g := range 8 {
		wg.Go(func() {
			// Each caller keeps up to 4 calls in flight and finishes them
			// in random order, so that outcomes arrive late, after the
			// state that let them through has changed.
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			var held []Ticket
			for range 4000 {
				clk.Advance(time.Duration(rng.IntN(200)) * time.Microsecond)
				if len(held) == 4 || (len(held) > 0 && rng.IntN(2) == 0) {
					i := rng.IntN(len(held))
					tk := held[i]
					held = slices.Delete(held, i, i+1)
					probeDone(tk)
					b.Done(tk, []Outcome{Success, Failure, Failure, Failure, Unknown}[rng.IntN(5)])
					continue
				}
				tk, ok := b.Allow()
				if !ok {
					continue
				}
				if tk.probe {
					mu.Lock()
					inFlight[tk.epoch]++
					if n := inFlight[tk.epoch]; n > probes {
						t.Errorf("%d probes in flight, want at most %d", n, probes)
					}
					mu.Unlock()
				}
				held = append(held, tk)
			}
			for _, tk := range held {
				probeDone(tk)
				b.Done(tk, Unknown)
			}
		})
	}
	wg.Wait()

	// Every change is a legal edge, and the changes (in whatever order the
	// callbacks ran) form a path from closed to the final state: for each
	// state, arrivals minus departures is 1 for the final state, -1 for
	// closed, 0 otherwise (both 0 when it ends closed).
	legal := map[string]bool{"closed>open": true, "open>half_open": true, "half_open>open": true, "half_open>closed": true}
	net := map[string]int{}
	count := map[string]int{}
	for _, e := range tr.list() {
		if !legal[e] {
			t.Fatalf("illegal transition %s", e)
		}
		count[e]++
		from, to, _ := strings.Cut(e, ">")
		net[from]--
		net[to]++
	}
	final := b.State()
	for _, s := range []State{Closed, Open, HalfOpen} {
		want := 0
		if s == final {
			want++
		}
		if s == Closed {
			want--
		}
		if net[s.String()] != want {
			t.Errorf("state %v: arrivals minus departures %d, want %d (final %v; transitions %v)", s, net[s.String()], want, final, count)
		}
	}
	for _, e := range []string{"closed>open", "open>half_open", "half_open>closed", "half_open>open"} {
		if count[e] == 0 {
			t.Errorf("the race never made transition %s (%v): the test exercised too little", e, count)
		}
	}
	// Every call is done, so after a cooldown exactly Probes probes (or
	// any number of calls, when it ended closed) go through, and a
	// successful one closes it.
	clk.Advance(3 * time.Millisecond)
	var last []Ticket
	for i := 0; i < probes; i++ {
		tk, ok := b.Allow()
		if !ok {
			t.Fatalf("every call is done, yet the %v breaker refused call %d after its cooldown", final, i+1)
		}
		last = append(last, tk)
	}
	if _, ok := b.Allow(); ok && b.State() == HalfOpen {
		t.Errorf("%d probes in flight with Probes %d", probes+1, probes)
	}
	for _, tk := range last {
		b.Done(tk, Success)
	}
	if b.State() != Closed {
		t.Fatalf("state %v after successful calls, want closed", b.State())
	}

	// And sustained failures open it again.
	for i := 0; i < 3; i++ {
		call(t, b, Failure)
		clk.Advance(time.Millisecond)
	}
	if b.State() != Open {
		t.Fatalf("state %v after 3 failures over 2 ms, want open", b.State())
	}
}

// TestRefusedOpensAtOnce: a refused connection is no stall: the breaker
// opens at once, and a refused probe opens it again.
func TestRefusedOpensAtOnce(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1000, 0))
	b := New(Options{Now: clk.Now})
	call(t, b, Refused)
	if b.State() != Open {
		t.Fatalf("state %v after a refused connection, want open", b.State())
	}
	clk.Advance(DefaultCooldown)
	call(t, b, Refused) // the probe
	if b.State() != Open {
		t.Fatalf("state %v after a refused probe, want open", b.State())
	}
	clk.Advance(DefaultCooldown)
	call(t, b, Success)
	if b.State() != Closed {
		t.Fatalf("state %v after a successful probe, want closed", b.State())
	}
}
