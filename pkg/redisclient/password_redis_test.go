//go:build redis

package redisclient

import (
	"context"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
)

// TestPasswordOverridesURL: Password overrides the URL's (on a real
// redis-server, so behind the redis tag; TestPasswordNeverShown checks the
// errors).
func TestPasswordOverridesURL(t *testing.T) {
	srv := redistest.StartServer(t, "--requirepass", "right")
	c, err := New(Options{URL: "redis://:hunter2@" + srv.Addr, Password: "right", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Errorf("Password overriding the URL's: %v", err)
	}
}
