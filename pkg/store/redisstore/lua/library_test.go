package lua

import (
	"strings"
	"testing"
)

// TestLibrary checks that the Function library is decide.lua's text
// without the script-only first and last lines, named by its hash, with
// its two functions registered.
func TestLibrary(t *testing.T) {
	if !strings.HasPrefix(Library, "#!lua name="+LibraryName+"\n") {
		t.Errorf("the library does not begin with its shebang: %.60q", Library)
	}
	if strings.Contains(Library, "replicate_commands") || strings.Contains(Library, evalEpilogue) {
		t.Error("the library keeps a script-only line")
	}
	if !strings.Contains(DecideSource, "\n"+evalPrologue) || !strings.HasSuffix(DecideSource, "\n"+evalEpilogue) {
		t.Error("decide.lua lacks its script-only lines")
	}
	h := strings.TrimPrefix(LibraryName, "rls_")
	if len(h) != 16 || DecideFunction != "rls_decide_"+h || PeekFunction != "rls_peek_"+h {
		t.Errorf("names %s %s %s", LibraryName, DecideFunction, PeekFunction)
	}
	for _, want := range []string{
		"redis.register_function('" + DecideFunction + "', rls_decide)",
		"function_name = '" + PeekFunction + "', callback = rls_decide, flags = { 'no-writes' }",
	} {
		if !strings.Contains(Library, want) {
			t.Errorf("the library does not say %q", want)
		}
	}
	// Another text is another name.
	other := strings.Replace(DecideSource, "local US = 1000000", "local US = 1000000 ", 1)
	if _, name, _, _ := library(other); name == LibraryName {
		t.Error("a changed text kept the library's name")
	}
	defer func() {
		if recover() == nil {
			t.Error("library accepted a text without the script lines")
		}
	}()
	library("return 1\n")
}
