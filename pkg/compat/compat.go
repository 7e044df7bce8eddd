// Package compat reads envoyproxy/ratelimit's environment (its
// src/settings/settings.go, at the version docs/MIGRATING.md names) with
// upstream's names, defaults and meanings, and turns it into the settings
// of rls: values for rls's RLS_* variables (so flags and RLS_* variables a
// user sets still win: the caller consults them first) and the few
// settings without a flag. It is a pure function of the environment, so
// that a Deployment written for the upstream image runs rls unchanged.
package compat

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Kind says what rls does with an upstream variable in compatibility mode.
type Kind uint8

const (
	// Read: read with upstream's meaning.
	Read Kind = iota
	// Warned: rls has no such behaviour to change; a set variable is
	// logged once at WARN and has no effect.
	Warned
	// Refused: a value asking for what rls cannot do (memcache, a
	// per-second Redis, DogStatsD...) stops the start; upstream's default
	// value is accepted.
	Refused
)

// Var is one upstream variable: its name, upstream's default and what
// compatibility mode does with it.
type Var struct {
	Name, Default string
	Kind          Kind
	// Why says, for a Warned variable, why it changes nothing and what
	// does ("" for the others).
	Why string
}

// Settings are the settings read from upstream's environment.
type Settings struct {
	// Env holds values for rls's own variables (RLS_* twins of flags,
	// RLS_REDIS_PASSWORD, OTEL_*): the caller uses one only when the
	// variable itself is unset.
	Env map[string]string
	// The settings without a flag.
	NearLimitRatio                            float64
	QuotaMode                                 bool
	HeaderLimit, HeaderRemaining, HeaderReset string
	XDSNodeMetadata, XDSTLSServerName         string
	XDSMaxRecvBytes                           int // 0: rls's default
	// UpstreamPrometheus serves upstream's stat names, as its Prometheus
	// mapper names them, on PrometheusAddr at PrometheusPath.
	UpstreamPrometheus             bool
	PrometheusAddr, PrometheusPath string
	// TracingSampleRatio is TRACING_SAMPLING_RATE when tracing is on and
	// it is set (upstream samples ParentBased(TraceIDRatioBased(rate)));
	// nil: OpenTelemetry's variables, else the SDK's default, decide.
	TracingSampleRatio *float64
	// IgnoreDotFiles is RUNTIME_IGNOREDOTFILES: the config files are
	// loaded as upstream's runtime loader does (descriptors.LoadOptions.
	// Upstream), skipping names that start with '.' only when it is true.
	IgnoreDotFiles bool
	// Warnings are the variables set without effect, one line each.
	Warnings []string
}

