package api

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/redact"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// maxResetTries bounds how often a reset or a fork link is appended again
// after losing an append race (another fork of the same run).
const maxResetTries = 8

// ResetRun re-opens a finished run at a point of its log (see the proto).
func (s *Server) ResetRun(ctx context.Context, req *planexv1.ResetRunRequest) (*planexv1.ResetRunResponse, error) {
	resp, err := s.resetRun(ctx, req, "")
	if resp != nil {
		resp.Run = s.mask(ctx).run(resp.GetRun())
	}
	return resp, s.status(ctx, "ResetRun", err)
}

// resetRun records a RunReset (batchID names the batch that asked, if
// any) and starts the run again: the API appends the event itself, as
// StartRun appends RunCreated, guarded by a timer published first so that
// a crash between the append and the kick leaves nothing stranded; the
// engine dispatches the steps that start over (or plans again) on the
// kick.
func (s *Server) resetRun(ctx context.Context, req *planexv1.ResetRunRequest, batchID string) (*planexv1.ResetRunResponse, error) {
	if err := s.validateReset(req); err != nil {
		return nil, err
	}
	admitted := false
	for range maxResetTries {
		st, err := s.load(ctx, req.GetRunId())
		if err != nil {
			return nil, err
		}
		events, err := runlog.ReadStored(ctx, s.res.JS, req.GetRunId())
		if err != nil {
			return nil, err
		}
		if id := req.GetRequestId(); id != "" {
			if r := resetWithID(events, id); r != nil {
				// The same request again: the reset it made stands.
				kept := r.GetPlan().GetLineage().GetKept()
				var rerun []string
				for _, step := range r.GetPlan().GetSteps() {
					if !slices.Contains(kept, step.GetId()) {
						rerun = append(rerun, step.GetId())
					}
				}
				return &planexv1.ResetRunResponse{Run: st.Run, Rerun: rerun, Kept: kept, KeptSideEffects: r.GetKeptSideEffects()}, nil
			}
		}
		run := st.Run
		if !runlog.Terminal(run.GetStatus()) {
			return nil, &preconditionError{msg: fmt.Sprintf("run %s is %s: only a finished run can be reset; cancel it first (planex runs cancel %s), or fork it (planex runs fork) to try something else beside it", run.GetId(), statusName(run.GetStatus()), run.GetId())}
		}
		at, err := foldTo(events, req.GetToSequence(), "to_sequence")
		if err != nil {
			return nil, err
		}
		cat, err := s.cfg.Tools.Get(ctx)
		if err != nil {
			return nil, err
		}
		sur, err := engine.PlanReset(engine.SurgeryInput{
			Current: run, At: at, FromStep: req.GetFromStep(), StepArgs: req.GetStepArgs(), Unknown: req.GetUnknownOutcomes(),
			Tool:    func(name string) *planexv1.ToolSpec { t, _ := cat.Tool(name); return t },
			Catalog: cat, Limits: s.cfg.PlanLimits,
		})
		if err != nil {
			return nil, surgeryStatus(err)
		}
		replan := req.GetReplan() || sur.Replan
		if len(sur.Rerun) == 0 && !replan && len(sur.Unknown) == 0 {
			return nil, &preconditionError{msg: fmt.Sprintf("nothing to reset: every step of run %s's plan keeps its result; reset from a step (from_step), to an earlier event (to_sequence), or with replan", run.GetId())}
		}
		budget, err := s.resetBudget(run, req.GetBudget(), len(sur.Rerun), replan)
		if err != nil {
			return nil, err
		}
		resp := &planexv1.ResetRunResponse{Run: run, Rerun: sur.Rerun, Kept: sur.Kept, KeptSideEffects: sur.KeptSideEffects, DryRun: req.GetDryRun()}
		if req.GetDryRun() {
			return resp, nil
		}
		ev := &planexv1.RunReset{
			ResetBy: startedBy(ctx), Actor: req.GetActor(), Reason: req.GetReason(),
			ToSequence: req.GetToSequence(), FromStep: req.GetFromStep(), Plan: sur.Plan,
			KeptSideEffects: sur.KeptSideEffects, UnknownOutcomes: sur.Unknown, Replan: replan,
			Budget: budget, RequestId: req.GetRequestId(), PreviousStatus: run.GetStatus(),
			PreviousStopReason: run.GetStopReason(), BatchId: batchID,
		}
		if !admitted {
			// The run is in flight again: the tenant's start quotas and
			// fair share apply as to a new run, before anything is
			// appended.
			release, err := s.admit(ctx, &planexv1.StartRunRequest{Goal: run.GetGoal(), Labels: run.GetLabels(), Budget: budget})
			if err != nil {
				return nil, err
			}
			defer release()
			admitted = true
		}
		rctx := engine.RunContext(ctx, st.TraceContext)
		// The guard first: should this call die after the append, its
		// timer advances the run (StartRun's start guard, for a reset).
		n := run.GetResets() + 1
		if err := publishGuard(rctx, s.res, run.GetId(), "reset-"+strconv.Itoa(int(n)), s.cfg.StartGuard); err != nil {
			return nil, err
		}
		tx := s.log.Begin(st)
		if err := tx.Emit(withRunID(run.GetId(), engine.Event(ev))); err != nil {
			return nil, err
		}
		next, err := s.log.Commit(rctx, tx)
		if errors.Is(err, runlog.ErrConflict) {
			continue // a fork's link was appended meanwhile: decide again
		}
		if err != nil {
			return nil, err
		}
		if h := s.cfg.Hooks.AfterResetAppend; h != nil {
			if err := h(run.GetId()); err != nil {
				return nil, err
			}
		}
		if err := s.kickReset(rctx, next.Run); err != nil {
			return nil, err
		}
		s.logger.InfoContext(rctx, "run reset", "run_id", run.GetId(), "rerun", len(sur.Rerun), "kept", len(sur.Kept), "kept_side_effects", len(sur.KeptSideEffects), "replan", replan, "batch_id", batchID)
		resp.Run = next.Run
		return resp, nil
	}
	return nil, fmt.Errorf("reset run %s: gave up after %d append conflicts", req.GetRunId(), maxResetTries)
}

