package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/breaker"
	"github.com/rls-project/rls/pkg/store"
)

// Errors of Redis calls fall in four kinds (classify):
//
//	kind          what                                        wraps                 breaker hears
//	outage        no answer in time, network, outageReplies   store.ErrUnavailable  a failure
//	protocol      any other error reply, a wrong reply shape  store.ErrProtocol     a success
//	auth          authReplies                                 store.ErrAuth         a success
//	cancellation  the caller's own                            (as it is)            breaker.Unknown
//
// Callers fall back on an outage only: a fleet on its local shares while
// its credentials are refused would admit N times each limit.

// errKind is the kind of a Redis call's error.
type errKind int

const (
	errNone     errKind = iota
	errCanceled         // the caller cancelled
	errOutage           // the node could not answer: store.ErrUnavailable
	errProtocol         // the node's answer is unusable: store.ErrProtocol
	errAuth             // the node refused rls's credentials: store.ErrAuth
)

// outageReplies are the first words of the Redis error replies that mean
// the node cannot serve now; every other error reply is a protocol error.
var outageReplies = map[string]bool{
	"LOADING":     true, // loading its dataset after a restart
	"CLUSTERDOWN": true, // the cluster cannot serve the slot
	"READONLY":    true, // a replica, after a failover it has not heard of
	"MASTERDOWN":  true, // a replica that lost its master
	"TRYAGAIN":    true, // a slot being resharded
	"MOVED":       true, // left over after the cluster client's redirects
	"ASK":         true,
	"BUSY":        true, // another script runs too long
	"OOM":         true, // maxmemory reached
	"MISCONF":     true, // writes stopped: snapshots fail
	"NOREPLICAS":  true, // min-replicas-to-write not met
	"NOSCRIPT":    true, // the script cache vanished again at once
}

// authReplies are the first words of the Redis error replies that refuse
// rls's credentials or permissions.
var authReplies = map[string]bool{
	"NOAUTH":    true, // a password is required and none was sent
	"WRONGPASS": true, // wrong user or password
	"NOPERM":    true, // the ACL user may not run a command or touch a key
}

// classify returns the kind of err, an error of a Redis call made under ctx.
func classify(ctx context.Context, err error) errKind {
	switch {
	case err == nil:
		return errNone
	case errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled):
		return errCanceled
	case errors.Is(err, store.ErrProtocol):
		return errProtocol
	case errors.Is(err, store.ErrAuth):
		return errAuth
	case errors.Is(err, store.ErrUnavailable):
		return errOutage
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return errOutage // network, timeout, closed client or pool
	}
	msg := re.Error()
	if strings.HasPrefix(msg, "ERR max number of clients reached") {
		return errOutage
	}
	// A password sent to a server that has none is as wrong as a wrong one.
	if strings.HasPrefix(msg, "ERR AUTH") || strings.HasPrefix(msg, "ERR Client sent AUTH") {
		return errAuth
	}
	word, _, _ := strings.Cut(msg, " ")
	switch {
	case outageReplies[word]:
		return errOutage
	case authReplies[word]:
		return errAuth
	}
	return errProtocol
}

// outcome is what a round trip that ended with err under ctx tells the
// node's breaker: whether the node answered.
func outcome(ctx context.Context, err error) breaker.Outcome {
	if redirected(err) {
		return breaker.Success // the node answered: the slot is elsewhere
	}
	switch classify(ctx, err) {
	case errNone, errProtocol, errAuth:
		return breaker.Success
	case errCanceled:
		return breaker.Unknown
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return breaker.Refused
	}
	return breaker.Failure
}

// budget names what bounds a call, for its timeout errors: the caller's
// deadline or the store's timeout.
type budget struct {
	caller bool          // the caller's deadline, else the store's timeout
	d      time.Duration // the time the call had (0: not known)
}

func (b budget) String() string {
	switch {
	case !b.caller:
		return fmt.Sprintf("the store timeout (%v)", b.d)
	case b.d > 0:
		return fmt.Sprintf("the caller's deadline (%v after the call began)", b.d.Round(time.Microsecond))
	}
	return "the caller's deadline"
}

// bound returns ctx bounded by its own deadline when it has one, else by
// the store's timeout, and names the bound.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc, budget) {
	if d, ok := ctx.Deadline(); ok {
		return ctx, func() {}, budget{caller: true, d: time.Until(d)}
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	return ctx, cancel, budget{d: s.timeout}
}

// Classify marks err, the error of a Redis command made under ctx by
// another client (package store/upstream's), as the Store marks its own
// (the kinds above). op names the operation in the message; nil stays nil.
func Classify(ctx context.Context, op string, err error) error {
	return new(Store).fail(ctx, op, budget{caller: true}, err)
}

// wrap is fail for a call bounded by ctx alone.
func (s *Store) wrap(ctx context.Context, op string, err error) error {
	return s.fail(ctx, op, budget{caller: true}, err)
}

// fail adds context to err, the error of a Redis call made under ctx
// (which b bounds), and marks its kind (the kinds above). An outage past
// ctx's deadline says which budget ran out and wraps
// context.DeadlineExceeded too.
func (s *Store) fail(ctx context.Context, op string, b budget, err error) error {
	switch classify(ctx, err) {
	case errNone:
		return nil
	case errCanceled:
		return fmt.Errorf("redis %s: %w", op, err)
	case errProtocol:
		if errors.Is(err, store.ErrProtocol) {
			return fmt.Errorf("redis %s: %w", op, err)
		}
		return fmt.Errorf("redis %s: %w: %w", op, store.ErrProtocol, err)
	case errAuth:
		if errors.Is(err, store.ErrAuth) {
			return fmt.Errorf("redis %s: %w", op, err)
		}
		return fmt.Errorf("redis %s: %w (check the password, RLS_REDIS_PASSWORD or the URL's, and the ACL user's permissions): %w", op, store.ErrAuth, err)
	}
	if errors.Is(err, store.ErrUnavailable) { // circuit open: says why
		return fmt.Errorf("redis %s: %w", op, err)
	}
	s.reloadClusterState()
	switch {
	case !deadlinePassed(ctx):
		return fmt.Errorf("redis %s: %w: %w", op, store.ErrUnavailable, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("redis %s: %w: no answer within %v: %w", op, store.ErrUnavailable, b, err)
	}
	return fmt.Errorf("redis %s: %w: no answer within %v (%w): %w", op, store.ErrUnavailable, b, context.DeadlineExceeded, err)
}

// deadlinePassed reports whether ctx's deadline has passed. (A socket
// timeout set to the deadline can fire before ctx's own timer marks ctx
// done.)
func deadlinePassed(ctx context.Context) bool {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// circuitOpen is the error of a call refused because node's breaker is open.
func circuitOpen(node string) error {
	if node == "" {
		return fmt.Errorf("%w: the Redis server has been failing", store.ErrCircuitOpen)
	}
	return fmt.Errorf("%w for node %s: it has been failing", store.ErrCircuitOpen, node)
}