// Sources names, for each of rls's variables that Env may fill, the
// upstream variables its value comes from: an error about the setting
// names them as the user set them (REDIS_AUTH, not RLS_REDIS_PASSWORD).
var Sources = map[string]string{
	"RLS_HTTP_ADDR": "HOST and PORT", "RLS_DEBUG_ADDR": "DEBUG_HOST and DEBUG_PORT", "RLS_GRPC_ADDR": "GRPC_HOST and GRPC_PORT",
	"RLS_GRPC_UDS": "GRPC_UDS", "RLS_ALLOW_EMPTY_CONFIG": "FORCE_START_WITHOUT_INITIAL_CONFIG", "RLS_SHADOW_MODE": "SHADOW_MODE",
	"RLS_RESPONSE_METADATA": "RESPONSE_DYNAMIC_METADATA", "RLS_MERGE_DOMAINS": "MERGE_DOMAIN_CONFIG",
	"RLS_GRPC_TLS_CERT": "GRPC_SERVER_TLS_CERT", "RLS_GRPC_TLS_KEY": "GRPC_SERVER_TLS_KEY",
	"RLS_GRPC_TLS_CLIENT_CA": "GRPC_CLIENT_TLS_CACERT", "RLS_GRPC_TLS_CLIENT_SAN": "GRPC_CLIENT_TLS_SAN",
	"RLS_LOG_LEVEL": "LOG_LEVEL", "RLS_LOG_FORMAT": "LOG_FORMAT", "RLS_CONFIG_SOURCE": "CONFIG_TYPE",
	"RLS_XDS_NODE_ID": "CONFIG_GRPC_XDS_NODE_ID", "RLS_XDS_SERVER": "CONFIG_GRPC_XDS_SERVER_URL",
	"RLS_XDS_TLS_CA": "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "RLS_XDS_TLS_CERT": "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
	"RLS_XDS_TLS_KEY": "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "RLS_STATSD_ADDR": "STATSD_HOST and STATSD_PORT",
	"RLS_CONFIG_DIR": "RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY", "RLS_OVER_LIMIT_CACHE": "LOCAL_CACHE_SIZE_IN_BYTES",
	"RLS_LOCAL_MAX_BYTES": "LOCAL_CACHE_SIZE_IN_BYTES", "RLS_KEY_PREFIX": "CACHE_KEY_PREFIX",
	"RLS_RESPONSE_HEADERS": "LIMIT_RESPONSE_HEADERS_ENABLED", "RLS_STORE": "BACKEND_TYPE and REDIS_TYPE",
	"RLS_REDIS_URL": "REDIS_URL", "RLS_REDIS_PASSWORD": "REDIS_AUTH", "RLS_REDIS_TLS_CA": "REDIS_TLS_CACERT",
	"RLS_REDIS_TLS_CERT": "REDIS_TLS_CLIENT_CERT", "RLS_REDIS_TLS_KEY": "REDIS_TLS_CLIENT_KEY",
	"RLS_DEFAULT_ALGORITHM": "(the default of ratelimit: fixed_window)",
}

// Error is a variable whose value rls refuses: Var names it, Msg says why
// and what to do.
type Error struct {
	Var, Value, Msg string
}

func (e *Error) Error() string {
	if e.Value == "" {
		return e.Var + ": " + e.Msg
	}
	return fmt.Sprintf("%s=%q: %s", e.Var, e.Value, e.Msg)
}

// reader reads the variables, collecting errors and warnings.
type reader struct {
	getenv func(string) string
	set    Settings
	errs   []error
}

// raw is the variable as set ("" when unset).
func (r *reader) raw(name string) string { return strings.TrimSpace(r.getenv(name)) }

// str is the variable, or upstream's default when unset.
func (r *reader) str(name string) string {
	if v := r.raw(name); v != "" {
		return v
	}
	return defaults[name]
}

func (r *reader) fail(name, msg string) {
	r.errs = append(r.errs, &Error{Var: name, Value: r.raw(name), Msg: msg})
}

func (r *reader) bool(name string) bool {
	v := r.str(name)
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.fail(name, "want true or false")
	}
	return b
}

func (r *reader) int(name string) int {
	v := r.str(name)
	n, err := strconv.Atoi(v)
	if err != nil {
		r.fail(name, "want a whole number")
	}
	return n
}

func (r *reader) duration(name string) time.Duration {
	d, err := time.ParseDuration(r.str(name))
	if err != nil {
		r.fail(name, "want a duration such as 500ms, 10s or 1m")
	}
	return d
}

func (r *reader) env(name, value string) { r.set.Env[name] = value }

// FromEnv reads upstream's environment through getenv. It returns every
// refused value at once, each a *Error naming its variable.
func FromEnv(getenv func(string) string) (Settings, error) {
	r := &reader{getenv: getenv, set: Settings{Env: map[string]string{}}}
	r.server()
	r.tls()
	r.logging()
	r.xds()
	r.stats()
	r.runtime()
	r.limits()
	r.redis()
	r.tracing()
	r.warnings()
	if len(r.errs) > 0 {
		return Settings{}, errors.Join(r.errs...)
	}
	return r.set, nil
}

