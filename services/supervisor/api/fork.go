package api

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/oklog/ulid/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// maxForkCreated bounds a fork's first event: the shared steps' inline
// outputs travel in it (outputs stored by reference only as references).
const maxForkCreated = 512 << 10

// ForkRun starts a run from another run's history (see the proto).
func (s *Server) ForkRun(ctx context.Context, req *planexv1.ForkRunRequest) (*planexv1.ForkRunResponse, error) {
	resp, err := s.forkRun(ctx, req)
	if resp != nil {
		resp.Run = s.mask(ctx).run(resp.GetRun())
	}
	return resp, s.status(ctx, "ForkRun", err)
}

func (s *Server) forkRun(ctx context.Context, req *planexv1.ForkRunRequest) (*planexv1.ForkRunResponse, error) {
	if err := validRunID(req.GetRunId()); err != nil {
		return nil, err
	}
	var errs []error
	if err := checkText("reason", req.GetReason(), maxReasonBytes); err != nil {
		errs = append(errs, err)
	}
	if req.GetAtSequence() > 0 && req.GetFromStep() != "" {
		errs = append(errs, invalid("from_step: give at_sequence or from_step, not both"))
	}
	if err := checkText("request_id", req.GetRequestId(), maxKeyBytes); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, checkStepArgs(req.GetStepArgs())...)
	if len(errs) > 0 {
		return nil, joinInvalid(errs)
	}
	orig, err := s.load(ctx, req.GetRunId())
	if err != nil {
		return nil, err
	}
	run := orig.Run
	// The fork is a run like any other: its goal, inputs, labels and
	// budget pass StartRun's checks.
	start := &planexv1.StartRunRequest{
		Goal: run.GetGoal(), Inputs: run.GetInputs(), Labels: maps.Clone(run.GetLabels()), Budget: proto.CloneOf(run.GetBudget()),
		Mode: run.GetMode(), PlannerBackend: run.GetPlannerBackend(), ApprovePlans: run.GetApprovePlans(),
	}
	if g := req.GetGoal(); g != "" {
		start.Goal = g
	}
	if req.GetInputs() != nil {
		start.Inputs = req.GetInputs()
	}
	if start.Labels == nil {
		start.Labels = map[string]string{}
	}
	maps.Copy(start.Labels, req.GetLabels())
	if b := req.GetBudget(); b != nil {
		mergeBudget(start.Budget, b)
	}
	budget, mode, err := s.validateStart(start)
	if err != nil {
		return nil, err
	}
	events, err := runlog.ReadStored(ctx, s.res.JS, run.GetId())
	if err != nil {
		return nil, err
	}
	at, err := foldTo(events, req.GetAtSequence(), "at_sequence")
	if err != nil {
		return nil, err
	}
	point := uint64(len(events))
	if req.GetAtSequence() > 0 {
		point = req.GetAtSequence()
	}
	cat, err := s.cfg.Tools.Get(ctx)
	if err != nil {
		return nil, err
	}
	sur, err := engine.PlanFork(engine.SurgeryInput{
		Current: run, At: at, FromStep: req.GetFromStep(), StepArgs: req.GetStepArgs(),
		Tool:    func(name string) *planexv1.ToolSpec { t, _ := cat.Tool(name); return t },
		Catalog: cat, Limits: s.cfg.PlanLimits,
	})
	if err != nil {
		return nil, surgeryStatus(err)
	}
	resp := &planexv1.ForkRunResponse{Shared: sur.Kept, Rerun: sur.Rerun, DryRun: req.GetDryRun()}
	if req.GetDryRun() {
		return resp, nil
	}

	forkID := ulid.Make().String()
	// existing answers a request id already claimed for run id: the fork
	// when it was created (linked and kicked again: the first call may
	// have died before either), or nil when the first call died before
	// creating it (this call creates it under that id).
	existing := func(id string) (*planexv1.ForkRunResponse, error) {
		st, err := s.log.Load(ctx, id)
		if errors.Is(err, runlog.ErrRunNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if err := s.linkFork(ctx, run.GetId(), st.Run); err != nil {
			return nil, err
		}
		if err := s.kickFork(ctx, st); err != nil {
			return nil, err
		}
		resp.Run, resp.Existing = st.Run, true
		return resp, nil
	}
	var key string
	retry := false // the request id was claimed by an earlier call
	if id := req.GetRequestId(); id != "" {
		key = "fork " + run.GetId() + " " + id
		prior, err := s.lookupKey(ctx, key, forkFingerprint(req))
		if err != nil {
			return nil, forkKeyError(err, id, run.GetId())
		}
		if prior != "" {
			if r, err := existing(prior); r != nil || err != nil {
				return r, err
			}
			forkID, retry = prior, true
		}
	}
	if !retry {
		// A fork is a new run of the tenant: the start quotas and the
		// fair share apply to it as to StartRun, before anything of it
		// exists (no request id claimed, nothing appended).
		release, err := s.admit(ctx, start)
		if err != nil {
			return nil, err
		}
		defer release()
	}
	if key != "" && !retry {
		prior, err := s.claimKey(ctx, key, forkID, forkFingerprint(req))
		if err != nil {
			return nil, forkKeyError(err, req.GetRequestId(), run.GetId())
		}
		if prior != "" {
			// A concurrent call claimed it since the lookup.
			if r, err := existing(prior); r != nil || err != nil {
				return r, err
			}
			forkID = prior
		}
	}

	// The fork's root span: a new trace, linked to the caller and to the
	// original run's trace.
	links := []trace.Link{trace.LinkFromContext(ctx), trace.LinkFromContext(engine.RunContext(ctx, orig.TraceContext))}
	rctx, span := s.tracer.Start(ctx, "run", trace.WithNewRoot(), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("planex.run_id", forkID), attribute.String("planex.forked_from", run.GetId()), attribute.String("planex.planning_mode", mode.String())))
	defer span.End()
	tc := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(rctx, tc)

	if err := engine.PublishStartGuard(rctx, s.res.JS, forkID, s.cfg.StartGuard); err != nil {
		return nil, err
	}
	created := &planexv1.RunCreated{
		Goal: start.GetGoal(), Inputs: start.GetInputs(), Budget: budget, Labels: start.GetLabels(), Mode: mode,
		PlannerBackend: start.GetPlannerBackend(), TraceContext: tc, StartedBy: startedBy(ctx), ApprovePlans: start.GetApprovePlans(),
		ForkOf: &planexv1.ForkOrigin{
			RunId: run.GetId(), Sequence: point, Hash: events[point-1].GetHash(), FromStep: req.GetFromStep(),
			ForkedBy: startedBy(ctx), Reason: req.GetReason(),
		},
		ForkPlan: sur.Plan, ForkSteps: sur.Shared, ForkReplan: req.GetReplan() && sur.Plan != nil,
	}
	if n := proto.Size(created); n > maxForkCreated {
		return nil, &preconditionError{msg: fmt.Sprintf("the shared history is %d bytes with its inline outputs, above the %d a fork's first event may hold: fork at an earlier point (at_sequence) or from an earlier step", n, maxForkCreated)}
	}
	tx := s.log.Begin(&runlog.State{})
	if err := tx.Emit(withRunID(forkID, engine.Event(created))); err != nil {
		return nil, err
	}
	st, err := s.log.Commit(rctx, tx)
	if errors.Is(err, runlog.ErrConflict) {
		// A concurrent call with the same request id created it.
		if st, err = s.log.Load(ctx, forkID); err != nil {
			return nil, err
		}
		resp.Existing = true
	} else if err != nil {
		return nil, err
	}
	if h := s.cfg.Hooks.AfterForkCreate; h != nil {
		if err := h(forkID); err != nil {
			return nil, err
		}
	}
	if err := s.linkFork(rctx, run.GetId(), st.Run); err != nil {
		return nil, err
	}
	if err := s.kickFork(rctx, st); err != nil {
		return nil, err
	}
	s.logger.InfoContext(rctx, "run forked", "run_id", forkID, "forked_from", run.GetId(), "at_sequence", point, "shared", len(sur.Kept), "rerun", len(sur.Rerun))
	resp.Run = st.Run
	return resp, nil
}

