package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
	"github.com/rls-project/rls/pkg/descriptors"
)

// TestLateTwemproxy: a twemproxy that was not reachable at start, found by
// the readiness probe while the store has never answered, stops rls with
// a message naming it; once the store has answered, a failing probe asks
// nothing more.
func TestLateTwemproxy(t *testing.T) {
	tw := redistest.StartTwemproxy(t, redistest.StartServer(t))
	for _, c := range []struct {
		name     string
		answered bool
		want     bool
	}{{"never answered", false, true}, {"answered before", true, false}} {
		t.Run(c.name, func(t *testing.T) {
			a := &app{cfg: &Config{Store: "redis", RedisURL: tw.URL(), RedisTimeout: time.Second},
				log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			errc := make(chan error, 1)
			stop := func(err error) {
				select {
				case errc <- err:
				default:
				}
			}
			fail := errors.New("redis ping: EOF")
			answered := c.answered
			ready := a.lateTwemproxy(func(context.Context) error {
				if answered {
					answered = false
					return nil
				}
				return fail
			}, nil, stop)
			for range 2 {
				if err := ready(t.Context()); err != nil && !errors.Is(err, fail) {
					t.Fatal(err)
				}
			}
			select {
			case err := <-errc:
				if !c.want || !strings.Contains(err.Error(), "twemproxy at "+tw.URL()) {
					t.Errorf("stopped with %v; want %v", err, c.want)
				}
			default:
				if c.want {
					t.Error("not stopped")
				}
			}
		})
	}
}

// TestCheckTwemproxy: behind twemproxy a config with a rule that needs
// scripts is refused in one line naming the first such rule and how many
// more; fixed windows of one unit and unlimited rules pass.
func TestCheckTwemproxy(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"t.yaml": []byte(`
domain: d
descriptors:
  - key: ok
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: free
    rate_limit: {unlimited: true}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 5}
`)})
	if err != nil {
		t.Fatal(err)
	}
	a := &app{cfg: &Config{RedisURL: "redis://127.0.0.1:22121"}, twemproxy: true}
	err = a.checkTwemproxy(cfg)
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("error %v, want one line", err)
	}
	for _, want := range []string{"twemproxy at redis://127.0.0.1:22121", "t.yaml:9", `domain "d"`, "tb", "a token_bucket", "and 1 more"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	a.twemproxy = false
	if err := a.checkTwemproxy(cfg); err != nil {
		t.Errorf("without twemproxy: %v", err)
	}
}
