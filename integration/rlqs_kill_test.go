package integration

import (
	"testing"
	"time"
)

// TestRLQSFleetReplicaKilled: the fixed-window fleet of
// TestRLQSFleetFixedWindow, steady, with one replica killed (SIGKILL: no
// TTL 0, no withdrawn demand) halfway. Its Envoys keep their grants to
// their TTL, fall back (deny-all), and move to the other replica. No window
// passes the limit: what the dead replica reserved stays counted. After the
// window of the kill and the next, each admits at least 80 % of the limit:
// the survivor's part of the limit still counts the dead replica's demand
// in Redis until it expires (6 s), and its top-ups take what that leaves.
func TestRLQSFleetReplicaKilled(t *testing.T) {
	_, ps, es := rlqsFleet(t, "fixed_window")
	id := map[string]string{"api_key": "k"}
	share := int64(rlqsLimit / 4)
	first := waitSecond()
	load := startLoad(es, id, 2*share, 2*share, 2*share, 2*share)
	defer load.end()
	const windows = 10
	var killedAt int64
	for w := first; w < first+windows; w++ {
		time.Sleep(time.Until(time.Unix(w+1, 0)))
		if w-first == 3 {
			killedAt = w + 1
			if err := ps[1].cmd.Process.Kill(); err != nil { // by its PID
				t.Fatal(err)
			}
		}
	}
	load.end()
	for w := first; w < first+windows; w++ {
		got := load.window(w)
		t.Logf("window %d: admitted %d of %d (offered %d)", w-first, got, rlqsLimit, load.offeredIn(w))
		if got > rlqsLimit {
			t.Errorf("window %d: admitted %d, over the limit %d", w-first, got, rlqsLimit)
		}
		if offered := load.offeredIn(w); offered < 8*int(share)*3/4 {
			t.Logf("window %d: the generator offered only %d of %d requests; its lower bound is not checked", w-first, offered, 8*share)
			continue
		}
		if want := rlqsLimit * 8 / 10; w > first && w != killedAt && w != killedAt+1 && got < want {
			t.Errorf("window %d: admitted %d, under %d of %d", w-first, got, want, rlqsLimit)
		}
	}
	for i, e := range es[2:] {
		e.mu.Lock()
		n := e.streams
		e.mu.Unlock()
		if n < 2 {
			t.Errorf("Envoy %d of the killed replica opened %d streams, want a second one on the other replica", i+2, n)
		}
	}
}
