// Package upstreamstats sends envoyproxy/ratelimit's stats, with its names
// and shapes, so that the dashboards and alerts built on them keep working
// on rls: to statsd through lyft/gostats (the library upstream uses), and,
// mapped as upstream's default Prometheus mapper maps them (through
// statsd_exporter's mapper, as upstream does), as Prometheus series.
//
// The decision path only adds to counters: names are resolved once per
// rule (per value for detailed_metric and value_to_metric rules, at most
// MaxDetailed of them per rule), response times go into a bounded queue,
// and a goroutine flushes everything on an interval. The counters follow
// the config: a new config starts a new set, and the old one is flushed
// once more and dropped.
package upstreamstats

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	gostats "github.com/lyft/gostats"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/service"
)

// Options configure Stats.
type Options struct {
	// Sinks receive the stats (NewStatsdSink, NewPrometheusSink); at least one.
	Sinks []gostats.Sink
	// Tags are EXTRA_TAGS: added to every stat, as gostats names tags.
	Tags map[string]string
	// Flush is the flush interval [10s].
	Flush time.Duration
	// LastFlush bounds the last flush, at shutdown [lastFlushWait].
	LastFlush time.Duration
	// MaxDetailed caps the names of one detailed_metric or value_to_metric
	// rule (and of overrides and unknown domains, each); beyond it, a
	// decision counts under the rule's own name [100].
	MaxDetailed int
	// NearLimitRatio is NEAR_LIMIT_RATIO [0.8].
	NearLimitRatio float64
	Log            *slog.Logger
}

// Stats records upstream's stats. It implements service.Observer.
type Stats struct {
	opts  Options
	sink  gostats.Sink
	base  gostats.Store // stats that outlive configs
	svc   serviceStats
	gen   atomic.Pointer[generation]
	mu    sync.Mutex
	old   []*generation // replaced, to flush once more
	times chan float64  // response times in ms, for the flusher
}

// serviceStats are the stats of the service and its calls.
type serviceStats struct {
	configLoadSuccess, configLoadError gostats.Counter
	redisError, serviceError           gostats.Counter
	totalRequests                      gostats.Counter
	responseTime                       gostats.Timer
}

// timesQueue bounds the response times waiting for a flush; beyond it they
// are dropped (a sample of each interval is sent).
const timesQueue = 4096

// lastFlushWait bounds the last flush at shutdown (Run).
const lastFlushWait = 2 * time.Second

