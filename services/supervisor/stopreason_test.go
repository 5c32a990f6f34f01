package supervisor_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// noBranch is the playbook planner's answer to a failure no on_failure
// branch handles: give up, restating the last failed step's error as
// services/planner/playbook does ("step %q (tool) failed: <error>").
func noBranch(req *planexv1.PlanRequest) *planexv1.PlanResponse {
	msg := "no step failed"
	for _, o := range req.GetHistory().GetSteps() {
		if o.GetError() != nil {
			msg = fmt.Sprintf("step %q (%s) failed: %s", o.GetStepId(), o.GetTool(), o.GetError().GetMessage())
		}
	}
	return &planexv1.PlanResponse{Stop: true, GiveUp: true, StopMessage: msg}
}

// A run the planner gives up on stops with a reason the user can act on:
// NO_DATA when the data says no (a playbook's fail: message, an expect
// that did not hold, a refusal), STEP_FAILED / STEP_TIMEOUT when a tool
// is broken. The stop message is the user's message first and alone, said
// once; the step, tool, attempts, code and error behind it are the stop
// detail (RunFinished.detail, Run.stop_detail).
func TestStopReasonsUsersCanActOn(t *testing.T) {
	h, r := setup(t)
	const unknown = "no customer is named Acme Inc; closest: Acme Corp"
	expectOne := func() *planexv1.Step {
		s := noRetry(step("count", "test.echo", map[string]any{"value": 0}))
		s.Expect = "output.value == 1"
		return s
	}
	giveUp := func(msg string) script {
		return func(n int, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
			if msg == "" {
				return noBranch(req), nil
			}
			return &planexv1.PlanResponse{Stop: true, GiveUp: true, StopMessage: msg}, nil
		}
	}
	tests := []struct {
		name string
		step *planexv1.Step
		// giveUp is the planner's give-up message; "" restates the
		// step's error, as a playbook without a branch for it does.
		giveUp  string
		reason  planexv1.StopReason
		message string   // the whole stop message
		detail  []string // what the detail holds
	}{
		{
			name: "fail branch over an expect", step: expectOne(), giveUp: unknown,
			reason: planexv1.StopReason_STOP_REASON_NO_DATA, message: unknown,
			detail: []string{`step "count" (test.echo) failed after 1 attempt`, "EXPECTATION_FAILED", `expect "output.value == 1"`},
		},
		{
			name: "expect without a branch", step: expectOne(),
			reason:  planexv1.StopReason_STOP_REASON_NO_DATA,
			message: `step "count" (test.echo) failed after 1 attempt: expect "output.value == 1": evaluated to false`,
			detail:  []string{"EXPECTATION_FAILED"},
		},
		{
			name: "refusal without a branch", step: noRetry(flaky("draft", "test.flaky", 1, "PERMISSION_DENIED")),
			reason: planexv1.StopReason_STOP_REASON_NO_DATA, message: "attempt 1: PERMISSION_DENIED",
			detail: []string{`step "draft" (test.flaky) failed after 1 attempt`, "PERMISSION_DENIED"},
		},
		{
			name: "fail branch over an invalid argument", step: noRetry(flaky("fetch", "test.flaky", 1, "INVALID_ARGUMENT")),
			giveUp: "no runbook about volcano eruption. Nothing was sent.",
			reason: planexv1.StopReason_STOP_REASON_NO_DATA, message: "no runbook about volcano eruption. Nothing was sent.",
			detail: []string{`step "fetch" (test.flaky) failed after 1 attempt`, "INVALID_ARGUMENT: attempt 1: INVALID_ARGUMENT"},
		},
		{
			name: "broken tool without a branch", step: noRetry(flaky("a", "test.flaky", 1, "TOOL_FAILED")),
			reason:  planexv1.StopReason_STOP_REASON_STEP_FAILED,
			message: `step "a" (test.flaky) failed after 1 attempt: attempt 1: TOOL_FAILED`,
			detail:  []string{"TOOL_FAILED"},
		},
		{
			name: "fail branch over a broken tool", step: noRetry(flaky("a", "test.flaky", 1, "INTERNAL")),
			giveUp: "the orders database is down; try again later",
			reason: planexv1.StopReason_STOP_REASON_STEP_FAILED, message: "the orders database is down; try again later",
			detail: []string{`step "a" (test.flaky) failed after 1 attempt: INTERNAL: attempt 1: INTERNAL`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			goal := "stop reason: " + tt.name
			h.planner.on(goal, func(n int, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
				if n == 0 {
					return planOf(tt.step), nil
				}
				return giveUp(tt.giveUp)(n, req)
			})
			id := start(t, r.client, &planexv1.StartRunRequest{Goal: goal})
			run := waitTerminal(t, r.client, id, 20*time.Second)
			if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_FAILED || run.GetStopReason() != tt.reason {
				t.Fatalf("run %s %s %q, want FAILED %s", run.GetStatus(), run.GetStopReason(), run.GetStopMessage(), tt.reason)
			}
			if got := run.GetStopMessage(); got != tt.message {
				t.Errorf("stop message %q, want exactly %q", got, tt.message)
			}
			for _, want := range tt.detail {
				if !strings.Contains(run.GetStopDetail(), want) {
					t.Errorf("stop detail %q lacks %q", run.GetStopDetail(), want)
				}
			}
			evs := watchAll(t, r.client, id, 1)
			fin := evs[len(evs)-1].GetFinished()
			if fin.GetMessage() != run.GetStopMessage() || fin.GetDetail() != run.GetStopDetail() {
				t.Errorf("RunFinished %q / %q, run %q / %q", fin.GetMessage(), fin.GetDetail(), run.GetStopMessage(), run.GetStopDetail())
			}
		})
	}
}
