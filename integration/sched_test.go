package integration

import (
	"flag"
	"sync"
	"testing"
)

// Every top-level test here is in one of three classes, so that the
// package's 10 minutes of mostly waiting tests share the machine without
// bending what the timing-sensitive ones measure:
//
//   - serial (no call at the top): a latency or deadline bound, its own
//     CPU burners, a load of hundreds of requests a second whose pace the
//     bounds assume (the global tests), or thousands of connections that
//     must open within a timeout. Go runs these first, one at a time,
//     before any other.
//   - timed(t): a lower bound on what a window admits, or a load whose
//     pace matters (leases, RLQS fleets, the fleet's heartbeats). One at
//     a time, beside light tests, first when a slot frees.
//   - light(t): the rest (counts, codes, memory bounds, config).
//
// At most slots tests of the last two classes run at once. Both calls
// make the test parallel; the gates below, not -parallel, bound how many
// run (TestMain raises -parallel so that a test waiting at a gate never
// holds a slot another class could use). Four at once (three light beside
// a timed one) failed a timed lower bound and a light test's TTL read in
// one of four quiet runs.
const slots = 3

var sched = struct {
	mu                        sync.Mutex
	cond                      *sync.Cond
	timed, light, timedQueued int
}{}

func init() { sched.cond = sync.NewCond(&sched.mu) }

// timed makes t parallel and waits for a slot while no other timed test
// runs.
func timed(t *testing.T) {
	t.Helper()
	gate(t, &sched.timed, &sched.timedQueued, func() bool { return sched.timed == 0 && sched.timed+sched.light < slots })
}

// light makes t parallel and waits for a slot no timed test is waiting for.
func light(t *testing.T) {
	t.Helper()
	gate(t, &sched.light, nil, func() bool {
		return sched.timed+sched.light < slots && (sched.timed > 0 || sched.timedQueued == 0)
	})
}

func gate(t *testing.T, running, queued *int, free func() bool) {
	t.Parallel()
	sched.mu.Lock()
	if queued != nil {
		*queued++
	}
	for !free() {
		sched.cond.Wait()
	}
	if queued != nil {
		*queued--
	}
	*running++
	sched.mu.Unlock()
	// Registered first, so it runs last: after the test's processes stop.
	t.Cleanup(func() {
		sched.mu.Lock()
		*running--
		sched.mu.Unlock()
		sched.cond.Broadcast()
	})
}

// raiseParallel sets -test.parallel to n unless the command line set it:
// the gates bound how many tests run, and a test waiting at one must not
// hold one of Go's slots (2 by default on 2 cores).
func raiseParallel(n string) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", n)
	}
}
