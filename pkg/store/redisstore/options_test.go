//go:build redis

package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store"
)

// TestNewDefaults: New applies every default in one place, uses the
// client it is given and closes it only when told to.
func TestNewDefaults(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	defer c.Close()
	s := mustNew(t, Options{Client: c})
	if s.timeout != DefaultTimeout || DefaultTimeout != time.Second || s.maxInFlight != DefaultMaxInFlight || s.maxBatch != DefaultMaxBatch || s.cluster || s.owned {
		t.Errorf("store %+v; want timeout %v, in flight %d, batch %d, a single node's client not owned", s, DefaultTimeout, DefaultMaxInFlight, DefaultMaxBatch)
	}
	s = mustNew(t, Options{Client: c, MaxInFlight: 3, MaxBatch: 7, Timeout: 5 * time.Second})
	decide(t, s, store.Check{Key: "k", Limit: 1, Window: time.Second, Hits: 1})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Errorf("Close closed the client it was given: %v", err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"localhost:1"}})
	defer cc.Close()
	if s := mustNew(t, Options{Client: cc}); !s.cluster {
		t.Error("a cluster client did not select cluster mode")
	}
	for _, o := range []Options{{}, {Client: c, MaxInFlight: MaxMaxInFlight + 1}, {Client: c, Timeout: -time.Second}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// TestWrongPassword: a password Redis refuses is store.ErrAuth, not an
// outage, and the error does not show it.
func TestWrongPassword(t *testing.T) {
	srv := redistest.StartServer(t, "--requirepass", "right")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "hunter2", MaxRetries: -1})
	defer c.Close()
	s := mustNew(t, Options{Client: c, Timeout: time.Second})
	err := s.Decide(context.Background(), []store.Check{{Key: "k", Limit: 1, Window: time.Second}}, make([]store.Result, 1))
	if err == nil || strings.Contains(err.Error(), "hunter2") || !errors.Is(err, store.ErrAuth) || errors.Is(err, store.ErrUnavailable) {
		t.Errorf("wrong password: %v; want store.ErrAuth (not an outage), without the password", err)
	}
}
