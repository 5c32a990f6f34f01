package api

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/internal/policy"
	"github.com/planex-dev/planex/internal/redact"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// ViaRunYes is DecideRequest.via of `planex run --yes`: the run's starter
// approves its own gates as they open (allowed only where self-approval
// is), recorded as such.
const ViaRunYes = "run --yes"

// maxDecisions bounds the decisions of one Decide call.
const maxDecisions = 256

// Decide answers open gates of a run: each decision is published to the
// engine (planex.engine.<run>.decision, message id "<run>:decide:<gate>"),
// which records it and dispatches, edits, replans (a rejection) or stops
// (a rejection with stop_run, or by the gate's rule); Decide waits,
// bounded, until the run shows every decision. A batch is validated whole
// (gates open, decider allowed, edited arguments valid against the tool's
// schema and the policies) before anything is published.
func (s *Server) Decide(ctx context.Context, req *planexv1.DecideRequest) (*planexv1.DecideResponse, error) {
	run, err := s.decide(ctx, req)
	return &planexv1.DecideResponse{Run: s.mask(ctx).run(run)}, s.status(ctx, "Decide", err)
}

// decisionAt is one decision with the field path errors name.
type decisionAt struct {
	*planexv1.GateDecision
	field string // "" for the single form, "decisions[i]." for a batch
}

func decisionsOf(req *planexv1.DecideRequest) ([]decisionAt, error) {
	single := req.GetGateId() != "" || req.GetDecision() != 0 || req.GetEditedArgs() != nil || req.GetComment() != "" || req.GetStopRun() || req.GetAnswer() != nil
	if len(req.GetDecisions()) == 0 {
		if req.GetGateId() == "" {
			return nil, invalid("gate_id: required (or decisions)")
		}
		return []decisionAt{{GateDecision: answered(&planexv1.GateDecision{
			GateId: req.GetGateId(), Decision: req.GetDecision(), EditedArgs: req.GetEditedArgs(), Comment: req.GetComment(), StopRun: req.GetStopRun(),
			Answer: req.GetAnswer(),
		})}}, nil
	}
	if single {
		return nil, invalid("decisions: set either gate_id, decision, edited_args, comment, stop_run and answer or decisions, not both")
	}
	if len(req.GetDecisions()) > maxDecisions {
		return nil, invalid("decisions: %d decisions, at most %d per call", len(req.GetDecisions()), maxDecisions)
	}
	out := make([]decisionAt, len(req.GetDecisions()))
	for i, d := range req.GetDecisions() {
		out[i] = decisionAt{GateDecision: answered(d), field: fmt.Sprintf("decisions[%d].", i)}
	}
	return out, nil
}

func (s *Server) decide(ctx context.Context, req *planexv1.DecideRequest) (*planexv1.Run, error) {
	switch req.GetVia() {
	case "", ViaRunYes:
	default:
		return nil, invalid("via %q: want empty or %q", clip(req.GetVia()), ViaRunYes)
	}
	return s.decideVia(ctx, req)
}

