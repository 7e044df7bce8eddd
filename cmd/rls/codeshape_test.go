package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxCyclo is the most cyclomatic complexity a production function of the
// main module or bench/ may have (issue 42).
const maxCyclo = 15

// TestNoComplexFunctions computes each production function's cyclomatic
// complexity as gocyclo does (github.com/fzipp/gocyclo: 1, plus one per
// if, for, range, non-default case and select case, && and ||, function
// literals counted in the function that holds them) and fails on any over
// maxCyclo. Generated files (.pb.go) and tests are left out.
func TestNoComplexFunctions(t *testing.T) {
	fset := token.NewFileSet()
	for _, root := range []string{"../..", "../../bench"} {
		productionFiles(t, root, func(path string, _ []byte) {
			if !strings.HasSuffix(path, ".go") {
				return
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, decl := range f.Decls {
				if fn, ok := decl.(*ast.FuncDecl); ok {
					if c := cyclomatic(fn); c > maxCyclo {
						t.Errorf("%s: %s has cyclomatic complexity %d, over %d: split it", fset.Position(fn.Pos()), fn.Name.Name, c, maxCyclo)
					}
				}
			}
		})
	}
}

// productionFiles calls fn with each production .go and .lua file of the
// module at root (tests, generated .pb.go, testdata and the other modules,
// bench/ and deploy/, left out).
func productionFiles(t *testing.T, root string, fn func(path string, src []byte)) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (d.Name() == "bench" || d.Name() == "deploy" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !(strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".lua")) || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fn(path, src)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func cyclomatic(fn *ast.FuncDecl) int {
	c := 1
	ast.Inspect(fn, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if n.List != nil {
				c++
			}
		case *ast.CommClause:
			if n.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if n.Op == token.LAND || n.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

// TestSourceFileSizes: no production file of the main module (.go or
// .lua; generated .pb.go left out) is over 700 lines, and cmd/rls holds
// at most 2,000 lines of production Go (issue 42): a file has one job, and
// the command only wires.
func TestSourceFileSizes(t *testing.T) {
	cmd := 0
	productionFiles(t, "../..", func(path string, src []byte) {
		n := bytes.Count(src, []byte("\n"))
		if n > 700 {
			t.Errorf("%s: %d lines, over 700: split it by job", path, n)
		}
		if strings.HasPrefix(path, "../../cmd/rls/") && strings.HasSuffix(path, ".go") {
			cmd += n
		}
	})
	if cmd > 2000 {
		t.Errorf("cmd/rls: %d lines of production Go, over 2,000: move what is not wiring into a package", cmd)
	}
	if cmd == 0 {
		t.Error("cmd/rls: no production Go found: the walk is wrong")
	}
}
