package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testSupport are the packages only tests use, by design: deadcode reports
// every function of theirs, and nothing else may be reported.
var testSupport = []string{
	"envoy/",
	"integration/redistest/",
	"pkg/rlqs/rlqstest/",
	"pkg/simulate/simtest/",
	"pkg/store/storetest/",
	"pkg/testkit/",
	"pkg/tlsconfig/tlstest/",
	"pkg/xds/xdstest/",
}

// TestNoDeadProductionCode runs deadcode (golang.org/x/tools/cmd/deadcode)
// over the module: a function of a production package that no main package
// reaches is either unused or used by tests only, and belongs in a _test.go
// file or a test-support package. deadcode type-checks the whole program
// (about 20 s on 2 cores), so the test is skipped with -short and where
// deadcode is not installed ($DEADCODE, else PATH, else GOPATH/bin; make
// test sets $DEADCODE to the version it pins).
func TestNoDeadProductionCode(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: deadcode takes about 20 s")
	}
	bin, err := os.Getenv("DEADCODE"), error(nil) // make test installs a pinned one
	if bin == "" {
		bin, err = exec.LookPath("deadcode")
	}
	if err != nil {
		gopath, _ := exec.Command("go", "env", "GOPATH").Output()
		bin = filepath.Join(strings.TrimSpace(string(gopath)), "bin", "deadcode")
		if _, err := os.Stat(bin); err != nil {
			t.Skip("deadcode is not installed (go install golang.org/x/tools/cmd/deadcode@latest): the dead-code check is skipped")
		}
	}
	for _, dir := range testSupport {
		if _, err := os.Stat(filepath.Join("../..", dir)); err != nil {
			t.Errorf("test-support package %s: %v (remove it from testSupport)", dir, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "./...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("deadcode ./...: %v\n%s", err, stderr.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "unreachable func") || isTestSupport(line) {
			continue
		}
		t.Errorf("%s: reached by tests only, or by nothing: move it to a _test.go file or a test-support package, or call the production entry point from the tests", line)
	}
}

func isTestSupport(line string) bool {
	for _, p := range testSupport {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}
