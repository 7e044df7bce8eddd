package upstreamstats

import "math"

// Counts are the hits one descriptor decision adds to each of a rule's
// stats, as envoyproxy/ratelimit's base limiter counts them: in hits, not
// decisions, with near_limit counting only the hits between the near-limit
// threshold and the limit.
type Counts struct {
	TotalHits, WithinLimit, NearLimit, OverLimit, OverLimitWithLocalCache, ShadowMode uint64
}

// Decision is what Account needs of one decision.
type Decision struct {
	Limit      uint64 // requests_per_unit
	Hits       uint64
	Before     uint64 // the count before this decision's hits
	Over       bool   // over the limit (denied, or shadow)
	LocalCache bool   // denied by the local over-limit cache
	Shadow     bool   // the rule is in shadow mode
}

// Account returns the counts of one decision, with upstream's arithmetic
// (src/limiter/base_limiter.go): near is floor(limit × ratio), computed in
// float32 as upstream does.
func Account(d Decision, ratio float64) Counts {
	c := Counts{TotalHits: d.Hits}
	after := d.Before + d.Hits
	near := uint64(math.Floor(float64(float32(d.Limit) * float32(ratio))))
	switch {
	case d.LocalCache:
		c.OverLimit, c.OverLimitWithLocalCache = d.Hits, d.Hits
	case d.Over && d.Before >= d.Limit:
		c.OverLimit = d.Hits
	case d.Over:
		c.OverLimit = after - d.Limit
		c.NearLimit = d.Limit - max(near, d.Before)
	default:
		c.WithinLimit = d.Hits
		if after > near {
			c.NearLimit = min(d.Hits, after-near)
		}
	}
	if d.Over && d.Shadow {
		c.ShadowMode = c.OverLimit
	}
	return c
}
