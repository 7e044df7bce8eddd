package service

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/pkg/logthrottle"
)

// A request for a domain that no config defines is answered OK for every
// descriptor (no rule matches), as Envoy's contract wants; but it is most
// often a mistake (a typo in Envoy's domain, a config not mounted), so it
// is counted and logged rather than passed silently.

// UnknownDomainLogEvery is how often, at most, the warning of one unknown
// domain is logged (the domains beyond the cap share one warning).
const UnknownDomainLogEvery = time.Minute

// unknownDomains counts the requests for domains no config defines, per
// domain up to max distinct domains, the rest under OtherDomain, and
// throttles their warning per domain: a client may send any domain, and
// each would otherwise be a series of its own. It is safe for concurrent
// use.
type unknownDomains struct {
	max  int
	now  func() time.Time
	desc *prometheus.Desc

	mu    sync.Mutex
	seen  map[string]*unknownEntry
	other *unknownEntry
}

type unknownEntry struct {
	n      atomic.Uint64
	warned *logthrottle.Throttle
}

func newUnknownDomains(max int, now func() time.Time) *unknownDomains {
	if now == nil {
		now = time.Now
	}
	return &unknownDomains{max: max, now: now, seen: map[string]*unknownEntry{},
		other: &unknownEntry{warned: logthrottle.New(UnknownDomainLogEvery, now)},
		desc: prometheus.NewDesc("rls_unknown_domain_requests_total",
			"Requests for a domain that no config defines, answered OK for every descriptor, by domain "+
				"(capped; the rest under domain=\"_other\").", []string{"domain"}, nil)}
}

// record counts one request for domain and logs it at WARN, at most once
// per UnknownDomainLogEvery per domain.
func (u *unknownDomains) record(domain string, log *slog.Logger) {
	u.mu.Lock()
	e, ok := u.seen[domain]
	if !ok {
		if len(u.seen) < u.max {
			e = &unknownEntry{warned: logthrottle.New(UnknownDomainLogEvery, u.now)}
			u.seen[domain] = e
		} else {
			e = u.other
		}
	}
	u.mu.Unlock()
	e.n.Add(1)
	if held, ok := e.warned.Allow(); ok {
		log.Warn("request for a domain that no config defines: every descriptor answered OK, nothing limited",
			"domain", domain, "not_logged_since", held, "note", "logged at most every "+UnknownDomainLogEvery.String()+" per domain")
	}
}

// Describe implements prometheus.Collector.
func (u *unknownDomains) Describe(ch chan<- *prometheus.Desc) { ch <- u.desc }

// Collect implements prometheus.Collector.
func (u *unknownDomains) Collect(ch chan<- prometheus.Metric) {
	u.mu.Lock()
	defer u.mu.Unlock()
	// Label values must be UTF-8: a domain's other bytes are written \xNN
	// (printable), and domains that then read alike share one series.
	byLabel := make(map[string]float64, len(u.seen)+1)
	for d, e := range u.seen {
		byLabel[printable(d)] += float64(e.n.Load())
	}
	if n := u.other.n.Load(); n > 0 {
		byLabel[otherValue] += float64(n)
	}
	for d, n := range byLabel {
		ch <- prometheus.MustNewConstMetric(u.desc, prometheus.CounterValue, n, d)
	}
}
