package service

import (
	"time"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
	adminv1 "github.com/rls-project/rls/proto/rls/admin/v1"
)

// shareDescriber is a Shares that can say what a key's shares are (the
// admin API's Explain).
type shareDescriber interface {
	Describe(key string, limit uint64, window time.Duration) string
}

// shareNote sets e's note to what Shares says of the shares of key of a
// scope: global rule r; any other rule's note, or a Shares that cannot
// say, is left as it is.
func (s *Service) shareNote(e *adminv1.Explanation, r *descriptors.Rule, key string) {
	d, ok := s.opts.Shares.(shareDescriber)
	if ok && r != nil && r.Global {
		e.Note = d.Describe(key, uint64(r.RequestsPerUnit), r.Window())
	}
}

// Shares gives a scope: global rule's check its region's share of the
// limit (pkg/global's Table): Share sets c.Limit to the least share of the
// windows the check may be counted in, sent now and answered by deadline
// (zero: the store's own bound), and counts c's hits as the region's
// demand. It is on the request path and does no I/O.
type Shares interface {
	// Share is told the rule's domain and metric label (its name, else its
	// path), for metrics by rule.
	Share(domain, rule string, c *store.Check, deadline time.Time)
}

// share applies Options.Shares to the check c of a scope: global rule r
// and returns it: its limit becomes its region's share; without Shares
// (never with a config that has global rules: rls refuses one without
// --region) it is 0, so nothing is admitted beyond a share. The caller
// calls it for global rules only: c escapes to the heap here, and the other
// rules' checks must not (TestTracingOffAddsNoAllocation).
func (s *Service) share(r *descriptors.Rule, c store.Check, deadline time.Time) store.Check {
	if s.opts.Shares == nil {
		c.Limit = 0
		return c
	}
	s.opts.Shares.Share(r.Domain, ruleLabel(r), &c, deadline)
	return c
}
