package simulate

import (
	"fmt"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
)

// Source is the rule a simulation counts by: a rule of a descriptor
// config, or a bare limit.
type Source struct {
	// Config holds the rules; nil simulates Limit.
	Config *descriptors.Config
	// Domain and Entries are the descriptor whose rule of Config is
	// simulated; an empty Domain picks Config's first limited rule.
	Domain  string
	Entries []*rlcommon.RateLimitDescriptor_Entry
	// Limit is the limit simulated without Config.
	Limit Limit
}

// OptionError is a Source that cannot be simulated: Option names the
// field ("Config", "Entries" for the descriptor, domain included, or
// "Limit"), Msg says what is wrong. The caller names the setting behind
// the field its own way (a flag, say).
type OptionError struct {
	Option string
	Msg    string
}

// Error is the message with the field's name.
func (e *OptionError) Error() string { return "simulate option " + e.Option + ": " + e.Msg }

// Setup is what a Source resolves to: the limit, the candidates to
// compare, and which counter each request counts against.
type Setup struct {
	Limit      Limit
	Candidates []Candidate
	// Key maps a CSV row's descriptor entries to its counter (ReadCSV);
	// with Config, rows whose descriptor matches another rule are skipped.
	Key KeyFunc
	// GenKey is the counter of generated events and of CSV rows without
	// entries.
	GenKey string
}

// NewSetup resolves src. The candidates are those of Candidates for
// precisions, with the rule's own configuration marked when src has a
// Config. Errors about src's fields are *OptionError; a rule whose limit
// the stores cannot count is an error naming its file and line.
func NewSetup(src Source, precisions []uint64) (*Setup, error) {
	if src.Config == nil {
		return limitSetup(src.Limit, precisions)
	}
	r, err := pickRule(src)
	if err != nil {
		return nil, err
	}
	l := Limit{Requests: uint64(r.RequestsPerUnit), Window: r.Window()}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("%s:%d: %v", r.File, r.Line, err)
	}
	own := Candidate{Algorithm: r.Algorithm, Precision: uint64(r.Precision), Strict: r.Strict, Burst: uint64(r.Burst)}
	cfg, domain, genKey := src.Config, r.Domain, r.Path
	if len(src.Entries) > 0 {
		genKey = string(descriptors.AppendKey(nil, domain, src.Entries, r))
	}
	return &Setup{Limit: l, Candidates: Candidates(l, precisions, &own), GenKey: genKey,
		Key: func(row []string) (string, bool) {
			if len(row) == 0 {
				return genKey, true
			}
			es := entries(row)
			if cfg.Match(domain, es) != r {
				return "", false
			}
			return string(descriptors.AppendKey(nil, domain, es, r)), true
		}}, nil
}

// limitSetup is the Setup of a bare limit: a CSV row's counter is its
// entries joined with '|', "sim" without entries.
func limitSetup(l Limit, precisions []uint64) (*Setup, error) {
	if err := l.Validate(); err != nil {
		return nil, &OptionError{Option: "Limit", Msg: err.Error()}
	}
	return &Setup{Limit: l, Candidates: Candidates(l, precisions, nil), GenKey: "sim",
		Key: func(row []string) (string, bool) {
			if len(row) == 0 {
				return "sim", true
			}
			return strings.Join(row, "|"), true
		}}, nil
}

// pickRule returns the rule of src.Config that src's descriptor matches,
// or without one the first limited rule.
func pickRule(src Source) (*descriptors.Rule, error) {
	if src.Domain == "" {
		for _, r := range src.Config.Rules() {
			if !r.Unlimited {
				return r, nil
			}
		}
		return nil, &OptionError{Option: "Config", Msg: "no limited rule in it"}
	}
	r := src.Config.Match(src.Domain, src.Entries)
	switch {
	case r == nil:
		return nil, &OptionError{Option: "Entries", Msg: "no rule of the config matches it"}
	case r.Unlimited:
		return nil, &OptionError{Option: "Entries", Msg: fmt.Sprintf("%s:%d is unlimited: nothing to simulate", r.File, r.Line)}
	}
	return r, nil
}

// entries turns a CSV row's "key=value" fields into descriptor entries.
func entries(row []string) []*rlcommon.RateLimitDescriptor_Entry {
	es := make([]*rlcommon.RateLimitDescriptor_Entry, len(row))
	for i, kv := range row {
		k, v, _ := strings.Cut(kv, "=")
		es[i] = &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	return es
}

// Generate returns the traces of the generator specs (see Generate),
// "standard" standing for StandardGenerators, with s's limit and GenKey.
func (s *Setup) Generate(specs []string, seed uint64) ([]Trace, error) {
	var out []Trace
	for _, spec := range specs {
		expanded := []string{spec}
		if spec == "standard" {
			expanded = StandardGenerators
		}
		for _, g := range expanded {
			tr, err := Generate(g, s.Limit.Requests, s.Limit.Window, seed, s.GenKey)
			if err != nil {
				return nil, err
			}
			out = append(out, tr)
		}
	}
	return out, nil
}
