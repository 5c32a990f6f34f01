package runlog_test

import (
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// A child's dispatch records it in its parent; its end is charged once,
// even when recorded again, and also for a child whose step a replan
// dropped.
func TestFoldChildRuns(t *testing.T) {
	childDispatch := func(step, child string, attempt int32) *planexv1.RunEvent {
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{
			StepId: step, Attempt: attempt, PlanRevision: 1, Tool: "run.child",
			Child: &planexv1.ChildStart{RunId: child, Budget: &planexv1.Budget{MaxSteps: 4, MaxTokens: 100}},
		}}}
	}
	ended := func(step, child string, attempt, steps int32, tokens int64) *planexv1.RunEvent {
		return &planexv1.RunEvent{Payload: &planexv1.RunEvent_ChildRunFinished{ChildRunFinished: &planexv1.ChildRunFinished{
			ChildRunId: child, StepId: step, Attempt: attempt, Status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED,
			StopReason: planexv1.StopReason_STOP_REASON_SUCCEEDED, Usage: &planexv1.BudgetUsage{Steps: steps, Tokens: tokens},
		}}}
	}
	run := build(t, planexv1.PlanningMode_PLANNING_MODE_FULL,
		planEv(1, &planexv1.PlanLineage{Added: []string{"a", "b"}}, st("a"), st("b")),
		childDispatch("a", "CHILDA", 1),
		childDispatch("b", "CHILDB", 1),
	)
	if got := stepOf(run, "a").GetChildRunId(); got != "CHILDA" {
		t.Fatalf("step a child_run_id %q", got)
	}
	if s, tok := runlog.ChildrenCommitted(run); s != 8 || tok != 200 {
		t.Fatalf("committed to running children: %d steps, %d tokens; want their budgets 8, 200", s, tok)
	}
	run = build(t, planexv1.PlanningMode_PLANNING_MODE_FULL,
		planEv(1, &planexv1.PlanLineage{Added: []string{"a", "b"}}, st("a"), st("b")),
		childDispatch("a", "CHILDA", 1),
		childDispatch("b", "CHILDB", 1),
		ended("a", "CHILDA", 1, 2, 30),
		ended("a", "CHILDA", 1, 2, 30), // recorded again: no second charge
		planEv(2, &planexv1.PlanLineage{PreviousRevision: 1, Kept: []string{"a"}, Dropped: []string{"b"}}, st("a")),
		ended("b", "CHILDB", 1, 1, 7), // dropped, cancelled: charged all the same
	)
	if u := run.GetChildrenUsage(); u.GetSteps() != 3 || u.GetTokens() != 37 {
		t.Fatalf("children_usage %v, want 3 steps, 37 tokens", u)
	}
	for _, c := range run.GetChildren() {
		if c.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
			t.Fatalf("child %s recorded as %s", c.GetRunId(), c.GetStatus())
		}
	}
}
