package descriptors

import (
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rls-project/rls/pkg/store"
)

// Rule is one configured limit (the rate_limit of a descriptor) or a limit
// made from a request's override. Rules returned by Config.Match are shared
// between goroutines and must be treated as read-only.
type Rule struct {
	Name            string // rate_limit.name, may be empty
	Unit            Unit
	UnitMultiplier  uint32 // units per window (unit_multiplier); 0 or 1: one unit
	RequestsPerUnit uint32 // requests per window: per UnitMultiplier units
	Unlimited       bool   // never limited: answer OK without counting
	Algorithm       store.Algorithm
	Burst           uint32 // token bucket capacity as configured; 0 means RequestsPerUnit
	Precision       uint32 // sliding window sub-windows (2..MaxPrecision); 0 or 1: the two-counter window
	Strict          bool   // sliding window of precision >= 2: the oldest sub-window counts whole
	Split           uint32 // sub-keys a key's counter is spread over (1..MaxSplit, see Splits); 0 or 1: none
	OnError         OnError
	// NoReserve keeps the rule's keys off leases (reserve: false):
	// every request goes to the store.
	NoReserve bool
	// Global is scope: global: one limit across regions, decided in each
	// region against its share (pkg/global, docs/global.md).
	Global         bool
	ShadowMode     bool
	DetailedMetric bool
	QuotaMode      bool     // the descriptor's quota_mode flag, carried for the service
	Replaces       []string // names of the limits this one replaces
	ResponseBody   string   // body of the 429 when this rule denies (raw_body); may be empty
	ContentType    string   // content-type of ResponseBody; empty means Envoy's default
	Domain         string
	Path           string // place in the YAML: key or key=value per level, joined by '/'
	statsPath      string // the same as upstream's stats name it (StatsPath)
	File           string
	Line           int  // line of the rate_limit field in File
	Override       bool // made from a request's limit override (OverrideRule)
	// Metadata is the descriptor's metadata field, returned (merged with
	// the other passing descriptors') as the response's dynamic metadata
	// when the service is asked to; nil when absent.
	Metadata *structpb.Struct

	// share holds, per descriptor level, the wildcard pattern whose matches
	// share one counter (share_threshold), or "" for the request's value.
	// nil when no level shares.
	share []string
	// metric holds, per descriptor level, how value_to_metric names the
	// level in metrics; nil when no level has value_to_metric.
	metric []metricLevel
	// rr is the round robin over sub-keys of a split rule (NextSub); nil
	// without split. An override made from the rule shares it.
	rr *splitRR
}

// Window returns the rule's window: its unit's length times its
// unit_multiplier (0 for an invalid unit). A rule from Parse, or an override
// whose period Unit.Window accepted, is at most MaxWindow.
func (r *Rule) Window() time.Duration {
	return time.Duration(r.WindowSeconds()) * time.Second
}

// WindowSeconds returns the rule's window in seconds.
func (r *Rule) WindowSeconds() int64 {
	secs, _ := r.Unit.Window(r.UnitMultiplier)
	return secs
}

// ApplyReplaces implements envoyproxy/ratelimit's replaces: rules holds the
// rule matched for each descriptor of one request (nil entries allowed), and
// every rule whose non-empty Name is listed in the Replaces of any matched
// rule is set to nil. The replaced names are taken from all matched rules
// before any is removed, so the result does not depend on order. It does not
// allocate for up to 64 rules.
func ApplyReplaces(rules []*Rule) {
	var buf [64]bool
	drop := buf[:0]
	if len(rules) > len(buf) {
		drop = make([]bool, 0, len(rules))
	}
	for _, r := range rules {
		drop = append(drop, r != nil && r.Name != "" && replaced(rules, r.Name))
	}
	for i, d := range drop {
		if d {
			rules[i] = nil
		}
	}
}

// replaced reports whether any rule of rules lists name in its Replaces.
func replaced(rules []*Rule, name string) bool {
	for _, o := range rules {
		if o == nil {
			continue
		}
		for _, n := range o.Replaces {
			if n == name {
				return true
			}
		}
	}
	return false
}

// OverrideRule returns the rule for a request descriptor's limit override:
// RequestsPerUnit, Unit and UnitMultiplier (mult: 0 or 1 is one unit) come
// from the override and Override is true. The caller checks the period
// first (Unit.Window).
// Everything else (name, algorithm, on_error, shadow mode, detailed metric,
// replaces, place in the YAML) comes from base when base is not nil, except
// Burst, which is 0 so the capacity follows the override. With a nil base
// the rule has the defaults (sliding window, OnErrorDefault). Its counter key
// never equals a configured rule's or another override's (see AppendKey).
func OverrideRule(base *Rule, domain string, rpu uint32, unit Unit, mult uint32) *Rule {
	r := &Rule{Domain: domain}
	if base != nil {
		*r = *base
		r.Unlimited = false
		r.Burst = 0
		r.share = nil
		r.metric = nil
	}
	r.Domain = domain
	r.RequestsPerUnit = rpu
	r.Unit = unit
	r.UnitMultiplier = mult
	r.Override = true
	return r
}
