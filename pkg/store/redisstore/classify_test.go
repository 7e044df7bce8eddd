package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/breaker"
	"github.com/rls-project/rls/pkg/store"
)

// replyErr is a Redis error reply, as go-redis returns them.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

func TestClassify(t *testing.T) {
	live := context.Background()
	cancelled, cancel := context.WithCancel(live)
	cancel()
	for _, tc := range []struct {
		err  error
		ctx  context.Context
		kind errKind
		o    breaker.Outcome
	}{
		{nil, live, errNone, breaker.Success},
		{context.Canceled, cancelled, errCanceled, breaker.Unknown},
		{fmt.Errorf("queued: %w", context.Canceled), cancelled, errCanceled, breaker.Unknown},
		{context.DeadlineExceeded, live, errOutage, breaker.Failure},
		{&net.OpError{Op: "read", Net: "tcp", Err: errors.New("i/o timeout")}, live, errOutage, breaker.Failure},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, live, errOutage, breaker.Failure},
		{io.EOF, live, errOutage, breaker.Failure},
		{redis.ErrPoolTimeout, live, errOutage, breaker.Failure},
		{store.ErrCircuitOpen, live, errOutage, breaker.Failure},
		{replyErr("LOADING Redis is loading the dataset in memory"), live, errOutage, breaker.Failure},
		{replyErr("CLUSTERDOWN The cluster is down"), live, errOutage, breaker.Failure},
		{replyErr("READONLY You can't write against a read only replica. script: f_x, on @user_script:120."), live, errOutage, breaker.Failure},
		{replyErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), live, errOutage, breaker.Failure},
		{replyErr("BUSY Redis is busy running a script."), live, errOutage, breaker.Failure},
		{replyErr("OOM command not allowed when used memory > 'maxmemory'. script: f_x"), live, errOutage, breaker.Failure},
		{replyErr("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), live, errOutage, breaker.Failure},
		{replyErr("NOREPLICAS Not enough good replicas to write."), live, errOutage, breaker.Failure},
		{replyErr("ERR max number of clients reached"), live, errOutage, breaker.Failure},
		// Redirects are outages when they reach a caller, but the node
		// answered.
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), live, errOutage, breaker.Success},
		{replyErr("MOVED 3999 127.0.0.1:6381"), live, errOutage, breaker.Success},
		// The node refused rls's credentials: answered, but not to rls.
		{replyErr("NOAUTH Authentication required."), live, errAuth, breaker.Success},
		{replyErr("WRONGPASS invalid username-password pair or user is disabled."), live, errAuth, breaker.Success},
		{replyErr("NOPERM User rls has no permissions to run the 'evalsha' command"), live, errAuth, breaker.Success},
		{replyErr("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?"), live, errAuth, breaker.Success},
		{fmt.Errorf("redis ping: %w: WRONGPASS", store.ErrAuth), live, errAuth, breaker.Success},
		// The node answered with something rls cannot use.
		{replyErr("WRONGTYPE Operation against a key holding the wrong kind of value script: f_x, on @user_script:77."), live, errProtocol, breaker.Success},
		{replyErr("ERR user_script:1: Script attempted to access nonexistent global variable 'x' script: f_x"), live, errProtocol, breaker.Success},
		{replyErr("ERR unknown command 'EVALSHA'"), live, errProtocol, breaker.Success},
		{replyErr("BUSYKEY Target key name already exists."), live, errProtocol, breaker.Success},
		{fmt.Errorf("%w: the script replied int64, not an array", store.ErrProtocol), live, errProtocol, breaker.Success},
	} {
		if got := classify(tc.ctx, tc.err); got != tc.kind {
			t.Errorf("classify(%v) = %v, want %v", tc.err, got, tc.kind)
		}
		if got := outcome(tc.ctx, tc.err); got != tc.o {
			t.Errorf("outcome(%v) = %v, want %v", tc.err, got, tc.o)
		}
		s := &Store{}
		err := s.fail(tc.ctx, "decide", budget{d: time.Second}, tc.err)
		switch tc.kind {
		case errNone:
			if err != nil {
				t.Errorf("fail(nil) = %v", err)
			}
		case errOutage:
			if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrProtocol) {
				t.Errorf("fail(%v) = %v; want ErrUnavailable", tc.err, err)
			}
		case errProtocol:
			if !errors.Is(err, store.ErrProtocol) || errors.Is(err, store.ErrUnavailable) {
				t.Errorf("fail(%v) = %v; want ErrProtocol and not ErrUnavailable", tc.err, err)
			}
		case errAuth:
			if !errors.Is(err, store.ErrAuth) || errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrProtocol) {
				t.Errorf("fail(%v) = %v; want ErrAuth alone", tc.err, err)
			}
		case errCanceled:
			if !errors.Is(err, context.Canceled) || errors.Is(err, store.ErrUnavailable) {
				t.Errorf("fail(%v) = %v; want Canceled and not ErrUnavailable", tc.err, err)
			}
		}
	}
}

// TestTimeoutSaysWhichBudget: a timeout error names the budget that ran
// out and wraps context.DeadlineExceeded, whatever the error of the call.
func TestTimeoutSaysWhichBudget(t *testing.T) {
	s := &Store{}
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	readTimeout := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("i/o timeout")}
	for _, tc := range []struct {
		b    budget
		err  error
		want string
	}{
		{budget{d: 50 * time.Millisecond}, readTimeout, "no answer within the store timeout (50ms)"},
		{budget{caller: true, d: 12 * time.Millisecond}, context.DeadlineExceeded, "no answer within the caller's deadline (12ms after the call began)"},
		{budget{caller: true}, readTimeout, "no answer within the caller's deadline"},
	} {
		err := s.fail(expired, "decide", tc.b, tc.err)
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("fail(%v, %v) = %v; want ErrUnavailable, DeadlineExceeded and %q", tc.b, tc.err, err, tc.want)
		}
	}
}
