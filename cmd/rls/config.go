package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rls-project/rls/pkg/compat"
	"github.com/rls-project/rls/pkg/connguard"
	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/telemetry"
)

// Config is everything rls reads from its flags, their RLS_* environment
// twins and the environment variables it reads besides (OpenTelemetry's,
// GOGC, GOMEMLIMIT, RLS_REDIS_PASSWORD), read once at start-up by
// parseConfig and validated before anything is started. Fields without a
// flag hold fixed values (see defaultConfig): upstream envoyproxy/ratelimit
// variables may set some of them one day; tests shorten others.
type Config struct {
	ConfigDir                     string
	AllowEmptyConfig              bool
	Store                         string // memory, redis, redis-cluster or redis-sentinel
	GRPCAddr, HTTPAddr, DebugAddr string
	AdminAddr                     string
	MaxConns                      int
	IdleTimeout, FirstCallTimeout time.Duration
	LogLevel, LogFormat           string
	ShutdownDrain                 time.Duration
	DryRun                        bool // check the flags, environment and config, then exit (dryrun.go)

	RedisURL      string
	RedisPassword string // RLS_REDIS_PASSWORD only: never on a command line
	RedisTimeout  time.Duration
	// No flag: the URL's user, master_name and pool_size say the same.
	RedisUsername, RedisMasterName string
	RedisPoolSize                  int

	OnStoreError                  string
	DefaultAlgorithm              string // of rules naming none, files and xDS; a compat mode may set it before Validate
	FleetSize, MinFleetSize       int
	OverLimitCache                bool
	Reserve, RLQS                 bool
	RLQSUnmatched                 string // allow, deny or abandon
	LocalMaxBytes, MemoryMaxBytes int64
	ResponseHeaders               bool
	AllowNegativeHits             bool

	GRPCTLSCert, GRPCTLSKey, GRPCTLSClientCA string
	RedisTLSCA, RedisTLSCert, RedisTLSKey    string

	// Configuration over xDS (--config-source xds; xds_config.go).
	ConfigSource, XDSServer, XDSNodeID string
	XDSTLSCA, XDSTLSCert, XDSTLSKey    string
	XDSNodeMetadata                    string // no flag
	XDSTLSServerName                   string // no flag: the certificate must name --xds-server's host
	XDSMaxRecvBytes                    int    // no flag

	Global GlobalConfig // --region, --global-* (global.go)

	// Tracing: on when OpenTelemetry's endpoint variables are set.
	TraceDescriptorValues bool
	OTLP                  telemetry.OTLPEnv

	// envoyproxy/ratelimit compatibility (docs/MIGRATING.md). EnvCompat
	// "upstream" reads its environment (pkg/compat); Compat holds what it read.
	ShadowMode, ResponseMetadata, MergeDomains bool
	EnvCompat, StatsdAddr, GRPCUDS, KeyPrefix  string
	DetailedMetricMax                          int
	GRPCTLSClientSAN                           string
	Compat                                     compat.Settings
	StrayUpstream                              []string // upstream's variables set outside upstream mode (compat.Stray)
	// No flag: quota_mode on the descriptors says what QuotaMode does.
	QuotaMode                                 bool
	NearLimitRatio                            float64
	HeaderLimit, HeaderRemaining, HeaderReset string

	// Fixed, without a flag. ConfigPoll below 0 disables polling.
	ShutdownTimeout, ConfigPoll, GRPCMaxConnAge time.Duration
	ConfigMaxBytes                              int64

	// The Go runtime's GOGC and GOMEMLIMIT, as read: with neither set rls
	// tunes the GC target itself (pkg/gctune).
	GOGC, GOMEMLIMIT string

	given map[string]bool // the flags (or twins) and RLS_REDIS_PASSWORD set
	// upstreamNames maps each RLS_* variable whose value came from
	// upstream's environment (upstream mode) to the upstream variables
	// the user set (compat.Sources), for upstreamError.
	upstreamNames map[string]string
}

// defaultConfig is the Config of the settings without a flag.
func defaultConfig() *Config {
	return &Config{
		XDSMaxRecvBytes: 4 << 20,
		NearLimitRatio:  0.8,
		HeaderLimit:     "RateLimit-Limit", HeaderRemaining: "RateLimit-Remaining", HeaderReset: "RateLimit-Reset",
		ShutdownTimeout: 10 * time.Second,
		ConfigPoll:      10 * time.Second,
		ConfigMaxBytes:  descriptors.DefaultMaxFileBytes,
		GRPCMaxConnAge:  30 * time.Minute,
	}
}