// forkKeyError names a fork's request_id in a refusal of its reuse with
// other parameters (the key's own message names StartRun's
// idempotency_key and the key as stored).
func forkKeyError(err error, requestID, runID string) error {
	var pe *preconditionError
	if !errors.As(err, &pe) {
		return err
	}
	return &preconditionError{msg: fmt.Sprintf("request_id %q was already used to fork run %s with different parameters; use a new request_id for a new fork", clip(requestID), runID), reason: pe.reason}
}

// mergeBudget sets b's fields from the non-zero fields of over.
func mergeBudget(b, over *planexv1.Budget) {
	if over.GetMaxSteps() != 0 {
		b.MaxSteps = over.GetMaxSteps()
	}
	if over.GetMaxReplans() != 0 {
		b.MaxReplans = over.GetMaxReplans()
	}
	if over.GetDeadline() != nil {
		b.Deadline = over.GetDeadline()
	}
	if over.GetMaxTokens() != 0 {
		b.MaxTokens = over.GetMaxTokens()
	}
	if over.GetStepTimeout() != nil {
		b.StepTimeout = over.GetStepTimeout()
	}
	if over.GetMaxParallelism() != 0 {
		b.MaxParallelism = over.GetMaxParallelism()
	}
}

// linkFork records the fork in the original's log (engine.LinkFork).
func (s *Server) linkFork(ctx context.Context, origID string, fork *planexv1.Run) error {
	return engine.LinkFork(ctx, s.log, origID, fork)
}

