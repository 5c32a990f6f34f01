package engine

import (
	"context"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/policy"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// Human input steps (docs/human-input.md). A step of the built-in tool
// human.input never goes to a pool: when it is ready the engine opens an
// input gate (GATE_KIND_INPUT) carrying its question and the answer's
// schema, and the run waits like at any gate (SLA, escalation and
// approvers as a policy rule requiring approval of the step sets them).
// An answer (GateDecided.answer, validated by the API) records, in the
// same transaction, the step's attempt: its StepDispatched and its
// StepSucceeded with the answer as output, which later steps reference
// like any output. A rejection replans or stops as for any gate.

// scheduleInput handles a ready human.input step whose gate g (nil: none
// yet) is not decided: it opens the gate, or fails the step when its
// arguments do not resolve, its schema does not compile or a policy
// denies it. An open gate needs nothing.
func (e *Engine) scheduleInput(ctx context.Context, tx *runlog.Tx, s *planexv1.Step, st *planexv1.StepState, spec *planexv1.ToolSpec, g *planexv1.Gate) error {
	if g != nil {
		return nil // open: it waits; decided: the decision acted on it
	}
	args, failure, err := e.resolve(ctx, tx.State(), s, st, spec, false)
	if err != nil {
		return err
	}
	var d policy.Decision
	var in *planexv1.HumanInput
	if failure == nil {
		if in, err = catalog.InputOf(args); err != nil {
			failure = &planexv1.StepFailed{StepId: s.GetId(), Attempt: st.GetAttempt() + 1, Error: &planexv1.StepError{
				Code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Message: err.Error(), Field: "args.schema",
			}}
		} else if d = e.stepVerdict(tx.Run(), s, args, spec); d.Action == policy.Deny {
			failure = denied(s, st.GetAttempt()+1, d)
		}
	}
	if failure != nil {
		return tx.Emit(Event(failure)) // the failure is handled in the next round
	}
	gate := &planexv1.Gate{
		Id: runlog.GateID(s.GetId(), st.GetPlanRevision()), Kind: planexv1.GateKind_GATE_KIND_INPUT,
		StepId: s.GetId(), PlanRevision: st.GetPlanRevision(), Reason: "step " + s.GetId() + " asks: " + in.GetQuestion(),
		Input: in,
	}
	rule := d.Action == policy.RequireApproval
	if rule {
		e.applyRule(gate, d)
	}
	onReject(gate, rule && d.StopOnReject)
	return tx.Emit(Event(&planexv1.GateOpened{Gate: gate}))
}

// answerInput records the answer to input gate g (GateDecided d, just
// emitted): the step's attempt, dispatched and succeeded at once with the
// answer as its output. No executor is involved, so nothing is published.
func answerInput(tx *runlog.Tx, g *planexv1.Gate, d *planexv1.GateDecided) error {
	st := tx.State().Step(g.GetStepId())
	attempt := st.GetAttempt() + 1
	in := g.GetInput()
	args := &structpb.Struct{Fields: map[string]*structpb.Value{
		"question": structpb.NewStringValue(in.GetQuestion()),
		"schema":   structpb.NewStructValue(in.GetSchema()),
	}}
	if len(in.GetChoices()) > 0 {
		args.Fields["choices"] = structpb.NewListValue(&structpb.ListValue{Values: in.GetChoices()})
	}
	if err := tx.Emit(Event(&planexv1.StepDispatched{
		StepId: g.GetStepId(), Attempt: attempt, PlanRevision: g.GetPlanRevision(), Tool: catalog.HumanInput, ResolvedArgs: args,
	})); err != nil {
		return err
	}
	return tx.Emit(Event(&planexv1.StepSucceeded{StepId: g.GetStepId(), Attempt: attempt, Output: d.GetAnswer(), ExecutorId: executorSupervisor}))
}

// executorSupervisor is the executor id of the attempts the supervisor
// completes itself (human.input answers).
const executorSupervisor = "supervisor"
