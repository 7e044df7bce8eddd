package main

import (
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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
	const module, pathLines = "github.com/rls-project/rls/", 5780
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

// TestArchitectureImports holds docs/ARCHITECTURE.md's package table to
// `go list`: every package of the module with non-test Go files has a row,
// every row names a package (or another module, ending in "/"), and each
// row's import column lists exactly the module's packages it imports
// outside its tests. A failure prints the import cells to write.
func TestArchitectureImports(t *testing.T) {
	const module = "github.com/rls-project/rls/"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{len .GoFiles}}|{{join .Imports \" \"}}", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	want := map[string]string{} // package → its import cell, sorted
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "|", 3)
		if f[1] == "0" {
			continue // tests only
		}
		var ours []string
		for _, imp := range strings.Fields(f[2]) {
			if strings.HasPrefix(imp, module) {
				ours = append(ours, strings.TrimPrefix(strings.TrimPrefix(imp, module), "pkg/"))
			}
		}
		want[strings.TrimPrefix(f[0], module)] = importCell(ours)
	}
	doc, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, _ := strings.Cut(string(doc), "## Packages")
	sec, _, _ = strings.Cut(sec, "\n## ")
	paren := regexp.MustCompile(`\([^()]*\)`)
	seen := map[string]bool{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		pkg := strings.Trim(strings.TrimSpace(cells[1]), "`")
		if strings.HasSuffix(pkg, "/") { // another module: bench/, deploy/
			continue
		}
		seen[pkg] = true
		w, ok := want[pkg]
		if !ok {
			t.Errorf("docs/ARCHITECTURE.md has a row for %s, which is not a package of the module", pkg)
			continue
		}
		var got []string
		for _, name := range strings.Split(paren.ReplaceAllString(cells[3], ""), ",") {
			if name = strings.Trim(strings.TrimSpace(name), "`"); name != "" && name != "none" {
				got = append(got, name)
			}
		}
		if g := importCell(got); g != w {
			t.Errorf("docs/ARCHITECTURE.md: the row of `%s` lists imports %q; write: %s", pkg, g, w)
		}
	}
	for pkg, w := range want {
		if !seen[pkg] {
			t.Errorf("docs/ARCHITECTURE.md has no row for %s; add: | `%s` | ... | %s |", pkg, pkg, w)
		}
	}
}

// importCell is names sorted and comma-separated, or "none".
func importCell(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
