package api

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/internal/redact"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// Decide answers an open gate: the decision is published to the engine
// (planex.engine.<run>.decision, message id "<run>:decide:<gate>"), which
// records it and dispatches, edits or stops; Decide waits, bounded, until
// the run shows the decision.
func (s *Server) Decide(ctx context.Context, req *planexv1.DecideRequest) (*planexv1.DecideResponse, error) {
	run, err := s.decide(ctx, req)
	return &planexv1.DecideResponse{Run: s.mask(ctx).run(run)}, s.status(ctx, "Decide", err)
}

func (s *Server) decide(ctx context.Context, req *planexv1.DecideRequest) (*planexv1.Run, error) {
	if err := validRunID(req.GetRunId()); err != nil {
		return nil, err
	}
	if req.GetGateId() == "" {
		return nil, invalid("gate_id: required")
	}
	// The actor, comment and edited arguments are recorded in the run log:
	// no secret may ride along.
	if err := checkText("actor", req.GetActor(), maxActorBytes); err != nil {
		return nil, err
	}
	if err := checkText("comment", req.GetComment(), maxCommentBytes); err != nil {
		return nil, err
	}
	if err := checkSecret("edited_args", redact.CanonicalStruct(req.GetEditedArgs())); err != nil {
		return nil, err
	}
	switch req.GetDecision() {
	case planexv1.DecisionKind_DECISION_KIND_APPROVE, planexv1.DecisionKind_DECISION_KIND_REJECT:
		if req.GetEditedArgs() != nil {
			return nil, invalid("edited_args: only allowed with DECISION_KIND_EDIT")
		}
	case planexv1.DecisionKind_DECISION_KIND_EDIT:
		if req.GetEditedArgs() == nil {
			return nil, invalid("edited_args: required with DECISION_KIND_EDIT")
		}
	default:
		return nil, invalid("decision %d: want APPROVE, REJECT or EDIT", req.GetDecision())
	}
	st, err := s.load(ctx, req.GetRunId())
	if err != nil {
		return nil, err
	}
	if err := s.checkDecide(ctx, st.Run, req.GetDecision()); err != nil {
		return nil, err
	}
	g := runlog.Gate(st.Run, req.GetGateId())
	if g == nil {
		return nil, &notFoundError{msg: fmt.Sprintf("gate %q not found in run %q", clip(req.GetGateId()), req.GetRunId())}
	}
	if !runlog.GateOpen(st.Run, g) {
		return nil, &preconditionError{msg: fmt.Sprintf("gate %q is not open (decision %s, run %s)", g.GetId(), g.GetDecision(), st.Run.GetStatus())}
	}
	if req.GetDecision() == planexv1.DecisionKind_DECISION_KIND_EDIT {
		if err := s.checkEdit(ctx, st.Run, g, req); err != nil {
			return nil, err
		}
	}
	_, err = bus.Publish(engine.RunContext(ctx, st.TraceContext), s.res.JS, bus.Publication{
		Subject: bus.EngineSubject(req.GetRunId(), bus.KindDecision),
		Msg: &planexv1.GateDecided{
			GateId: g.GetId(), Decision: req.GetDecision(), EditedArgs: req.GetEditedArgs(),
			Actor: req.GetActor(), Comment: req.GetComment(), DecidedBy: startedBy(ctx),
		},
		MsgID: bus.MsgID(req.GetRunId(), "decide", g.GetId()),
		Attrs: []attribute.KeyValue{attribute.String("planex.run_id", req.GetRunId()), attribute.String("planex.step_id", g.GetStepId())},
	})
	if err != nil {
		return nil, fmt.Errorf("publish decision on gate %s of run %s: %w", g.GetId(), req.GetRunId(), err)
	}
	return s.waitFor(ctx, req.GetRunId(), func(run *planexv1.Run) bool {
		return runlog.Gate(run, g.GetId()).GetDecision() != planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED || runlog.Terminal(run.GetStatus())
	})
}

// checkEdit validates edited arguments against the step's tool schema.
func (s *Server) checkEdit(ctx context.Context, run *planexv1.Run, g *planexv1.Gate, req *planexv1.DecideRequest) error {
	step := runlog.PlanStep(run, g.GetStepId())
	cat, err := catalog.Load(ctx, s.res.Tools, s.logger)
	if err != nil {
		return err
	}
	spec, ok := cat.Tool(step.GetTool())
	if !ok {
		return &preconditionError{msg: fmt.Sprintf("tool %s of step %q is not registered; cannot check edited_args", step.GetTool(), g.GetStepId())}
	}
	if err := plan.ValidateArgs(spec, req.GetEditedArgs()); err != nil {
		return invalid("edited_args: %v", err)
	}
	return nil
}
