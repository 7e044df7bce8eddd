package redistest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestServerLifecycle(t *testing.T) {
	s := StartServer(t)
	ctx := context.Background()
	c := s.Client()
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := s.CommandStats(ctx)["set"]; got != 1 {
		t.Errorf("commandstats set = %d, want 1", got)
	}

	s.Pause()
	pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := c.Ping(pctx).Err()
	cancel()
	if err == nil {
		t.Error("PING answered while paused")
	}
	s.Resume()
	c1 := s.Client()
	defer c1.Close()
	if err := c1.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after resume: %v", err)
	}

	oldPID := s.PID
	s.Restart(t)
	if s.PID == oldPID {
		t.Error("Restart kept the PID")
	}
	c2 := s.Client()
	defer c2.Close()
	if n, err := c2.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("after restart EXISTS k = %d, %v; want 0 (fresh server)", n, err)
	}

	s.Stop()
	if err := ping(s.Addr); err == nil {
		t.Error("PING answered after Stop")
	}
	s.Stop() // idempotent
}

func TestParseCommandStats(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_evalsha:calls=3,usec=120,usec_per_call=40.00,rejected_calls=0,failed_calls=1\r\n" +
		"cmdstat_EVAL:calls=1,usec=10\r\ncmdstat_broken\r\n"
	got := parseCommandStats(info, "calls")
	if got["evalsha"] != 3 || got["eval"] != 1 || len(got) != 2 {
		t.Errorf("parseCommandStats calls = %v", got)
	}
	if got := parseCommandStats(info, "usec"); got["evalsha"] != 120 || got["eval"] != 10 || len(got) != 2 {
		t.Errorf("parseCommandStats usec = %v", got)
	}
}

func TestCluster(t *testing.T) {
	c := StartCluster(t, 3, 0)
	ctx := context.Background()
	if !strings.HasPrefix(c.Seeds(), "redis://"+c.Nodes[0].Addr+"?addr="+c.Nodes[1].Addr+"&addr=") {
		t.Errorf("Seeds() = %q", c.Seeds())
	}
	cc := c.Client()
	defer cc.Close()
	masters := map[*Server]bool{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		if err := cc.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		m := c.MasterOf(k)
		if m == nil {
			t.Fatalf("MasterOf(%q) = nil", k)
		}
		masters[m] = true
		// The key must live on the node MasterOf names.
		mc := m.Client()
		n, err := mc.Exists(ctx, k).Result()
		mc.Close()
		if err != nil || n != 1 {
			t.Errorf("key %q not on MasterOf node %s: %d, %v", k, m.Addr, n, err)
		}
	}
	if len(masters) < 2 {
		t.Errorf("8 keys landed on %d masters", len(masters))
	}
}

// fatalRecorder records the message of the first Fatal call and ends the
// goroutine, like testing.T does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestMissingBinaryFails(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for name, start := range map[string]func(testing.TB){
		"server":  func(tb testing.TB) { StartServer(tb) },
		"cluster": func(tb testing.TB) { StartCluster(tb, 3, 0) },
	} {
		rec := &fatalRecorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			start(rec)
		}()
		<-done
		if rec.msg != missing {
			t.Errorf("%s: Fatal(%q), want %q", name, rec.msg, missing)
		}
	}
}
