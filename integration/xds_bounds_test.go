package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/testkit"
	"github.com/rls-project/rls/pkg/xds/xdstest"
)

// The xDS bounds tests: hostile and broken control planes against the
// production build of rls (rlsFastBin: the memory it takes is what a pod
// would take), each with an xDS server of its own.

// Bounds of the tests, generous against what they measure on a 2-core
// machine (see docs/bench/HISTORY.md): a breach means the config was built
// before it was refused, not a busy machine.
const (
	deepPeakLimit      = 100 << 20 // VmHWM with a 9,000-deep resource NACKed
	widePeakLimit      = 200 << 20 // VmHWM with 180,000 descriptors NACKed
	wideValidRatio     = 3.0       // VmHWM of 90,000 rules over xDS, over the same as a file
	scrapeLimit        = 2 * time.Second
	steadyDeadline     = time.Second // a steady client's deadline per call
	hungConnectedLimit = 30 * time.Second
)

// vmHWM returns the peak resident memory of process pid, in bytes.
func vmHWM(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/<pid>/status")
	return 0
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// steady calls rls at rate per second, each call with steadyDeadline, until
// stop is called, which returns how many calls were made, failed, and
// outlived their deadline, and the slowest call.
func steady(t *testing.T, p *rlsProc, rate int) (stop func() (calls, failed, late int64, slowest time.Duration)) {
	t.Helper()
	var calls, failed, late atomic.Int64
	var slowest atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				calls.Add(1)
				ctx, cancel := context.WithTimeout(context.Background(), steadyDeadline)
				defer cancel()
				start := time.Now()
				r, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "xds",
					Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "steady")}})
				el := time.Since(start)
				for {
					s := slowest.Load()
					if int64(el) <= s || slowest.CompareAndSwap(s, int64(el)) {
						break
					}
				}
				switch {
				case status.Code(err) == codes.DeadlineExceeded:
					late.Add(1)
				case err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK:
					failed.Add(1)
				}
			}()
		}
	}()
	return func() (int64, int64, int64, time.Duration) {
		close(done)
		wg.Wait()
		return calls.Load(), failed.Load(), late.Load(), time.Duration(slowest.Load())
	}
}

// deepResource nests n descriptors, one per level.
func deepResource(n int) *rlsconf.RateLimitConfig {
	c := &rlsconf.RateLimitConfig{Name: "deep", Domain: "deep"}
	level := &c.Descriptors
	for range n {
		d := &rlsconf.RateLimitDescriptor{Key: "k"}
		*level = append(*level, d)
		level = &d.Descriptors
	}
	return c
}

// wideRule is the value of wide rule i.
func wideRule(i int) string { return strconv.FormatInt(int64(i), 36) }

// wideResource has n descriptors t=<i> side by side, 10 a minute each.
func wideResource(n int) *rlsconf.RateLimitConfig {
	c := &rlsconf.RateLimitConfig{Name: "wide", Domain: "wide", Descriptors: make([]*rlsconf.RateLimitDescriptor, n)}
	for i := range n {
		c.Descriptors[i] = &rlsconf.RateLimitDescriptor{Key: "t", Value: wideRule(i),
			RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 10}}
	}
	return c
}

// wideYAML is wideResource(n) as a descriptor file.
func wideYAML(n int) string {
	var b strings.Builder
	b.WriteString("domain: wide\ndescriptors:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {key: t, value: %q, rate_limit: {unit: minute, requests_per_unit: 10}}\n", wideRule(i))
	}
	return b.String()
}

// startXDSRLS starts the production build against cp, gives it version 1
// (a tenant limit of a million a minute, for the steady client) plus
// extra, and waits until it serves.
func startXDSRLS(t *testing.T, cp *xdstest.Server, extra ...*rlsconf.RateLimitConfig) *rlsProc {
	t.Helper()
	p := startRLSBin(t, rlsFastBin, t.TempDir(), "--config-source", "xds", "--xds-server", cp.Addr, "--xds-node-id", "test")
	cp.Set(t, "test", "1", append([]*rlsconf.RateLimitConfig{tenantLimit(1_000_000)}, extra...)...)
	if _, ack := cp.AnswerTo(t, "1", 60*time.Second); ack.GetErrorDetail() != nil {
		t.Fatalf("version 1 NACKed: %s", ack.GetErrorDetail().GetMessage())
	}
	p.waitServing(t, 20*time.Second)
	return p
}

