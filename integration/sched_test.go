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
//     pace matters (global shares, leases, RLQS fleets). One at a time,
//     beside light tests.
//   - light(t): the rest (counts, codes, memory bounds, config). At most
//     lightSlots at once.
//
// Both calls make the test parallel; the gates below, not -parallel,
// bound how many run (TestMain raises -parallel so that a test waiting
// at a gate never holds a slot another class could use).
const lightSlots = 3

var sched = struct {
	mu           sync.Mutex
	cond         *sync.Cond
	timed, light int
}{}

func init() { sched.cond = sync.NewCond(&sched.mu) }

// timed makes t parallel and waits until no other timed test runs.
func timed(t *testing.T) {
	t.Helper()
	gate(t, func() bool { return sched.timed == 0 }, &sched.timed)
}

// light makes t parallel and waits for one of lightSlots.
func light(t *testing.T) {
	t.Helper()
	gate(t, func() bool { return sched.light < lightSlots }, &sched.light)
}

func gate(t *testing.T, free func() bool, running *int) {
	t.Parallel()
	sched.mu.Lock()
	for !free() {
		sched.cond.Wait()
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
