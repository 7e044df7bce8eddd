package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/rls-project/rls/pkg/gctune"
	"github.com/rls-project/rls/pkg/redisclient"
	"github.com/rls-project/rls/pkg/tlsconfig"
)

// optionNames names the setting behind each package option whose errors
// and messages reach the user: the one place where the packages' option
// names become the flags and variables a user sets. Options absent here
// have no setting of their own (their packages name them plainly).
var optionNames = map[string]string{
	"redis.URL":                flagRef("redis-url"),
	"redis.Mode":               flagRef("store"),
	"redis.MasterName":         flagRef("redis-url"), // its master_name
	"redis.Username":           flagRef("redis-url"), // its user
	"redis.PoolSize":           flagRef("redis-url"), // its pool_size
	"redis.Timeout":            flagRef("redis-timeout"),
	"redis.Password":           redisPasswordEnv,
	"descriptors.MergeDomains": flagRef("merge-domains"),
	"reload.AllowEmpty":        flagRef("allow-empty-config"),
}

// userError turns a package's option error into one naming the setting
// (optionNames); other errors are returned as they are.
func userError(err error) error {
	var oe *redisclient.OptionError
	if errors.As(err, &oe) {
		if name, ok := optionNames["redis."+oe.Option]; ok {
			return fmt.Errorf("%s: %s", name, oe.Msg)
		}
	}
	return err
}

// stores are the values of --store.
var stores = []string{"memory", "redis", "redis-cluster", "redis-sentinel"}

// Validate reports every invalid setting, naming the flag and its env twin
// (or the variable), and the allowed values.
func (c *Config) Validate() error {
	c.LogLevel = strings.ToLower(c.LogLevel) // upstream's LOG_LEVEL is upper case
	return errors.Join(
		c.validateConfigDir(),
		validAddr("grpc-addr", c.GRPCAddr, false),
		validAddr("http-addr", c.HTTPAddr, true),
		validAddr("debug-addr", c.DebugAddr, true),
		validAddr("admin-addr", c.AdminAddr, true),
		oneOf("store", c.Store, stores...),
		oneOf("log-level", c.LogLevel, "debug", "info", "warn", "error"),
		oneOf("log-format", c.LogFormat, "text", "json"),
		oneOf("on-store-error", c.OnStoreError, "fail_open", "fail_closed"),
		oneOf("default-algorithm", strings.ToLower(c.DefaultAlgorithm), "sliding_window", "fixed_window", "token_bucket"),
		oneOf("rlqs-unmatched", c.RLQSUnmatched, "allow", "deny", "abandon"),
		c.validateBounds(),
		c.validateGRPCTLS(),
		c.validateEnv(),
		c.validateXDS(),
		c.validateRedis(),
		c.validateRedisUnused(),
		c.validateDropin(),
		c.validateRLQSUnused(),
		c.validateGlobal(),
	)
}

// validateRLQSUnused refuses --rlqs-unmatched given with --rlqs=false: the
// user meant the service to run with it, and it would not run at all.
func (c *Config) validateRLQSUnused() error {
	if !c.RLQS && c.given["rlqs-unmatched"] {
		return fmt.Errorf("%s is set but %s is false, which leaves RLQS unserved: remove %s, or set %s true",
			flagRef("rlqs-unmatched"), flagRef("rlqs"), flagRef("rlqs-unmatched"), flagRef("rlqs"))
	}
	return nil
}

// validateRedisUnused refuses a Redis setting given with the memory store,
// which counts per process: a fleet would admit its limits once per replica.
func (c *Config) validateRedisUnused() error {
	var errs []error
	for _, name := range []string{"redis-url", "redis-timeout", "redis-tls-ca", "redis-tls-cert", "redis-tls-key", redisPasswordEnv} {
		if ref := flagRef(name); c.Store == "memory" && c.given[name] {
			if name == redisPasswordEnv {
				ref = name
			}
			errs = append(errs, fmt.Errorf("%s is set but %s is memory, which reads no Redis setting and counts per process: "+
				"set %s redis (or redis-cluster, redis-sentinel) to share the counts in Redis, or remove %s", ref, flagRef("store"), flagRef("store"), ref))
		}
	}
	return errors.Join(errs...)
}