// refused sets version 2 (the tenant limit and bad) while a steady client
// calls rls at 200/s, and checks that it is NACKed naming limit, with peak
// memory under peakLimit and no call failed or late.
func refused(t *testing.T, bad *rlsconf.RateLimitConfig, limit string, peakLimit int64) {
	cp := xdstest.Start(t, "127.0.0.1:0")
	p := startXDSRLS(t, cp)
	pid := p.cmd.Process.Pid
	before := vmHWM(t, pid)
	stop := steady(t, p, 200)
	start := time.Now()
	cp.Set(t, "test", "2", tenantLimit(1_000_000), bad)
	_, nack := cp.AnswerTo(t, "2", 30*time.Second)
	took := time.Since(start)
	// The control plane sends it again at once: rls NACKs the repetitions
	// after 1 s, 2 s, ... without building them.
	time.Sleep(3 * time.Second) // the repetitions' backoff: real time on purpose
	calls, failed, late, slowest := stop()
	peak := vmHWM(t, pid)
	t.Logf("a resource of %d bytes NACKed in %v: VmHWM %s before, %s after; %d steady calls, %d failed, %d over their %v deadline, slowest %v",
		proto.Size(bad), took.Round(time.Millisecond), mib(before), mib(peak), calls, failed, late, steadyDeadline, slowest.Round(time.Millisecond))
	if d := nack.GetErrorDetail().GetMessage(); nack.GetVersionInfo() != "1" || !strings.Contains(d, "over the xDS "+limit+" limit") {
		t.Errorf("answer to version 2: version %q, error %q; want a NACK naming the %s limit", nack.GetVersionInfo(), d, limit)
	}
	if peak > peakLimit {
		t.Errorf("peak RSS %s, over the bound of %s", mib(peak), mib(peakLimit))
	}
	if failed > 0 || late > 0 {
		t.Errorf("steady client: %d calls, %d failed, %d late; want every call answered OK in time", calls, failed, late)
	}
	// Its 200/s over the 3 s and more above is 600 calls; this process, on
	// a machine as busy as CI's, may send fewer (382 beside a global test),
	// but a second's worth is the least that says rls kept answering.
	if calls < 200 {
		t.Errorf("steady client: %d calls, want at least a second's worth (200) beside the NACK", calls)
	}
	if got := should(t, p.client(), "xds", desc("tenant", "after")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("the config in force after the NACK: %v", got)
	}
	if m := series(scrape(t, p)); m[`rls_config_reloads_total{result="failure"}`] < 1 || m["rls_config_last_reload_successful"] != 0 {
		t.Errorf("the NACK is not counted: failures %v", m[`rls_config_reloads_total{result="failure"}`])
	}
}

// TestXDSDeepNesting: a 60 KB resource nesting 9,000 deep is refused
// before it is built.
func TestXDSDeepNesting(t *testing.T) {
	light(t)
	refused(t, deepResource(9000), "depth", deepPeakLimit)
}

// TestXDSWideRefused: 180,000 descriptors in one response under the
// receive cap are refused before any is built.
func TestXDSWideRefused(t *testing.T) {
	light(t)
	refused(t, wideResource(180_000), "descriptors", widePeakLimit)
}

// TestXDSWideValid: 90,000 rules over xDS cost less than 3x what the same
// rules as a file do, and /metrics with a series for each scrapes in under
// 2 s.
func TestXDSWideValid(t *testing.T) {
	light(t)
	const n = 90_000
	file := startRLSFast(t, writeConfig(t, map[string]string{"wide.yaml": wideYAML(n)}))
	fileHWM := vmHWM(t, file.cmd.Process.Pid)
	file.stop(t)

	cp := xdstest.Start(t, "127.0.0.1:0")
	p := startXDSRLS(t, cp, wideResource(n))
	xdsHWM := vmHWM(t, p.cmd.Process.Pid)

	// A decision of every rule: 64 descriptors a call, 8 at a time.
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for first := w * 64; first < n; first += 8 * 64 {
				req := &rlsv3.RateLimitRequest{Domain: "wide"}
				for i := first; i < min(first+64, n); i++ {
					req.Descriptors = append(req.Descriptors, desc("t", wideRule(i)))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if r, err := p.client().ShouldRateLimit(ctx, req); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					failed.Add(1)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	start := time.Now()
	text := scrapeAddr(t, p.HTTPAddr)
	took := time.Since(start)
	rules := strings.Count(text, "\nrls_decisions_total{domain=\"wide\"")
	t.Logf("%d rules: VmHWM %s as a file, %s over xDS (%.2fx); /metrics with %d rule series, %d KB, in %v",
		n, mib(fileHWM), mib(xdsHWM), float64(xdsHWM)/float64(fileHWM), rules, len(text)>>10, took.Round(time.Millisecond))
	if failed.Load() > 0 {
		t.Errorf("%d calls failed", failed.Load())
	}
	if float64(xdsHWM) > wideValidRatio*float64(fileHWM) {
		t.Errorf("over xDS %s, as a file %s: more than %.0fx", mib(xdsHWM), mib(fileHWM), wideValidRatio)
	}
	if rules != n || took > scrapeLimit {
		t.Errorf("/metrics: %d rule series (want %d) in %v (want under %v)", rules, n, took, scrapeLimit)
	}
}

// TestXDSRenameChurn: 2,000 versions in a row, each renaming the rule and
// each deciding once, leave the series of the last one only.
func TestXDSRenameChurn(t *testing.T) {
	light(t)
	cp := xdstest.Start(t, "127.0.0.1:0")
	p := startXDSRLS(t, cp)
	start := time.Now()
	const versions = 2000
	for v := 2; v <= versions+1; v++ {
		version := strconv.Itoa(v)
		cp.Set(t, "test", version, xdstest.Limit("xds", "xds", "tenant", 1_000_000, rlsconf.RateLimitUnit_MINUTE),
			&rlsconf.RateLimitConfig{Name: "churn", Domain: "churn", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k",
				RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 1_000_000, Name: "r" + version}}}})
		if _, ack := cp.AnswerTo(t, version, 30*time.Second); ack.GetErrorDetail() != nil {
			t.Fatalf("version %s NACKed: %s", version, ack.GetErrorDetail().GetMessage())
		}
		if got := should(t, p.client(), "churn", desc("k", "x")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("version %s: %v", version, got)
		}
	}
	var got []string
	for name := range series(scrape(t, p)) {
		if strings.HasPrefix(name, "rls_decisions_total{") || strings.HasPrefix(name, "rls_detailed_decisions_total{") {
			got = append(got, name)
		}
	}
	want := fmt.Sprintf(`rls_decisions_total{domain="churn",outcome="ok",rule="r%d"}`, versions+1)
	t.Logf("%d renames in %v: decision series %v, VmHWM %s", versions, time.Since(start).Round(time.Millisecond), got, mib(vmHWM(t, p.cmd.Process.Pid)))
	if len(got) != 1 || got[0] != want {
		t.Errorf("decision series after %d renames: %v, want only %s", versions, got, want)
	}
}

