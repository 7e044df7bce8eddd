package main

import (
	"go/build"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rls-project/rls/pkg/testkit"
)

// TestArchitectureRoutes holds docs/ARCHITECTURE.md's route table to the
// code: every route names a file that exists and tests that exist.
func TestArchitectureRoutes(t *testing.T) {
	doc, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	defined, err := testkit.DefinedTests("../..")
	if err != nil {
		t.Fatal(err)
	}
	routes := 0
	for _, line := range strings.Split(string(doc), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 8 || strings.TrimSpace(cells[1]) == "#" || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		routes++
		for _, f := range regexp.MustCompile("`([a-z/_.]+\\.go|pkg/[a-z/]+)`").FindAllStringSubmatch(cells[5], -1) {
			path := f[1]
			if !strings.Contains(path, "/") { // a file of the row's package, named before it
				continue
			}
			if _, err := os.Stat("../../" + path); err != nil {
				t.Errorf("route %s: %s does not exist", strings.TrimSpace(cells[2]), path)
			}
		}
		tests := regexp.MustCompile("`((?:Test|Fuzz)\\w+)`").FindAllStringSubmatch(cells[6], -1)
		if len(tests) == 0 {
			t.Errorf("route %s names no test", strings.TrimSpace(cells[2]))
		}
		for _, m := range tests {
			if !defined[m[1]] {
				t.Errorf("route %s: no test %s", strings.TrimSpace(cells[2]), m[1])
			}
		}
	}
	if routes != 9 {
		t.Errorf("%d routes in docs/ARCHITECTURE.md's table, want the 9 of limiter.Decide", routes)
	}
}

// TestPathLines holds the decision path to its size (docs/ARCHITECTURE.md):
// the non-test Go and Lua of pkg/limiter, pkg/store/redisstore and the
// packages of this module they build on add up to at most pathLines.
func TestPathLines(t *testing.T) {
	const module, pathLines = "github.com/rls-project/rls/", 5760
	seen := map[string]bool{}
	lines := 0
	var visit func(pkg string)
	visit = func(pkg string) {
		if seen[pkg] {
			return
		}
		seen[pkg] = true
		p, err := build.Default.ImportDir(filepath.Join("../..", strings.TrimPrefix(pkg, module)), 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range append(p.GoFiles, p.EmbedPatterns...) {
			b, err := os.ReadFile(filepath.Join(p.Dir, f))
			if err != nil {
				t.Fatal(err)
			}
			lines += strings.Count(string(b), "\n")
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module) {
				visit(imp)
			}
		}
	}
	visit(module + "pkg/limiter")
	visit(module + "pkg/store/redisstore")
	t.Logf("%d lines in %d packages", lines, len(seen))
	if lines > pathLines {
		t.Errorf("the decision path is %d lines of Go and Lua, over its %d (docs/ARCHITECTURE.md)", lines, pathLines)
	}
}
