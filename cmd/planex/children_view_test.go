package main

import (
	"strings"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// runs get lists a run's children under the step that started them, with
// their status and spend, and a child names its parent.
func TestRenderRunChildren(t *testing.T) {
	parent := &planexv1.Run{
		Id: "P", Status: planexv1.RunStatus_RUN_STATUS_RUNNING, Goal: "parent",
		Usage: &planexv1.BudgetUsage{Steps: 3, Tokens: 30},
		Children: []*planexv1.ChildRun{
			{RunId: "C1", StepId: "c1", Attempt: 1, Status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, StopReason: planexv1.StopReason_STOP_REASON_SUCCEEDED, Usage: &planexv1.BudgetUsage{Steps: 2, Tokens: 15}},
			{RunId: "C2", StepId: "c2", Attempt: 1, Status: planexv1.RunStatus_RUN_STATUS_FAILED, StopReason: planexv1.StopReason_STOP_REASON_NO_DATA, Usage: &planexv1.BudgetUsage{Steps: 1, Tokens: 20}},
			{RunId: "C3", StepId: "c2", Attempt: 2, Budget: &planexv1.Budget{MaxSteps: 5, MaxTokens: 100}},
		},
		ChildrenUsage: &planexv1.BudgetUsage{Steps: 3, Tokens: 35},
	}
	got := renderRun(parent)
	for _, want := range []string{
		"children:\n├─ step c1\n│  └─ attempt 1: run C1  succeeded  (2 steps, 15 tokens)\n",
		"└─ step c2\n   ├─ attempt 1: run C2  failed (no_data)  (1 steps, 20 tokens)\n   └─ attempt 2: run C3  running  (budget 5 steps, 100 tokens)\n",
		"spent: 6 steps, 65 tokens (own 3, 30; children 3, 35)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("renderRun lacks\n%s\ngot:\n%s", want, got)
		}
	}
	child := renderRun(&planexv1.Run{Id: "C1", Goal: "child", ParentRunId: "P", ParentStepId: "c1", ParentAttempt: 1})
	if !strings.Contains(child, "child of: P, step c1 (attempt 1)\n") {
		t.Errorf("a child's view does not name its parent:\n%s", child)
	}
}
