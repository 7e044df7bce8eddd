package testkit

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

var testFunc = regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)\w+)\(`)

// DefinedTests returns the names of the Test and Fuzz functions of every
// _test.go file under root, for tests that hold a doc's test names to the
// code.
func DefinedTests(root string) (map[string]bool, error) {
	defined := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		for _, m := range testFunc.FindAllSubmatch(b, -1) {
			defined[string(m[1])] = true
		}
		return err
	})
	return defined, err
}
