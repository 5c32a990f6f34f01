package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// ModelCritic configures the model critic: after a step succeeds (and the
// deterministic verifiers passed), the engine asks a planner backend for a
// verdict before the run moves on.
type ModelCritic struct {
	// Backend is the planner backend asked (PlannerService.Critique with
	// this backend); empty turns the model critic off.
	Backend string
	// Tools are the tools whose results are judged; "*" judges every tool.
	Tools []string
	// MaxTokens is the critic's token budget per run, apart from the
	// planner's max_tokens; once spent, results are no longer judged (a
	// skipped verdict records it). It must be positive when Backend is set.
	MaxTokens int64
	// Escalate stops the run ESCALATED on a failing verdict instead of
	// failing the attempt (retry or replan).
	Escalate bool
}

// Critic verdict actions of the model critic besides replan and escalate.
const (
	verdictPass    = "pass"
	verdictSkipped = "skipped"
)

// judges reports whether the model critic judges results of tool.
func (c ModelCritic) judges(tool string) bool {
	return c.Backend != "" && (slices.Contains(c.Tools, "*") || slices.Contains(c.Tools, tool))
}

func (c ModelCritic) verifier() string { return "model:" + c.Backend }

// CritiqueKickID is the message id of the kick that asks the model critic
// about one attempt: the kick published with the CritiquePending event and
// any repair of it are one message.
func CritiqueKickID(runID, stepID string, attempt int32) string {
	return bus.MsgID(runID, "critique", stepID, strconv.Itoa(int(attempt)))
}

// holdForCritique records a succeeded attempt that the model critic must
// judge first: CritiquePending holds its StepSucceeded until the verdict
// (the step stays RUNNING, so nothing that depends on it runs). With the
// critic's budget spent, the result is not judged: a skipped verdict
// records why and the step succeeds. It reports whether it took the
// result; false leaves recording it to the caller.
func (e *Engine) holdForCritique(tx *runlog.Tx, st *planexv1.StepState, ok *planexv1.StepSucceeded) (bool, error) {
	c := e.cfg.Critic
	if !c.judges(st.GetTool()) {
		return false, nil
	}
	run := tx.Run()
	if spent := run.GetCriticTokens(); spent >= c.MaxTokens {
		if err := tx.Emit(Event(&planexv1.CriticVerdict{
			StepId: st.GetStepId(), Attempt: st.GetAttempt(), Verifier: c.verifier(), Passed: true, Action: verdictSkipped,
			Reason: fmt.Sprintf("not judged: the critic's token budget is spent (%d of %d tokens, --critic-max-tokens)", spent, c.MaxTokens),
		})); err != nil {
			return true, err
		}
		return true, tx.Emit(Event(ok))
	}
	return true, tx.Emit(Event(&planexv1.CritiquePending{StepId: st.GetStepId(), Attempt: st.GetAttempt(), Backend: c.Backend, Result: ok}))
}

// critiqueKicks publishes the kick of every critique the transaction
// opened, and, when the state was folded from the log (a replica that may
// have missed them), of every critique still pending (deduplicated by
// CritiqueKickID).
func (e *Engine) critiqueKicks(ctx context.Context, base, next *runlog.State, events []*planexv1.RunEvent) []func() error {
	opened := map[string]bool{}
	for _, ev := range events {
		if c := ev.GetCritiquePending(); c != nil {
			opened[c.GetStepId()] = true
		}
	}
	var jobs []func() error
	run := next.Run
	for _, st := range stepsToPerform(base, next, events) {
		if !runlog.Critiquing(st) || !(opened[st.GetStepId()] || !base.Verified) {
			continue
		}
		jobs = append(jobs, func() error {
			kick := &planexv1.EngineKick{RunId: run.GetId(), Critique: true, Reason: fmt.Sprintf("critique step %s attempt %d", st.GetStepId(), st.GetAttempt())}
			if _, err := bus.Publish(e.runContext(ctx, next), e.res.JS, bus.Publication{
				Subject: bus.EngineSubject(run.GetId(), bus.KindKick), Msg: kick,
				MsgID: CritiqueKickID(run.GetId(), st.GetStepId(), st.GetAttempt()),
				Attrs: []attribute.KeyValue{attribute.String("planex.run_id", run.GetId())},
			}); err != nil {
				return fmt.Errorf("publish critique kick: %w", err)
			}
			return nil
		})
	}
	return jobs
}

