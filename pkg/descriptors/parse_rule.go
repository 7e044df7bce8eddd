package descriptors

import (
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/rls-project/rls/pkg/store"
)

// rule parses the rate_limit of the descriptor at nodePath and records it;
// nil when it is not a mapping. levelShare holds the share_threshold
// patterns of the descriptor's levels.
func (p *parser) rule(rf field, nodePath string, fl descFlags, levelShare []string, levelMetric []metricLevel) *Rule {
	r := p.rateLimit(rf)
	if r == nil {
		return nil
	}
	r.Path, r.File, r.Line = nodePath, p.file, rf.key.Line
	var sp strings.Builder
	for i, m := range levelMetric {
		if i > 0 {
			sp.WriteByte('.')
		}
		sp.WriteString(m.key)
		if m.fixed != "" {
			sp.WriteByte('_')
			sp.WriteString(m.fixed)
		}
	}
	r.statsPath = sp.String()
	r.ShadowMode, r.DetailedMetric, r.QuotaMode = fl.shadow, fl.detailed, fl.quota
	for _, s := range levelShare {
		if s != "" {
			r.share = levelShare
			break
		}
	}
	for _, m := range levelMetric {
		if m.runtime {
			r.metric = levelMetric
			break
		}
	}
	p.rules = append(p.rules, r)
	return r
}

// rateLimit parses a rate_limit mapping; nil when it is not a mapping.
func (p *parser) rateLimit(rf field) *Rule {
	fs := p.mapping(rf.val, "rate_limit", rateLimitFields)
	if fs == nil {
		return nil
	}
	r := &Rule{}
	if f, ok := fs["unlimited"]; ok {
		r.Unlimited = p.boolean(f, "unlimited")
	}
	if f, ok := fs["name"]; ok {
		r.Name, _ = p.str(f, "name")
	}
	p.limit(rf, fs, r)
	if f, ok := fs["replaces"]; ok {
		r.Replaces = p.replaces(f, r.Name)
	}
	p.algorithm(fs, r)
	p.split(fs, r)
	p.response(fs, r)
	if f, ok := fs["on_error"]; ok {
		r.OnError = p.onError(f)
	}
	if f, ok := fs["reserve"]; ok {
		r.NoReserve = !p.boolean(f, "reserve")
	}
	p.scope(fs, r)
	return r
}

// limit parses a rate_limit's unit, unit_multiplier and requests_per_unit
// into r: unit and requests_per_unit are required unless r is unlimited,
// and all three are forbidden when it is.
func (p *parser) limit(rf field, fs map[string]field, r *Rule) {
	uf, hasUnit := fs["unit"]
	if hasUnit {
		r.Unit = p.unit(uf)
	}
	mf, hasMult := fs["unit_multiplier"]
	if hasMult {
		p.multiplier(mf, r)
	}
	rpuf, hasRPU := fs["requests_per_unit"]
	if hasRPU {
		r.RequestsPerUnit, _ = p.uint32Field(rpuf, "requests_per_unit")
	}
	if !r.Unlimited {
		if !hasUnit {
			p.errorf(rf.key, "unit", "missing; required unless unlimited is true")
		}
		return
	}
	if hasUnit {
		p.errorf(uf.key, "unit", "must not be set when unlimited is true")
	}
	if hasMult {
		p.errorf(mf.key, "unit_multiplier", "must not be set when unlimited is true")
	}
	if hasRPU {
		p.errorf(rpuf.key, "requests_per_unit", "must not be set when unlimited is true")
	}
}

// unit parses a unit field; 0 (invalid) after an error.
func (p *parser) unit(f field) Unit {
	s, ok := p.str(f, "unit")
	if !ok {
		return 0
	}
	u, ok := ParseUnit(s)
	if !ok {
		p.errorf(f.val, "unit", "invalid unit %q; choices are second, minute, hour, day, week, month, year", s)
	}
	return u
}

// multiplier parses a rate_limit's unit_multiplier into r: at least 1,
// and a window (unit times multiplier) of at most MaxWindow. r.Unit is
// already parsed; an invalid unit is reported there.
func (p *parser) multiplier(f field, r *Rule) {
	n, ok := p.uint32Field(f, "unit_multiplier")
	if !ok {
		return
	}
	r.UnitMultiplier = n
	if _, ok := r.Unit.Window(n); n == 0 || (!ok && r.Unit.Valid()) {
		p.errorf(f.val, "unit_multiplier", "%s", WindowError(r.Unit, n))
	}
}

