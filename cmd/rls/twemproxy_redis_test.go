//go:build redis

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
