package reload

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/testkit"
)

// countLoads replaces load with a wrapper counting its calls.
func countLoads(t *testing.T) func() int {
	var mu sync.Mutex
	n := 0
	orig := load
	load = func(dir string, o descriptors.LoadOptions) (*descriptors.Config, []string, error) {
		mu.Lock()
		n++
		mu.Unlock()
		return orig(dir, o)
	}
	t.Cleanup(func() { load = orig })
	return func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// past sets a file's modification time an hour back, out of racyWindow.
func past(t *testing.T, path string) {
	t.Helper()
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
}

func newGuarded(t *testing.T, dir string, opts Options) (*Watcher, *applied, *testkit.Buffer) {
	t.Helper()
	cfg, _, err := descriptors.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := &applied{}
	lb := &testkit.Buffer{}
	opts.Dir = dir
	opts.Apply = func(c *descriptors.Config) { a.mu.Lock(); a.cfgs = append(a.cfgs, c); a.mu.Unlock() }
	opts.Report = func(r Result, _ *descriptors.Config) { a.mu.Lock(); a.res = append(a.res, r); a.mu.Unlock() }
	opts.Log = slog.New(slog.NewTextHandler(lb, nil))
	return New(cfg, opts), a, lb
}

// TestOversizedFileIsRefusedOnceAndNotReread: a 50 MB file (sparse: nothing
// is written) is refused by its size, the error names the file, its size
// and the limit; later polls with the same files neither load nor parse.
func TestOversizedFileIsRefusedOnceAndNotReread(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "d.yaml"), fmt.Sprintf(good, "1"))
	w, a, lb := newGuarded(t, dir, Options{Poll: -1, MaxFileBytesName: "--config-max-bytes"})
	loads := countLoads(t)

	big := filepath.Join(dir, "big.yaml")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Truncate(big, 50<<20); err != nil {
		t.Fatal(err)
	}
	past(t, big)
	past(t, filepath.Join(dir, "d.yaml"))
	if r := w.Reload(); r != Failure {
		t.Fatalf("reload with a 50 MB file: %v, want failure", r)
	}
	want := fmt.Sprintf("%s: file is %d bytes, more than the %d bytes of --config-max-bytes; not read", big, 50<<20, descriptors.DefaultMaxFileBytes)
	if !strings.Contains(lb.String(), want) || !strings.Contains(lb.String(), "level=ERROR") {
		t.Fatalf("log %q does not say %q at ERROR", lb.String(), want)
	}
	for i := 0; i < 5; i++ {
		if r := w.Reload(); r != Failure {
			t.Fatalf("poll %d of the same rejected files: %v, want failure", i, r)
		}
	}
	if n := loads(); n != 1 {
		t.Fatalf("the rejected set was loaded %d times, want once", n)
	}
	if n := strings.Count(lb.String(), "config reload rejected"); n != 1 {
		t.Errorf("rejection logged %d times, want once", n)
	}
	if _, n := a.last(); n != 0 {
		t.Fatalf("%d configs applied, want none", n)
	}
	// Removing the file is a change: loaded again, and the config in force
	// is what the directory has.
	if err := os.Remove(big); err != nil {
		t.Fatal(err)
	}
	if r := w.Reload(); r != Unchanged || loads() != 2 {
		t.Fatalf("reload after removing the file: %v after %d loads, want unchanged after 2", r, loads())
	}
}

// TestRejectedSetChangedIsReloaded: any change of name, size or mtime of a
// rejected set is loaded again, and a set modified within racyWindow is not
// trusted to be unchanged.
func TestRejectedSetChangedIsReloaded(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "d.yaml")
	write(t, path, fmt.Sprintf(good, "1"))
	w, a, _ := newGuarded(t, dir, Options{Poll: -1})
	loads := countLoads(t)

	bad := "domain: d\ndescriptors:\n  - key: k\n    bogus: 1\n"
	write(t, path, bad) // just written: within racyWindow
	w.Reload()
	w.Reload()
	if n := loads(); n != 2 {
		t.Fatalf("a just-written rejected set loaded %d times in 2 reloads, want 2 (not trusted yet)", n)
	}
	past(t, path)
	w.Reload() // mtime changed: loaded, now trusted
	w.Reload()
	if n := loads(); n != 3 {
		t.Fatalf("loads %d, want 3", n)
	}
	// A new version: loaded again, and applied.
	write(t, path, fmt.Sprintf(good, "7"))
	if r := w.Reload(); r != Success || loads() != 4 {
		t.Fatalf("reload of the fixed file: %v after %d loads", r, loads())
	}
	if c, _ := a.last(); limitOf(c) != 7 {
		t.Fatalf("limit %d applied, want 7", limitOf(c))
	}
}

// TestEmptyDirKeepsTheLastGoodConfig: removing every file is a failure that
// keeps the config in force, logged at ERROR, unless AllowEmpty.
func TestEmptyDirKeepsTheLastGoodConfig(t *testing.T) {
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprint("allow=", allow), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "d.yaml")
			write(t, path, fmt.Sprintf(good, "1"))
			w, a, lb := newGuarded(t, dir, Options{Poll: -1, AllowEmpty: allow, AllowEmptyName: "--allow-empty-config"})
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			// A stray non-YAML file: still no domain.
			if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			r := w.Reload()
			_, n := a.last()
			if allow {
				if r != Success || n != 1 {
					t.Fatalf("allowed empty reload: %v, %d applied", r, n)
				}
				return
			}
			if r != Failure || n != 0 {
				t.Fatalf("empty reload: %v, %d applied; want failure, none", r, n)
			}
			if !strings.Contains(lb.String(), "level=ERROR") || !strings.Contains(lb.String(), "no domain left") ||
				!strings.Contains(lb.String(), "--allow-empty-config") {
				t.Fatalf("log %q", lb.String())
			}
			// Files back: applied as usual.
			write(t, path, fmt.Sprintf(good, "3"))
			if r := w.Reload(); r != Success {
				t.Fatalf("reload after restoring: %v", r)
			}
		})
	}
}
