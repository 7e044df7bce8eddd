package lua

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"
)

// decide.lua as a Redis Function library (Redis 7 and later), loaded once
// per node by FUNCTION LOAD REPLACE: its text without the first and last
// lines of code (a library's top level may touch no global), plus the
// registration of its two functions. FCALL and EVALSHA run the same text.
const (
	// evalPrologue is decide.lua's first line of code, for scripts only.
	evalPrologue = "if redis.replicate_commands then pcall(redis.replicate_commands) end\n"
	// evalEpilogue is decide.lua's last line, for scripts only.
	evalEpilogue = "return rls_decide(KEYS, ARGV)\n"
)

// Library is the Function library's source and LibraryName its name.
// DecideFunction is called by FCALL in any mode, PeekFunction (no-writes)
// by FCALL_RO for ModePeek. The names carry a hash of the text: Function
// names are global to a server, so two rls versions in a rolling upgrade
// each call their own.
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
