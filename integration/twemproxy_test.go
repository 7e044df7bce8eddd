package integration

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/integration/redistest"
)

// twemproxyConfig is a fixed window of 5 an hour (the default algorithm
// as ratelimit), so no window boundary falls within the test.
const twemproxyConfig = `
domain: tw
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
`

// TestTwemproxyTwoReplicasExact: two replicas run as ratelimit with
// upstream's default socket setup (REDIS_SOCKET_TYPE=unix, REDIS_URL a
// nutcracker socket), Debian's nutcracker in front of two Redis servers,
// admit exactly the limit of a fixed window from 40 requests spread over
// both, and nutcracker refuses none of their commands.
func TestTwemproxyTwoReplicasExact(t *testing.T) {
	light(t) // processes of its own; asserts counts and memory, not time
	tw := redistest.StartTwemproxy(t, redistest.StartServer(t), redistest.StartServer(t))
	env := map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": tw.Socket, "USE_STATSD": "false", "LOG_LEVEL": "info"}
	var reps []*rlsProc
	for range 2 {
		p := startRatelimit(t, env, map[string]string{"tw.yaml": twemproxyConfig}, nil)
		p.waitServing(t, 20*time.Second)
		reps = append(reps, p)
	}
	var ok atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			c := reps[g%2].client()
			for range 5 {
				if should(t, c, "tw", desc("k", "shared")).OverallCode == rlsv3.RateLimitResponse_OK {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := ok.Load(); n != 5 {
		t.Errorf("two replicas behind nutcracker admitted %d of 40, want exactly the limit, 5", n)
	}
	if u := twRefused(tw); len(u) > 0 {
		t.Errorf("nutcracker refused %v", u)
	}
	for i, p := range reps {
		if !strings.Contains(p.Log.String(), "twemproxy detected") {
			t.Errorf("replica %d did not say it found twemproxy:\n%s", i, p.Log.String())
		}
	}
}

// TestTwemproxyRefusesScriptRules: behind nutcracker a rule rls cannot
// count with plain commands (a sliding window, rls's default when run as
// rls) stops the start with one line naming twemproxy and the rule.
func TestTwemproxyRefusesScriptRules(t *testing.T) {
	light(t)
	tw := redistest.StartTwemproxy(t, redistest.StartServer(t))
	dir := writeConfig(t, map[string]string{"tw.yaml": twemproxyConfig})
	p := startRLSNoWait(t, dir, "--store", "redis", "--redis-url", tw.URL())
	if err := p.wait(t, 20*time.Second); err == nil {
		t.Fatalf("rls started behind nutcracker with a sliding window:\n%s", p.Log.String())
	}
	var line string
	for _, l := range strings.Split(p.Log.String(), "\n") {
		if strings.HasPrefix(l, "rls: ") {
			line = l
		}
	}
	for _, want := range []string{"twemproxy at " + tw.URL(), "tw.yaml:5", `domain "tw"`, "sliding_window", "fixed_window"} {
		if !strings.Contains(line, want) {
			t.Errorf("refusal %q lacks %q", line, want)
		}
	}
	if u := twRefused(tw); len(u) > 0 {
		t.Errorf("nutcracker refused %v: rls spoke to it as to Redis", u)
	}
}

// twRefused is what nutcracker refused besides the TIME of each start's
// detection (upstream.Detect).
func twRefused(tw *redistest.Twemproxy) []string {
	var out []string
	for _, c := range tw.Unsupported() {
		if c != "TIME" {
			out = append(out, c)
		}
	}
	return out
}