// port is the port number the variable holds (upstream reads an int).
func (r *reader) port(name string) string {
	v := r.str(name)
	if n, err := strconv.Atoi(v); err != nil || n < 0 || n > 65535 {
		r.fail(name, "want a port number (0-65535)")
	}
	return v
}

func (r *reader) server() {
	r.env("RLS_HTTP_ADDR", net.JoinHostPort(r.str("HOST"), r.port("PORT")))
	// The debug port serves pprof (heap dumps, CPU profiles): on loopback
	// unless DEBUG_HOST says otherwise, where upstream listens on 0.0.0.0.
	r.env("RLS_DEBUG_ADDR", net.JoinHostPort(cmp.Or(r.raw("DEBUG_HOST"), "127.0.0.1"), r.port("DEBUG_PORT")))
	r.env("RLS_GRPC_ADDR", net.JoinHostPort(r.str("GRPC_HOST"), r.port("GRPC_PORT")))
	if v := r.raw("GRPC_UDS"); v != "" {
		r.env("RLS_GRPC_UDS", v)
	}
	r.env("RLS_ALLOW_EMPTY_CONFIG", strconv.FormatBool(r.bool("FORCE_START_WITHOUT_INITIAL_CONFIG")))
	r.env("RLS_SHADOW_MODE", strconv.FormatBool(r.bool("SHADOW_MODE")))
	r.env("RLS_RESPONSE_METADATA", strconv.FormatBool(r.bool("RESPONSE_DYNAMIC_METADATA")))
	r.env("RLS_MERGE_DOMAINS", strconv.FormatBool(r.bool("MERGE_DOMAIN_CONFIG")))
	r.set.QuotaMode = r.bool("QUOTA_MODE")
	// Upstream counts every rule in a fixed window, in keys rls then shares.
	r.env("RLS_DEFAULT_ALGORITHM", "fixed_window")
}

