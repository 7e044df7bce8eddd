package simulate

import (
	"context"
	"fmt"
)

// MaxKeys is the most distinct counter keys a trace may have. A simulation
// holds every key's state three times (the memory store of a candidate, the
// exact log, the report's counts), about 400 bytes a key: 10 million keys
// took 4 GB. A trace beyond it is refused with an error naming the cap
// (KeyCapError), at the row that crossed it, before that memory is spent.
const MaxKeys = 1_000_000

// KeyCapError is a trace with more than Max distinct keys, found at Line
// of the CSV file Name (0 for a generated trace).
type KeyCapError struct {
	Name string
	Line int
	Max  int
}

// Error names the trace, the line and the cap.
func (e *KeyCapError) Error() string {
	where := e.Name
	if e.Line > 0 {
		where = fmt.Sprintf("%s:%d", e.Name, e.Line)
	}
	return fmt.Sprintf("%s: more than %d distinct keys, rls simulate's cap (simulate.MaxKeys): simulate one rule's keys, or a sample of them", where, e.Max)
}

// checkEvery is how many events (or CSV rows) pass between two looks at
// the context: cheap, and well under a millisecond of work.
const checkEvery = 4096

// keySet interns a trace's keys (events of one key share one string) and
// refuses more than max of them.
type keySet struct {
	seen   map[string]string
	max    int
	events int
}

// add returns the key of the event at line, k's interned copy, or a
// *KeyCapError when k would be key max+1, or ctx's error when ctx is done
// (looked at every checkEvery events).
func (s *keySet) add(ctx context.Context, k, name string, line int) (string, error) {
	if s.events++; s.events%checkEvery == 0 && ctx.Err() != nil {
		return "", fmt.Errorf("%s:%d: %w", name, line, ctx.Err())
	}
	if own, ok := s.seen[k]; ok {
		return own, nil
	}
	if len(s.seen) >= s.max {
		return "", &KeyCapError{Name: name, Line: line, Max: s.max}
	}
	s.seen[k] = k
	return k, nil
}

// RunAll runs each trace in turn (Run). When ctx is done it returns
// the reports of the traces finished, and an error saying so; when a trace
// fails, nil and its error.
func RunAll(ctx context.Context, traces []Trace, l Limit, cands []Candidate) ([]*Report, error) {
	reps := make([]*Report, 0, len(traces))
	for i, tr := range traces {
		rep, err := Run(ctx, tr, l, cands)
		if err != nil && ctx.Err() != nil {
			return reps, fmt.Errorf("stopped (%w) during %s: the reports of %d of %d traces are written", ctx.Err(), tr.Name, i, len(traces))
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tr.Name, err)
		}
		reps = append(reps, rep)
	}
	return reps, nil
}