// kickFork publishes what starts a fork: a fork without a plan plans from
// its goal like a new run; one that plans again gets its round's kick; one
// that continues the shared plan is kicked to dispatch its next steps.
func (s *Server) kickFork(ctx context.Context, st *runlog.State) error {
	run := st.Run
	switch run.GetStatus() {
	case planexv1.RunStatus_RUN_STATUS_PENDING:
		return s.kick(ctx, st)
	case planexv1.RunStatus_RUN_STATUS_RUNNING, planexv1.RunStatus_RUN_STATUS_PLANNING, planexv1.RunStatus_RUN_STATUS_WAITING:
	default:
		return nil
	}
	ctx = engine.RunContext(ctx, st.TraceContext)
	if err := engine.PublishDeadline(ctx, s.res, run); err != nil {
		return err
	}
	msgID := bus.MsgID(run.GetId(), "fork")
	if run.GetStatus() == planexv1.RunStatus_RUN_STATUS_PLANNING {
		msgID = engine.PlanKickID(run.GetId(), runlog.CurrentPlan(run).GetRevision()+1, run.GetUsage().GetReplans())
	}
	_, err := bus.Publish(ctx, s.res.JS, bus.Publication{
		Subject: bus.EngineSubject(run.GetId(), bus.KindKick),
		Msg:     &planexv1.EngineKick{RunId: run.GetId(), Reason: "fork"},
		MsgID:   msgID,
		Attrs:   []attribute.KeyValue{attribute.String("planex.run_id", run.GetId())},
	})
	if err != nil {
		return fmt.Errorf("kick fork %s: %w", run.GetId(), err)
	}
	return nil
}

// forkFingerprint identifies a ForkRun request's parameters (everything
// but its request id).
func forkFingerprint(req *planexv1.ForkRunRequest) string {
	c := proto.CloneOf(req)
	c.RequestId = ""
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		return "unmarshalable"
	}
	return fingerprintBytes(b)
}