// envName returns the environment twin of a flag: --redis-url → RLS_REDIS_URL.
func envName(flagName string) string {
	return "RLS_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// flagRef names a flag and its environment twin for messages.
func flagRef(name string) string {
	return fmt.Sprintf("--%s (%s)", name, envName(name))
}

// redisPasswordEnv is the one RLS_* variable without a flag: a secret kept
// off the command line, where ps shows it.
const redisPasswordEnv = "RLS_REDIS_PASSWORD"

// newFlagSet declares every serve flag on c with its default. Each usage
// is one short line; docs/flags.md's table has the details.
func newFlagSet(c *Config, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("rls serve", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.ConfigDir, "config-dir", "./config", "directory of descriptor YAML files, one domain per file")
	fs.BoolVar(&c.AllowEmptyConfig, "allow-empty-config", false, "serve and reload a config without any domain (xds: before the first)")
	fs.StringVar(&c.Store, "store", "memory", "counter store: memory, redis, redis-cluster or redis-sentinel")
	fs.StringVar(&c.GRPCAddr, "grpc-addr", ":8081", "gRPC address: RateLimitService, health, reflection")
	fs.StringVar(&c.HTTPAddr, "http-addr", ":8080", "HTTP address: /healthcheck, /metrics; empty disables it")
	fs.StringVar(&c.DebugAddr, "debug-addr", "127.0.0.1:6070", "debug address: /debug/pprof, /rlconfig; empty disables it")
	fs.StringVar(&c.AdminAddr, "admin-addr", "", "admin API address (e.g. 127.0.0.1:8082); empty (the default): off")
	fs.IntVar(&c.MaxConns, "max-conns", 1000, "most connections open at once on each port; 0 is no cap")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", 5*time.Minute, "close a connection without a call or request for this long")
	fs.DurationVar(&c.FirstCallTimeout, "first-call-timeout", connguard.DefaultFirstCall, "close a connection that makes no call or request this long after opening")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error (any case)")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	fs.DurationVar(&c.ShutdownDrain, "shutdown-drain", 0, "on SIGTERM, serve this long while health says NOT_SERVING")
	fs.BoolVar(&c.DryRun, "dry-run", false, "check the flags, environment and config as serve would, then exit")

	fs.StringVar(&c.RedisURL, "redis-url", "redis://127.0.0.1:6379", "redis:// or rediss:// URL; Cluster seeds and Sentinels as ?addr=h:p")
	fs.DurationVar(&c.RedisTimeout, "redis-timeout", time.Second, "Redis budget of a decision whose caller sent no gRPC deadline")

	fs.StringVar(&c.OnStoreError, "on-store-error", "fail_open", "rules without on_error, store down: fail_open (a share) or fail_closed")
	fs.StringVar(&c.DefaultAlgorithm, "default-algorithm", "sliding_window", "rules naming no algorithm: sliding_window, fixed_window or token_bucket")
	fs.IntVar(&c.FleetSize, "fleet-size", 0, "replicas sharing the limits, for the fail-open share; 0 learns it")
	fs.IntVar(&c.MinFleetSize, "min-fleet-size", 1, "least fleet size learned, and assumed before the first heartbeat")
	fs.BoolVar(&c.OverLimitCache, "over-limit-cache", true, "deny what the store found over its limit locally until its retry time")
	fs.BoolVar(&c.Reserve, "reserve", true, "Redis: decide keys seen often from leases of hits counted ahead in Redis")
	fs.Int64Var(&c.LocalMaxBytes, "local-max-bytes", limiter.DefaultOverLimitCacheBytes+2*limiter.DefaultBucketsBytes, "most bytes of the local tables (over-limit cache, fail-open buckets)")
	fs.Int64Var(&c.MemoryMaxBytes, "memory-max-bytes", memory.DefaultMaxBytes, "memory store: most bytes of counters; the oldest are evicted beyond it")
	fs.BoolVar(&c.ResponseHeaders, "response-headers", false, "add RateLimit-* headers, and Retry-After to OVER_LIMIT answers")
	fs.BoolVar(&c.AllowNegativeHits, "allow-negative-hits", false, "decide refunds (is_negative_hits); off: they are InvalidArgument")
	fs.BoolVar(&c.RLQS, "rlqs", true, "serve Envoy's RLQS (StreamRateLimitQuotas) on the gRPC port")
	fs.StringVar(&c.RLQSUnmatched, "rlqs-unmatched", "allow", "RLQS: a BucketId that matches no rule gets allow, deny or abandon")

	fs.StringVar(&c.GRPCTLSCert, "grpc-tls-cert", "", "PEM certificate (chain) for TLS on the gRPC port, with --grpc-tls-key")
	fs.StringVar(&c.GRPCTLSKey, "grpc-tls-key", "", "PEM private key of --grpc-tls-cert")
	fs.StringVar(&c.GRPCTLSClientCA, "grpc-tls-client-ca", "", "PEM CA bundle gRPC clients' certificates must chain to (mutual TLS)")
	fs.StringVar(&c.GRPCTLSClientSAN, "grpc-tls-client-san", "", "admit only client certificates naming this DNS, IP or URI SAN")
	fs.StringVar(&c.RedisTLSCA, "redis-tls-ca", "", "PEM CA bundle to trust for rediss:// instead of the system roots")
	fs.StringVar(&c.RedisTLSCert, "redis-tls-cert", "", "PEM client certificate for Redis, with --redis-tls-key")
	fs.StringVar(&c.RedisTLSKey, "redis-tls-key", "", "PEM private key of --redis-tls-cert")

	xdsFlags(fs, c)
	globalFlags(fs, &c.Global)

	fs.BoolVar(&c.TraceDescriptorValues, "trace-descriptor-values", false, "record descriptor entries, values included (API keys...), in spans")

	fs.BoolVar(&c.ShadowMode, "shadow-mode", false, "answer OK to every request; statuses and metrics still show denials")
	fs.BoolVar(&c.ResponseMetadata, "response-metadata", false, "return the request and its descriptors' metadata as dynamic_metadata")
	fs.BoolVar(&c.MergeDomains, "merge-domains", false, "let several files of --config-dir define one domain")
	fs.StringVar(&c.EnvCompat, "env-compat", "", "upstream: read envoyproxy/ratelimit's variables (default as ratelimit)")
	fs.StringVar(&c.GRPCUDS, "grpc-uds", "", "serve gRPC on this Unix socket path instead of --grpc-addr")
	fs.StringVar(&c.KeyPrefix, "key-prefix", "", "begin every Redis key with this (several deployments on one Redis)")
	fs.StringVar(&c.StatsdAddr, "statsd-addr", "", "statsd for upstream's stats: host:port or udp://host:port?tags=...")
	fs.IntVar(&c.DetailedMetricMax, "detailed-metric-max", 100, "most values a detailed_metric or value_to_metric rule counts by")
	return fs
}

// helpGroup is one topic of rls serve --help: its flags in order, and the
// environment variables rls reads for it besides their twins.
type helpGroup struct {
	title string
	flags []string
	env   [][2]string // name, usage
}

// helpGroups lists every serve flag once (TestHelpGroupsEveryFlag).
var helpGroups = []helpGroup{
	{"Core", []string{"config-dir", "allow-empty-config", "store", "grpc-addr", "http-addr", "debug-addr", "admin-addr",
		"max-conns", "idle-timeout", "first-call-timeout", "log-level", "log-format", "shutdown-drain", "dry-run"},
		[][2]string{{"GOGC, GOMEMLIMIT", "the Go runtime's; with neither set, rls tunes GOGC itself"}}},
	{"Redis", []string{"redis-url", "redis-timeout"},
		[][2]string{{redisPasswordEnv, "Redis password, overriding the URL's (never a flag: ps shows flags)"}}},
	{"Limits", []string{"on-store-error", "default-algorithm", "fleet-size", "min-fleet-size", "over-limit-cache", "reserve", "local-max-bytes",
		"memory-max-bytes", "response-headers", "allow-negative-hits"}, nil},
	{"RLQS", []string{"rlqs", "rlqs-unmatched"}, nil},
	{"TLS", []string{"grpc-tls-cert", "grpc-tls-key", "grpc-tls-client-ca", "grpc-tls-client-san", "redis-tls-ca", "redis-tls-cert", "redis-tls-key"}, nil},
	{"xDS", []string{"config-source", "xds-server", "xds-node-id", "xds-tls-ca", "xds-tls-cert", "xds-tls-key"}, nil},
	globalHelp,
	{"Tracing", []string{"trace-descriptor-values"}, [][2]string{
		{telemetry.EnvTracesEndpoint + ", " + telemetry.EnvEndpoint, "an http(s):// collector URL turns tracing on"},
		{telemetry.EnvTracesProtocol + ", " + telemetry.EnvProtocol, "grpc (the default) or http/protobuf"},
		{"OTEL_*", "the other OpenTelemetry variables, read by its SDK"}}},
	{"Compatibility with envoyproxy/ratelimit", []string{"shadow-mode", "response-metadata", "merge-domains", "env-compat",
		"statsd-addr", "detailed-metric-max", "grpc-uds", "key-prefix"}, nil},
}

const usageHead = `usage: rls [serve] [flags]
       rls validate DIR
       rls simulate --help
       rls version
       rls help

rls serve's flags, by topic. Each is also read from its RLS_* environment
twin (--redis-url from RLS_REDIS_URL); docs/flags.md has the details.
`

// printHelp writes rls serve --help: the flags by topic, each with its
// default and a one-line usage.
func printHelp(out io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(out, usageHead)
	for _, g := range helpGroups {
		fmt.Fprintf(out, "\n%s:\n", g.title)
		for _, name := range g.flags {
			f := fs.Lookup(name)
			def := ""
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
				def = fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintf(out, "  --%s%s\n      %s\n", f.Name, def, f.Usage)
		}
		for _, e := range g.env {
			fmt.Fprintf(out, "  %s (environment)\n      %s\n", e[0], e[1])
		}
	}
}

// parseConfig parses args, then fills every flag not given on the command
// line from its RLS_* environment twin, reads the other variables rls
// takes (all through getenv), and validates the result.
func parseConfig(args []string, getenv func(string) string, out io.Writer) (*Config, error) {
	c := defaultConfig()
	fs := newFlagSet(c, out)
	// The flag package prints its Usage on every parse error: only --help
	// gets the list of flags; a bad value gets one line naming it.
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		printHelp(out, fs)
		return nil, err
	} else if err != nil {
		return nil, fmt.Errorf("%w (rls --help lists the flags)", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := readEnv(fs, c, getenv); err != nil {
		return c, err // c names the upstream variables read (upstreamError)
	}
	return c, c.Validate()
}

// readEnv sets every flag not given on the command line from its RLS_*
// twin, and reads the variables without a flag.
func readEnv(fs *flag.FlagSet, c *Config, getenv func(string) string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	raw := getenv
	getenv, err := c.readCompat(set["env-compat"], getenv)
	if err != nil {
		return err
	}
	c.upstreamNames = compat.Renames(c.Compat.Env, raw, func(f string) bool { return set[f] })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			set[f.Name] = true
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %v", envName(f.Name), v, valueError(f, err)))
			}
		}
	})
	c.RedisPassword = getenv(redisPasswordEnv)
	set[redisPasswordEnv] = c.RedisPassword != ""
	c.given = set
	c.OTLP = telemetry.ReadOTLPEnv(getenv)
	c.GOGC, c.GOMEMLIMIT = getenv("GOGC"), getenv("GOMEMLIMIT")
	return errors.Join(errs...)
}

