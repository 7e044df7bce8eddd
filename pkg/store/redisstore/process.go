package redisstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/logthrottle"
)

// SetLogger routes go-redis's own messages (dial failures and the like,
// one per attempt while Redis is down) to log, throttled. go-redis has one
// logger per process.
func SetLogger(log *slog.Logger) {
	redis.SetLogger(&throttledLogger{log: log, th: logthrottle.New(logthrottle.Every, nil)})
}

type throttledLogger struct {
	log *slog.Logger
	th  *logthrottle.Throttle
}

func (l *throttledLogger) Printf(_ context.Context, format string, v ...any) {
	if held, ok := l.th.Allow(); ok {
		l.log.Warn("go-redis: "+fmt.Sprintf(format, v...), "not_logged_since", held,
			"note", "go-redis messages logged at most every "+l.th.Interval().String())
	}
}

// Heartbeats: each replica refreshes its own entry every
// HeartbeatInterval; an entry not refreshed for HeartbeatTTL is no longer
// counted.
const (
	HeartbeatInterval = 2 * time.Second
	HeartbeatTTL      = 6 * time.Second
)

// Replica returns this process's id in the fleet's heartbeats and the
// RLQS demand hashes.
func (s *Store) Replica() string { return s.replica }

// replicaID names this process in the fleet's heartbeats: host name, PID
// and a random suffix, so a restarted replica never counts twice for long.
func replicaID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%x", host, os.Getpid(), b)
}
