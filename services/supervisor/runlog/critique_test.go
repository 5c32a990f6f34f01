package runlog_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

func started(id string, attempt int32) *planexv1.RunEvent {
	return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepStarted{StepStarted: &planexv1.StepStarted{StepId: id, Attempt: attempt}}}
}

// A result waiting for the model critic keeps its step RUNNING; the
// verdict ends the wait and counts the critic's tokens apart from the
// planner's.
func TestFoldCritique(t *testing.T) {
	held := succeeded("x", 1).GetStepSucceeded()
	pending := &planexv1.RunEvent{Payload: &planexv1.RunEvent_CritiquePending{CritiquePending: &planexv1.CritiquePending{StepId: "x", Attempt: 1, Backend: "openai", Result: held}}}
	verdict := &planexv1.RunEvent{Payload: &planexv1.RunEvent_CriticVerdict{CriticVerdict: &planexv1.CriticVerdict{
		StepId: "x", Attempt: 1, Verifier: "model:openai", Passed: true, Action: "pass", Usage: &planexv1.TokenUsage{InputTokens: 100, OutputTokens: 20}}}}

	run := build(t, planexv1.PlanningMode_PLANNING_MODE_FULL, planEv(1, nil, st("x")), dispatched("x", 1), started("x", 1), pending)
	x := stepOf(run, "x")
	if !runlog.Critiquing(x) || x.GetStatus() != planexv1.StepStatus_STEP_STATUS_RUNNING || !proto.Equal(x.GetCritiquePending().GetResult(), held) {
		t.Fatalf("after CritiquePending: %v", x)
	}
	run = build(t, planexv1.PlanningMode_PLANNING_MODE_FULL, planEv(1, nil, st("x")), dispatched("x", 1), started("x", 1), pending, verdict, succeeded("x", 1))
	x = stepOf(run, "x")
	if runlog.Critiquing(x) || x.GetCritiquePending() != nil || x.GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED ||
		run.GetCriticTokens() != 120 || run.GetUsage().GetTokens() != 0 {
		t.Fatalf("after the verdict: step %v, critic tokens %d, planner tokens %d", x, run.GetCriticTokens(), run.GetUsage().GetTokens())
	}
	// A pending critique of an attempt that is not running is not folded.
	run = build(t, planexv1.PlanningMode_PLANNING_MODE_FULL, planEv(1, nil, st("x")), dispatched("x", 1), started("x", 1), failed("x", 1, planexv1.ErrorCode_ERROR_CODE_INTERNAL), pending)
	if stepOf(run, "x").GetCritiquePending() != nil {
		t.Fatalf("a failed attempt waits for the critic: %v", stepOf(run, "x"))
	}
}

// Folding into a clone leaves the original's progress ledger (stall
// detection) alone: a run GetRun reads while the engine folds shares it.
func TestCloneIsolatesTheProgressLedger(t *testing.T) {
	var l runlog.Log
	emit := func(s *runlog.State, evs ...*planexv1.RunEvent) *runlog.State {
		t.Helper()
		tx := l.Begin(s)
		for _, ev := range evs {
			if err := tx.Emit(ev); err != nil {
				t.Fatal(err)
			}
		}
		return tx.State()
	}
	orig := emit(&runlog.State{},
		&planexv1.RunEvent{RunId: "R", Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "g", Budget: &planexv1.Budget{MaxSteps: 5, MaxReplans: 3}}}},
		planEv(1, nil, st("x"), st("y")),
		dispatched("x", 1), failed("x", 1, planexv1.ErrorCode_ERROR_CODE_INTERNAL),
		&planexv1.RunEvent{Payload: &planexv1.RunEvent_ReplanRequested{ReplanRequested: &planexv1.ReplanRequested{Reason: "x failed"}}},
		planEv(2, nil, st("x"), st("y")),
		dispatched("x", 1), dispatched("y", 1),
	)
	before := proto.CloneOf(orig.Run.GetProgress())
	if before.GetReplansSinceSuccess() != 1 || len(before.GetFailing()) != 1 {
		t.Fatalf("ledger before: %v", before)
	}
	emit(orig, succeeded("y", 1), failed("x", 1, planexv1.ErrorCode_ERROR_CODE_INTERNAL))
	if !proto.Equal(orig.Run.GetProgress(), before) {
		t.Fatalf("folding into a clone changed the original ledger: %v, was %v", orig.Run.GetProgress(), before)
	}
}
