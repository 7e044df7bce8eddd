// Package simtest holds what tests of the simulator need and rls simulate
// does not: replaying a trace in lockstep with a running service's
// verdicts.
package simtest

import (
	"context"
	"fmt"

	"github.com/rls-project/rls/pkg/simulate"
)

// Follow replays tr through candidate c in lockstep with decisions made
// elsewhere (a running service's verdicts, ok): each event is decided from
// the state that ok's admissions left, and the state is then made what ok
// says (hits the candidate denied but ok admitted are added as a forced
// write-back; hits it admitted but ok denied are refunded). It returns
// the indexes of the events c decides differently from ok. A divergence
// thus never cascades into the decisions after it.
func Follow(tr simulate.Trace, l simulate.Limit, c simulate.Candidate, ok []bool) ([]int, error) {
	if len(ok) != len(tr.Events) {
		return nil, fmt.Errorf("%d verdicts for %d events", len(ok), len(tr.Events))
	}
	var diff []int
	err := simulate.Replay(context.Background(), tr, l, c, func(i int, allowed bool) (force, refund bool) {
		if allowed == ok[i] {
			return false, false
		}
		diff = append(diff, i)
		return ok[i], allowed
	})
	return diff, err
}
