package integration

import (
	"bytes"
	"errors"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
)

// TestSimulateStopsOnSignal: rls simulate, on SIGINT or SIGTERM in the
// middle of a long trace, exits within seconds (status 1, saying it
// stopped) and writes the reports of the traces it finished.
func TestSimulateStopsOnSignal(t *testing.T) {
	light(t)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			// A short trace, then one of about 3 million requests: tens of
			// seconds of replays.
			cmd := exec.Command(rlsFastBin, "simulate", "--limit", "100", "--gen", "poisson:duration=2s",
				"--gen", "poisson:rate=30000,duration=100s")
			cmd.SysProcAttr = redistest.ChildAttr()
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			time.Sleep(3 * time.Second) // generating both traces, then into the replays
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			sent := time.Now()
			var err error
			select {
			case err = <-done:
			case <-time.After(15 * time.Second):
				cmd.Process.Kill()
				<-done
				t.Fatalf("rls simulate still running 15 s after %v", sig)
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("exit %v, want status 1; stderr:\n%s", err, stderr.String())
			}
			m := regexp.MustCompile(`rls: stopped \(context canceled\) during (\S+): the reports of (\d) of 2 traces are written`).FindStringSubmatch(stderr.String())
			if m == nil {
				t.Fatalf("stderr %q: want the stop and how many reports were written", stderr.String())
			}
			n, _ := strconv.Atoi(m[2])
			hasFirst := strings.Contains(stdout.String(), "poisson:duration=2s (seed 1): ")
			t.Logf("%v: stopped %v after the signal, during %s, %d of 2 reports written", sig, time.Since(sent).Round(time.Millisecond), m[1], n)
			if (n == 1) != hasFirst || strings.Contains(stdout.String(), "rate=30000") {
				t.Errorf("stdout says the first report written %v, stderr says %d: want them to agree, and no report of the trace stopped:\n%s", hasFirst, n, stdout.String())
			}
		})
	}
}
