package main

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

func TestRenderRunDrawsTheDAG(t *testing.T) {
	step := func(id, tool string, deps ...string) *planexv1.Step {
		return &planexv1.Step{Id: id, Tool: tool, DependsOn: deps}
	}
	run := &planexv1.Run{
		Id: "r1", Goal: "compare", Status: planexv1.RunStatus_RUN_STATUS_FAILED,
		StopReason: planexv1.StopReason_STOP_REASON_FAILED, StopMessage: "step b failed",
		Plans: []*planexv1.Plan{{Revision: 1}, {Revision: 2, Lineage: &planexv1.PlanLineage{Kept: []string{"a"}, Added: []string{"b"}}, Steps: []*planexv1.Step{
			step("a", "sql.query"), step("b", "sql.query"), step("c", "email.draft", "a"), step("j", "sql.query", "a", "b"),
		}}},
		Steps: []*planexv1.StepState{
			{StepId: "a", Status: planexv1.StepStatus_STEP_STATUS_SUCCEEDED, Duration: durationpb.New(1500000)},
			{StepId: "b", Status: planexv1.StepStatus_STEP_STATUS_FAILED, Attempt: 2, Error: &planexv1.StepError{Message: "no such column: region"}},
		},
	}
	got := renderRun(run)
	for _, want := range []string{
		"run r1  failed",
		"plan r2 (1 replan; kept 1, added 1, changed 0, dropped 0)",
		"  ✓ a  sql.query  succeeded  2ms",
		"  └─ · c  email.draft  pending",
		"  ✗ b  sql.query  failed (attempt 2)",
		"error: no such column: region",
		"· j  sql.query  pending  (joins a, b)",
		"stopped: failed: step b failed",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rendered run lacks %q:\n%s", want, got)
		}
	}
	// The join is drawn once, after both branches.
	if strings.Count(got, " j ") != 1 || strings.Index(got, " j ") < strings.Index(got, " b ") {
		t.Errorf("join not drawn once after its branches:\n%s", got)
	}
}

func TestRunExitCodes(t *testing.T) {
	tests := []struct {
		name   string
		status planexv1.RunStatus
		reason planexv1.StopReason
		want   int
	}{
		{"succeeded", planexv1.RunStatus_RUN_STATUS_SUCCEEDED, planexv1.StopReason_STOP_REASON_SUCCEEDED, 0},
		{"failed", planexv1.RunStatus_RUN_STATUS_FAILED, planexv1.StopReason_STOP_REASON_FAILED, 3},
		{"planner error", planexv1.RunStatus_RUN_STATUS_FAILED, planexv1.StopReason_STOP_REASON_PLANNER_ERROR, 3},
		{"escalated", planexv1.RunStatus_RUN_STATUS_ESCALATED, planexv1.StopReason_STOP_REASON_ESCALATED, 4},
		{"waiting", planexv1.RunStatus_RUN_STATUS_WAITING, planexv1.StopReason_STOP_REASON_UNSPECIFIED, 4},
		{"rejected", planexv1.RunStatus_RUN_STATUS_FAILED, planexv1.StopReason_STOP_REASON_REJECTED, 3},
		// The data said no: the run did not do what was asked.
		{"no data", planexv1.RunStatus_RUN_STATUS_FAILED, planexv1.StopReason_STOP_REASON_NO_DATA, 3},
		{"cancelled", planexv1.RunStatus_RUN_STATUS_CANCELLED, planexv1.StopReason_STOP_REASON_CANCELLED, 5},
		{"deadline", planexv1.RunStatus_RUN_STATUS_FAILED, planexv1.StopReason_STOP_REASON_DEADLINE, 5},
		{"budget", planexv1.RunStatus_RUN_STATUS_FAILED, planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := runExitCode(&planexv1.Run{Status: tt.status, StopReason: tt.reason}); got != tt.want {
				t.Fatalf("exit code %d, want %d", got, tt.want)
			}
		})
	}
}

// A run the data said no to shows its message alone; `runs get` adds the
// detail behind it on its own line.
func TestRenderRunShowsANoDataMessageAlone(t *testing.T) {
	const msg = "no customer is named Acme Inc; closest: Acme Corp"
	run := &planexv1.Run{
		Id: "r1", Goal: "How many open support tickets does Acme Inc have?", Status: planexv1.RunStatus_RUN_STATUS_FAILED,
		StopReason: planexv1.StopReason_STOP_REASON_NO_DATA, StopMessage: msg,
		StopDetail: `step "count" (sql.query) failed after 1 attempt: EXPECTATION_FAILED: expect "output.row_count == 1": evaluated to false`,
	}
	got := renderRun(run)
	if !strings.Contains(got, "\nstopped: "+msg+"\n") || strings.Contains(got, "no_data") || strings.Contains(got, "EXPECTATION_FAILED") {
		t.Errorf("rendered run:\n%s\nwant %q alone on the stop line and no internals", got, msg)
	}
	if line := stopDetailLine(run); line != "detail: "+run.GetStopDetail()+"\n" {
		t.Errorf("detail line %q", line)
	}
	run.Status, run.StopDetail = planexv1.RunStatus_RUN_STATUS_RUNNING, ""
	if line := stopDetailLine(run); line != "" {
		t.Errorf("detail line %q of a run without detail", line)
	}
}

func TestFitLinesKeepsEveryLineWithinTheWidth(t *testing.T) {
	got := fitLines("short\n"+strings.Repeat("x", 30)+"\nλλλλλλλλλλλλ\n", 10)
	for _, l := range strings.Split(strings.TrimSuffix(got, "\n"), "\n") {
		if n := len([]rune(l)); n >= 10 {
			t.Fatalf("line %q has %d runes, want fewer than 10", l, n)
		}
	}
	if !strings.HasPrefix(got, "short\n") || strings.Count(got, "\n") != 3 {
		t.Fatalf("fitLines changed the line structure: %q", got)
	}
}
