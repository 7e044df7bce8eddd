package reload

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/testkit"
)

const good = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %s}\n"

func write(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // an atomic replace
		t.Fatal(err)
	}
}

type applied struct {
	mu   sync.Mutex
	cfgs []*descriptors.Config
	res  []Result
}

func (a *applied) last() (*descriptors.Config, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cfgs) == 0 {
		return nil, 0
	}
	return a.cfgs[len(a.cfgs)-1], len(a.cfgs)
}

// waitWatching returns once the watcher sees events: it touches a stray
// non-YAML file until a reload attempt is reported (attempts counts them).
// These tests turn the poll off, so a change made before the watch exists
// would never be seen. The touches are 100 ms apart, longer than the
// debounce, so that they do not keep postponing the reload.
func waitWatching(t *testing.T, dir string, attempts func() int) {
	t.Helper()
	probe := filepath.Join(dir, "probe.txt")
	if !testkit.EventuallyEvery(5*time.Second, 100*time.Millisecond, func() bool {
		if attempts() > 0 {
			return true
		}
		if err := os.WriteFile(probe, []byte(time.Now().String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return false
	}) {
		t.Fatal("timed out waiting for the watch to start")
	}
}

func (a *applied) attempts() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.res)
}

func limitOf(cfg *descriptors.Config) uint32 {
	for _, r := range cfg.Rules() {
		return r.RequestsPerUnit
	}
	return 0
}

func TestWatcherAppliesValidChangesOnly(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "d.yaml"), fmt.Sprintf(good, "1"))
	cfg, _, err := descriptors.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := &applied{}
	w := New(cfg, Options{Dir: dir, Debounce: 20 * time.Millisecond, Poll: -1,
		Apply:  func(c *descriptors.Config) { a.mu.Lock(); a.cfgs = append(a.cfgs, c); a.mu.Unlock() },
		Report: func(r Result, _ *descriptors.Config) { a.mu.Lock(); a.res = append(a.res, r); a.mu.Unlock() }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitWatching(t, dir, a.attempts)

	write(t, filepath.Join(dir, "d.yaml"), fmt.Sprintf(good, "2"))
	testkit.WaitFor(t, "limit 2", 5*time.Second, func() bool { c, _ := a.last(); return c != nil && limitOf(c) == 2 })

	// A broken edit is rejected: nothing applied.
	write(t, filepath.Join(dir, "d.yaml"), "domain: d\ndescriptors:\n  - key: k\n    bogus: 1\n")
	testkit.WaitFor(t, "a failure", 5*time.Second, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.res) > 0 && a.res[len(a.res)-1] == Failure
	})
	if _, n := a.last(); n != 1 {
		t.Fatalf("%d configs applied, want 1 (the broken one must not be)", n)
	}
	// A stray non-YAML file changes nothing; fixing the file applies again.
	if err := os.WriteFile(filepath.Join(dir, "README.txt"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "d.yaml"), fmt.Sprintf(good, "3"))
	testkit.WaitFor(t, "limit 3", 5*time.Second, func() bool { c, _ := a.last(); return c != nil && limitOf(c) == 3 })
	// Adding a domain file and removing it.
	write(t, filepath.Join(dir, "e.yaml"), "domain: e\ndescriptors: []\n")
	testkit.WaitFor(t, "domain e", 5*time.Second, func() bool { c, _ := a.last(); return c != nil && len(c.Domains()) == 2 })
	if err := os.Remove(filepath.Join(dir, "e.yaml")); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "domain e removed", 5*time.Second, func() bool { c, _ := a.last(); return c != nil && len(c.Domains()) == 1 })
}

// TestConfigMapSymlinkSwap rebuilds Kubernetes' ConfigMap layout: the files
// are symlinks into ..data, itself a symlink swapped atomically to a new
// timestamped directory on update.
func TestConfigMapSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	mkVersion := func(name, limit string) {
		v := filepath.Join(dir, name)
		if err := os.Mkdir(v, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(v, "d.yaml"), []byte(fmt.Sprintf(good, limit)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	swap := func(name string) {
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	mkVersion("..2026_01_01_00_00_00.1", "1")
	swap("..2026_01_01_00_00_00.1")
	if err := os.Symlink("..data/d.yaml", filepath.Join(dir, "d.yaml")); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := descriptors.Load(dir)
	if err != nil || limitOf(cfg) != 1 {
		t.Fatalf("initial load: %v", err)
	}
	a := &applied{}
	w := New(cfg, Options{Dir: dir, Debounce: 20 * time.Millisecond, Poll: -1,
		Apply:  func(c *descriptors.Config) { a.mu.Lock(); a.cfgs = append(a.cfgs, c); a.mu.Unlock() },
		Report: func(r Result, _ *descriptors.Config) { a.mu.Lock(); a.res = append(a.res, r); a.mu.Unlock() }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitWatching(t, dir, a.attempts)

	mkVersion("..2026_01_01_00_00_00.2", "7")
	swap("..2026_01_01_00_00_00.2")
	testkit.WaitFor(t, "limit 7 after the ..data swap", 5*time.Second, func() bool { c, _ := a.last(); return c != nil && limitOf(c) == 7 })
}

func TestPollCatchesMissedEvents(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "d.yaml"), fmt.Sprintf(good, "1"))
	cfg, _, _ := descriptors.Load(dir)
	a := &applied{}
	w := New(cfg, Options{Dir: dir, Apply: func(c *descriptors.Config) { a.cfgs = append(a.cfgs, c) }})
	if r := w.Reload(); r != Unchanged {
		t.Fatalf("reload of the same files: %v", r)
	}
	write(t, filepath.Join(dir, "d.yaml"), fmt.Sprintf(good, "5"))
	if r := w.Reload(); r != Success || limitOf(a.cfgs[0]) != 5 {
		t.Fatalf("reload: %v", r)
	}
}

// TestCheckRefusesAValidConfig: a config that loads but that Check refuses
// (rules the store cannot count) fails the reload, and the config in force
// stays.
func TestCheckRefusesAValidConfig(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "d.yaml"), fmt.Sprintf(good, "5"))
	cfg, _, err := descriptors.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var a applied
	w := New(cfg, Options{Dir: dir, Poll: -1, Apply: func(c *descriptors.Config) { a.cfgs = append(a.cfgs, c) },
		Check: func(c *descriptors.Config) error {
			if limitOf(c) == 7 {
				return fmt.Errorf("7 is not countable here")
			}
			return nil
		}})
	write(t, filepath.Join(dir, "d.yaml"), fmt.Sprintf(good, "7"))
	if r := w.Reload(); r != Failure {
		t.Fatalf("reload to a refused config: %v, want failure", r)
	}
	write(t, filepath.Join(dir, "d.yaml"), fmt.Sprintf(good, "8"))
	if r := w.Reload(); r != Success {
		t.Fatalf("reload to an accepted config: %v, want success", r)
	}
	if c, n := a.last(); n != 1 || limitOf(c) != 8 {
		t.Errorf("applied %d configs, the last with limit %d; want only 8", n, limitOf(c))
	}
}
