package rlqs

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
)

// Action is what a BucketId that matches no rule gets.
type Action uint8

// The actions for unmatched buckets.
const (
	Allow   Action = iota // ALLOW_ALL for Options.Period
	Deny                  // DENY_ALL for Options.Period
	Abandon               // AbandonAction: Envoy forgets the bucket
)

// ParseAction parses "allow", "deny" or "abandon".
func ParseAction(s string) (Action, error) {
	switch s {
	case "allow":
		return Allow, nil
	case "deny":
		return Deny, nil
	case "abandon":
		return Abandon, nil
	}
	return 0, fmt.Errorf("unmatched bucket action %q: want allow, deny or abandon", s)
}

// Resolver resolves a domain's descriptor entries to the store check
// ShouldRateLimit would make (service.Service implements it).
type Resolver interface {
	Config() *descriptors.Config
	BucketCheck(domain string, entries []*rlcommon.RateLimitDescriptor_Entry) (store.Check, *descriptors.Rule, bool, error)
}

// Options configure a Server. Zero fields take the defaults in brackets.
type Options struct {
	Store    store.Store
	Resolver Resolver
	// Unmatched is what a BucketId that maps to no rule gets [Allow].
	Unmatched Action
	// IdleReports abandons a bucket after this many reports in a row with
	// no requests [3].
	IdleReports int
	// MaxBuckets bounds the buckets of one stream; more are abandoned [1000].
	MaxBuckets int
	// StreamsPerConn bounds the open streams of one connection; more are
	// refused ResourceExhausted [64: Envoy opens one per domain and filter
	// config]. Streams are counted by their peer's address: a TCP
	// connection's, or a Unix-socket connection's as connguard names it
	// (other Unix-socket peers, which share one address, are not counted).
	StreamsPerConn int
	// MaxReportBytes bounds one report; a bigger one ends the stream
	// ResourceExhausted [256 KiB, under the gRPC port's 1 MiB message cap].
	MaxReportBytes int
	// Period is the TTL of grants of token-bucket rules and of blanket
	// answers, a whole number of seconds [2s].
	Period time.Duration
	// Overlap bounds how long after a window's end an Envoy may still
	// apply the window's grant (the delivery of the next one); the next
	// window is charged for it [40ms].
	Overlap time.Duration
	// MinShare is the least grant, in hits per window, of a bucket with
	// demand while the rule has budget [1].
	MinShare uint64
	// Fleet returns the number of rls replicas sharing the store; without
	// Demand (or when it fails) each takes the limit over this number as
	// its part, and divides that among its own streams by their demand [1].
	Fleet func() int
	// Demand shares this replica's demand for a counter (hits per second
	// over its streams of the key) with the other replicas for ttl, and
	// returns the fleet's, this replica's included; 0 withdraws it. Each
	// replica's part of a limit then follows its share of the fleet's
	// demand [nil: the limit over Fleet].
	Demand func(ctx context.Context, key string, demand float64, ttl time.Duration) (float64, error)
	// SendWait is how long a client may leave a response unread (its
	// flow-control window full) before its stream is cut
	// ResourceExhausted [10s].
	SendWait time.Duration
	// MemoryBudget bounds, in bytes, what every stream holds together: the
	// reports being decoded and handled, the BucketIds of the buckets
	// subscribed, the responses not yet sent; a stream holds at most a
	// quarter of it. The stream that would pass it ends ResourceExhausted,
	// naming it [64 MiB].
	MemoryBudget int64
	// SilentMin is the least time a stream may send no report before it is
	// ended Unavailable; it is ended after two of its reporting intervals
	// otherwise (the longest between two reports of a bucket; 15 s before
	// a bucket's second report) [10s].
	SilentMin time.Duration
	// StoreTimeout bounds one store call [1s].
	StoreTimeout time.Duration
	// Now is the clock of grants, windows and demand [time.Now]; the
	// store's clock must agree with it (windows are the store's).
	Now     func() time.Time
	Metrics *Metrics
	Log     *slog.Logger
}

func (o *Options) defaults() {
	if o.IdleReports <= 0 {
		o.IdleReports = 3
	}
	if o.MaxBuckets <= 0 {
		o.MaxBuckets = 1000
	}
	if o.StreamsPerConn <= 0 {
		o.StreamsPerConn = 64
	}
	if o.MaxReportBytes <= 0 {
		o.MaxReportBytes = 256 << 10
	}
	if o.Period <= 0 {
		o.Period = 2 * time.Second
	}
	o.Period = time.Duration(wholeSeconds(o.Period)) * time.Second
	if o.Overlap <= 0 {
		o.Overlap = 40 * time.Millisecond
	}
	if o.MinShare == 0 {
		o.MinShare = 1
	}
	if o.Fleet == nil {
		o.Fleet = func() int { return 1 }
	}
	if o.SendWait <= 0 {
		o.SendWait = 10 * time.Second
	}
	if o.MemoryBudget <= 0 {
		o.MemoryBudget = 64 << 20
	}
	if o.SilentMin <= 0 {
		o.SilentMin = 10 * time.Second
	}
	if o.StoreTimeout <= 0 {
		o.StoreTimeout = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}
