package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore/lua"
)

// How a node runs decide.lua: as a Function library (Redis 7 and later),
// called by FCALL (FCALL_RO for a peek), or by EVALSHA (EVAL on NOSCRIPT)
// where FUNCTION is refused (docs/redis.md, invariant 8).

// The script modes, as Store.ScriptModes and OnScriptMode name them.
const (
	// ScriptFunction is a node that runs decide.lua as a Function library.
	ScriptFunction = "function"
	// ScriptEval is a node that runs decide.lua with EVALSHA.
	ScriptEval = "eval"
)

const (
	modeUnknown int32 = iota
	modeFunction
	modeEval
)

// scripts is one node's script mode.
type scripts struct {
	mode     atomic.Int32
	loadedAt atomic.Int64 // unix nanoseconds of the last load
	loading  atomic.Bool  // a FUNCTION LOAD is under way
	retryAt  atomic.Int64 // unix nanoseconds: after an outage, no load before
	node     string
	onMode   func(node, mode, reason string)
}

// set records mode m and reports it when it changed.
func (sc *scripts) set(m int32, reason string) {
	if old := sc.mode.Swap(m); old != m && sc.onMode != nil {
		name := ScriptEval
		if m == modeFunction {
			name = ScriptFunction
		}
		sc.onMode(sc.node, name, reason)
	}
}

// functions reports whether the node runs Functions, finding out first
// when nobody has yet (one caller loads; the others use EVALSHA meanwhile).
func (sc *scripts) functions(ctx context.Context, node redis.Cmdable) bool {
	switch sc.mode.Load() {
	case modeFunction:
		return true
	case modeEval:
		return false
	}
	if time.Now().UnixNano() < sc.retryAt.Load() {
		return false
	}
	return sc.load(ctx, node, "")
}

// load loads the library on node and reports whether the node runs
// Functions now. On false the caller goes by EVALSHA: the node refused (for
// good), had an outage (for loadRetry), or another call is loading. why
// says what prompted a reload ("" the first time).
func (sc *scripts) load(ctx context.Context, node redis.Cmdable, why string) bool {
	if node == nil || !sc.loading.CompareAndSwap(false, true) {
		return false // another call is loading it: this one goes by EVALSHA
	}
	defer sc.loading.Store(false)
	err := node.FunctionLoadReplace(ctx, lua.Library).Err()
	switch {
	case err == nil:
		sc.loadedAt.Store(time.Now().UnixNano())
		reason := "library " + lua.LibraryName + " loaded"
		if why != "" {
			reason += " again (" + why + ")"
		}
		sc.set(modeFunction, reason)
		return true
	case refused(err):
		sc.set(modeEval, "FUNCTION LOAD refused: "+err.Error())
		return false
	}
	// An outage: try again on a call after loadRetry, and go by EVALSHA
	// until then, so that a node that is down or out of memory does not
	// cost every call a second round trip.
	sc.retryAt.Store(time.Now().Add(loadRetry).UnixNano())
	return false
}

// loadRetry is how long a node whose FUNCTION LOAD met an outage goes by
// EVALSHA before the library is tried again.
const loadRetry = time.Second

// reload loads the library again on a node that answered "Function not
// found", unless a load met an outage less than loadRetry ago, and reports
// whether it did.
func (sc *scripts) reload(ctx context.Context, node redis.Cmdable) bool {
	if time.Now().UnixNano() < sc.retryAt.Load() {
		return false
	}
	return sc.load(ctx, node, "the node did not have it")
}

// refused reports whether err is Redis refusing a command, not failing to
// serve it: an error reply other than an outage's (unknown command or
// subcommand, a library it cannot load), or NOPERM (an ACL without it).
func refused(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	word, _, _ := strings.Cut(re.Error(), " ")
	return word == "NOPERM" || !outageReplies[word]
}

// functionMissing reports whether err is FCALL's answer on a node that does
// not have the function.
func functionMissing(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "Function not found")
}

// fcallRefused reports whether err is a node refusing FCALL itself (unknown
// command, NOPERM): it must run scripts.
func fcallRefused(err error) bool {
	if err == nil || functionMissing(err) {
		return false
	}
	return redis.HasErrorPrefix(err, "NOPERM") || redis.HasErrorPrefix(err, "unknown command")
}

// fcall queues or sends the FCALL of decide.lua with keys and args:
// FCALL_RO of the peek function for a peek.
func fcall(ctx context.Context, c redis.Cmdable, keys []string, args []any) *redis.Cmd {
	if len(args) > 1 && args[1] == argModePeek {
		return c.FCallRo(ctx, lua.PeekFunction, keys, args...)
	}
	return c.FCall(ctx, lua.DecideFunction, keys, args...)
}

// run runs one script call on c (the node's client, or the cluster
// client) alone, in the node's mode. A missing function is loaded again,
// unless it was loaded since sent (unix ns); a refused FCALL falls back to
// EVALSHA.
func (n *node) run(ctx context.Context, c redis.Cmdable, keys []string, args []any, sent int64) (string, error) {
	sc := &n.scripts
	if sc.functions(ctx, n.cmdable()) {
		cmd := fcall(ctx, c, keys, args)
		err := cmd.Err()
		if functionMissing(err) && sc.loadedAt.Load() > sent {
			cmd = fcall(ctx, c, keys, args) // another call loaded it since
			err = cmd.Err()
		}
		switch {
		case functionMissing(err):
			if !sc.reload(ctx, n.cmdable()) {
				return runEval(ctx, c, keys, args)
			}
			cmd = fcall(ctx, c, keys, args)
		case fcallRefused(err):
			sc.set(modeEval, "FCALL refused: "+err.Error())
			return runEval(ctx, c, keys, args)
		}
		return scriptReply(cmd)
	}
	return runEval(ctx, c, keys, args)
}

// runEval runs decide.lua by its SHA, sending the source only when the
// node answers NOSCRIPT.
func runEval(ctx context.Context, c redis.Scripter, keys []string, args []any) (string, error) {
	cmd := c.EvalSha(ctx, lua.Decide.Hash(), keys, args...)
	if noScript(cmd.Err()) {
		cmd = c.Eval(ctx, lua.DecideSource, keys, args...)
	}
	return scriptReply(cmd)
}

// scriptReply returns a script call's reply, which must be a string.
func scriptReply(cmd *redis.Cmd) (string, error) {
	v, err := cmd.Result()
	if err != nil {
		return "", err
	}
	reply, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%w: the script replied %T, not a string", store.ErrProtocol, v)
	}
	return reply, nil
}

// noScript reports whether err is Redis's NOSCRIPT (script not cached).
func noScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// redirected reports whether a cluster node's error means the slot is
// elsewhere or moving (MOVED, ASK, TRYAGAIN) or the node's client went away
// with a topology change, so the call must go through the cluster client.
func redirected(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	return redis.HasErrorPrefix(err, "MOVED ") || redis.HasErrorPrefix(err, "ASK ") ||
		redis.IsTryAgainError(err) || errors.Is(err, redis.ErrClosed)
}

// ScriptModes returns how many Redis nodes seen so far run decide.lua in
// each mode, by ScriptFunction and ScriptEval (a node not called yet is in
// neither).
func (s *Store) ScriptModes() map[string]int {
	m := map[string]int{ScriptFunction: 0, ScriptEval: 0}
	s.nodes.Range(func(_, v any) bool {
		switch v.(*node).scripts.mode.Load() {
		case modeFunction:
			m[ScriptFunction]++
		case modeEval:
			m[ScriptEval]++
		}
		return true
	})
	return m
}
