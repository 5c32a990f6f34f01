package engine

import (
	"slices"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/policy"
	"github.com/planex-dev/planex/services/supervisor/runlog"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Guardrails configures the engine's guardrails.
type Guardrails struct {
	// Policies are the guardrail policies (nil: none).
	Policies PolicySource
	// StallLimit stops a run as STALLED when a step that failed in this
	// many revisions is planned again, after this many replans without a
	// newly succeeded step, or when a plan repeats this many earlier
	// revisions (0 disables stall detection).
	StallLimit int
	// Critic is the model critic (critic_model.go); its zero value is off.
	Critic ModelCritic
}

// PolicySource gives the guardrail policies in force (a *policy.Watcher,
// which reloads them); a nil source or set allows everything.
type PolicySource interface {
	Current() *policy.Set
}

// fieldPolicy is StepError.field of a step a policy denied; such a failure
// is never retried.
const fieldPolicy = "policy"

func (e *Engine) policies() *policy.Set {
	if e.cfg.Policies == nil {
		return nil
	}
	return e.cfg.Policies.Current()
}

// stepVerdict evaluates the step rules on a step about to be dispatched
// with its resolved arguments.
func (e *Engine) stepVerdict(run *planexv1.Run, s *planexv1.Step, args *structpb.Struct, spec *planexv1.ToolSpec) policy.Decision {
	set := e.policies()
	if set.Empty() {
		return policy.Decision{}
	}
	return set.EvalStep(policy.StepInput(run, runlog.CurrentPlan(run), s, args, spec, e.cfg.Now()))
}

// denied is the StepFailed of a step a policy denies: it fails before it
// reaches a pool, and the planner sees the policy's name and reason in its
// history.
func denied(s *planexv1.Step, attempt int32, d policy.Decision) *planexv1.StepFailed {
	return &planexv1.StepFailed{StepId: s.GetId(), Attempt: attempt, Error: &planexv1.StepError{
		Code: planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED, Field: fieldPolicy, Message: "denied by " + d.Message(),
	}}
}

// stepGate is the gate step s needs before its dispatch, or nil: the plan
// asks for approval, the tool requires it (unless auto-approved), or a
// policy requires it (unless the tool is auto-approved). A rejection goes
// back to the planner unless a policy rule requiring approval of the step
// says on_reject: stop.
func (e *Engine) stepGate(s *planexv1.Step, st *planexv1.StepState, spec *planexv1.ToolSpec, d policy.Decision) *planexv1.Gate {
	auto := slices.Contains(e.cfg.AutoApprove, s.GetTool())
	g := &planexv1.Gate{
		Id: runlog.GateID(s.GetId(), st.GetPlanRevision()), Kind: planexv1.GateKind_GATE_KIND_STEP,
		StepId: s.GetId(), PlanRevision: st.GetPlanRevision(),
	}
	switch {
	case s.GetRequiresApproval():
		g.Reason = "the plan asks for approval"
	case spec.GetRequiresApproval() && !auto:
		g.Reason = "tool " + s.GetTool() + " requires approval"
	case d.Action == policy.RequireApproval && !auto:
		g.Reason = d.Message()
	default:
		return nil
	}
	rule := d.Action == policy.RequireApproval && !auto
	if rule {
		e.applyRule(g, d)
	}
	onReject(g, rule && d.StopOnReject)
	return g
}

// onReject records on g what its rejection does: stop the run when the
// rule that opened it says on_reject: stop, else replan.
func onReject(g *planexv1.Gate, stop bool) {
	g.StopOnReject, g.ReplanOnReject = stop, !stop
}

// staticGate reports whether step s needs a gate whatever the policies
// say: the plan asks for approval, or its tool requires it and is not
// auto-approved.
func (e *Engine) staticGate(s *planexv1.Step, spec *planexv1.ToolSpec) bool {
	return s.GetRequiresApproval() || (spec.GetRequiresApproval() && !slices.Contains(e.cfg.AutoApprove, s.GetTool()))
}

// applyRule copies a policy decision's gate settings onto g.
func (e *Engine) applyRule(g *planexv1.Gate, d policy.Decision) {
	g.Policy, g.Rule, g.Approvers = d.Policy, d.Rule, d.Approvers
	if d.GateTimeout > 0 {
		g.SlaAt = timestamppb.New(e.cfg.Now().Add(d.GateTimeout))
		g.OnTimeout = planexv1.GateTimeoutAction_GATE_TIMEOUT_ACTION_ESCALATE
		if d.OnTimeout == policy.TimeoutReject {
			g.OnTimeout = planexv1.GateTimeoutAction_GATE_TIMEOUT_ACTION_REJECT
		}
	}
}

// planGate is the gate a new plan revision needs before its first step, or
// nil: the run asks for plan approval, or a plan rule requires it.
func (e *Engine) planGate(run *planexv1.Run, p *planexv1.Plan, d policy.Decision) *planexv1.Gate {
	if !run.GetApprovePlans() && d.Action != policy.RequireApproval {
		return nil
	}
	g := &planexv1.Gate{Id: runlog.PlanGateID(p.GetRevision()), Kind: planexv1.GateKind_GATE_KIND_PLAN, PlanRevision: p.GetRevision()}
	if d.Action == policy.RequireApproval {
		g.Reason = d.Message()
		e.applyRule(g, d)
	} else {
		g.Reason = "the run asks for approval of every plan revision"
	}
	onReject(g, d.Action == policy.RequireApproval && d.StopOnReject)
	return g
}

// planVerdict evaluates the plan rules on a new revision.
func (e *Engine) planVerdict(run *planexv1.Run, p *planexv1.Plan) policy.Decision {
	set := e.policies()
	if set.Empty() {
		return policy.Decision{}
	}
	return set.EvalPlan(policy.PlanInput(run, p, e.cfg.Now()))
}
