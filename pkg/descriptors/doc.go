// Package descriptors is the rate-limit configuration model: it parses and
// validates the descriptor YAML files of a config directory, matches the
// descriptors of an Envoy request to rules, and builds the store keys of the
// counters. It is pure: no network, no Redis, no I/O beyond reading files.
//
// # YAML
//
// The format is a superset of envoyproxy/ratelimit's, so its files load
// unchanged. One domain per file:
//
//	domain: api                      # required, unique across files (ParseOptions.MergeDomains)
//	descriptors:
//	  - key: api_key                 # required
//	    value: "premium-*"           # optional; '*' matches any run of characters
//	    shadow_mode: false           # decisions are computed but never deny
//	    detailed_metric: false       # metrics may carry the request's values
//	    value_to_metric: false       # metrics name the request's value (Rule.MetricValue)
//	    share_threshold: false       # wildcard values share one counter (see below)
//	    quota_mode: false            # a quota: denies only when all the request's quotas are over
//	    metadata: {any: mapping}     # Rule.Metadata, returned as response dynamic metadata
//	    rate_limit:
//	      unit: minute               # second|minute|hour|day|week|month|year
//	      unit_multiplier: 1         # units per window: 5 with minute is 5 minutes (at most a year)
//	      requests_per_unit: 100     # 0..4294967295, per window
//	      name: premium              # optional; used by replaces
//	      unlimited: false           # never limited; no unit/requests_per_unit then
//	      replaces: [{name: base}]   # drop these named limits when this one matches
//	      algorithm: sliding_window  # | token_bucket | fixed_window; absent: ParseOptions.DefaultAlgorithm
//	      burst: 50                  # token_bucket only: capacity, default requests_per_unit
//	      precision: 10              # sliding_window only: sub-windows per window (1..60)
//	      split: 3                   # spread each key's counter over 3 sub-keys (1..64; see split.go)
//	      on_error: fail_open        # | fail_closed; absent: the service's default
//	    descriptors: [...]           # nested levels
//
// Every validation failure is a *ConfigError naming the file, the line of the
// offending YAML node and the field; Load and Parse collect all of them into
// an Errors value. Unknown fields are errors at every level. YAML anchors,
// aliases and merge keys ("<<") are supported.
//
// # Matching
//
// Match follows envoyproxy/ratelimit: the request's entries are walked level
// by level from the domain's top-level descriptors. At each level the entry
// (k, v) selects the child with key k and value v, else the first child (in
// file order) with key k whose wildcard value matches v, else the child with
// key k and no value. The rule is the rate_limit of the node reached by the
// last entry; there is no fallback to a parent's limit, and a request deeper
// than the configuration matches nothing. As in envoyproxy/ratelimit (since
// its #1085), a '*' may appear anywhere in a value. Unlike there, a '*' in a
// key is a literal character: envoyproxy/ratelimit matches a wildcard
// against "key_value" as one string, so it accidentally treats key-only
// "foo*" as a key prefix.
//
// # Store keys
//
// AppendKey builds "rl:{tenant}:rest" (sliding and fixed window) or
// "tb:{tenant}:rest" (token bucket). The tenant is the escaped domain and the
// request's first entry, so all counters of one tenant share a Redis Cluster
// hash slot. rest holds the algorithm and window in seconds, the unit times
// unit_multiplier ("s60", "f3600", "t1", "s120" for two minutes), for
// a request override "o" and its requests_per_unit, then every further entry
// as "|key=value". Keys and values are the request's (a wildcard or key-only
// rule counts every distinct value separately) and are percent-escaped so
// that distinct inputs never share a key. An entry matched through a
// share_threshold wildcard is written as "%*" followed by the escaped pattern
// instead of its value, so every value matching the wildcard shares one
// counter ("%*" never occurs in an escaped value). Override rules never share.
// A split rule counts each request on one of its sub-keys (NextSub), whose
// keys AppendSubKey builds: the same key with a suffix in the hash tag that
// moves it to another part of the Cluster's slot space.
//
// # Concurrency
//
// A *Config is immutable after Load or Parse and safe for concurrent use.
// Rules returned by Match are shared and must not be modified.
package descriptors
