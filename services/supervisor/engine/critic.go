package engine

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/internal/policy"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// Critic verdict actions (CriticVerdict.action).
const (
	verdictReplan   = "replan"
	verdictEscalate = "escalate"
)

// critique judges a succeeded attempt with the policies' result rules (the
// deterministic verifiers: emptiness, the tool's output_schema, anything
// CEL says about the output) before the run moves on. A failing verdict is
// recorded (CriticVerdict, and a "critic" span) and either fails the
// attempt (ExpectationFailed: the run replans like for a false expect) or
// escalates the run. It reports whether the verdict failed.
func (e *Engine) critique(ctx context.Context, tx *runlog.Tx, st *planexv1.StepState, output any) (bool, error) {
	set := e.policies()
	if !set.Has(policy.ScopeResult) {
		return false, nil
	}
	run := tx.Run()
	s := runlog.PlanStep(run, st.GetStepId())
	cat, err := e.tools.Get(ctx)
	if err != nil {
		return false, err
	}
	spec, _ := cat.Tool(s.GetTool())
	in := policy.StepInput(run, runlog.CurrentPlan(run), s, st.GetResolvedArgs(), spec, e.cfg.Now())
	in.Output, in.OutputEmpty, in.OutputSchemaErrors = output, policy.IsEmpty(output), outputProblems(spec, output)
	_, span := e.tracer.Start(ctx, "critic", trace.WithAttributes(
		attribute.String("planex.run_id", run.GetId()), attribute.String("planex.step_id", st.GetStepId()),
		attribute.Int("planex.attempt", int(st.GetAttempt())), attribute.String("planex.tool", s.GetTool())))
	defer span.End()
	d := set.EvalResult(in)
	span.SetAttributes(attribute.Bool("planex.critic.passed", d.Action != policy.Deny))
	if d.Action != policy.Deny {
		return false, nil
	}
	action := verdictReplan
	if d.Escalate {
		action = verdictEscalate
	}
	span.SetAttributes(attribute.String("planex.critic.verifier", "policy:"+d.Policy+"/"+d.Rule), attribute.String("planex.critic.action", action))
	if err := tx.Emit(Event(&planexv1.CriticVerdict{
		StepId: st.GetStepId(), Attempt: st.GetAttempt(), Verifier: "policy:" + d.Policy + "/" + d.Rule, Reason: d.Reason, Action: action,
	})); err != nil {
		return true, err
	}
	if d.Escalate {
		return true, finish(tx, planexv1.StopReason_STOP_REASON_ESCALATED,
			fmt.Sprintf("the critic rejected the result of step %q (%s): %s", st.GetStepId(), s.GetTool(), d.Message()), nil, 0)
	}
	return true, tx.Emit(Event(&planexv1.ExpectationFailed{
		StepId: st.GetStepId(), Attempt: st.GetAttempt(), Expect: "critic " + d.Policy + "/" + d.Rule, Message: d.Message(),
	}))
}

// outputProblems checks an object output against the tool's output_schema
// (other outputs and tools without a schema pass).
func outputProblems(spec *planexv1.ToolSpec, output any) []string {
	m, ok := output.(map[string]any)
	if !ok || spec.GetOutputSchema() == nil {
		return nil
	}
	v, err := structpb.NewStruct(m)
	if err != nil {
		return []string{err.Error()}
	}
	err = plan.ValidateArgs(&planexv1.ToolSpec{Name: spec.GetName() + " output", ArgsSchema: spec.GetOutputSchema()}, v)
	var ve *plan.ValidationError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ve):
		out := make([]string, 0, len(ve.Problems))
		for _, p := range ve.Problems {
			out = append(out, p.String())
		}
		return out
	default:
		return []string{err.Error()}
	}
}