func (r *reader) tls() {
	if !r.bool("GRPC_SERVER_USE_TLS") {
		return
	}
	cert, key := r.raw("GRPC_SERVER_TLS_CERT"), r.raw("GRPC_SERVER_TLS_KEY")
	if cert == "" || key == "" {
		r.fail("GRPC_SERVER_USE_TLS", "needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
		return
	}
	r.env("RLS_GRPC_TLS_CERT", cert)
	r.env("RLS_GRPC_TLS_KEY", key)
	if ca := r.raw("GRPC_CLIENT_TLS_CACERT"); ca != "" {
		r.env("RLS_GRPC_TLS_CLIENT_CA", ca)
	}
	if san := r.raw("GRPC_CLIENT_TLS_SAN"); san != "" {
		r.env("RLS_GRPC_TLS_CLIENT_SAN", san)
	}
}

func (r *reader) logging() {
	switch lvl := strings.ToLower(r.str("LOG_LEVEL")); lvl {
	case "trace":
		r.env("RLS_LOG_LEVEL", "debug")
	case "warning":
		r.env("RLS_LOG_LEVEL", "warn")
	case "fatal", "panic":
		r.env("RLS_LOG_LEVEL", "error")
	default:
		r.env("RLS_LOG_LEVEL", lvl)
	}
	r.env("RLS_LOG_FORMAT", strings.ToLower(r.str("LOG_FORMAT")))
}

func (r *reader) xds() {
	switch t := strings.ToUpper(r.str("CONFIG_TYPE")); t {
	case "FILE":
		r.env("RLS_CONFIG_SOURCE", "file")
		return
	case "GRPC_XDS_SOTW":
		r.env("RLS_CONFIG_SOURCE", "xds")
	default:
		r.fail("CONFIG_TYPE", "want FILE or GRPC_XDS_SOTW")
		return
	}
	r.env("RLS_XDS_NODE_ID", r.str("CONFIG_GRPC_XDS_NODE_ID"))
	r.env("RLS_XDS_SERVER", r.str("CONFIG_GRPC_XDS_SERVER_URL"))
	r.set.XDSNodeMetadata = r.raw("CONFIG_GRPC_XDS_NODE_METADATA")
	if n := r.raw("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"); n != "" {
		r.set.XDSMaxRecvBytes = r.int("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
	}
	if r.raw("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS") != "" {
		r.fail("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "rls sends no extra headers to the xDS server: authenticate with CONFIG_GRPC_XDS_CLIENT_TLS_CERT instead, or unset it")
	}
	if !r.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS") {
		return
	}
	ca, cert, key := r.raw("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"), r.raw("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"), r.raw("CONFIG_GRPC_XDS_CLIENT_TLS_KEY")
	if ca == "" && cert == "" {
		r.fail("CONFIG_GRPC_XDS_SERVER_USE_TLS", "rls turns TLS to the xDS server on with a CA or a client certificate: set CONFIG_GRPC_XDS_SERVER_TLS_CACERT (the server's CA)")
		return
	}
	r.env("RLS_XDS_TLS_CA", ca)
	r.env("RLS_XDS_TLS_CERT", cert)
	r.env("RLS_XDS_TLS_KEY", key)
	r.set.XDSTLSServerName = r.raw("CONFIG_GRPC_XDS_SERVER_TLS_SAN")
}

// stats maps upstream's stats sinks: statsd (its default) becomes
// --statsd-addr, a udp:// URL carrying the flush interval and the extra
// tags; Prometheus serves upstream's names on its own address.
func (r *reader) stats() {
	if r.bool("USE_DOG_STATSD") {
		r.fail("USE_DOG_STATSD", "rls sends plain statsd only: set USE_STATSD=true (tags go as EXTRA_TAGS) or USE_PROMETHEUS=true")
	}
	if r.raw("PROMETHEUS_MAPPER_YAML") != "" && r.bool("USE_PROMETHEUS") {
		r.fail("PROMETHEUS_MAPPER_YAML", "rls serves upstream's default mapping only: unset it, and relabel when scraping")
	}
	if r.bool("DISABLE_STATS") {
		return
	}
	flush := r.duration("STATS_FLUSH_INTERVAL")
	tags := r.raw("EXTRA_TAGS")
	if r.bool("USE_STATSD") {
		// gostats's STATSD_PROTOCOL, which upstream's statsd sink reads:
		// tcp unless it says udp.
		scheme := "tcp"
		switch p := strings.ToLower(strings.TrimSpace(r.getenv("STATSD_PROTOCOL"))); p {
		case "", "tcp", "tcp4", "tcp6":
		case "udp", "udp4", "udp6":
			scheme = "udp"
		default:
			r.errs = append(r.errs, &Error{Var: "STATSD_PROTOCOL", Value: p, Msg: "want tcp or udp"})
		}
		u := url.URL{Scheme: scheme, Host: net.JoinHostPort(r.str("STATSD_HOST"), r.str("STATSD_PORT"))}
		q := url.Values{}
		q.Set("flush_interval", flush.String())
		if tags != "" {
			q.Set("tags", tags)
		}
		u.RawQuery = q.Encode()
		r.env("RLS_STATSD_ADDR", u.String())
	}
	if r.bool("USE_PROMETHEUS") {
		r.set.UpstreamPrometheus = true
		r.set.PrometheusAddr, r.set.PrometheusPath = r.str("PROMETHEUS_ADDR"), r.str("PROMETHEUS_PATH")
		if !strings.HasPrefix(r.set.PrometheusPath, "/") {
			r.fail("PROMETHEUS_PATH", "want a path starting with /")
		}
	}
}

func (r *reader) runtime() {
	r.env("RLS_CONFIG_DIR", filepath.Join(r.str("RUNTIME_ROOT"), r.str("RUNTIME_SUBDIRECTORY"), r.str("RUNTIME_APPDIRECTORY")))
	r.set.IgnoreDotFiles = r.bool("RUNTIME_IGNOREDOTFILES")
}

func (r *reader) limits() {
	n := r.int("LOCAL_CACHE_SIZE_IN_BYTES")
	switch {
	case n < 0:
		r.fail("LOCAL_CACHE_SIZE_IN_BYTES", "is negative")
	case n == 0:
		r.env("RLS_OVER_LIMIT_CACHE", "false")
	default:
		// The over-limit cache gets half of --local-max-bytes.
		r.env("RLS_OVER_LIMIT_CACHE", "true")
		r.env("RLS_LOCAL_MAX_BYTES", strconv.FormatInt(max(2*int64(n), 1<<20), 10))
	}
	ratio, err := strconv.ParseFloat(r.str("NEAR_LIMIT_RATIO"), 64)
	if err != nil || !(ratio > 0 && ratio <= 1) || math.IsNaN(ratio) {
		r.fail("NEAR_LIMIT_RATIO", "want a number above 0 and at most 1, such as 0.8")
	}
	r.set.NearLimitRatio = ratio
	if p := r.raw("CACHE_KEY_PREFIX"); p != "" {
		r.env("RLS_KEY_PREFIX", p)
	}
	r.env("RLS_RESPONSE_HEADERS", strconv.FormatBool(r.bool("LIMIT_RESPONSE_HEADERS_ENABLED")))
	r.set.HeaderLimit = r.str("LIMIT_LIMIT_HEADER")
	r.set.HeaderRemaining = r.str("LIMIT_REMAINING_HEADER")
	r.set.HeaderReset = r.str("LIMIT_RESET_HEADER")
}

// redis maps the backend and Redis variables to --store and one
// --redis-url (with the password as RLS_REDIS_PASSWORD).
func (r *reader) redis() {
	if b := strings.ToLower(r.str("BACKEND_TYPE")); b != "redis" {
		r.fail("BACKEND_TYPE", "rls counts in Redis (or in memory with RLS_STORE=memory): memcache is not supported, set BACKEND_TYPE=redis")
		return
	}
	if r.bool("REDIS_PERSECOND") {
		r.fail("REDIS_PERSECOND", "rls decides a request in one store, atomically: point REDIS_URL at one Redis (or a Cluster) and set REDIS_PERSECOND=false")
	}
	u, store, ok := r.redisURL("REDIS_URL", r.str("REDIS_TYPE"), r.str("REDIS_SOCKET_TYPE"))
	if !ok {
		return
	}
	r.env("RLS_STORE", store)
	q := u.Query()
	if r.raw("REDIS_POOL_SIZE") != "" {
		n := r.int("REDIS_POOL_SIZE")
		if n < 0 {
			r.fail("REDIS_POOL_SIZE", "want 0 (the default) or more connections")
		}
		q.Set("pool_size", strconv.Itoa(n))
	}
	if r.bool("REDIS_TLS") {
		if u.Scheme == "unix" {
			r.fail("REDIS_TLS", "TLS over a Unix socket is not supported: set REDIS_TLS=false")
		}
		u.Scheme = "rediss"
		if r.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION") {
			q.Set("skip_verify", "true")
		}
		r.env("RLS_REDIS_TLS_CA", r.raw("REDIS_TLS_CACERT"))
		r.env("RLS_REDIS_TLS_CERT", r.raw("REDIS_TLS_CLIENT_CERT"))
		r.env("RLS_REDIS_TLS_KEY", r.raw("REDIS_TLS_CLIENT_KEY"))
	}
	user, pass := splitAuth(r.raw("REDIS_AUTH"))
	if pass != "" {
		r.env("RLS_REDIS_PASSWORD", pass)
	}
	switch {
	case store == "redis-sentinel":
		// The URL's credentials are the sentinels'; the password the master's.
		if user != "" {
			r.fail("REDIS_AUTH", "with REDIS_TYPE=SENTINEL rls takes the master's password only: drop the user")
		}
		if su, sp := splitAuth(r.raw("REDIS_SENTINEL_AUTH")); sp != "" {
			u.User = url.UserPassword(su, sp)
		}
	case user != "":
		u.User = url.User(user)
	}
	u.RawQuery = q.Encode()
	r.env("RLS_REDIS_URL", u.String())
}

// splitAuth splits upstream's REDIS_AUTH: "user:pass" or "pass".
func splitAuth(auth string) (user, pass string) {
	if u, p, ok := strings.Cut(auth, ":"); ok {
		return u, p
	}
	return "", auth
}

// redisURL builds the URL of REDIS_URL: host:port for a single Redis,
// h1:p1,h2:p2 for a Cluster's seeds, master,s1:p1,s2:p2 for Sentinel, or a
// socket path with REDIS_SOCKET_TYPE=unix.
func (r *reader) redisURL(name, typ, socket string) (*url.URL, string, bool) {
	addrs := strings.Split(r.str(name), ",")
	socket = strings.ToLower(socket)
	if socket != "tcp" && socket != "unix" {
		r.fail("REDIS_SOCKET_TYPE", "want tcp or unix")
		return nil, "", false
	}
	store := map[string]string{"SINGLE": "redis", "CLUSTER": "redis-cluster", "SENTINEL": "redis-sentinel"}[strings.ToUpper(typ)]
	if store == "" {
		r.fail("REDIS_TYPE", "want SINGLE, CLUSTER or SENTINEL")
		return nil, "", false
	}
	if socket == "unix" {
		if store != "redis" || len(addrs) != 1 || !filepath.IsAbs(addrs[0]) {
			r.fail(name, "with REDIS_SOCKET_TYPE=unix, want the absolute path of one socket (REDIS_TYPE=SINGLE)")
			return nil, "", false
		}
		return &url.URL{Scheme: "unix", Path: addrs[0]}, store, true
	}
	u := &url.URL{Scheme: "redis"}
	q := url.Values{}
	if store == "redis-sentinel" {
		if len(addrs) < 2 {
			r.fail(name, "with REDIS_TYPE=SENTINEL, want master,sentinel1:port[,sentinel2:port...]")
			return nil, "", false
		}
		q.Set("master_name", addrs[0])
		addrs = addrs[1:]
	}
	for i, a := range addrs {
		a = strings.TrimSpace(a)
		if _, _, err := net.SplitHostPort(a); err != nil {
			r.fail(name, fmt.Sprintf("%q is not host:port", a))
			return nil, "", false
		}
		if i == 0 {
			u.Host = a
		} else {
			q.Add("addr", a)
		}
	}
	u.RawQuery = q.Encode()
	return u, store, true
}

// tracing maps TRACING_ENABLED: upstream traces only when it is true (to
// OpenTelemetry's endpoint variables, else localhost's OTLP/HTTP port).
func (r *reader) tracing() {
	if !r.bool("TRACING_ENABLED") {
		r.env("OTEL_SDK_DISABLED", "true")
		return
	}
	proto := "http/protobuf"
	switch p := strings.ToLower(r.str("TRACING_EXPORTER_PROTOCOL")); p {
	case "http", "http/protobuf":
	case "grpc":
		proto = "grpc"
	default:
		r.fail("TRACING_EXPORTER_PROTOCOL", "want http or grpc")
	}
	r.env("OTEL_EXPORTER_OTLP_PROTOCOL", proto)
	if v := r.raw("TRACING_SAMPLING_RATE"); v != "" && r.getenv("OTEL_TRACES_SAMPLER") == "" {
		rate, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(rate) {
			r.fail("TRACING_SAMPLING_RATE", "want a number such as 0.1 (0 samples nothing, 1 everything)")
		}
		r.set.TracingSampleRatio = &rate
	}
	if proto == "grpc" {
		r.env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4317")
	} else {
		r.env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")
	}
}

// warnings lists the variables set that change nothing in rls.
func (r *reader) warnings() {
	for _, v := range Vars {
		if v.Kind != Warned || r.raw(v.Name) == "" {
			continue
		}
		r.set.Warnings = append(r.set.Warnings, fmt.Sprintf("%s=%s has no effect in rls: %s", v.Name, r.raw(v.Name), v.Why))
	}
	if !r.bool("GRPC_SERVER_USE_TLS") {
		for _, v := range []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN"} {
			if r.raw(v) != "" {
				r.set.Warnings = append(r.set.Warnings, v+" has no effect without GRPC_SERVER_USE_TLS=true, as upstream")
			}
		}
	}
}

