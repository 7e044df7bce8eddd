package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestArchitectureRoutes holds docs/ARCHITECTURE.md's route table to the
// code: every route names a file that exists and tests that exist.
func TestArchitectureRoutes(t *testing.T) {
	doc, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	err = filepath.WalkDir("../..", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		for _, m := range regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)\w+)\(`).FindAllSubmatch(b, -1) {
			defined[string(m[1])] = true
		}
		return err
	})
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
