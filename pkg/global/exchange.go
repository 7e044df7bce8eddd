// Package global holds one limit across regions (rules of scope: global,
// docs/global.md): each region decides a global rule's requests on its own
// Redis against its share of the limit, and the shares are exchanged in
// the background through a global store that no request waits on.
//
// exchange.lua is the one writer of the global store; Exchange calls it
// for many keys in one pipeline; Table is a replica's view of its region's
// shares, which the service reads for each request (Table.Share) and the
// exchange loop (Table.Run) renews.
package global

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed exchange.lua
var exchangeSource string

var exchangeScript = redis.NewScript(exchangeSource)

// Settings are a replica's exchange settings.
type Settings struct {
	Region   string        // this replica's region
	Replica  string        // this replica's name, unique in its region
	Interval time.Duration // demand published and shares renewed [1s]
	Lease    time.Duration // how far ahead a region's shares reach [the interval]
	Floor    float64       // each active region's standing share, a fraction of the limit
	MaxKeys  int           // most keys exchanged per interval [10000]
	// Margin is the clock error allowed between the region's Redis and the
	// global store's TIME, used while RegionClock cannot say [DefaultMargin].
	Margin time.Duration
	// RegionClock says when the region's Redis (the node of key) may
	// count a hit sent now in a call answered by deadline (zero: the
	// store's own bound), in its Unix time, as measured; ok false while it
	// cannot (nil: never). Share then takes the least share of the windows
	// in that span, else of those within Margin of the global clock.
	RegionClock func(key string, deadline time.Time) (from, to time.Time, ok bool)
}

// DefaultMargin is Settings.Margin's default.
const DefaultMargin = 20 * time.Millisecond

func (s *Settings) defaults() {
	if s.Interval <= 0 {
		s.Interval = time.Second
	}
	if s.Lease < s.Interval {
		s.Lease = s.Interval
	}
	if s.MaxKeys <= 0 {
		s.MaxKeys = 10000
	}
	if s.Margin <= 0 {
		s.Margin = DefaultMargin
	}
}

// Ask is one key's exchange: the rule's limit and window, and this
// replica's demand (admitted and denied hits) per window.
type Ask struct {
	Key     string // the counter's key in the region's store
	Limit   uint64
	Window  time.Duration
	Sliding bool
	Demand  uint64
	Shift   bool  // Demand is the rate since the interval's boundary: a shift (demandRate)
	Now     int64 // test clock in µs; 0: the global store's TIME
}

// Grant is the global store's answer to an Ask: this region's shares of
// the windows from Current to LeaseEnd, and its floor.
type Grant struct {
	Now       int64 // the global store's clock when it answered, µs
	Current   int64 // the window Now is in (Now / window)
	Floor     uint64
	FloorFrom int64 // the first window the floor holds in
	LeaseEnd  int64
	Shares    []uint64 // Shares[i] is window Current+i's
}

// MetaKey is the global store's key of a key's state: its windows' hashes
// are MetaKey|v. It wraps the counter's key in braces, so that on a Redis
// Cluster every key of one counter has one hash tag (the text from the
// first '{' to the next '}', all within "g:{" and the counter's key), and
// names the limit and window: a changed rule starts anew.
func MetaKey(key string, limit uint64, window time.Duration) string {
	return "g:{" + key + "}|" + strconv.FormatUint(limit, 10) + "|" + strconv.FormatInt(int64(window/time.Second), 10)
}

// Exchange runs the grant of every ask in one pipeline (loading the
// script once when the store lacks it) and returns a grant or an error
// for each. A key's grant reads the demand every replica published this
// round (Publish), and publishes a's when it has not.
func Exchange(ctx context.Context, c redis.UniversalClient, s Settings, asks []Ask) ([]Grant, []error) {
	grants := make([]Grant, len(asks))
	errs := run(ctx, c, s, asks, "g", func(i int, cmd *redis.Cmd) (err error) {
		grants[i], err = parseGrant(cmd)
		return err
	})
	return grants, errs
}

// Publish publishes each ask's demand for this round in one pipeline: a
// round's grants (Exchange), a quarter interval later, read every
// replica's alike.
func Publish(ctx context.Context, c redis.UniversalClient, s Settings, asks []Ask) []error {
	return run(ctx, c, s, asks, "p", func(_ int, cmd *redis.Cmd) error { return cmd.Err() })
}

// run calls the script for every ask in one pipeline, in mode ("p":
// publish, "g": grant), loading the script once when the store lacks it,
// and returns read's error for each ask.
func run(ctx context.Context, c redis.UniversalClient, s Settings, asks []Ask, mode string, read func(int, *redis.Cmd) error) []error {
	s.defaults()
	errs := make([]error, len(asks))
	for attempt := 0; attempt < 2; attempt++ {
		cmds := make([]*redis.Cmd, len(asks))
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range asks {
				a := &asks[i]
				cmds[i] = exchangeScript.EvalSha(ctx, p, []string{MetaKey(a.Key, a.Limit, a.Window)}, s.args(a, mode)...)
			}
			return nil
		})
		noScript := false
		for i, cmd := range cmds {
			errs[i] = read(i, cmd)
			noScript = noScript || (errs[i] != nil && strings.HasPrefix(errs[i].Error(), "NOSCRIPT"))
		}
		if !noScript {
			break
		}
		if err := exchangeScript.Load(ctx, c).Err(); err != nil {
			for i := range errs {
				errs[i] = err
			}
			break
		}
	}
	return errs
}

// args returns the script's ARGV for a's call in mode.
func (s *Settings) args(a *Ask, mode string) []any {
	now, sliding, shift := "", "0", "0"
	if a.Now > 0 {
		now = strconv.FormatInt(a.Now, 10)
	}
	if a.Sliding {
		sliding = "1"
	}
	if a.Shift {
		shift = "1"
	}
	return []any{now, s.Region, s.Replica, a.Limit, a.Window.Microseconds(), s.Lease.Microseconds(), s.Interval.Microseconds(),
		uint64(s.Floor * float64(a.Limit)), a.Demand, sliding, s.Margin.Microseconds(), mode, shift}
}

// errReply marks a reply of the wrong shape.
var errReply = errors.New("global store: exchange reply of the wrong shape")

func parseGrant(cmd *redis.Cmd) (Grant, error) {
	vals, err := cmd.Int64Slice()
	if err != nil {
		return Grant{}, err
	}
	if len(vals) < 5 || vals[4] < vals[1] || int64(len(vals)-5) != vals[4]-vals[1]+1 {
		return Grant{}, fmt.Errorf("%w: %v", errReply, vals)
	}
	g := Grant{Now: vals[0], Current: vals[1], Floor: uint64(vals[2]), FloorFrom: vals[3], LeaseEnd: vals[4]}
	for _, v := range vals[5:] {
		g.Shares = append(g.Shares, uint64(max(v, 0)))
	}
	return g, nil
}
