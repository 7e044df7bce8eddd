package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store"
)

// TestUpstreamKeys: an upstream check counts in upstream's key with the
// window's start appended, as a plain integer with the window as its TTL;
// a denial takes its hits back, a refund returns hits, a peek writes
// nothing, and rls's keys still go to the script.
func TestUpstreamKeys(t *testing.T) {
	srv := redistest.StartServer(t)
	s, err := New(Options{URL: srv.URL(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Unix(1_000_000, 0) // minute window start: 999960
	u := NewUpstreamKeys(s, "p:")
	u.now = func() time.Time { return now }
	ctx := context.Background()
	key := "p:rl_foo_x_"
	decide := func(c store.Check) store.Result {
		t.Helper()
		res := make([]store.Result, 1)
		if err := u.Decide(ctx, []store.Check{c}, res); err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	c := store.Check{Key: key, Algorithm: store.FixedWindow, Limit: 2, Window: time.Minute, Hits: 1}
	for i, want := range []bool{true, true, false} {
		r := decide(c)
		if r.Allowed != want || r.Consumed != want || r.Reset != 20*time.Second {
			t.Fatalf("call %d: %+v, want allowed %v, reset 20s", i+1, r, want)
		}
	}
	redisKey := key + strconv.Itoa(999960)
	if v, err := srv.Client().Get(ctx, redisKey).Int(); err != nil || v != 2 {
		t.Fatalf("%s = %d (%v), want 2: the denial took its hit back", redisKey, v, err)
	}
	if ttl := srv.Client().TTL(ctx, redisKey).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("TTL %v, want the window", ttl)
	}
	refund := c
	refund.Refund = true
	decide(refund)
	res := make([]store.Result, 2)
	rls := store.Check{Key: "p:rl:{d|k=v}:f60", Algorithm: store.FixedWindow, Limit: 5, Window: time.Minute, Hits: 1}
	if err := u.Peek(ctx, []store.Check{c, rls}, res); err != nil {
		t.Fatal(err)
	}
	if !res[0].Allowed || res[0].Remaining != 1 || !res[1].Allowed || res[1].Remaining != 5 {
		t.Errorf("peek after a refund: %+v, want 1 left upstream, 5 on rls's key", res)
	}
	if err := u.Decide(ctx, []store.Check{c, rls}, res); err != nil || !res[0].Allowed || !res[1].Allowed || res[1].Remaining != 4 {
		t.Errorf("mixed batch: %+v %v", res, err)
	}
	if n := srv.Client().Exists(ctx, "p:rl:{d|k=v}:f60").Val(); n != 1 {
		t.Errorf("rls's key not written by its script")
	}
}
