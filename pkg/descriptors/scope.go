package descriptors

import "github.com/rls-project/rls/pkg/store"

// GlobalFlags names what a rule of scope: global needs, for its error when
// ParseOptions.Global is off.
const GlobalFlags = "rls serve's --region and --global-redis-url"

// scope parses a rate_limit's scope into r: region (the default: the limit
// holds per region's store) or global (one limit across regions, decided
// in each region against its share; docs/global.md). A global rule counts
// in windows, fixed or sliding, which shares divide; it has one counter per
// key (no split), and needs ParseOptions.Global. A global rule naming no
// algorithm is a sliding window whatever the default.
func (p *parser) scope(fs map[string]field, r *Rule) {
	f, ok := fs["scope"]
	if !ok {
		return
	}
	s, ok := p.str(f, "scope")
	if !ok {
		return
	}
	switch s {
	case "region":
		return
	case "global":
	default:
		p.errorf(f.val, "scope", "invalid scope %q; choices are region (the default) and global", s)
		return
	}
	if _, named := fs["algorithm"]; !named && r.Algorithm == store.TokenBucket {
		r.Algorithm = store.SlidingWindow // as precision does: the default never makes a file invalid
	}
	name := r.Name
	if name == "" {
		name = "(unnamed)"
	}
	switch {
	case r.Unlimited:
		p.errorf(f.key, "scope", "rule %s: must not be global when unlimited is true", name)
	case r.Algorithm == store.TokenBucket:
		p.errorf(f.key, "scope", "rule %s: global needs algorithm fixed_window or sliding_window (a token bucket has no windows to share)", name)
	case r.Split > 1:
		p.errorf(f.key, "scope", "rule %s: global and split do not combine (a share is of one counter)", name)
	case !p.global:
		p.errorf(f.key, "scope", "rule %s: scope: global needs %s", name, GlobalFlags)
	default:
		r.Global = true
	}
}
