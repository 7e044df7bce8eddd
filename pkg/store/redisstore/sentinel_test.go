//go:build redis

package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/redisclient"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore/lua"
	"github.com/rls-project/rls/pkg/testkit"
)

// TestSentinel runs the store through a Sentinel and fails the master over
// to its replica: decisions resume on the new master, whose script cache is
// empty, with the counters replicated.
func TestSentinel(t *testing.T) {
	t.Parallel() // real time on servers of its own
	ctx := context.Background()
	master := redistest.StartServer(t)
	replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	sentinel := redistest.StartSentinel(t, "mymaster", master)
	s, err := New(Options{Client: urlClient(t, redisclient.Options{URL: "redis://" + sentinel.Addr, Mode: redisclient.ModeSentinel, MasterName: "mymaster", Timeout: time.Second}),
		CloseClient: true, Timeout: time.Second, NoPlain: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	check := store.Check{Key: "rl:{sent}:x", Algorithm: store.FixedWindow, Limit: 1000, Window: time.Hour, Hits: 1}
	for i := 0; i < 3; i++ {
		decide(t, s, check)
	}
	if got := master.CommandStats(ctx)["fcall"]; got != 3 {
		t.Errorf("master fcall = %d, want 3", got)
	}
	// Wait until the replica has the counter. The first full sync starts
	// after the master's repl-diskless-sync-delay (5 s by default), so allow
	// well beyond that.
	rc := replica.Client()
	defer rc.Close()
	testkit.WaitFor(t, "the counter on the replica", 20*time.Second, func() bool {
		v, _ := rc.Get(ctx, string(lua.WindowKey(nil, check.Key, time.Now().Unix()/3600*3600))).Int()
		return v == 3
	})

	master.Stop()
	// Sentinel notices after 1 s and promotes the replica; decisions fail
	// meanwhile (store unavailable) and then resume.
	var res []store.Result
	testkit.WaitFor(t, "a decision on the promoted replica", 20*time.Second, func() bool {
		res = make([]store.Result, 1)
		return s.Decide(ctx, []store.Check{check}, res) == nil
	})
	if !res[0].Allowed || res[0].Remaining != 1000-4 {
		t.Errorf("first decision on the new master: %+v, want allowed with 996 remaining", res[0])
	}
	// The library came with replication: the new master runs FCALL.
	if st := replica.CommandStats(ctx); st["fcall"] == 0 {
		t.Errorf("the promoted replica ran no FCALL: %v", st)
	}
}

// waitProgress waits until n has grown by at least by.
func waitProgress(t *testing.T, n *atomic.Int64, by int64) {
	t.Helper()
	want := n.Load() + by
	testkit.WaitFor(t, fmt.Sprintf("%d more", by), 20*time.Second, func() bool { return n.Load() >= want })
}
