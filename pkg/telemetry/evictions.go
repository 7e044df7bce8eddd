package telemetry

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/pkg/logthrottle"
)

// EvictionEvery is how often EvictionWatch reads each master's eviction
// policy and evicted-keys count.
const EvictionEvery = 2 * time.Second

// EvictionOptions configure NewEvictionWatch.
type EvictionOptions struct {
	// Client is the store's Redis (each master of a Cluster is read).
	Client redis.UniversalClient
	// Every is the interval between readings [EvictionEvery].
	Every time.Duration
	// Timeout bounds one reading of one master [1s].
	Timeout time.Duration
	// Log receives the WARN of a policy that may evict counters and of
	// each rise of the evictions (at most once per logthrottle.Every)
	// [discard].
	Log *slog.Logger
}

// EvictionWatch makes Redis's evictions loud. A Redis with a maxmemory and
// an allkeys-* or volatile-* policy (every rls key has a TTL) evicts
// counters under memory pressure, and every request they counted is
// admitted again: a silent fail-open (about 3,000 admitted per window
// against a limit of 1,000, with no error). It reads each master's
// maxmemory-policy and evicted_keys (INFO): a policy that may evict is a
// WARN (at the first reading, and on a change) and
// rls_store_eviction_policy_evicts 1; keys evicted while rls serves are
// counted in rls_store_evicted_keys_total and logged at WARN. noeviction
// makes Redis refuse writes instead, which rls sees as errors and decides
// per rule in fallback: loud. A reading that fails is retried at the next
// interval; a refused INFO (an ACL without it) is logged once. Run reads;
// EvictionWatch is safe for concurrent use.
type EvictionWatch struct {
	o       EvictionOptions
	evicted prometheus.Counter
	evicts  prometheus.Gauge
	rose    *logthrottle.Throttle

	mu      sync.Mutex
	nodes   map[string]*nodeEvictions
	refused bool // INFO refused: logged once
}

// nodeEvictions is what the last reading of a master found.
type nodeEvictions struct {
	policy  string
	evicted int64
}

// NewEvictionWatch registers rls_store_evicted_keys_total and
// rls_store_eviction_policy_evicts on reg.
func NewEvictionWatch(reg prometheus.Registerer, o EvictionOptions) *EvictionWatch {
	if o.Every <= 0 {
		o.Every = EvictionEvery
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	w := &EvictionWatch{o: o, nodes: map[string]*nodeEvictions{}, rose: logthrottle.New(logthrottle.Every, nil),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_store_evicted_keys_total",
			Help: "Keys Redis evicted (maxmemory-policy) while rls served, over its masters: counters among them, whose requests are then admitted again."}),
		evicts: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rls_store_eviction_policy_evicts",
			Help: "1 while a Redis master's maxmemory-policy may evict rls's counters (allkeys-*, volatile-*: every rls key has a TTL); 0 with noeviction."}),
	}
	reg.MustRegister(w.evicted, w.evicts)
	return w
}

// Run reads at once and then every Every until ctx is done.
func (w *EvictionWatch) Run(ctx context.Context) {
	t := time.NewTicker(w.o.Every)
	defer t.Stop()
	for {
		w.Check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check reads every master once.
func (w *EvictionWatch) Check(ctx context.Context) {
	read := func(ctx context.Context, node string, c *redis.Client) error {
		ctx, cancel := context.WithTimeout(ctx, w.o.Timeout)
		defer cancel()
		mem, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return err
		}
		stats, err := c.Info(ctx, "stats").Result()
		if err != nil {
			return err
		}
		w.record(node, infoField(mem, "maxmemory_policy"), infoField(mem, "maxmemory"), infoField(stats, "evicted_keys"))
		return nil
	}
	var err error
	switch c := w.o.Client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return read(ctx, m.Options().Addr, m) })
	case *redis.Client:
		err = read(ctx, c.Options().Addr, c)
	}
	if err != nil && strings.Contains(err.Error(), "NOPERM") {
		w.mu.Lock()
		first := !w.refused
		w.refused = true
		w.mu.Unlock()
		if first {
			w.o.Log.Warn("cannot read Redis's eviction policy: INFO is refused; grant rls's Redis user +info to have evictions of counters logged and counted",
				"err", err)
		}
	}
}

// record takes one master's reading.
func (w *EvictionWatch) record(node, policy, maxmemory, evicted string) {
	n, _ := strconv.ParseInt(evicted, 10, 64)
	w.mu.Lock()
	prev, seen := w.nodes[node]
	if !seen {
		prev = &nodeEvictions{evicted: n}
		w.nodes[node] = prev
	}
	changed := prev.policy != policy
	prev.policy = policy
	rose := n - prev.evicted
	if n < prev.evicted { // Redis restarted: its count started over
		rose = n
	}
	prev.evicted = n
	evicting := false
	for _, ne := range w.nodes {
		evicting = evicting || mayEvict(ne.policy)
	}
	w.mu.Unlock()
	if evicting {
		w.evicts.Set(1)
	} else {
		w.evicts.Set(0)
	}
	if changed && mayEvict(policy) {
		w.o.Log.Warn("Redis may evict rls's counters: under memory pressure its maxmemory-policy drops keys, and every request an evicted counter held is admitted again (a silent fail-open); set maxmemory-policy noeviction, and size maxmemory for the counters",
			"node", node, "maxmemory_policy", policy, "maxmemory", maxmemory, "evicted_keys_so_far", n)
	}
	if seen && rose > 0 {
		w.evicted.Add(float64(rose))
		if held, ok := w.rose.Allow(); ok {
			w.o.Log.Warn("Redis evicted keys: counters among them start over, and the requests they held are admitted again",
				"node", node, "evicted", rose, "maxmemory_policy", policy, "maxmemory", maxmemory, "held", held)
		}
	}
}

// mayEvict reports whether a maxmemory-policy may drop rls's keys (all of
// which have a TTL).
func mayEvict(policy string) bool {
	return policy != "" && policy != "noeviction"
}

// infoField returns the value of name in INFO text ("name:value" lines).
func infoField(info, name string) string {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), name+":"); ok {
			return v
		}
	}
	return ""
}
