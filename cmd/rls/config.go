package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/tlsconfig"
)

// Config is everything rls reads from its flags and their RLS_* environment
// twins, read once at start-up and validated before anything is started.
type Config struct {
	ConfigDir       string
	GRPCAddr        string
	HTTPAddr        string
	DebugAddr       string
	Store           string
	LogLevel        string
	LogFormat       string
	ShutdownDrain   time.Duration
	ShutdownTimeout time.Duration

	GRPCTLSCert     string
	GRPCTLSKey      string
	GRPCTLSClientCA string

	RedisURL        string
	RedisMode       string
	RedisMasterName string
	RedisUsername   string
	RedisPassword   string
	RedisPoolSize   int
	RedisTimeout    time.Duration

	RedisTLSCA                 string
	RedisTLSCert               string
	RedisTLSKey                string
	RedisTLSInsecureSkipVerify bool

	MemoryMaxKeys  int
	MemoryMaxBytes int64

	MaxDescriptors    int
	MaxEntries        int
	MaxKeyBytes       int
	MaxValueBytes     int
	MaxHits           uint64
	GRPCMaxRecvBytes  int
	GRPCMaxStreams    int
	GRPCMaxConnIdle   time.Duration
	GRPCMaxConnAge    time.Duration
	HTTPIdleTimeout   time.Duration
	MaxConns          int
	Admin             bool
	ResponseHeaders   bool
	DetailedMetricMax int
	ConfigPoll        time.Duration
	ConfigMaxBytes    int64
	AllowEmptyConfig  bool
	GCPercent         int

	OnStoreError   string
	FleetSize      int
	MinFleetSize   int
	OverLimitCache bool
	LocalMaxKeys   int
	LocalMaxBytes  int64

	// envoyproxy/ratelimit compatibility (docs/MIGRATING.md).
	ShadowMode       bool
	QuotaMode        bool
	ResponseMetadata bool
	MergeDomains     bool
	NearLimitRatio   float64
	HeaderLimit      string
	HeaderRemaining  string
	HeaderReset      string

	tracingConfig // --otlp-endpoint, --otlp-protocol, --trace-descriptor-values: tracing.go

	// Configuration over xDS (--config-source xds).
	ConfigSource     string
	XDSServer        string
	XDSNodeID        string
	XDSNodeMetadata  string
	XDSTLSCA         string
	XDSTLSCert       string
	XDSTLSKey        string
	XDSTLSServerName string
	XDSMaxRecvBytes  int

	// DryRun: check the flags, environment and config, then exit (dryrun.go).
	DryRun bool
}

