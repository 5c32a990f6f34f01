package engine

import (
	"fmt"
	"slices"
	"strings"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// Stall kinds (StallEvidence.kind).
const (
	StallRepeatedFailingStep = "repeated_failing_step"
	StallNoProgress          = "no_progress"
	StallOscillatingPlan     = "oscillating_plan"
)

// stalled checks a new plan revision p against the run's progress ledger
// (Config.StallLimit = n; 0 disables the detection) and returns the
// evidence when the run makes no progress:
//
//   - a step of p (same tool, same planned arguments) already failed in n
//     earlier revisions;
//   - n replans happened since the last step succeeded;
//   - p's steps are those of n earlier revisions (the planner oscillates).
func (e *Engine) stalled(run *planexv1.Run, p *planexv1.Plan) *planexv1.StallEvidence {
	n := e.cfg.StallLimit
	if n <= 0 {
		return nil
	}
	for _, s := range p.GetSteps() {
		if runlog.Step(run, s.GetId()).GetStatus() == planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
			continue
		}
		if f := runlog.Failing(run, runlog.StepKey(s.GetTool(), s.GetArgs())); f != nil && len(f.GetRevisions()) >= n {
			return &planexv1.StallEvidence{
				Kind: StallRepeatedFailingStep, Revisions: append(slices.Clone(f.GetRevisions()), p.GetRevision()),
				Steps: []string{fmt.Sprintf("%s (%s)", s.GetId(), s.GetTool())}, Limit: int32(n),
			}
		}
	}
	l := run.GetProgress()
	if int(l.GetReplansSinceSuccess()) >= n {
		var revs []int32
		for _, rp := range run.GetPlans() {
			revs = append(revs, rp.GetRevision())
		}
		var steps []string
		for _, f := range l.GetFailing() {
			steps = append(steps, fmt.Sprintf("%s (%s)", f.GetStepId(), f.GetTool()))
		}
		return &planexv1.StallEvidence{Kind: StallNoProgress, Revisions: lastN(revs, n), Steps: steps, Limit: int32(n)}
	}
	h := runlog.PlanHash(p)
	var same []int32
	for i, ph := range l.GetPlanHashes() {
		if ph == h && i < len(run.GetPlans()) {
			same = append(same, run.GetPlans()[i].GetRevision())
		}
	}
	if len(same) >= n {
		return &planexv1.StallEvidence{Kind: StallOscillatingPlan, Revisions: append(same, p.GetRevision()), Limit: int32(n)}
	}
	return nil
}

func lastN(s []int32, n int) []int32 {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// finishStalled stops the run ESCALATED with STOP_REASON_STALLED and the
// evidence.
func finishStalled(tx *runlog.Tx, ev *planexv1.StallEvidence) error {
	var what string
	switch ev.GetKind() {
	case StallRepeatedFailingStep:
		what = fmt.Sprintf("the planner planned again step %s, which already failed in revisions %s", strings.Join(ev.GetSteps(), ", "), revisions(ev.GetRevisions()[:len(ev.GetRevisions())-1]))
	case StallNoProgress:
		what = fmt.Sprintf("%d replans without a newly succeeded step (revisions %s)", ev.GetLimit(), revisions(ev.GetRevisions()))
	default:
		what = fmt.Sprintf("the plan repeats revisions %s", revisions(ev.GetRevisions()[:len(ev.GetRevisions())-1]))
	}
	return tx.Emit(Event(&planexv1.RunFinished{
		Status: planexv1.RunStatus_RUN_STATUS_ESCALATED, StopReason: planexv1.StopReason_STOP_REASON_STALLED,
		Message: fmt.Sprintf("stalled (limit %d): %s", ev.GetLimit(), what), Stall: ev,
	}))
}

func revisions(revs []int32) string {
	s := make([]string, len(revs))
	for i, r := range revs {
		s[i] = fmt.Sprint(r)
	}
	return strings.Join(s, ", ")
}