// New returns Stats sending to opts.Sinks. Call Run to flush.
func New(opts Options) *Stats {
	if opts.Flush <= 0 {
		opts.Flush = 10 * time.Second
	}
	if opts.MaxDetailed <= 0 {
		opts.MaxDetailed = 100
	}
	if opts.NearLimitRatio <= 0 || opts.NearLimitRatio > 1 {
		opts.NearLimitRatio = service.DefaultNearLimitRatio
	}
	if opts.LastFlush <= 0 {
		opts.LastFlush = lastFlushWait
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	s := &Stats{opts: opts, sink: fanout(opts.Sinks), times: make(chan float64, timesQueue)}
	s.base = gostats.NewStore(s.sink, false)
	svc := s.base.ScopeWithTags("ratelimit", opts.Tags).Scope("service")
	call := svc.Scope("call.should_rate_limit")
	server := s.base.ScopeWithTags("ratelimit_server", opts.Tags)
	s.svc = serviceStats{
		configLoadSuccess: svc.NewCounter("config_load_success"),
		configLoadError:   svc.NewCounter("config_load_error"),
		redisError:        call.NewCounter("redis_error"),
		serviceError:      call.NewCounter("service_error"),
		totalRequests:     server.NewCounter("ShouldRateLimit.total_requests"),
		responseTime:      server.NewTimer("ShouldRateLimit.response_time"),
	}
	s.gen.Store(s.newGeneration(nil))
	return s
}

// Run flushes every interval until ctx is cancelled, then once more,
// waiting at most Options.LastFlush for that.
func (s *Stats) Run(ctx context.Context) {
	t := time.NewTicker(s.opts.Flush)
	defer t.Stop()
	// A flush runs in a goroutine of its own, one at a time: gostats's TCP
	// sink waits on a statsd it cannot reach (it connects, sleeps, retries)
	// before it gives up, which must hold neither the ticks nor the
	// shutdown. A tick that finds the last flush still running skips.
	var flushing chan struct{}
	flush := func() {
		if flushing != nil {
			select {
			case <-flushing:
			default:
				return
			}
		}
		ch := make(chan struct{})
		flushing = ch
		go func() { s.Flush(); close(ch) }()
	}
	for {
		select {
		case <-ctx.Done():
			// The last flush, after the one in flight, all within LastFlush.
			deadline := time.After(s.opts.LastFlush)
			last := make(chan struct{})
			go func() {
				if flushing != nil {
					<-flushing
				}
				s.Flush()
				close(last)
			}()
			select {
			case <-last:
			case <-deadline:
				s.opts.Log.Warn("statsd: the last stats not flushed at shutdown: statsd does not take them", "waited", s.opts.LastFlush)
			}
			return
		case <-t.C:
			flush()
		}
	}
}

// Flush sends what was counted since the last flush.
func (s *Stats) Flush() {
	for n := len(s.times); n > 0; n-- {
		s.svc.responseTime.AddValue(<-s.times)
	}
	s.base.Flush()
	s.mu.Lock()
	old := s.old
	s.old = nil
	s.mu.Unlock()
	for _, g := range old {
		g.store.Flush()
	}
	s.gen.Load().store.Flush()
}

// ConfigLoaded counts a config load: config_load_success or _error.
func (s *Stats) ConfigLoaded(ok bool) {
	if ok {
		s.svc.configLoadSuccess.Inc()
	} else {
		s.svc.configLoadError.Inc()
	}
}

// Call counts one ShouldRateLimit call and its response time, as
// upstream's server interceptor does; an error is a service_error.
func (s *Stats) Call(d time.Duration, err error) {
	s.svc.totalRequests.Inc()
	select {
	case s.times <- float64(d.Milliseconds()):
	default: // full until the next flush: this one is not sampled
	}
	if err != nil {
		s.svc.serviceError.Inc()
	}
}

// SetConfig starts the stats of a new config (service.Observer).
func (s *Stats) SetConfig(cfg *descriptors.Config) {
	old := s.gen.Swap(s.newGeneration(cfg))
	if old != nil {
		s.mu.Lock()
		s.old = append(s.old, old)
		s.mu.Unlock()
	}
}

// Decided counts one descriptor's decision (service.Observer).
func (s *Stats) Decided(domain string, d *rlcommon.RateLimitDescriptor, r *descriptors.Rule, o service.Outcome, it *limiter.Item, remaining uint64) {
	g := s.gen.Load()
	if r == nil {
		if !g.domains[domain] {
			g.notFound(domain).Inc()
		}
		return
	}
	if it == nil || r.Unlimited {
		return
	}
	if it.Source == limiter.FromFailOpen || it.Source == limiter.FromFailClosed {
		s.svc.redisError.Inc()
	}
	rs := g.ruleStats(domain, d, r)
	limit := uint64(r.RequestsPerUnit)
	used := limit - min(remaining, limit)
	dec := Decision{Limit: limit, Hits: it.Check.Hits, Shadow: r.ShadowMode, LocalCache: it.Source == limiter.FromCache}
	switch o {
	case service.OutcomeOverLimit, service.OutcomeShadowOverLimit, service.OutcomeQuotaOverLimit:
		dec.Over, dec.Before = true, used // rls counted none of a denied request's hits
	default:
		dec.Before = used - min(used, dec.Hits)
	}
	rs.add(Account(dec, s.opts.NearLimitRatio))
}

// rateLimitStats are the six stats of one stats key.
type rateLimitStats struct {
	totalHits, overLimit, nearLimit, overLimitWithLocalCache, withinLimit, shadowMode gostats.Counter
}

func (rs *rateLimitStats) add(c Counts) {
	for _, x := range []struct {
		c gostats.Counter
		n uint64
	}{{rs.totalHits, c.TotalHits}, {rs.overLimit, c.OverLimit}, {rs.nearLimit, c.NearLimit},
		{rs.overLimitWithLocalCache, c.OverLimitWithLocalCache}, {rs.withinLimit, c.WithinLimit}, {rs.shadowMode, c.ShadowMode}} {
		if x.n > 0 {
			x.c.Add(x.n)
		}
	}
}

// generation holds the stats of one config.
type generation struct {
	store   gostats.Store
	scope   gostats.Scope // ratelimit.service.rate_limit
	max     int
	domains map[string]bool
	rules   sync.Map // *descriptors.Rule → *ruleEntry
	mu      sync.Mutex
	// overrides and unknown domains, by stats key; capped at max each.
	overrides map[string]*rateLimitStats
	unknown   map[string]gostats.Counter
}

// ruleEntry is a rule's stats, and for a rule named by request values
// (detailed_metric, value_to_metric) the stats of each name.
type ruleEntry struct {
	plain  *rateLimitStats
	byName sync.Map // string → *rateLimitStats
	names  atomic.Int64
}

func (s *Stats) newGeneration(cfg *descriptors.Config) *generation {
	st := gostats.NewStore(s.sink, false)
	g := &generation{store: st, scope: st.ScopeWithTags("ratelimit", s.opts.Tags).Scope("service").Scope("rate_limit"),
		max: s.opts.MaxDetailed, domains: map[string]bool{},
		overrides: map[string]*rateLimitStats{}, unknown: map[string]gostats.Counter{}}
	for _, d := range cfg.Domains() {
		g.domains[d] = true
	}
	return g
}

func (g *generation) newStats(key string) *rateLimitStats {
	key = SanitizeStatName(key)
	return &rateLimitStats{
		totalHits:               g.scope.NewCounter(key + ".total_hits"),
		overLimit:               g.scope.NewCounter(key + ".over_limit"),
		nearLimit:               g.scope.NewCounter(key + ".near_limit"),
		overLimitWithLocalCache: g.scope.NewCounter(key + ".over_limit_with_local_cache"),
		withinLimit:             g.scope.NewCounter(key + ".within_limit"),
		shadowMode:              g.scope.NewCounter(key + ".shadow_mode"),
	}
}

// notFound is the domain_not_found counter of an unknown domain; beyond
// max distinct ones, they share "_unknown"'s.
func (g *generation) notFound(domain string) gostats.Counter {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.unknown[domain]
	if c == nil {
		if len(g.unknown) >= g.max {
			domain = "_unknown"
			if c = g.unknown[domain]; c != nil {
				return c
			}
		}
		c = g.scope.NewCounter(SanitizeStatName(domain) + ".domain_not_found")
		g.unknown[domain] = c
	}
	return c
}

// ruleStats returns the stats a decision of r counts in: the rule's, or
// for a rule named by request values, the name's (capped at max).
func (g *generation) ruleStats(domain string, d *rlcommon.RateLimitDescriptor, r *descriptors.Rule) *rateLimitStats {
	if r.Override {
		return g.overrideStats(domain, d)
	}
	v, ok := g.rules.Load(r)
	if !ok {
		v, _ = g.rules.LoadOrStore(r, &ruleEntry{plain: g.newStats(RuleKey(r))})
	}
	e := v.(*ruleEntry)
	if !r.DetailedMetric && !r.ValueToMetric() {
		return e.plain
	}
	name := domain + "." + r.StatsName(d.GetEntries())
	if rs, ok := e.byName.Load(name); ok {
		return rs.(*rateLimitStats)
	}
	if e.names.Add(1) > int64(g.max) {
		e.names.Add(-1)
		return e.plain
	}
	rs, loaded := e.byName.LoadOrStore(name, g.newStats(name))
	if loaded {
		e.names.Add(-1)
	}
	return rs.(*rateLimitStats)
}

// overrideStats are the stats of a request's limit override: upstream
// names them by the request's entries.
func (g *generation) overrideStats(domain string, d *rlcommon.RateLimitDescriptor) *rateLimitStats {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range d.GetEntries() {
		b.WriteByte('.')
		b.WriteString(e.GetKey())
		if e.GetValue() != "" {
			b.WriteByte('_')
			b.WriteString(e.GetValue())
		}
	}
	key := b.String()
	g.mu.Lock()
	defer g.mu.Unlock()
	rs := g.overrides[key]
	if rs == nil {
		if len(g.overrides) >= g.max {
			key = domain + "._override"
			if rs = g.overrides[key]; rs != nil {
				return rs
			}
		}
		rs = g.newStats(key)
		g.overrides[key] = rs
	}
	return rs
}

// RuleKey is a rule's stats key, as upstream names it: the domain, then
// each level of the rule's descriptor path as key_value (or key), joined
// by '.', values as configured ("files_files/*").
func RuleKey(r *descriptors.Rule) string {
	return r.Domain + "." + r.StatsPath()
}

var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// SanitizeStatName is upstream's utils.SanitizeStatName: ':' and '|' become
// '_', and so do the dots of IPv4 addresses.
func SanitizeStatName(s string) string {
	s = strings.NewReplacer(":", "_", "|", "_").Replace(s)
	return ipv4.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}
