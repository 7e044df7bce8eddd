package lua

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"
)

// decide.lua as a Redis Function library (Redis 7 and later): loaded once
// per node with FUNCTION LOAD REPLACE, its top level (every helper
// function) runs once, and each FCALL runs rls_decide alone. The library is
// decide.lua's own text, so FCALL and EVALSHA run the same arithmetic: the
// line that asks for effects replication (a library's top level may touch
// no global, and Functions replicate effects anyway) and the script's last
// line, which calls rls_decide, are left out, and the registration of the
// two functions is added.
const (
	// evalPrologue is decide.lua's first line of code, for scripts only.
	evalPrologue = "if redis.replicate_commands then pcall(redis.replicate_commands) end\n"
	// evalEpilogue is decide.lua's last line, for scripts only.
	evalEpilogue = "return rls_decide(KEYS, ARGV)\n"
)

// Library is the Function library's source, LibraryName its name, and
// DecideFunction and PeekFunction the names of its functions: FCALL
// DecideFunction with the KEYS and ARGV of decide.lua (any mode), FCALL_RO
// PeekFunction for ModePeek (flagged no-writes, so it may run where writes
// are refused). Names carry a hash of the library's text: Function names are
// global to a Redis server, so two rls versions (a rolling upgrade) each
// load and call their own, and a name always means one text.
var (
	Library        string
	LibraryName    string
	DecideFunction string
	PeekFunction   string
)

func init() {
	Library, LibraryName, DecideFunction, PeekFunction = library(DecideSource)
}

// library builds the Function library from decide.lua's text src. It
// panics when src lacks the lines it replaces: decide.lua and this file
// disagree, which TestLibrary catches.
func library(src string) (code, name, decide, peek string) {
	i := strings.Index(src, "\n"+evalPrologue)
	if i < 0 || !strings.HasSuffix(src, "\n"+evalEpilogue) {
		panic("lua: decide.lua lacks its script prologue or epilogue line")
	}
	body := src[:i+1] + src[i+1+len(evalPrologue):len(src)-len(evalEpilogue)]
	sum := sha1.Sum([]byte(body))
	h := hex.EncodeToString(sum[:8])
	name, decide, peek = "rls_"+h, "rls_decide_"+h, "rls_peek_"+h
	code = fmt.Sprintf("#!lua name=%s\n%s\nredis.register_function('%s', rls_decide)\n"+
		"redis.register_function{function_name = '%s', callback = rls_decide, flags = { 'no-writes' }}\n",
		name, body, decide, peek)
	return code, name, decide, peek
}