// envName returns the environment twin of a flag: --redis-url → RLS_REDIS_URL.
func envName(flagName string) string {
	return "RLS_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// newFlagSet declares every serve flag on c with its default.
func newFlagSet(c *Config, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("rls serve", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.BoolVar(&c.DryRun, "dry-run", false, dryRunUsage)
	fs.StringVar(&c.ConfigDir, "config-dir", "./config", "directory of descriptor YAML files, one domain per file")
	fs.StringVar(&c.GRPCAddr, "grpc-addr", ":8081", "gRPC listen address (RateLimitService, health, reflection)")
	fs.StringVar(&c.GRPCTLSCert, "grpc-tls-cert", "", "PEM certificate (chain) for TLS on the gRPC port, with --grpc-tls-key; reloaded when the file changes")
	fs.StringVar(&c.GRPCTLSKey, "grpc-tls-key", "", "PEM private key of --grpc-tls-cert")
	fs.StringVar(&c.GRPCTLSClientCA, "grpc-tls-client-ca", "", "PEM CA bundle: require gRPC clients to present a certificate it signed (mutual TLS); reloaded when the file changes")
	fs.StringVar(&c.HTTPAddr, "http-addr", ":8080", "HTTP listen address (/healthcheck, /metrics); empty disables it")
	fs.StringVar(&c.DebugAddr, "debug-addr", "127.0.0.1:6070", "debug listen address (/debug/pprof, /rlconfig); keep it on loopback; empty disables it")
	fs.StringVar(&c.Store, "store", "memory", "counter store: memory (embedded, per process) or redis (shared by the fleet)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error (any case)")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	fs.DurationVar(&c.ShutdownDrain, "shutdown-drain", 0, "on SIGTERM, time to keep serving while health reports NOT_SERVING")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM, how long in-flight calls may take to finish")
	fs.StringVar(&c.RedisURL, "redis-url", "redis://127.0.0.1:6379", "Redis URL: redis:// or rediss:// (TLS); cluster seeds and sentinels as redis://h1:p1?addr=h2:p2")
	fs.StringVar(&c.RedisMode, "redis-mode", "single", "Redis topology: single, cluster or sentinel")
	fs.StringVar(&c.RedisMasterName, "redis-master-name", "", "Sentinel master name (--redis-mode sentinel)")
	fs.StringVar(&c.RedisUsername, "redis-username", "", "Redis ACL user name (overrides the URL's)")
	fs.StringVar(&c.RedisPassword, "redis-password", "", "Redis password (overrides the URL's); prefer the RLS_REDIS_PASSWORD environment variable")
	fs.StringVar(&c.RedisTLSCA, "redis-tls-ca", "", "PEM CA bundle to trust for Redis TLS (rediss://) instead of the system roots")
	fs.StringVar(&c.RedisTLSCert, "redis-tls-cert", "", "PEM client certificate for Redis TLS (tls-auth-clients), with --redis-tls-key")
	fs.StringVar(&c.RedisTLSKey, "redis-tls-key", "", "PEM private key of --redis-tls-cert")
	fs.BoolVar(&c.RedisTLSInsecureSkipVerify, "redis-tls-insecure-skip-verify", false, "do not verify Redis's TLS certificate (testing only)")
	fs.IntVar(&c.RedisPoolSize, "redis-pool-size", 0, "most Redis connections per node (opened on demand); 0 means 10 per CPU and at least 100")
	fs.DurationVar(&c.RedisTimeout, "redis-timeout", time.Second, "budget for one decision's Redis calls when the caller sent no gRPC deadline; when it sent one (Envoy always sends its timeout, 20ms by default) the budget is that deadline minus a small margin")
	fs.IntVar(&c.MemoryMaxKeys, "memory-max-keys", 1_000_000, "memory store: most counters kept; the oldest are evicted beyond it")
	fs.Int64Var(&c.MemoryMaxBytes, "memory-max-bytes", memory.DefaultMaxBytes, "memory store: most bytes of counters kept (each key's length plus 176, and 8 per sub-window of a precision window); the oldest are evicted beyond it")
	fs.IntVar(&c.MaxDescriptors, "max-descriptors", service.DefaultLimits.Descriptors, "most descriptors in one request; more is InvalidArgument")
	fs.IntVar(&c.MaxEntries, "max-entries", service.DefaultLimits.Entries, "most entries in one descriptor; more is InvalidArgument")
	fs.IntVar(&c.MaxKeyBytes, "max-key-bytes", service.DefaultLimits.KeyBytes, "longest descriptor entry key in bytes; longer is InvalidArgument")
	fs.IntVar(&c.MaxValueBytes, "max-value-bytes", service.DefaultLimits.ValueBytes, "longest descriptor entry value (and domain) in bytes; longer is InvalidArgument")
	fs.Uint64Var(&c.MaxHits, "max-hits", service.DefaultLimits.Hits, "largest hits_addend of a request or descriptor (at most 2^53); larger is InvalidArgument")
	fs.IntVar(&c.GRPCMaxRecvBytes, "grpc-max-recv-bytes", 1<<20, "largest gRPC request message in bytes; larger is ResourceExhausted")
	fs.IntVar(&c.GRPCMaxStreams, "grpc-max-streams", 256, "most concurrent gRPC calls on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); Envoy opens another connection beyond it; a connection with more than twice this many (at least 100) streams refused within a second is closed (after 1 s unread)")
	fs.DurationVar(&c.GRPCMaxConnIdle, "grpc-max-conn-idle", 5*time.Minute, "close a gRPC connection (GOAWAY) with no call for this long; 0 disables")
	fs.DurationVar(&c.GRPCMaxConnAge, "grpc-max-conn-age", 30*time.Minute, "close a gRPC connection (GOAWAY, ±10% jitter, then 10s for calls in flight) after this long; 0 disables")
	fs.DurationVar(&c.HTTPIdleTimeout, "http-idle-timeout", time.Minute, "close a keep-alive connection of --http-addr or --debug-addr idle for this long")
	fs.IntVar(&c.MaxConns, "max-conns", 1000, "most connections open at once on each port (gRPC, HTTP, debug); beyond it new ones are accepted and closed at once; 0 is no cap")
	fs.BoolVar(&c.Admin, "admin", false, "serve rls.admin.v1.AdminService (Explain, ResetCounters) on the gRPC port; anyone who reaches the port can reset counters")
	fs.BoolVar(&c.ResponseHeaders, "response-headers", false, "add RateLimit-Limit/-Remaining/-Reset (draft-03) to every response and Retry-After to OVER_LIMIT ones")
	fs.IntVar(&c.DetailedMetricMax, "detailed-metric-max", 100, "most distinct descriptor values counted per detailed_metric rule; the rest are counted as value=\"_other\"")
	fs.DurationVar(&c.ConfigPoll, "config-poll", 10*time.Second, "re-read --config-dir this often even without file events (0 disables; file events always trigger a reload)")
	fs.Int64Var(&c.ConfigMaxBytes, "config-max-bytes", descriptors.DefaultMaxFileBytes, "largest config file read, in bytes; a larger one is refused from its size, before it is read (the last good config stays)")
	fs.BoolVar(&c.AllowEmptyConfig, "allow-empty-config", false, "allow a config directory without any domain: at start-up, and on a reload that would remove every domain (without it, start-up fails and such a reload keeps the last good config); with --config-source xds: serve before the first config, and accept an update without any domain")
	fs.StringVar(&c.OnStoreError, "on-store-error", "fail_open", "what rules without on_error do when the store cannot answer: fail_open (local share of the limit) or fail_closed (deny)")
	fs.IntVar(&c.FleetSize, "fleet-size", 0, "replicas sharing the limits, for the fail-open share (limit/fleet size); 0 learns it from heartbeats in Redis (memory store: 1)")
	fs.IntVar(&c.MinFleetSize, "min-fleet-size", 1, "the least fleet size a learned size may be, and the size assumed before the first heartbeat answers (a replica started while Redis is down); set it to the Deployment's minimum replicas")
	fs.BoolVar(&c.OverLimitCache, "over-limit-cache", true, "deny keys the store found over their limit locally until their retry time, without a store call")
	fs.IntVar(&c.LocalMaxKeys, "local-max-keys", 100_000, "most keys kept by each local table (over-limit cache, fail-open buckets); least recently used evicted beyond it")
	fs.Int64Var(&c.LocalMaxBytes, "local-max-bytes", limiter.DefaultCacheBytes+2*limiter.DefaultBucketsBytes, "most bytes kept by the local tables (each key's length plus its entry's overhead): half for the over-limit cache, a quarter each for the fail-open buckets and the pending write-backs; least recently used evicted beyond it")
	addTracingFlags(fs, &c.tracingConfig)
	fs.IntVar(&c.GCPercent, "gc-percent", 400, "Go GC target (as GOGC) while the extra heap it allows stays under 64 MiB, falling toward 100 beyond; fewer collections, less CPU and a flatter tail; 0 or a GOGC environment variable leaves Go's setting alone")
	compatFlags(fs, c)
	xdsFlags(fs, c)
	return fs
}

// compatFlags declares the switches envoyproxy/ratelimit users know by its
// environment variables (named in each usage; docs/MIGRATING.md maps them all).
func compatFlags(fs *flag.FlagSet, c *Config) {
	fs.BoolVar(&c.ShadowMode, "shadow-mode", false, "answer OK to every request; descriptors keep their OVER_LIMIT statuses and metrics count them as shadow_over_limit (SHADOW_MODE)")
	fs.BoolVar(&c.QuotaMode, "quota-mode", false, "treat every descriptor as quota_mode: a request is denied only when all its descriptors are over their limits (QUOTA_MODE)")
	fs.BoolVar(&c.ResponseMetadata, "response-metadata", false, "return the request and the merged metadata of its passing descriptors as the response's dynamic_metadata (RESPONSE_DYNAMIC_METADATA)")
	fs.BoolVar(&c.MergeDomains, "merge-domains", false, "let several files of --config-dir define one domain; their top-level descriptors are combined, a descriptor defined twice is an error (MERGE_DOMAIN_CONFIG)")
	fs.Float64Var(&c.NearLimitRatio, "near-limit-ratio", service.DefaultNearLimitRatio, "share of a limit used, in (0, 1], from which an allowed decision counts as near_limit in rls_decisions_total (NEAR_LIMIT_RATIO)")
	fs.StringVar(&c.HeaderLimit, "header-limit", "RateLimit-Limit", "name of the limit header that --response-headers adds (LIMIT_LIMIT_HEADER)")
	fs.StringVar(&c.HeaderRemaining, "header-remaining", "RateLimit-Remaining", "name of the remaining header that --response-headers adds (LIMIT_REMAINING_HEADER)")
	fs.StringVar(&c.HeaderReset, "header-reset", "RateLimit-Reset", "name of the reset header that --response-headers adds (LIMIT_RESET_HEADER)")
}

// validateCompat checks the compatibility switches' values.
func (c *Config) validateCompat() error {
	var errs []error
	if !(c.NearLimitRatio > 0 && c.NearLimitRatio <= 1) { // also NaN
		errs = append(errs, fmt.Errorf("%s %v is out of range: want a number in (0, 1], e.g. 0.8", flagRef("near-limit-ratio"), c.NearLimitRatio))
	}
	names := map[string]string{}
	for _, h := range []struct{ flag, v string }{{"header-limit", c.HeaderLimit}, {"header-remaining", c.HeaderRemaining}, {"header-reset", c.HeaderReset}} {
		if !validHeaderName(h.v) {
			errs = append(errs, fmt.Errorf("%s %q is not an HTTP header name (letters, digits and !#$%%&'*+-.^_`|~)", flagRef(h.flag), h.v))
			continue
		}
		lower := strings.ToLower(h.v)
		if other, dup := names[lower]; dup {
			errs = append(errs, fmt.Errorf("%s and %s both name the header %q", flagRef(other), flagRef(h.flag), h.v))
		}
		names[lower] = h.flag
	}
	return errors.Join(errs...)
}

// validHeaderName reports whether s is an HTTP field name (RFC 9110 token)
// that is not a pseudo-header or a hop-by-hop header Envoy would refuse.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0) {
			return false
		}
	}
	switch strings.ToLower(s) {
	case "connection", "keep-alive", "transfer-encoding", "upgrade", "te", "host", "content-length":
		return false
	}
	return true
}