// critiqueCall is a critic request prepared under the run lock.
type critiqueCall struct {
	stepID  string
	attempt int32
	req     *planexv1.CritiqueRequest
	ref     *planexv1.OutputRef // output to read before the call, if stored by reference
	state   *runlog.State
}

// onCritiques answers the run's pending critiques, like a planning round:
// the requests are prepared under the run lock, the critic is called
// without it, and each verdict is applied only if the attempt still waits
// for it. A replica that dies during a call leaves the kick
// unacknowledged; another replica asks again. A replan that a failing
// verdict causes publishes its own planning kick.
func (e *Engine) onCritiques(ctx context.Context, runID string) error {
	var calls []*critiqueCall
	err := e.transact(ctx, runID, func(ctx context.Context, tx *runlog.Tx) error {
		calls = nil
		run := tx.Run()
		for _, st := range run.GetSteps() {
			if !runlog.Critiquing(st) {
				continue
			}
			call, err := e.critiqueRequest(ctx, tx.State(), st)
			if err != nil {
				return err
			}
			calls = append(calls, call)
		}
		return errIgnore
	})
	if err != nil && !errors.Is(err, errIgnore) {
		return err
	}
	for _, call := range calls {
		resp, cerr := e.callCritic(ctx, call)
		if cerr != nil && transient(cerr) {
			return fmt.Errorf("call critic for run %s step %s: %w", runID, call.stepID, cerr)
		}
		if err := e.transact(ctx, runID, func(ctx context.Context, tx *runlog.Tx) error {
			st := runlog.Step(tx.Run(), call.stepID)
			if !runlog.Critiquing(st) || st.GetAttempt() != call.attempt {
				e.logger.DebugContext(ctx, "dropping a verdict for an attempt no longer waiting for it", "step_id", call.stepID, "attempt", call.attempt)
				return errIgnore
			}
			return e.applyVerdict(tx, st, resp, cerr)
		}); err != nil && !errors.Is(err, errIgnore) {
			return err
		}
	}
	return nil
}

// critiqueRequest builds the critic's input for a step waiting for it.
func (e *Engine) critiqueRequest(ctx context.Context, st *runlog.State, s *planexv1.StepState) (*critiqueCall, error) {
	run := st.Run
	cat, err := e.tools.Get(ctx)
	if err != nil {
		return nil, err
	}
	spec, _ := cat.Tool(s.GetTool())
	if spec == nil {
		spec = &planexv1.ToolSpec{Name: s.GetTool()}
	}
	ps := runlog.PlanStep(run, s.GetStepId())
	res := s.GetCritiquePending().GetResult()
	return &critiqueCall{
		stepID: s.GetStepId(), attempt: s.GetAttempt(), ref: res.GetOutputRef(), state: st.Clone(),
		req: &planexv1.CritiqueRequest{
			RunId: run.GetId(), Goal: run.GetGoal(), StepId: s.GetStepId(), Attempt: s.GetAttempt(),
			Description: ps.GetDescription(), Tool: spec, Args: s.GetResolvedArgs(), Output: res.GetOutput(),
			Expect: ps.GetExpect(), Backend: s.GetCritiquePending().GetBackend(), PlanRevision: s.GetPlanRevision(),
			RemainingTokens: max(e.cfg.Critic.MaxTokens-run.GetCriticTokens(), 1),
		},
	}, nil
}