// TestXDSHungControlPlane: a control plane stopped with SIGSTOP keeps its
// TCP connection open; rls notices by keepalive (rls_xds_connected 0
// within 30 s), keeps serving its config, and reconnects once the control
// plane is continued.
func TestXDSHungControlPlane(t *testing.T) {
	light(t)
	dir := t.TempDir()
	resources := filepath.Join(dir, "resources.yaml")
	write := func(rpu int) {
		t.Helper()
		body := fmt.Sprintf("- name: xds\n  domain: xds\n  descriptors:\n    - key: tenant\n      rate_limit: {unit: MINUTE, requests_per_unit: %d}\n", rpu)
		if err := os.WriteFile(resources+".tmp", []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(resources+".tmp", resources); err != nil {
			t.Fatal(err)
		}
	}
	write(3)
	cpAddr := freeAddr(t)
	cp, cpLog := exampleControlPlane(t, "--addr", cpAddr, "--node-id", "test", "--config", resources, "--poll", "100ms")
	p := startRLSNoWait(t, t.TempDir(), "--config-source", "xds", "--xds-server", cpAddr, "--xds-node-id", "test")
	p.waitServing(t, 30*time.Second)
	connected := func() float64 { return series(scrape(t, p))["rls_xds_connected"] }
	testkit.WaitFor(t, "rls_xds_connected 1", 10*time.Second, func() bool { return connected() == 1 })
	xdsAllows(t, p, "a", 3)

	if err := cp.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	testkit.WaitFor(t, "rls_xds_connected 0 with the control plane stopped", hungConnectedLimit, func() bool { return connected() == 0 })
	noticed := time.Since(stopped)
	xdsAllows(t, p, "b", 3) // the config in force stays
	// Still stopped: new connections reach its listen queue and no
	// further; rls must not call that connected.
	time.Sleep(5 * time.Second) // it stays stopped: real time on purpose
	if c := connected(); c != 0 {
		t.Errorf("rls_xds_connected %v while the control plane is still stopped", c)
	}

	if err := cp.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	continued := time.Now()
	testkit.WaitFor(t, "rls_xds_connected 1 once the control plane is continued", 60*time.Second, func() bool { return connected() == 1 })
	back := time.Since(continued)
	write(5)
	testkit.WaitFor(t, "version 2 applied after the reconnection", 20*time.Second, func() bool {
		return strings.Contains(cpLog.String(), `ACK from test: version "2"`)
	})
	xdsAllows(t, p, "c", 5)
	t.Logf("connected 0 %v after SIGSTOP; 1 again %v after SIGCONT", noticed.Round(time.Millisecond), back.Round(time.Millisecond))
}

// exampleControlPlane builds and starts examples/xds-control-plane with
// args, waits until it serves, and stops it (continuing it first, should
// the test have stopped it) when the test ends.
func exampleControlPlane(t *testing.T, args ...string) (*exec.Cmd, *testkit.Buffer) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "xds-control-plane")
	if out, err := exec.Command("go", "build", "-o", bin, "../examples/xds-control-plane").CombinedOutput(); err != nil {
		t.Fatalf("build the example: %v\n%s", err, out)
	}
	log := &testkit.Buffer{}
	cp := exec.Command(bin, args...)
	cp.Stdout, cp.Stderr = log, log
	cp.SysProcAttr = redistest.ChildAttr()
	if err := cp.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cp.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cp.Process.Signal(syscall.SIGCONT)
		_ = cp.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("the example control plane did not exit; killing pid %d", cp.Process.Pid)
			_ = cp.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("control plane log:\n%s", log.String())
		}
	})
	testkit.WaitFor(t, "the example control plane serving", 10*time.Second, func() bool { return strings.Contains(log.String(), "serving RateLimitConfig") })
	return cp, log
}