// parseConfig parses args, then fills every flag not given on the command
// line from its RLS_* environment twin, and validates the result.
func parseConfig(args []string, getenv func(string) string, out io.Writer) (*Config, error) {
	c := &Config{}
	fs := newFlagSet(c, out)
	// The flag package prints its Usage on every parse error: only --help
	// gets the list of flags; a bad value gets one line naming it.
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(out, "usage: rls [serve] [flags]\n       rls validate DIR\n       rls simulate --help\n       rls version\n       rls help\n\nFlags (each also read from its RLS_* environment twin):\n")
		fs.VisitAll(func(f *flag.Flag) {
			fmt.Fprintf(out, "  --%s (%s, default %q)\n    \t%s\n", f.Name, envName(f.Name), f.DefValue, f.Usage)
		})
		return nil, err
	} else if err != nil {
		return nil, fmt.Errorf("%w (rls --help lists the flags)", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %v", envName(f.Name), v, valueError(f, err)))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, c.Validate()
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

func oneOf(flagName, v string, choices ...string) error {
	if slices.Contains(choices, v) {
		return nil
	}
	return fmt.Errorf("--%s (%s) %q is invalid; choices are %v", flagName, envName(flagName), v, choices)
}

func validAddr(flagName, v string, allowEmpty bool) error {
	if v == "" && allowEmpty {
		return nil
	}
	if _, _, err := net.SplitHostPort(v); err != nil {
		return fmt.Errorf("--%s (%s) %q is invalid: want host:port", flagName, envName(flagName), v)
	}
	return nil
}

// Validate reports every invalid setting, naming the flag and its env twin.
func (c *Config) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case c.ConfigSource == "xds": // --config-dir is not read
	case c.ConfigDir == "":
		add(errors.New("--config-dir (RLS_CONFIG_DIR) is empty"))
	default:
		if st, err := os.Stat(c.ConfigDir); c.DryRun && errors.Is(err, os.ErrNotExist) {
			// --dry-run: often a volume of the pod only (dryrun.go)
		} else if err != nil {
			add(fmt.Errorf("--config-dir (RLS_CONFIG_DIR): %v", err))
		} else if !st.IsDir() {
			add(fmt.Errorf("--config-dir (RLS_CONFIG_DIR) %q is not a directory", c.ConfigDir))
		}
	}
	add(validAddr("grpc-addr", c.GRPCAddr, false))
	add(validAddr("http-addr", c.HTTPAddr, true))
	add(validAddr("debug-addr", c.DebugAddr, true))
	add(oneOf("store", c.Store, "memory", "redis"))
	c.LogLevel = strings.ToLower(c.LogLevel) // upstream's LOG_LEVEL is upper case
	add(oneOf("log-level", c.LogLevel, "debug", "info", "warn", "error"))
	add(oneOf("log-format", c.LogFormat, "text", "json"))
	if c.ShutdownDrain < 0 {
		add(errors.New("--shutdown-drain (RLS_SHUTDOWN_DRAIN) is negative"))
	}
	if c.ShutdownTimeout <= 0 {
		add(errors.New("--shutdown-timeout (RLS_SHUTDOWN_TIMEOUT) must be positive"))
	}
	if c.RedisTimeout <= 0 {
		add(errors.New("--redis-timeout (RLS_REDIS_TIMEOUT) must be positive"))
	}
	add(oneOf("on-store-error", c.OnStoreError, "fail_open", "fail_closed"))
	if c.FleetSize < 0 {
		add(errors.New("--fleet-size (RLS_FLEET_SIZE) is negative"))
	}
	for _, b := range []struct {
		name string
		v    int
	}{{"max-descriptors", c.MaxDescriptors}, {"max-entries", c.MaxEntries}, {"max-key-bytes", c.MaxKeyBytes},
		{"max-value-bytes", c.MaxValueBytes}, {"grpc-max-recv-bytes", c.GRPCMaxRecvBytes},
		{"detailed-metric-max", c.DetailedMetricMax}, {"local-max-keys", c.LocalMaxKeys}, {"memory-max-keys", c.MemoryMaxKeys},
		{"min-fleet-size", c.MinFleetSize}} {
		if b.v < 1 {
			add(fmt.Errorf("--%s (%s) must be at least 1", b.name, envName(b.name)))
		}
	}
	if c.MaxHits < 1 || c.MaxHits > service.MaxHitsBound {
		add(fmt.Errorf("--max-hits (RLS_MAX_HITS) %d is out of range [1, 2^53]", c.MaxHits))
	}
	if c.ConfigPoll < 0 {
		add(errors.New("--config-poll (RLS_CONFIG_POLL) is negative"))
	}
	for _, b := range []struct {
		name string
		v    int64
	}{{"local-max-bytes", c.LocalMaxBytes}, {"memory-max-bytes", c.MemoryMaxBytes}} {
		if b.v < 1<<20 {
			add(fmt.Errorf("--%s (%s) must be at least 1 MiB (1048576)", b.name, envName(b.name)))
		}
	}
	if c.ConfigMaxBytes < 1 {
		add(errors.New("--config-max-bytes (RLS_CONFIG_MAX_BYTES) must be at least 1"))
	}
	if c.GRPCMaxStreams < 1 {
		add(errors.New("--grpc-max-streams (RLS_GRPC_MAX_STREAMS) must be at least 1"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"grpc-max-conn-idle", c.GRPCMaxConnIdle}, {"grpc-max-conn-age", c.GRPCMaxConnAge}} {
		if d.v < 0 {
			add(fmt.Errorf("%s is negative", flagRef(d.name)))
		}
	}
	if c.HTTPIdleTimeout <= 0 {
		add(errors.New("--http-idle-timeout (RLS_HTTP_IDLE_TIMEOUT) must be positive"))
	}
	if c.MaxConns < 0 {
		add(errors.New("--max-conns (RLS_MAX_CONNS) is negative"))
	}
	if c.GCPercent < 0 {
		add(errors.New("--gc-percent (RLS_GC_PERCENT) is negative"))
	}
	add(c.validateGRPCTLS())
	add(c.validateCompat())
	add(c.validateTracing())

	add(c.validateXDS())
	if c.Store == "redis" {
		add(c.validateRedis())
	}
	return errors.Join(errs...)
}

// validateRedis checks the redis store's options and --redis-tls-* flags
// (redis store only).
func (c *Config) validateRedis() error {
	opts := c.redisOptions()
	if opts.Timeout <= 0 {
		opts.Timeout = 0 // reported by Validate with its env twin; not twice
	}
	return errors.Join(opts.Validate(), c.validateRedisTLS())
}

// flagRef names a flag and its environment twin for messages.
func flagRef(name string) string {
	return fmt.Sprintf("--%s (%s)", name, envName(name))
}

// validPair checks a certificate flag and its key flag: both or neither,
// each readable, and together a valid pair.
func validPair(certFlag, cert, keyFlag, key string) error {
	if cert == "" && key == "" {
		return nil
	}
	if cert == "" || key == "" {
		return fmt.Errorf("%s and %s go together: set both or neither", flagRef(certFlag), flagRef(keyFlag))
	}
	var errs []error
	for _, f := range [][2]string{{certFlag, cert}, {keyFlag, key}} {
		if _, err := os.ReadFile(f[1]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", flagRef(f[0]), err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if _, err := tlsconfig.LoadPair(cert, key); err != nil {
		return fmt.Errorf("%s and %s: %v", flagRef(certFlag), flagRef(keyFlag), err)
	}
	return nil
}

// validCA checks a CA bundle flag: empty, or a readable PEM file with at
// least one certificate.
func validCA(name, file string) error {
	if file == "" {
		return nil
	}
	if _, err := tlsconfig.LoadPool(file); err != nil {
		return fmt.Errorf("%s: %v", flagRef(name), err)
	}
	return nil
}

// validateGRPCTLS checks the --grpc-tls-* flags.
func (c *Config) validateGRPCTLS() error {
	errs := []error{validPair("grpc-tls-cert", c.GRPCTLSCert, "grpc-tls-key", c.GRPCTLSKey)}
	if c.GRPCTLSClientCA != "" && (c.GRPCTLSCert == "" || c.GRPCTLSKey == "") {
		errs = append(errs, fmt.Errorf("%s needs %s and %s (mutual TLS is TLS first)",
			flagRef("grpc-tls-client-ca"), flagRef("grpc-tls-cert"), flagRef("grpc-tls-key")))
	}
	errs = append(errs, validCA("grpc-tls-client-ca", c.GRPCTLSClientCA))
	return errors.Join(errs...)
}

// redisTLSSet reports whether any --redis-tls-* flag is set.
func (c *Config) redisTLSSet() bool {
	return c.RedisTLSCA != "" || c.RedisTLSCert != "" || c.RedisTLSKey != "" || c.RedisTLSInsecureSkipVerify
}

// validateRedisTLS checks the --redis-tls-* flags (redis store only).
func (c *Config) validateRedisTLS() error {
	if !c.redisTLSSet() {
		return nil
	}
	var errs []error
	if !strings.HasPrefix(strings.ToLower(c.RedisURL), "rediss://") {
		errs = append(errs, fmt.Errorf("the --redis-tls-* flags need a rediss:// %s", flagRef("redis-url")))
	}
	errs = append(errs, validCA("redis-tls-ca", c.RedisTLSCA),
		validPair("redis-tls-cert", c.RedisTLSCert, "redis-tls-key", c.RedisTLSKey))
	return errors.Join(errs...)
}
