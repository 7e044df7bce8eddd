//go:build redis

package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/storetest"
)

// TestConformance runs the shared store vectors against the Lua script with
// the suite's clock, called as a Redis Function (TestConformanceEval: as a
// script): the Redis store gives the memory store's numbers.
func TestConformance(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	storetest.Run(t, func(t *testing.T, now func() time.Time) store.Store {
		s := mustNew(t, Options{Client: c, Clock: now, Timeout: time.Second})
		if err := s.Ping(context.Background()); err != nil || s.ScriptModes()[ScriptFunction] != 1 {
			t.Fatalf("Ping: %v; ScriptModes() = %v, want function", err, s.ScriptModes())
		}
		return s
	})
}

// TestConformanceConcurrent races decisions through real connections with
// Redis's own clock (TIME), unless the hour is about to turn (the suite must
// not cross an hour boundary), when a frozen clock is used instead.
func TestConformanceConcurrent(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	opts := Options{Client: c, Timeout: time.Second}
	if now := time.Now(); now.Add(time.Minute).Truncate(time.Hour) != now.Truncate(time.Hour) {
		frozen := now
		opts.Clock = func() time.Time { return frozen }
	}
	storetest.RunConcurrent(t, mustNew(t, opts))
}