// defaults are upstream's defaults of the variables read.
var defaults = func() map[string]string {
	m := map[string]string{}
	for _, v := range Vars {
		m[v.Name] = v.Default
	}
	return m
}()

// Mode reads --env-compat: the flag's value when given on the command line
// (flagSet), else its RLS_ENV_COMPAT twin. It returns the settings read
// from upstream's environment and a getenv where they stand in for unset
// RLS_* (and OTEL_*) variables, so that flags and rls's own variables win;
// without upstream mode, nil and getenv itself.
func Mode(flagValue string, flagSet bool, getenv func(string) string) (*Settings, func(string) string, error) {
	if v := getenv("RLS_ENV_COMPAT"); !flagSet && v != "" {
		flagValue = v
	}
	switch flagValue {
	case "":
		return nil, getenv, nil
	case "upstream":
	default:
		return nil, nil, fmt.Errorf("--env-compat (RLS_ENV_COMPAT) %q is invalid; choices are upstream or empty", flagValue)
	}
	s, err := FromEnv(getenv)
	if err != nil {
		return nil, nil, fmt.Errorf("upstream environment (--env-compat upstream): %w", err)
	}
	return &s, func(k string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return s.Env[k]
	}, nil
}

// CheckFlags checks the flags of this compatibility, each error naming
// its flag.
func CheckFlags(statsdAddr, clientSAN, clientCA, keyPrefix string, parseStatsd func(string) error) error {
	var errs []error
	if statsdAddr != "" {
		if err := parseStatsd(statsdAddr); err != nil {
			errs = append(errs, fmt.Errorf("--statsd-addr (RLS_STATSD_ADDR) %q: %v", statsdAddr, err))
		}
	}
	if clientSAN != "" && clientCA == "" {
		errs = append(errs, errors.New("--grpc-tls-client-san (RLS_GRPC_TLS_CLIENT_SAN) needs --grpc-tls-client-ca (RLS_GRPC_TLS_CLIENT_CA): only a verified client certificate names a SAN"))
	}
	if strings.ContainsAny(keyPrefix, "{}") {
		errs = append(errs, fmt.Errorf("--key-prefix (RLS_KEY_PREFIX) %q: no '{' or '}': Redis Cluster would hash the prefix, not the key's tenant", keyPrefix))
	}
	return errors.Join(errs...)
}

// AsRatelimit returns getenv, with RLS_ENV_COMPAT defaulting to upstream
// when the program runs as ratelimit (argv0's base name): the upstream
// image's entrypoint, /bin/ratelimit, a link to rls.
func AsRatelimit(argv0 string, getenv func(string) string) func(string) string {
	if filepath.Base(argv0) != "ratelimit" {
		return getenv
	}
	return func(k string) string {
		if v := getenv(k); v != "" || k != "RLS_ENV_COMPAT" {
			return v
		}
		return "upstream"
	}
}

// Stray returns the names of upstream's variables (Vars) that getenv has
// set, in Vars' order: outside upstream mode rls reads none of them, and
// says so (a Deployment's env: carried over to rls serve).
func Stray(getenv func(string) string) []string {
	var out []string
	for _, v := range Vars {
		if strings.TrimSpace(getenv(v.Name)) != "" {
			out = append(out, v.Name)
		}
	}
	return out
}