// decideVia is decide with req.via recorded as given (RunBatch's
// "batch <id>", which clients cannot send).
func (s *Server) decideVia(ctx context.Context, req *planexv1.DecideRequest) (*planexv1.Run, error) {
	if err := validRunID(req.GetRunId()); err != nil {
		return nil, err
	}
	decisions, err := decisionsOf(req)
	if err != nil {
		return nil, err
	}
	// The actor, comments and edited arguments are recorded in the run
	// log: no secret may ride along.
	if err := checkText("actor", req.GetActor(), maxActorBytes); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, d := range decisions {
		if err := checkDecision(d); err != nil {
			return nil, err
		}
		if seen[d.GetGateId()] {
			return nil, invalid("%sgate_id %q: decided twice in one call", d.field, clip(d.GetGateId()))
		}
		seen[d.GetGateId()] = true
	}
	st, err := s.load(ctx, req.GetRunId())
	if err != nil {
		return nil, err
	}
	gates := make([]*planexv1.Gate, len(decisions))
	for i, d := range decisions {
		g := runlog.Gate(st.Run, d.GetGateId())
		if g.GetKind() != planexv1.GateKind_GATE_KIND_INPUT {
			// Answering a question is not approving: a run's starter may
			// answer what their own run asks (input.go).
			if err := s.checkDecide(ctx, st.Run, d.GetDecision()); err != nil {
				return nil, err
			}
		}
		if g == nil {
			return nil, &notFoundError{msg: fmt.Sprintf("%sgate_id: gate %q not found in run %q", d.field, clip(d.GetGateId()), req.GetRunId())}
		}
		if !runlog.GateOpen(st.Run, g) {
			return nil, &preconditionError{msg: fmt.Sprintf("%sgate_id: gate %q is not open (decision %s, run %s)", d.field, g.GetId(), g.GetDecision(), st.Run.GetStatus())}
		}
		if err := checkApprovers(ctx, g); err != nil {
			return nil, err
		}
		if err := checkAnswer(g, d); err != nil {
			return nil, err
		}
		if d.GetDecision() == planexv1.DecisionKind_DECISION_KIND_EDIT {
			if err := s.checkEdit(ctx, st.Run, g, d); err != nil {
				return nil, err
			}
		}
		gates[i] = g
	}
	rctx := engine.RunContext(ctx, st.TraceContext)
	for i, d := range decisions {
		g := gates[i]
		_, err = bus.Publish(rctx, s.res.JS, bus.Publication{
			Subject: bus.EngineSubject(req.GetRunId(), bus.KindDecision),
			Msg: &planexv1.GateDecided{
				GateId: g.GetId(), Decision: d.GetDecision(), EditedArgs: d.GetEditedArgs(),
				Actor: req.GetActor(), Comment: d.GetComment(), DecidedBy: startedBy(ctx), Via: req.GetVia(), StopRun: d.GetStopRun(),
				Answer: d.GetAnswer(),
			},
			MsgID: bus.MsgID(req.GetRunId(), "decide", g.GetId()),
			Attrs: []attribute.KeyValue{attribute.String("planex.run_id", req.GetRunId()), attribute.String("planex.gate_id", g.GetId())},
		})
		if err != nil {
			return nil, fmt.Errorf("publish decision on gate %s of run %s: %w", g.GetId(), req.GetRunId(), err)
		}
	}
	return s.waitFor(ctx, req.GetRunId(), func(run *planexv1.Run) bool {
		if runlog.Terminal(run.GetStatus()) {
			return true
		}
		for _, g := range gates {
			if runlog.Gate(run, g.GetId()).GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
				return false
			}
		}
		return true
	})
}

// checkDecision validates one decision on its own, naming its field.
func checkDecision(d decisionAt) error {
	if d.GetGateId() == "" {
		return invalid("%sgate_id: required", d.field)
	}
	if err := checkText(d.field+"comment", d.GetComment(), maxCommentBytes); err != nil {
		return err
	}
	if err := checkSecret(d.field+"edited_args", redact.CanonicalStruct(d.GetEditedArgs())); err != nil {
		return err
	}
	if d.GetStopRun() && d.GetDecision() != planexv1.DecisionKind_DECISION_KIND_REJECT {
		return invalid("%sstop_run: only allowed with DECISION_KIND_REJECT", d.field)
	}
	switch d.GetDecision() {
	case planexv1.DecisionKind_DECISION_KIND_APPROVE, planexv1.DecisionKind_DECISION_KIND_REJECT:
		if d.GetEditedArgs() != nil {
			return invalid("%sedited_args: only allowed with DECISION_KIND_EDIT", d.field)
		}
	case planexv1.DecisionKind_DECISION_KIND_EDIT:
		if d.GetEditedArgs() == nil {
			return invalid("%sedited_args: required with DECISION_KIND_EDIT", d.field)
		}
	default:
		return invalid("%sdecision %d: want APPROVE, REJECT or EDIT", d.field, d.GetDecision())
	}
	return nil
}

// checkEdit validates edited arguments against the step's tool schema and
// the policies (a deny refuses the edit).
func (s *Server) checkEdit(ctx context.Context, run *planexv1.Run, g *planexv1.Gate, d decisionAt) error {
	if g.GetKind() != planexv1.GateKind_GATE_KIND_STEP {
		return invalid("%sdecision: a plan gate cannot be edited; reject it with a comment to have the planner revise the plan", d.field)
	}
	step := runlog.PlanStep(run, g.GetStepId())
	cat, err := s.cfg.Tools.Fresh(ctx)
	if err != nil {
		return err
	}
	spec, ok := cat.Tool(step.GetTool())
	if !ok {
		return &preconditionError{msg: fmt.Sprintf("%sedited_args: tool %s of step %q is not registered; cannot check them", d.field, step.GetTool(), g.GetStepId())}
	}
	if err := plan.ValidateArgs(spec, d.GetEditedArgs()); err != nil {
		return invalid("%sedited_args: %v", d.field, err)
	}
	if s.cfg.Policies != nil {
		v := s.cfg.Policies.Current().EvalStep(policy.StepInput(run, runlog.CurrentPlan(run), step, d.GetEditedArgs(), spec, time.Now()))
		if v.Action == policy.Deny {
			return invalid("%sedited_args: denied by %s", d.field, v.Message())
		}
	}
	return nil
}
