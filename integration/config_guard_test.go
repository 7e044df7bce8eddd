package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/pkg/testkit"
)

// cgCPU returns the CPU time (user + system) the process pid has used so
// far, from /proc/PID/stat (in clock ticks of 10 ms, Linux's USER_HZ).
func cgCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64) // field 14 of proc(5)
	stime, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// cgRSS returns the process's VmRSS in MiB, for logs.
func cgRSS(t *testing.T, pid int) string {
	v, err := readVmRSS(pid)
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("%.1f MiB", float64(v)/(1<<20))
}

// cgBusy is the share of one core the process used over d.
func cgBusy(t *testing.T, pid int, d time.Duration) float64 {
	t.Helper()
	before := cgCPU(t, pid)
	time.Sleep(d) // the period measured: real time on purpose
	return float64(cgCPU(t, pid)-before) / float64(d)
}

// cgPokedBusy is cgBusy while a file rls ignores (by its extension) is
// rewritten every 400 ms: each write is a file event, after which rls
// checks the directory again, as a poll does (rls polls every 10 s).
func cgPokedBusy(t *testing.T, dir string, pid int, d time.Duration) float64 {
	t.Helper()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(400 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				_ = os.WriteFile(filepath.Join(dir, "poke.txt"), []byte(now.String()), 0o644)
			}
		}
	}()
	busy := cgBusy(t, pid, d)
	close(stop)
	<-done
	return busy
}

// cgFailures reads rls_config_reloads_total{result="failure"}.
func cgFailures(t *testing.T, p *rlsProc) int {
	t.Helper()
	v, ok := series(scrape(t, p))[`rls_config_reloads_total{result="failure"}`]
	if !ok {
		t.Fatal("no rls_config_reloads_total failure series")
	}
	return int(v)
}

// cgPlace writes body under a hidden name (ignored by rls), dates it back
// an hour and renames it to name: the file appears whole, at once.
func cgPlace(t *testing.T, dir, name string, write func(*os.File)) {
	t.Helper()
	tmp := filepath.Join(dir, ".tmp-"+name)
	f, err := os.Create(tmp)
	if err != nil {
		t.Fatal(err)
	}
	write(f)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(tmp, old, old); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// TestConfigGuards: a 50 MB config file is refused from its size (logged
// naming the limit) and a big invalid file under the limit is parsed once,
// not at every check: the last good config keeps limiting and rls stays
// nearly idle over many checks. Emptying the directory keeps the last good
// config too.
func TestConfigGuards(t *testing.T) {
	light(t)
	dir := writeConfig(t, map[string]string{"guard.yaml": `
domain: guard
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: 2}
`})
	p := startRLSFast(t, dir)
	pid := p.cmd.Process.Pid
	c := p.client()
	limited := func(what string) {
		t.Helper()
		resp := should(t, c, "guard", desc("k", "x"))
		st := resp.Statuses[0]
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.CurrentLimit.GetRequestsPerUnit() != 2 {
			t.Fatalf("%s: %v %v, want OVER_LIMIT of the 2/day limit", what, resp.OverallCode, st)
		}
	}
	should(t, c, "guard", desc("k", "x"))
	should(t, c, "guard", desc("k", "x"))
	limited("the third call")

	// 1. A 50 MB file: refused by its size, never read.
	cgPlace(t, dir, "huge.yaml", func(f *os.File) {
		line := []byte("  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
		f.WriteString("domain: huge\ndescriptors:\n")
		for n := 0; n < 50<<20; n += len(line) {
			f.Write(line)
		}
	})
	testkit.WaitForEvery(t, "the 50 MB file refused", 10*time.Second, pollEvery, func() bool {
		return strings.Contains(p.Log.String(), "huge.yaml: file is ") &&
			strings.Contains(p.Log.String(), "more than the 8388608 bytes of the size limit; not read")
	})
	failed := cgFailures(t, p)
	busy := cgPokedBusy(t, dir, pid, 3*time.Second)
	t.Logf("50 MB file, 3 s of checks every 400 ms: %.1f%% of a core, rss %s, failures +%d", busy*100, cgRSS(t, pid), cgFailures(t, p)-failed)
	if busy > 0.10 {
		t.Errorf("rls used %.0f%% of a core over 3 s with a 50 MB file refused; want under 10%%", busy*100)
	}
	if cgFailures(t, p) <= failed {
		t.Error("the checks of the refused file are not counted as failures")
	}
	limited("with the 50 MB file refused")

	// 2. A big invalid file under the limit (~6 MB, more descriptors than a
	// file may have): parsed once, then skipped until it changes.
	if err := os.Remove(filepath.Join(dir, "huge.yaml")); err != nil {
		t.Fatal(err)
	}
	cgPlace(t, dir, "big.yaml", func(f *os.File) {
		f.WriteString("domain: big\ndescriptors:\n")
		for i := 0; i < 110_000; i++ {
			fmt.Fprintf(f, "  - key: k%d\n    rate_limit: {unit: second, requests_per_unit: 1}\n", i)
		}
	})
	testkit.WaitForEvery(t, "the big invalid file rejected", 20*time.Second, pollEvery, func() bool {
		return strings.Contains(p.Log.String(), "big.yaml: descriptors: more than 100000 descriptors")
	})
	time.Sleep(300 * time.Millisecond) // let the one parse's garbage be collected
	busy = cgPokedBusy(t, dir, pid, 3*time.Second)
	t.Logf("6 MB invalid file, 3 s of checks every 400 ms: %.1f%% of a core, rss %s", busy*100, cgRSS(t, pid))
	if busy > 0.10 {
		t.Errorf("rls used %.0f%% of a core over 3 s with an unchanged rejected file; want under 10%% (it must not be re-parsed)", busy*100)
	}
	if n := strings.Count(p.Log.String(), "more than 100000 descriptors"); n != 1 {
		t.Errorf("the rejection was logged %d times, want once", n)
	}
	limited("with the big invalid file rejected")

	// 3. Every file deleted: the last good config stays, and says why.
	for _, name := range []string{"big.yaml", "guard.yaml"} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitForEvery(t, "the empty directory refused", 10*time.Second, pollEvery, func() bool {
		return strings.Contains(p.Log.String(), "has no domain left")
	})
	if !regexp.MustCompile(`level=ERROR msg="config reload rejected; keeping the last good config" error=".*has no domain left`).MatchString(p.Log.String()) {
		t.Errorf("no ERROR line for the empty directory:\n%s", p.Log.String())
	}
	limited("with the directory emptied")
}

// TestEmptyConfigDirAtStartup: rls does not start on a directory without a
// domain unless --allow-empty-config.
func TestEmptyConfigDirAtStartup(t *testing.T) {
	light(t)
	dir := t.TempDir()
	p := startRLSNoWait(t, dir)
	if err := p.wait(t, 20*time.Second); err == nil || !strings.Contains(p.Log.String(), "--allow-empty-config") {
		t.Fatalf("rls on an empty directory: %v\n%s", err, p.Log.String())
	}
	startRLS(t, dir, "--allow-empty-config")
}
