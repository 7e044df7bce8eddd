package service

import (
	"time"

	"errors"
	"fmt"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store"
)

// resolution is a request resolved against a config: per descriptor, the
// rule it matched, the rule that counts once replaces apply, and its
// limiter item. It is reused across calls (see Service.pool).
type resolution struct {
	matched []*descriptors.Rule // per descriptor: the rule it matched; nil for none
	rules   []*descriptors.Rule // per descriptor: the rule counted; nil for none, or replaced
	index   []int               // per descriptor: its item's index in items; -1 when not counted
	items   []limiter.Item
	key     []byte
	// deadline is the request's (zero: none): a global rule's share is the
	// least of the windows its region's Redis may count it in by then.
	deadline time.Time
	// outcomes holds, per descriptor, what respond counted (for traces).
	outcomes []Outcome
}

// item returns descriptor i's limiter item, or nil when it is not counted.
func (res *resolution) item(i int) *limiter.Item {
	if res.index[i] < 0 {
		return nil
	}
	return &res.items[res.index[i]]
}

// resolve checks req against the request bounds and resolves it against
// cfg: each descriptor's rule (a limit override makes its own), the
// replaces between them, and the store check of each counted descriptor.
// It is the one path from a request to checks, for ShouldRateLimit and the
// admin API. A request beyond a bound, or that cannot be decided, is a
// badRequest.
func (s *Service) resolve(cfg *descriptors.Config, req *rlsv3.RateLimitRequest, res *resolution) error {
	if err := validateRequest(req, &s.opts.Limits); err != nil {
		return badRequest{err}
	}
	if s.opts.RefuseRefunds {
		if err := refuseRefunds(req); err != nil {
			return badRequest{err}
		}
	}
	res.match(cfg, req)

	reqHits := uint64(req.HitsAddend)
	if reqHits == 0 {
		reqHits = 1
	}
	res.items, res.index = res.items[:0], res.index[:0]
	for i, d := range req.Descriptors {
		r := res.rules[i]
		if r == nil || r.Unlimited {
			res.index = append(res.index, -1)
			continue
		}
		hits := reqHits
		if d.HitsAddend != nil {
			hits = d.HitsAddend.Value
		}
		// A split rule counts this request on one of its sub-keys, in
		// turn (docs/redis.md, "Hot keys: split"); a refund goes back to the
		// sub-key the last charge went to.
		var sub int
		if d.IsNegativeHits {
			sub = r.RefundSub(req.Domain, d.Entries)
		} else {
			sub = r.NextSub(req.Domain, d.Entries)
		}
		res.key = descriptors.AppendSubKey(append(res.key[:0], s.opts.KeyPrefix...), req.Domain, d.Entries, r, sub)
		if s.upstreamKeyed(r) { // a rolling update from upstream shares its counters
			res.key = appendUpstreamKey(append(res.key[:0], s.opts.KeyPrefix...), req.Domain, d.Entries, r)
		}
		c := ruleCheck(r, string(res.key), sub)
		c.Hits, c.Refund = hits, d.IsNegativeHits
		// The global shadow mode makes every check a shadow. A quota
		// descriptor denies the request only with all the others (the
		// limiter's rule; it refunds what a denied request consumed).
		c.Shadow = c.Shadow || s.opts.ShadowMode
		if r.Global {
			c = s.share(r, c, res.deadline) // the region's share (global.go)
		}
		res.index = append(res.index, len(res.items))
		// Upstream's keys count as upstream does (INCRBY), which a reservation's
		// shadow check does not fit: they are decided request by request.
		res.items = append(res.items, limiter.Item{Check: c, FailClosed: s.failClosed(r), Quota: s.quotaMode(r), NoReserve: r.NoReserve || s.upstreamKeyed(r)})
	}
	return nil
}

// ErrRefundsOff is the error of a refund (is_negative_hits) refused by
// Options.RefuseRefunds.
var ErrRefundsOff = errors.New("refunds (is_negative_hits) are not allowed by this server")