// precision parses a rate_limit's precision and strict into r.
func (p *parser) precision(fs map[string]field, r *Rule) {
	if f, ok := fs["precision"]; ok {
		if r.Algorithm != store.SlidingWindow {
			p.errorf(f.key, "precision", "only valid with algorithm: sliding_window (the default)")
		} else if n, ok := p.uint32Field(f, "precision"); ok {
			if n < 1 || n > store.MaxPrecision {
				p.errorf(f.val, "precision", "must be 1 to %d sub-windows per window, got %d", store.MaxPrecision, n)
			}
			r.Precision = n
		}
	}
	if f, ok := fs["strict"]; ok {
		if r.Strict = p.boolean(f, "strict"); r.Strict && r.Precision < 2 {
			p.errorf(f.key, "strict", "only valid with a sliding_window of precision 2 or more (it counts the oldest sub-window whole)")
		}
	}
}

// algorithm parses a rate_limit's algorithm and burst into r. A rule that
// names no algorithm is validated as a sliding window (so what is valid
// does not depend on the default) and then gets the parser's default
// algorithm, unless it sets precision, which asks for a sliding window.
func (p *parser) algorithm(fs map[string]field, r *Rule) {
	defer func() {
		_, named := fs["algorithm"]
		_, precise := fs["precision"]
		if !named && !precise {
			r.Algorithm = p.defaultAlg
		}
	}()
	if f, ok := fs["algorithm"]; ok {
		if s, ok := p.str(f, "algorithm"); ok {
			if a, ok := store.ParseAlgorithm(s); ok {
				r.Algorithm = a
			} else {
				p.errorf(f.val, "algorithm", "invalid algorithm %q; choices are sliding_window, token_bucket, fixed_window", s)
			}
		}
	}
	p.precision(fs, r)
	f, ok := fs["burst"]
	if !ok {
		return
	}
	if r.Algorithm != store.TokenBucket {
		p.errorf(f.key, "burst", "only valid with algorithm: token_bucket")
	} else if b, ok := p.uint32Field(f, "burst"); ok {
		if b < 1 {
			p.errorf(f.val, "burst", "must be at least 1")
		}
		r.Burst = b
	}
}

// response parses a rate_limit's response_body and content_type into r.
func (p *parser) response(fs map[string]field, r *Rule) {
	if f, ok := fs["response_body"]; ok {
		if s, ok := p.str(f, "response_body"); ok {
			r.ResponseBody = s
		}
	}
	f, ok := fs["content_type"]
	if !ok {
		return
	}
	s, ok := p.str(f, "content_type")
	if !ok {
		return
	}
	if _, hasBody := fs["response_body"]; !hasBody {
		p.errorf(f.key, "content_type", "only valid with response_body")
	} else if s == "" || strings.ContainsAny(s, "\r\n") {
		p.errorf(f.val, "content_type", "must be a non-empty single-line media type")
	}
	r.ContentType = s
}

// onError parses an on_error field; OnErrorDefault after an error.
func (p *parser) onError(f field) OnError {
	s, ok := p.str(f, "on_error")
	if !ok {
		return OnErrorDefault
	}
	switch strings.ToLower(s) {
	case "fail_open":
		return OnErrorFailOpen
	case "fail_closed":
		return OnErrorFailClosed
	}
	p.errorf(f.val, "on_error", "invalid value %q; choices are fail_open, fail_closed", s)
	return OnErrorDefault
}

// replaces parses a replaces list of {name: X} mappings.
func (p *parser) replaces(f field, own string) []string {
	seq := resolve(f.val)
	if seq.Kind == yaml.ScalarNode && seq.Tag == "!!null" {
		return nil
	}
	if seq.Kind != yaml.SequenceNode {
		p.errorf(seq, "replaces", "must be a list of {name: ...}, got %s", kindName(seq))
		return nil
	}
	var names []string
	for _, item := range seq.Content {
		item = resolve(item)
		fs := p.mapping(item, "replaces", replacesFields)
		if fs == nil {
			continue
		}
		nf, ok := fs["name"]
		if !ok {
			p.errorf(item, "replaces", "entry has no name")
			continue
		}
		name, ok := p.str(nf, "name")
		switch {
		case !ok:
		case name == "":
			p.errorf(nf.val, "replaces", "entry has an empty name")
		case name == own:
			p.errorf(nf.val, "replaces", "names the rule's own name %q", name)
		default:
			names = append(names, name)
		}
	}
	return names
}
