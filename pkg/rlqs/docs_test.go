package rlqs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestInvariantTestsExist holds docs/rlqs.md to its tests: every test it
// names exists in the repository (a name after -run may be a prefix), and
// every numbered invariant names at least one.
func TestInvariantTestsExist(t *testing.T) {
	doc, err := os.ReadFile("../../docs/rlqs.md")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllSubmatch(b, -1) {
			defined[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`(-run '?\^?)?\b(Test[A-Za-z0-9_]+)`)
	for _, m := range named.FindAllStringSubmatch(string(doc), -1) {
		name, pattern := m[2], m[1] != ""
		if defined[name] || pattern && hasPrefixed(defined, name) {
			continue
		}
		t.Errorf("docs/rlqs.md names %s, which no test of the repository defines", name)
	}
	_, inv, ok := strings.Cut(string(doc), "## Guarantees: the invariants\n")
	if !ok {
		t.Fatal(`docs/rlqs.md has no "## Guarantees: the invariants" section`)
	}
	inv, _, _ = strings.Cut(inv, "\n## ")
	item := regexp.MustCompile(`(?m)^(\d+)\. `)
	idx := item.FindAllStringSubmatchIndex(inv, -1)
	if len(idx) == 0 {
		t.Fatal("docs/rlqs.md states no numbered invariant")
	}
	for i, at := range idx {
		end := len(inv)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		if n := inv[at[2]:at[3]]; n != strconv.Itoa(i+1) {
			t.Errorf("invariant %s is numbered out of order (want %d)", n, i+1)
		}
		if !named.MatchString(inv[at[0]:end]) {
			t.Errorf("invariant %d names no test that holds it", i+1)
		}
	}
}

func hasPrefixed(defined map[string]bool, prefix string) bool {
	for n := range defined {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}