// validateConfigDir checks --config-dir, which --config-source xds does
// not read. With --dry-run a missing directory is fine: often a volume of
// the pod only (dryrun.go).
func (c *Config) validateConfigDir() error {
	if c.fromXDS() {
		return nil
	}
	if c.ConfigDir == "" {
		return errors.New("--config-dir (RLS_CONFIG_DIR) is empty")
	}
	st, err := os.Stat(c.ConfigDir)
	switch {
	case c.DryRun && errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("--config-dir (RLS_CONFIG_DIR): %v", err)
	case !st.IsDir():
		return fmt.Errorf("--config-dir (RLS_CONFIG_DIR) %q is not a directory", c.ConfigDir)
	}
	return nil
}

// validateBounds checks the numeric flags' ranges.
func (c *Config) validateBounds() error {
	var errs []error
	for _, b := range []struct {
		name string
		bad  bool
		msg  string
	}{
		{"shutdown-drain", c.ShutdownDrain < 0, "is negative"},
		{"fleet-size", c.FleetSize < 0, "is negative"},
		{"max-conns", c.MaxConns < 0, "is negative"},
		{"redis-timeout", c.RedisTimeout <= 0, "must be positive"},
		{"idle-timeout", c.IdleTimeout <= 0, "must be positive"},
		{"first-call-timeout", c.FirstCallTimeout <= 0, "must be positive"},
		{"min-fleet-size", c.MinFleetSize < 1, "must be at least 1"},
		{"detailed-metric-max", c.DetailedMetricMax < 1, "must be at least 1"},
		{"local-max-bytes", c.LocalMaxBytes < 1<<20, "must be at least 1 MiB (1048576)"},
		{"memory-max-bytes", c.MemoryMaxBytes < 1<<20, "must be at least 1 MiB (1048576)"},
	} {
		if b.bad {
			errs = append(errs, fmt.Errorf("%s %s", flagRef(b.name), b.msg))
		}
	}
	return errors.Join(errs...)
}

// validateEnv checks the variables rls reads besides the flags' twins:
// OpenTelemetry's, GOGC and GOMEMLIMIT. A bad one is an error whether
// tracing is on or not: rls serve would refuse it.
func (c *Config) validateEnv() error {
	_, err := c.OTLP.Settings()
	return errors.Join(err, gctune.Check(c.GOGC, c.GOMEMLIMIT))
}

// validateRedis checks the Redis store's options and the --redis-tls-*
// flags (Redis stores only).
func (c *Config) validateRedis() error {
	if c.storeKind() != "redis" || !slices.Contains(stores, c.Store) {
		return nil
	}
	opts := c.redisOptions()
	if opts.Timeout <= 0 {
		opts.Timeout = 0 // reported by validateBounds; not twice
	}
	client, err := redisclient.New(opts)
	if err == nil {
		client.Close()
	}
	return errors.Join(userError(err), c.validateRedisTLS())
}

func oneOf(flagName, v string, choices ...string) error {
	if slices.Contains(choices, v) {
		return nil
	}
	return fmt.Errorf("%s %q is invalid; choices are %v", flagRef(flagName), v, choices)
}

func validAddr(flagName, v string, allowEmpty bool) error {
	if v == "" && allowEmpty {
		return nil
	}
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("%s %q is invalid: want host:port", flagRef(flagName), v)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("%s %q is invalid: %q is not a port number (0-65535) or a service name", flagRef(flagName), v, port)
	}
	return nil
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
	return c.RedisTLSCA != "" || c.RedisTLSCert != "" || c.RedisTLSKey != ""
}

// validateRedisTLS checks the --redis-tls-* flags (Redis stores only).
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
