package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"
)

// The flags page shows rls serve --help verbatim between these markers;
// RLS_UPDATE_DOCS=1 go test ./cmd/rls -run TestFlagsDoc rewrites it.
const (
	helpBegin = "<!-- begin: rls serve --help -->\n```text\n"
	helpEnd   = "```\n<!-- end: rls serve --help -->"
	flagsDoc  = "../../docs/flags.md"
)

// TestFlagsDoc: docs/flags.md shows what rls serve --help prints (its
// table is checked by TestReadmeListsEveryFlag).
func TestFlagsDoc(t *testing.T) {
	var help bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, func(string) string { return "" }, &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	b, err := os.ReadFile(flagsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, helpBegin), strings.Index(doc, helpEnd)
	if i < 0 || j < i {
		t.Fatalf("%s: no block between %q and %q", flagsDoc, helpBegin, helpEnd)
	}
	shown := doc[i+len(helpBegin) : j]
	if shown != help.String() {
		if os.Getenv("RLS_UPDATE_DOCS") == "1" {
			doc = doc[:i+len(helpBegin)] + help.String() + doc[j:]
			if err := os.WriteFile(flagsDoc, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("%s shows another rls serve --help than rls prints (RLS_UPDATE_DOCS=1 go test ./cmd/rls -run TestFlagsDoc updates it):\n%s", flagsDoc, help.String())
	}
}