// callCritic asks the critic in a "critic" span of the run's trace.
func (e *Engine) callCritic(ctx context.Context, call *critiqueCall) (*planexv1.CritiqueResponse, error) {
	ctx, span := e.tracer.Start(e.runContext(ctx, call.state), "critic",
		trace.WithLinks(trace.LinkFromContext(ctx)),
		trace.WithAttributes(
			attribute.String("planex.run_id", call.req.GetRunId()), attribute.String("planex.step_id", call.stepID),
			attribute.Int("planex.attempt", int(call.attempt)), attribute.String("planex.tool", call.req.GetTool().GetName()),
			attribute.String("planex.critic.verifier", "model:"+call.req.GetBackend()),
		))
	defer span.End()
	req := call.req
	if call.ref != nil {
		out, err := e.outputOf(ctx, nil, call.ref)
		if err != nil {
			span.RecordError(err)
			return nil, status.Errorf(grpccodes.Unavailable, "read the output of step %s: %v", call.stepID, err)
		}
		v, err := structpb.NewValue(out)
		if err != nil {
			return nil, status.Errorf(grpccodes.Internal, "output of step %s: %v", call.stepID, err)
		}
		req = proto.CloneOf(call.req)
		req.Output = v
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.PlannerTimeout)
	defer cancel()
	resp, err := e.planner.Critique(ctx, req)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, status.Convert(err).Message())
		return nil, err
	}
	span.SetAttributes(attribute.Bool("planex.critic.passed", resp.GetPassed()),
		attribute.Int64("planex.tokens", spent(resp.GetUsage())))
	return resp, nil
}

// applyVerdict records the critic's answer: a passing verdict releases the
// held StepSucceeded; a failing one fails the attempt (ExpectationFailed:
// retried if the step's retry policy covers EXPECTATION_FAILED, otherwise
// replanned with the reason in the planner's history) or, with
// --critic-on-fail escalate, stops the run. A critic whose budget cannot
// cover the call (ResourceExhausted) skips the result; any other error of
// the critic escalates the run: an unjudged result must not pass silently.
func (e *Engine) applyVerdict(tx *runlog.Tx, st *planexv1.StepState, resp *planexv1.CritiqueResponse, cerr error) error {
	c := e.cfg.Critic
	held := st.GetCritiquePending()
	verdict := &planexv1.CriticVerdict{StepId: st.GetStepId(), Attempt: st.GetAttempt(), Verifier: "model:" + held.GetBackend()}
	switch {
	case status.Code(cerr) == grpccodes.ResourceExhausted:
		verdict.Passed, verdict.Action, verdict.Usage = true, verdictSkipped, usageOf(cerr)
		verdict.Reason = "not judged: " + plannerMessage(cerr)
		if err := tx.Emit(Event(verdict)); err != nil {
			return err
		}
		return tx.Emit(Event(held.GetResult()))
	case cerr != nil:
		verdict.Action, verdict.Usage = verdictEscalate, usageOf(cerr)
		verdict.Reason = "the critic could not judge the result: " + plannerMessage(cerr)
		if err := tx.Emit(Event(verdict)); err != nil {
			return err
		}
		return finish(tx, planexv1.StopReason_STOP_REASON_ESCALATED,
			fmt.Sprintf("the model critic could not judge the result of step %q (%s): %s", st.GetStepId(), st.GetTool(), plannerMessage(cerr)), nil, 0)
	}
	verdict.Passed, verdict.Reason, verdict.Usage = resp.GetPassed(), resp.GetReason(), resp.GetUsage()
	switch {
	case resp.GetPassed():
		verdict.Action = verdictPass
	case c.Escalate:
		verdict.Action = verdictEscalate
	default:
		verdict.Action = verdictReplan
	}
	if err := tx.Emit(Event(verdict)); err != nil {
		return err
	}
	switch verdict.Action {
	case verdictPass:
		return tx.Emit(Event(held.GetResult()))
	case verdictEscalate:
		return finish(tx, planexv1.StopReason_STOP_REASON_ESCALATED,
			fmt.Sprintf("the model critic rejected the result of step %q (%s): %s", st.GetStepId(), st.GetTool(), resp.GetReason()), nil, 0)
	}
	return tx.Emit(Event(&planexv1.ExpectationFailed{
		StepId: st.GetStepId(), Attempt: st.GetAttempt(), Expect: "critic " + verdict.GetVerifier(), Message: resp.GetReason(),
	}))
}