// refuseRefunds returns ErrRefundsOff, naming the first descriptor of req
// that asks for a refund by its index and entry keys, or nil.
func refuseRefunds(req *rlsv3.RateLimitRequest) error {
	for i, d := range req.Descriptors {
		if !d.IsNegativeHits {
			continue
		}
		keys := make([]string, len(d.Entries))
		for j, e := range d.Entries {
			keys[j] = printable(e.Key)
		}
		return fmt.Errorf("descriptors[%d] (%s): %w", i, strings.Join(keys, ", "), ErrRefundsOff)
	}
	return nil
}

// quotaMode reports whether r is a quota descriptor: it denies a request
// only when every quota descriptor of the request is over its limit
// (envoyproxy/ratelimit's quota_mode and QUOTA_MODE).
func (s *Service) quotaMode(r *descriptors.Rule) bool {
	return (r.QuotaMode || s.opts.QuotaMode) && !r.ShadowMode
}

// failClosed reports whether r denies, rather than falls back to the local
// share, when the store cannot answer. A scope: global rule that sets no
// on_error fails closed: what a local bucket admits is counted only later,
// outside the share the world's bound rests on (docs/global.md).
func (s *Service) failClosed(r *descriptors.Rule) bool {
	return r.OnError == descriptors.OnErrorFailClosed || (r.OnError == descriptors.OnErrorDefault && (s.opts.FailClosed || r.Global))
}

// ruleCheck returns the store check of rule r at key, the key of its
// sub-key sub (0 without split), consuming nothing (the caller sets Hits
// and Refund): a sub-key's limit and burst are its shares of the rule's. It
// is the one place where a rule becomes a store check.
func ruleCheck(r *descriptors.Rule, key string, sub int) store.Check {
	limit, burst := r.SubLimit(sub)
	return store.Check{
		Key:       key,
		Algorithm: r.Algorithm,
		Limit:     uint64(limit),
		Window:    r.Window(),
		Burst:     uint64(burst),
		Precision: uint8(r.Precision), // at most store.MaxPrecision
		Strict:    r.Strict && r.Precision >= 2,
		Shadow:    r.ShadowMode,
	}
}

// wholeRemaining is the whole key's remaining budget that a split rule r
// reports, from rem, the remaining of the sub-key check c counted on: rem
// scaled by the whole capacity over the sub-key's share (requests_per_unit,
// or a token bucket's burst). It is exact when every sub-key has as much
// left, which the round robin keeps close; reading them all would cost N
// store calls. Without split it is rem.
func wholeRemaining(r *descriptors.Rule, c *store.Check, rem uint64) uint64 {
	if r.Splits() <= 1 {
		return rem
	}
	share, whole := c.Limit, uint64(r.RequestsPerUnit)
	if c.Algorithm == store.TokenBucket && c.Burst > 0 {
		share, whole = c.Burst, uint64(r.Burst)
	}
	if share == 0 {
		return rem
	}
	return min(rem, share) * whole / share // both at most 2^32: no overflow
}

// badRequest marks an error the caller made: InvalidArgument.
type badRequest struct{ error }

func (e badRequest) Unwrap() error { return e.error }

// match sets res.matched to the rule each descriptor of req matches (its
// override's, where it carries a limit) and res.rules to them after
// replaces.
func (res *resolution) match(cfg *descriptors.Config, req *rlsv3.RateLimitRequest) {
	res.matched, res.rules = res.matched[:0], res.rules[:0]
	for _, d := range req.Descriptors {
		var r *descriptors.Rule
		if l := d.Limit; l != nil {
			r = cfg.MatchOverride(req.Domain, d.Entries, l.RequestsPerUnit, descriptors.Unit(l.Unit), l.GetUnitMultiplier().GetValue())
		} else {
			r = cfg.Match(req.Domain, d.Entries)
		}
		res.matched = append(res.matched, r)
	}
	res.rules = append(res.rules, res.matched...)
	descriptors.ApplyReplaces(res.rules)
}
