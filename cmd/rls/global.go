package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/global"
	"github.com/rls-project/rls/pkg/redisclient"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store/redisstore"
)

// GlobalConfig is the flags of limits across regions (scope: global rules,
// pkg/global, docs/global.md). The exchange's settings are query
// parameters of --global-redis-url, as go-redis's options are of
// --redis-url: interval, lease, floor, max_keys and mode (parseURL).
type GlobalConfig struct {
	Region   string // --region: this replica's region; "" without global rules
	RedisURL string // --global-redis-url: where regions exchange shares, as given

	ClientURL string        // RedisURL without rls's own parameters
	Mode      string        // mode: single, cluster or sentinel, as --store's redis-MODE [single]
	Interval  time.Duration // interval: demand published, shares renewed [1s]
	Lease     time.Duration // lease: how far ahead a region's shares reach [1s]
	Floor     float64       // floor: each active region's standing share, a fraction of the limit [0.1]
	MaxKeys   int           // max_keys: most keys exchanged per interval [10000]
}

// on reports whether scope: global rules are allowed: a region and a global store are named.
func (g *GlobalConfig) on() bool { return g.Region != "" && g.RedisURL != "" }

// globalFlags declares --region and --global-redis-url.
func globalFlags(fs *flag.FlagSet, g *GlobalConfig) {
	fs.StringVar(&g.Region, "region", "", "this replica's region, for scope: global rules")
	fs.StringVar(&g.RedisURL, "global-redis-url", "", "Redis where regions exchange shares; never on a request's path")
}

// globalHelp is the help topic of globalFlags.
var globalHelp = helpGroup{"Global limits across regions", []string{"region", "global-redis-url"}, nil}

var regionName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// validateGlobal checks the global flags: a region and a global store go
// together, on a Redis store (a region's replicas share its counters), and
// the URL's own parameters are valid.
func (c *Config) validateGlobal() error {
	g := &c.Global
	switch {
	case g.Region != "" && g.RedisURL == "":
		return fmt.Errorf("%s needs %s: where regions exchange shares", flagRef("region"), flagRef("global-redis-url"))
	case g.Region == "" && g.RedisURL != "":
		return fmt.Errorf("%s needs %s: the region this replica decides for", flagRef("global-redis-url"), flagRef("region"))
	case !g.on():
		return nil
	case !regionName.MatchString(g.Region):
		return fmt.Errorf("%s %q: 1 to 64 letters, digits, '_', '.' or '-'", flagRef("region"), g.Region)
	case c.storeKind() == "memory":
		return fmt.Errorf("%s needs a Redis %s: the replicas of a region decide against one count", flagRef("region"), flagRef("store"))
	}
	return g.parseURL()
}

// parseURL takes rls's parameters out of RedisURL into g, leaving
// ClientURL for the Redis client.
func (g *GlobalConfig) parseURL() error {
	g.Interval, g.Lease, g.Floor, g.MaxKeys, g.Mode = time.Second, time.Second, 0.1, 10000, redisclient.ModeSingle
	u, err := url.Parse(g.RedisURL)
	if err != nil {
		return fmt.Errorf("%s: %w", flagRef("global-redis-url"), err)
	}
	q := u.Query()
	bad := func(name, want string) error {
		return fmt.Errorf("%s: %s=%q: want %s", flagRef("global-redis-url"), name, q.Get(name), want)
	}
	params := g.urlParams()
	var errs []error
	for _, p := range params {
		if v := q.Get(p.name); v != "" && !p.parse(v) {
			errs = append(errs, bad(p.name, p.want))
		}
		q.Del(p.name)
	}
	if g.Lease < g.Interval {
		errs = append(errs, fmt.Errorf("%s: lease %v: want at least the interval (%v)", flagRef("global-redis-url"), g.Lease, g.Interval))
	}
	u.RawQuery = q.Encode()
	g.ClientURL = u.String()
	if _, err := redisclient.New(redisclient.Options{URL: g.ClientURL, Mode: g.Mode}); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", flagRef("global-redis-url"), err))
	}
	return errors.Join(errs...)
}

// urlParam is one of rls's parameters in --global-redis-url: parse sets
// it in the config and reports whether v is what want says.
type urlParam struct {
	name, want string
	parse      func(v string) bool
}

func (g *GlobalConfig) urlParams() []urlParam {
	return []urlParam{
		{"interval", "a duration from 100ms to 1m", func(v string) bool {
			d, err := time.ParseDuration(v)
			g.Interval = d
			return err == nil && d >= 100*time.Millisecond && d <= time.Minute
		}},
		{"lease", "a duration up to 1h", func(v string) bool {
			d, err := time.ParseDuration(v)
			g.Lease = d
			return err == nil && d <= time.Hour
		}},
		{"floor", "a fraction from 0 to 0.5", func(v string) bool {
			f, err := strconv.ParseFloat(v, 64)
			g.Floor = f
			return err == nil && f >= 0 && f <= 0.5
		}},
		{"max_keys", "at least 1", func(v string) bool {
			n, err := strconv.Atoi(v)
			g.MaxKeys = n
			return err == nil && n >= 1
		}},
		{"mode", "single, cluster or sentinel", func(v string) bool {
			ok := v == redisclient.ModeSingle || v == redisclient.ModeCluster || v == redisclient.ModeSentinel
			if ok {
				g.Mode = v
			}
			return ok
		}},
	}
}

// globalShares is a replica's part in global limits: its region's shares
// (pkg/global's Table) and the client of the global store, which only the
// background exchange uses.
type globalShares struct {
	table  *global.Table
	client redis.UniversalClient
}

// buildGlobal makes the share table when --region is set and returns it
// as the service's Shares; nil (no global rules) otherwise.
func (a *app) buildGlobal() service.Shares {
	g := &a.cfg.Global
	if !g.on() {
		return nil
	}
	client, err := redisclient.New(redisclient.Options{URL: g.ClientURL, Mode: g.Mode, Timeout: g.Interval})
	if err != nil { // validateGlobal parsed the URL: this is a bug
		a.log.Error("global store: cannot make its client; scope: global rules admit nothing", "err", err)
		return nil
	}
	host, _ := os.Hostname()
	replica := fmt.Sprintf("%s-%d-%d", host, os.Getpid(), time.Now().UnixNano()%1_000_000)
	s := global.Settings{Region: g.Region, Replica: replica, Interval: g.Interval, Lease: g.Lease, Floor: g.Floor, MaxKeys: g.MaxKeys}
	if rs, ok := a.rawStore.(*redisstore.Store); ok {
		s.RegionClock = rs.CountSpan // the region's Redis's clock, as measured
	}
	a.global = &globalShares{client: client, table: global.NewTable(client, s, a.log.With("component", "global"))}
	a.global.table.Register(a.reg)
	a.log.Info("global limits on: this region's shares are exchanged in the background", "region", g.Region,
		"global_store", redisclient.RedactURL(g.ClientURL), "mode", g.Mode, "interval", g.Interval, "lease", g.Lease, "floor", g.Floor)
	return a.global.table
}

// run exchanges until ctx ends, then closes the global store's client.
// A nil globalShares (no --region) returns at once.
func (gs *globalShares) run(ctx context.Context) {
	if gs == nil {
		return
	}
	gs.table.Run(ctx)
	_ = gs.client.Close()
}
