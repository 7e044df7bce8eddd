package redisstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/limiter"
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

// Fleet returns the fleet-size source of replicas sharing s: each beats
// its heartbeat in Redis, and the fleet is the live ones, at least min.
func (s *Store) Fleet(min int, log *slog.Logger) *limiter.Fleet {
	id := s.replica
	return limiter.NewFleet(limiter.FleetOptions{
		Beat:     func(ctx context.Context) (int, error) { return s.Heartbeat(ctx, id, heartbeatTTL) },
		Leave:    func(ctx context.Context) error { return s.Leave(ctx, id) },
		Interval: heartbeatInterval,
		Hold:     2 * heartbeatInterval, // every live replica beats within one interval
		Min:      min,
		Log:      log,
	})
}

// Heartbeats: each replica refreshes its own entry every heartbeatInterval;
// an entry not refreshed for heartbeatTTL is no longer counted.
const (
	heartbeatInterval = 2 * time.Second
	heartbeatTTL      = 6 * time.Second
)

// replicaID names this process in the fleet's heartbeats: host name, PID
// and a random suffix, so a restarted replica never counts twice for long.
func replicaID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%x", host, os.Getpid(), b)
}