// validateReset checks a reset request's fields.
func (s *Server) validateReset(req *planexv1.ResetRunRequest) error {
	var errs []error
	if err := validRunID(req.GetRunId()); err != nil {
		errs = append(errs, err)
	}
	switch r := req.GetReason(); {
	case r == "":
		errs = append(errs, invalid("reason: required: say why the run is reset (it is recorded in the run log)"))
	default:
		if err := checkText("reason", r, maxReasonBytes); err != nil {
			errs = append(errs, err)
		}
	}
	if req.GetToSequence() > 0 && req.GetFromStep() != "" {
		errs = append(errs, invalid("from_step: give to_sequence or from_step, not both"))
	}
	if err := checkText("actor", req.GetActor(), maxActorBytes); err != nil {
		errs = append(errs, err)
	}
	if err := checkText("request_id", req.GetRequestId(), maxKeyBytes); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, checkStepArgs(req.GetStepArgs())...)
	if len(errs) > 0 {
		return joinInvalid(errs)
	}
	return nil
}

// checkStepArgs refuses edited arguments that carry a secret (they go into
// the run log and perhaps to a remote planner, as inputs do).
func checkStepArgs(args map[string]*structpb.Struct) []error {
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(args)) {
		if err := checkSecret("step_args."+id, redact.CanonicalStruct(args[id])); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// resetWithID returns the reset recorded with request id, or nil.
func resetWithID(events []*planexv1.RunEvent, id string) *planexv1.RunReset {
	for _, ev := range slices.Backward(events) {
		if r := ev.GetRunReset(); r != nil && r.GetRequestId() == id {
			return r
		}
	}
	return nil
}

// foldTo returns the run as it was after event seq (nil for 0), checking
// the chain of the events it folds.
func foldTo(events []*planexv1.RunEvent, seq uint64, field string) (*planexv1.Run, error) {
	if seq == 0 {
		return nil, nil
	}
	if n := uint64(len(events)); seq > n {
		return nil, invalid("%s %d: the run's log has %d events", field, seq, n)
	}
	st := &runlog.State{}
	for i, ev := range events[:seq] {
		if err := st.Apply(ev, uint64(i)+1); err != nil {
			return nil, fmt.Errorf("fold the run to event %d: %w", seq, err)
		}
	}
	return st.Run, nil
}

// resetBudget is the run's budget after a reset: the run's limits with
// the request's non-zero fields, within the server's ceilings. The steps
// that start over must fit in it.
func (s *Server) resetBudget(run *planexv1.Run, in *planexv1.Budget, rerun int, replan bool) (*planexv1.Budget, error) {
	b := proto.CloneOf(run.GetBudget())
	if b == nil {
		b = &planexv1.Budget{}
	}
	if in != nil {
		if in.GetMaxSteps() != 0 {
			b.MaxSteps = in.GetMaxSteps()
		}
		if in.GetMaxReplans() != 0 {
			b.MaxReplans = in.GetMaxReplans()
		}
		if in.GetDeadline() != nil {
			b.Deadline = in.GetDeadline()
		}
		if in.GetMaxTokens() != 0 {
			b.MaxTokens = in.GetMaxTokens()
		}
		if in.GetStepTimeout() != nil {
			b.StepTimeout = in.GetStepTimeout()
		}
		if in.GetMaxParallelism() != 0 {
			b.MaxParallelism = in.GetMaxParallelism()
		}
	}
	resolved, err := s.cfg.Limits.Resolve(b)
	if err != nil {
		return nil, invalid("%v", err)
	}
	used := run.GetUsage()
	if need := used.GetSteps() + int32(rerun); !replan && need > resolved.GetMaxSteps() {
		return nil, invalid("budget.max_steps: the run used %d of its %d steps and the reset runs %d again: give budget.max_steps %d or more", used.GetSteps(), resolved.GetMaxSteps(), rerun, need)
	}
	if replan && used.GetTokens() >= resolved.GetMaxTokens() {
		return nil, invalid("budget.max_tokens: the run used %d of its %d planner tokens and a replan needs more: give a higher budget.max_tokens", used.GetTokens(), resolved.GetMaxTokens())
	}
	return resolved, nil
}

// kickReset publishes what starts a reset run again: its new deadline
// timer and a kick, which dispatches the steps that start over or, for a
// run that plans again, its planning round's kick.
func (s *Server) kickReset(ctx context.Context, run *planexv1.Run) error {
	if err := engine.PublishDeadline(ctx, s.res, run); err != nil {
		return err
	}
	msgID := bus.MsgID(run.GetId(), "reset", strconv.Itoa(int(run.GetResets())))
	if run.GetStatus() == planexv1.RunStatus_RUN_STATUS_PLANNING {
		msgID = engine.PlanKickID(run.GetId(), runlog.CurrentPlan(run).GetRevision()+1, run.GetUsage().GetReplans())
	}
	_, err := bus.Publish(ctx, s.res.JS, bus.Publication{
		Subject: bus.EngineSubject(run.GetId(), bus.KindKick),
		Msg:     &planexv1.EngineKick{RunId: run.GetId(), Reason: fmt.Sprintf("reset %d", run.GetResets())},
		MsgID:   msgID,
		Attrs:   []attribute.KeyValue{attribute.String("planex.run_id", run.GetId())},
	})
	if err != nil {
		return fmt.Errorf("kick reset run %s: %w", run.GetId(), err)
	}
	return nil
}

// publishGuard publishes a START_GUARD timer for a run (message id
// "<run>:timer:<name>"): when it fires, the engine loads the run and
// advances it, which publishes whatever a crashed caller did not.
func publishGuard(ctx context.Context, res *bus.Resources, runID, name string, delay time.Duration) error {
	if delay <= 0 {
		delay = 10 * time.Second
	}
	t := &planexv1.EngineTimer{RunId: runID, FireAt: timestamppb.New(time.Now().Add(delay)), Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_START_GUARD}
	if _, err := bus.Publish(ctx, res.JS, bus.Publication{
		Subject: bus.EngineSubject(runID, bus.KindTimer), Msg: t,
		MsgID: bus.MsgID(runID, "timer", name),
		Attrs: []attribute.KeyValue{attribute.String("planex.run_id", runID)},
	}); err != nil {
		return fmt.Errorf("publish guard of run %s: %w", runID, err)
	}
	return nil
}

// surgeryStatus maps the engine's refusal of a reset or fork to the API's
// errors: a field at fault is InvalidArgument, the run's state
// FailedPrecondition.
func surgeryStatus(err error) error {
	var se *engine.SurgeryError
	if !errors.As(err, &se) {
		return err
	}
	if se.Precondition() {
		return &preconditionError{msg: se.Msg}
	}
	return invalid("%s", se.Error())
}

// statusName is a run status as people read it ("running").
func statusName(s planexv1.RunStatus) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "RUN_STATUS_"))
}