// readCompat reads upstream's environment in upstream mode (pkg/compat)
// into c, and returns the getenv where its values stand in for unset RLS_*
// variables.
func (c *Config) readCompat(flagSet bool, getenv func(string) string) (func(string) string, error) {
	s, getenv, err := compat.Mode(c.EnvCompat, flagSet, getenv)
	if s == nil && err == nil {
		c.StrayUpstream = compat.Stray(getenv)
	}
	if s != nil {
		c.EnvCompat, c.Compat, c.QuotaMode, c.NearLimitRatio = "upstream", *s, s.QuotaMode, s.NearLimitRatio
		c.HeaderLimit, c.HeaderRemaining, c.HeaderReset = s.HeaderLimit, s.HeaderRemaining, s.HeaderReset
		c.XDSNodeMetadata, c.XDSTLSServerName = s.XDSNodeMetadata, s.XDSTLSServerName
		c.XDSMaxRecvBytes = cmp.Or(s.XDSMaxRecvBytes, c.XDSMaxRecvBytes)
	}
	return getenv, err
}

// upstreamError rewrites err in upstream mode to name the upstream
// variables a setting came from (compat.Rename). A nil c leaves err as it
// is.
func (c *Config) upstreamError(err error) error {
	if c == nil {
		return err
	}
	return compat.Rename(err, c.upstreamNames)
}

// valueError says what a flag's value must look like, where the flag
// package only says "parse error".
func valueError(f *flag.Flag, err error) error {
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return errors.New("want true or false (also 1/0, t/f)")
	}
	switch f.Value.(flag.Getter).Get().(type) {
	case time.Duration:
		return errors.New("want a duration such as 500ms, 2s or 1m")
	case int, int64, uint, uint64:
		return errors.New("want a whole number")
	}
	return err
}

// storeKind is the kind of the --store: memory or redis.
func (c *Config) storeKind() string {
	kind, _, _ := strings.Cut(c.Store, "-")
	return kind
}

// redisMode is the topology of a Redis --store: single, cluster or
// sentinel.
func (c *Config) redisMode() string {
	if _, mode, ok := strings.Cut(c.Store, "-"); ok {
		return mode
	}
	return "single"
}
