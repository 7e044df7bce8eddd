//go:build redis

package upstream

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/redisclient"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore"
)

// newStore returns a Store on url (a twemproxy's when tw) with rls's own
// keys in a Redis store on inner ("": none), at the clock now.
func newStore(t *testing.T, url string, tw bool, inner string, now time.Time) *Store {
	t.Helper()
	c, err := NewClient(ClientOptions{URL: url, Twemproxy: tw, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Client: c, KeyPrefix: "p:", Now: func() time.Time { return now }}
	if inner != "" {
		ic, err := redisclient.New(redisclient.Options{URL: inner, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		rs, err := redisstore.New(redisstore.Options{Client: ic, CloseClient: true, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		o.Inner = rs
	}
	s := New(o)
	t.Cleanup(func() { s.Close() })
	return s
}

func decide(t *testing.T, s *Store, cs ...store.Check) []store.Result {
	t.Helper()
	res := make([]store.Result, len(cs))
	if err := s.Decide(context.Background(), cs, res); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestUpstreamKeys: an upstream check counts in upstream's key with the
// window's start appended, as a plain integer with the window as its TTL;
// a denial takes its hits back, a refund returns hits (never below zero),
// a peek writes nothing, and rls's keys still go to the inner store.
func TestUpstreamKeys(t *testing.T) {
	srv := redistest.StartServer(t)
	now := time.Unix(1_000_000, 0) // minute window start: 999960
	s := newStore(t, srv.URL(), false, srv.URL(), now)
	ctx := context.Background()
	key := "p:rl_foo_x_"
	c := store.Check{Key: key, Algorithm: store.FixedWindow, Limit: 2, Window: time.Minute, Hits: 1}
	for i, want := range []bool{true, true, false} {
		r := decide(t, s, c)[0]
		if r.Allowed != want || r.Consumed != want || r.Reset != 20*time.Second {
			t.Fatalf("call %d: %+v, want allowed %v, reset 20s", i+1, r, want)
		}
		if !want && (r.RetryAfter != 20*time.Second || r.Remaining != 0) {
			t.Errorf("denied: %+v, want RetryAfter 20s, 0 left", r)
		}
	}
	rc := srv.Client()
	defer rc.Close()
	redisKey := key + strconv.Itoa(999960)
	if v, err := rc.Get(ctx, redisKey).Int(); err != nil || v != 2 {
		t.Fatalf("%s = %d (%v), want 2: the denial took its hit back", redisKey, v, err)
	}
	if ttl := rc.TTL(ctx, redisKey).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("TTL %v, want the window", ttl)
	}
	refund := c
	refund.Refund, refund.Hits = true, 5
	if r := decide(t, s, refund)[0]; !r.Allowed || r.Remaining != 2 {
		t.Errorf("refund of 5 on a count of 2: %+v, want allowed, 2 left", r)
	}
	if v, _ := rc.Get(ctx, redisKey).Int(); v != 0 {
		t.Errorf("count after the refund %d, want 0, never below", v)
	}
	decide(t, s, c)
	res := make([]store.Result, 2)
	rls := store.Check{Key: "p:rl:{d|k=v}:f60", Algorithm: store.FixedWindow, Limit: 5, Window: time.Minute, Hits: 1}
	if err := s.Peek(ctx, []store.Check{c, rls}, res); err != nil {
		t.Fatal(err)
	}
	if !res[0].Allowed || res[0].Remaining != 1 || !res[1].Allowed || res[1].Remaining != 5 {
		t.Errorf("peek: %+v, want 1 left upstream, 5 on rls's key", res)
	}
	if v, _ := rc.Get(ctx, redisKey).Int(); v != 1 {
		t.Errorf("count after a peek %d, want 1", v)
	}
	if err := s.Decide(ctx, []store.Check{c, rls}, res); err != nil || !res[0].Allowed || !res[1].Allowed || res[1].Remaining != 4 {
		t.Errorf("mixed batch: %+v %v", res, err)
	}
	if n := len(rc.Keys(ctx, "p:rl:{d|k=v}:f60:*").Val()); n != 1 { // its window's key
		t.Errorf("rls's key not written by the inner store")
	}
	if err := s.Delete(ctx, c); err != nil {
		t.Fatal(err)
	}
	if n := rc.Exists(ctx, redisKey).Val(); n != 0 {
		t.Errorf("Delete left the window's counter")
	}
}

// TestDenialTakesBack: a request with one check over its limit consumes
// nothing: the denied check's hits and the allowed check's go back, and
// neither reports Consumed; a shadow check's denial vetoes nothing.
func TestDenialTakesBack(t *testing.T) {
	srv := redistest.StartServer(t)
	now := time.Unix(1_000_000, 0)
	s := newStore(t, srv.URL(), false, "", now)
	a := store.Check{Key: "p:d_a_1_", Limit: 10, Window: time.Minute, Hits: 1}
	b := store.Check{Key: "p:d_b_1_", Limit: 1, Window: time.Minute, Hits: 1}
	decide(t, s, b)
	res := decide(t, s, a, b)
	if !res[0].Allowed || res[0].Consumed || res[1].Allowed || res[1].Consumed {
		t.Fatalf("results %+v, want a allowed but not consumed, b denied", res)
	}
	if res[0].Remaining != 10 {
		t.Errorf("a's remaining %d, want 10: its hit went back", res[0].Remaining)
	}
	rc := srv.Client()
	defer rc.Close()
	ctx := context.Background()
	if v, _ := rc.Get(ctx, "p:d_a_1_999960").Int(); v != 0 {
		t.Errorf("a counts %d, want 0", v)
	}
	if v, _ := rc.Get(ctx, "p:d_b_1_999960").Int(); v != 1 {
		t.Errorf("b counts %d, want 1", v)
	}
	shadow := b
	shadow.Shadow = true
	res = decide(t, s, a, shadow)
	if !res[0].Consumed || res[1].Allowed {
		t.Errorf("with b in shadow mode: %+v, want a consumed, b denied", res)
	}
}

// TestConcurrentNeverOver: callers racing for one key are admitted exactly
// the limit, never more.
func TestConcurrentNeverOver(t *testing.T) {
	srv := redistest.StartServer(t)
	s := newStore(t, srv.URL(), false, "", time.Unix(1_000_000, 0))
	c := store.Check{Key: "p:race_k_v_", Limit: 50, Window: time.Hour, Hits: 1}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 25 {
				res := make([]store.Result, 1)
				if err := s.Decide(context.Background(), []store.Check{c}, res); err != nil {
					t.Error(err)
					return
				}
				if res[0].Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 50 {
		t.Errorf("admitted %d of 200 racing calls, want exactly the limit, 50", n)
	}
}

// TestTwemproxyCommands: behind a real nutcracker the same decisions come
// out, with no command nutcracker refuses (no HELLO, TIME, script) and
// only plain commands reaching Redis; Detect tells it from Redis; a Redis
// behind it that is down is an outage, not a protocol error.
func TestTwemproxyCommands(t *testing.T) {
	srv := redistest.StartServer(t)
	tw := redistest.StartTwemproxy(t, srv)
	ctx := context.Background()
	for _, url := range []string{tw.URL(), tw.SocketURL()} {
		s := newStore(t, url, true, "", time.Unix(1_000_000, 0))
		c := store.Check{Key: "p:tw_k_" + url + "_", Limit: 2, Window: time.Minute, Hits: 1}
		var got []bool
		for range 3 {
			got = append(got, decide(t, s, c)[0].Allowed)
		}
		if !slices.Equal(got, []bool{true, true, false}) {
			t.Errorf("%s: allowed %v, want true true false", url, got)
		}
		if err := s.Ready(ctx); err != nil {
			t.Errorf("%s: Ready: %v", url, err)
		}
		res := make([]store.Result, 1)
		rls := store.Check{Key: "p:rl:{d|k=v}:f60", Limit: 5, Window: time.Minute, Hits: 1}
		if err := s.Decide(ctx, []store.Check{rls}, res); err == nil {
			t.Errorf("%s: rls's own key decided behind twemproxy", url)
		}
	}
	if u := tw.Unsupported(); len(u) > 0 {
		t.Errorf("nutcracker refused %v", u)
	}
	for cmd := range srv.CommandStats(ctx) { // ping: redistest's start; hello, client, info: the stats client
		if !slices.Contains([]string{"get", "incrby", "decrby", "expire", "ping", "hello", "client", "info"}, cmd) {
			t.Errorf("Redis saw %s", cmd)
		}
	}
	for _, c := range []struct {
		url  string
		want bool
	}{{tw.URL(), true}, {tw.SocketURL(), true}, {srv.URL(), false}} {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		got, err := Detect(dctx, ClientOptions{URL: c.url})
		cancel()
		if got != c.want || err != nil {
			t.Errorf("Detect(%s) = %v, %v; want %v", c.url, got, err, c.want)
		}
	}
	srv.Stop()
	s := newStore(t, tw.URL(), true, "", time.Unix(1_000_000, 0))
	err := s.Ready(ctx)
	if !isUnavailable(err) {
		t.Errorf("Ready with Redis down behind nutcracker: %v, want an outage", err)
	}
	res := make([]store.Result, 1)
	err = s.Decide(ctx, []store.Check{{Key: "p:down_", Limit: 1, Window: time.Second, Hits: 1}}, res)
	if !isUnavailable(err) || !res[0].Undecided {
		t.Errorf("Decide with Redis down behind nutcracker: %v %+v, want an outage, undecided", err, res[0])
	}
}

func isUnavailable(err error) bool { return errors.Is(err, store.ErrUnavailable) }
