package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/internal/policy"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// round identifies one planning round of a run: the revision it is to
// produce and the replans counted so far. A planner answer is applied only
// to the round it was asked for.
type round struct{ revision, replans int32 }

func roundOf(run *planexv1.Run) round {
	return round{revision: runlog.CurrentPlan(run).GetRevision() + 1, replans: run.GetUsage().GetReplans()}
}

// planning reports whether the run waits for the planner.
func planning(run *planexv1.Run) bool {
	s := run.GetStatus()
	return s == planexv1.RunStatus_RUN_STATUS_PENDING || s == planexv1.RunStatus_RUN_STATUS_PLANNING
}

// PlanKickID is the message id of the kick that starts a planning round, so
// the kick published by StartRun and any repair of it are one message.
func PlanKickID(runID string, revision, replans int32) string {
	return bus.MsgID(runID, "plan", strconv.Itoa(int(revision)), strconv.Itoa(int(replans)))
}

// kickRound reads the planning round a kick was published for from its
// message id (PlanKickID); ok is false for kicks that name none (a repair
// kick of the sweeper, a kick without an id).
func kickRound(runID, msgID string) (r round, ok bool) {
	rest, found := strings.CutPrefix(msgID, bus.MsgID(runID, "plan", ""))
	if !found {
		return round{}, false
	}
	rev, replans, found := strings.Cut(rest, ":")
	if !found {
		return round{}, false
	}
	a, err1 := strconv.ParseInt(rev, 10, 32)
	b, err2 := strconv.ParseInt(replans, 10, 32)
	if err1 != nil || err2 != nil || a < 1 || b < 0 {
		return round{}, false
	}
	return round{revision: int32(a), replans: int32(b)}, true
}

// reached reports whether a run's state has reached the planning round a
// kick was published for. A kick is published only once the log holds its
// round as a planning round, so a state that has not is stale: its round
// is behind (both counters only grow), or it is that round but not
// planning yet (a run leaves planning only with a new revision, which
// starts the next round, or by finishing).
func reached(run *planexv1.Run, kicked round) bool {
	now := roundOf(run)
	if now.revision < kicked.revision || now.replans < kicked.replans {
		return false
	}
	return now != kicked || planning(run)
}

// plannerCall is a planner request prepared under the run lock.
type plannerCall struct {
	req   *planexv1.PlanRequest
	round round
	base  int64 // tokens spent before the call
	state *runlog.State
}

// onPlanKick runs one planning round: reserve the token budget (an event),
// call the planner without holding the run, then apply the answer if the
// run is still in that round. A supervisor that dies during the call leaves
// the kick unacknowledged; another replica repeats the call.
//
// A kick is never dropped on a stale read. kicked, when the kick names its
// round (PlanKickID; a repair kick names none and reads the log afresh),
// is checked against the state: one that has not reached it is stale —
// this replica's cached run, behind another replica's appends, or a read
// served by a stream replica that lags. Acting on it would ack the kick
// as irrelevant, or ask the planner about a round the run has left (its
// answer dropped, the kick acked), and strand the run until the sweeper.
// Instead the decision is made again on the log (transact), and the kick
// comes back (errStale) while the log read is still behind.
func (e *Engine) onPlanKick(ctx context.Context, runID string, kicked *round) error {
	var call *plannerCall
	err := e.transact(ctx, runID, func(ctx context.Context, tx *runlog.Tx) error {
		call = nil
		run := tx.Run()
		if kicked != nil && !reached(run, *kicked) {
			now := roundOf(run)
			return fmt.Errorf("%w: planning kick of run %s for revision %d (replans %d), but the run read shows %s at revision %d (replans %d)",
				errStale, runID, kicked.revision, kicked.replans, run.GetStatus(), now.revision, now.replans)
		}
		if !planning(run) {
			return errIgnore
		}
		if dl := runDeadline(run); !dl.IsZero() && !e.cfg.Now().Before(dl) {
			return finishDeadline(tx)
		}
		u, b := run.GetUsage(), run.GetBudget()
		if u.GetTokensReserved() == 0 {
			remaining := b.GetMaxTokens() - u.GetTokens() - childTokens(run) // children's share included
			if remaining <= 0 {
				return finish(tx, planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED,
					fmt.Sprintf("the planner needs tokens but the run spent %d of %d (max_tokens)", u.GetTokens(), b.GetMaxTokens()),
					nil, planexv1.BudgetKind_BUDGET_KIND_TOKENS)
			}
			if err := tx.Emit(Event(&planexv1.BudgetUsed{Usage: &planexv1.BudgetUsage{
				Steps: u.GetSteps(), Replans: u.GetReplans(), Tokens: u.GetTokens(), TokensReserved: remaining,
			}})); err != nil {
				return err
			}
		}
		req, err := e.planRequest(ctx, tx.State())
		if err != nil {
			return err
		}
		call = &plannerCall{req: req, round: roundOf(run), base: run.GetUsage().GetTokens(), state: tx.State().Clone()}
		return nil
	})
	if err != nil || call == nil {
		return err
	}
	resp, perr := e.callPlanner(ctx, call)
	inRound := func(ctx context.Context, tx *runlog.Tx, apply func() error) error {
		run := tx.Run()
		if !planning(run) || roundOf(run) != call.round {
			e.logger.DebugContext(ctx, "dropping a planner answer for a round the run left", "revision", call.round.revision)
			return errIgnore
		}
		return apply()
	}
	if perr != nil && transient(perr) {
		if used := spent(usageOf(perr)); used > 0 {
			// Count what the failed call spent, then let the kick retry.
			if err := e.transact(ctx, runID, func(ctx context.Context, tx *runlog.Tx) error {
				return inRound(ctx, tx, func() error { return settle(tx, call.base+used) })
			}); err != nil && !errors.Is(err, errIgnore) {
				return err
			}
		}
		return fmt.Errorf("call planner for run %s: %w", runID, perr)
	}
	return e.transact(ctx, runID, func(ctx context.Context, tx *runlog.Tx) error {
		return inRound(ctx, tx, func() error { return e.applyPlan(ctx, tx, call, resp, perr) })
	})
}

// transient reports planner errors worth retrying later (same round, same
// kick) rather than ending the round.
func transient(err error) bool {
	switch status.Code(err) {
	case grpccodes.Unavailable, grpccodes.DeadlineExceeded, grpccodes.Canceled:
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// usageOf returns the tokens a failed planner call reports in its status
// details.
func usageOf(err error) *planexv1.TokenUsage {
	for _, d := range status.Convert(err).Details() {
		if u, ok := d.(*planexv1.TokenUsage); ok {
			return u
		}
	}
	return nil
}

func spent(u *planexv1.TokenUsage) int64 { return u.GetInputTokens() + u.GetOutputTokens() }

// settle records the run's token account after a planner call (absolute,
// so applying the same answer twice after a partial append does not count
// its tokens twice) and closes the reservation.
func settle(tx *runlog.Tx, tokens int64) error {
	u := tx.Run().GetUsage()
	return tx.Emit(Event(&planexv1.BudgetUsed{Usage: &planexv1.BudgetUsage{Steps: u.GetSteps(), Replans: u.GetReplans(), Tokens: tokens}}))
}

// plannerMessage is the planner's error message for stop_message, with one
// "planner: " prefix.
func plannerMessage(err error) string {
	msg := status.Convert(err).Message()
	if strings.HasPrefix(msg, "planner:") {
		return msg
	}
	return "planner: " + msg
}

func (e *Engine) callPlanner(ctx context.Context, call *plannerCall) (*planexv1.PlanResponse, error) {
	ctx, span := e.tracer.Start(e.runContext(ctx, call.state), "plan revision",
		trace.WithLinks(trace.LinkFromContext(ctx)),
		trace.WithAttributes(
			attribute.String("planex.run_id", call.req.GetRunId()),
			attribute.Int("planex.plan_revision", int(call.round.revision)),
			attribute.String("planex.planning_mode", call.req.GetMode().String()),
		))
	defer span.End()
	ctx, cancel := context.WithTimeout(ctx, e.cfg.PlannerTimeout)
	defer cancel()
	start := time.Now()
	resp, err := e.planner.Plan(ctx, call.req)
	e.metrics.plannerCall(ctx, time.Since(start), resp, err)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, status.Convert(err).Message())
		return nil, err
	}
	span.SetAttributes(attribute.Bool("planex.plan_stop", resp.GetStop()),
		attribute.Int64("planex.tokens", resp.GetUsage().GetInputTokens()+resp.GetUsage().GetOutputTokens()))
	return resp, nil
}

// planRequest builds the planner's input from the run's state.
func (e *Engine) planRequest(ctx context.Context, st *runlog.State) (*planexv1.PlanRequest, error) {
	run := st.Run
	cat, err := e.tools.Get(ctx)
	if err != nil {
		return nil, err
	}
	b, u := run.GetBudget(), run.GetUsage()
	hist := &planexv1.PlanHistory{
		Revisions:        run.GetPlans(),
		ValidationErrors: st.RejectErrors,
		ReplanReason:     st.ReplanReason,
	}
	var outcomes []timedOutcome
	for _, s := range runlog.Outcomes(run) {
		o := &planexv1.StepOutcome{
			StepId: s.GetStepId(), Tool: s.GetTool(), Args: s.GetResolvedArgs(), Status: s.GetStatus(),
			Output: s.GetOutput(), Error: s.GetError(), Attempt: s.GetAttempt(), PlanRevision: s.GetPlanRevision(),
		}
		if ref := s.GetOutputRef(); ref != nil && o.Output == nil {
			o.Output = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"output_ref": structpb.NewStringValue(ref.GetName()),
				"size":       structpb.NewNumberValue(float64(ref.GetSize())),
			}})
		}
		outcomes = append(outcomes, timedOutcome{s.GetFinishedAt().AsTime(), o})
	}
	outcomes = append(outcomes, rejectedSteps(run)...)
	slices.SortStableFunc(outcomes, func(a, b timedOutcome) int { return a.at.Compare(b.at) })
	for _, o := range outcomes {
		hist.Steps = append(hist.Steps, o.o)
	}
	return &planexv1.PlanRequest{
		RunId:  run.GetId(),
		Tenant: e.cfg.Tenant,
		Goal:   run.GetGoal(),
		Inputs: run.GetInputs(),
		Tools:  cat.Specs(),
		Constraints: &planexv1.PlanConstraints{
			MaxSteps:         max(b.GetMaxSteps()-u.GetSteps(), 0),
			MaxParallelism:   b.GetMaxParallelism(),
			RemainingTokens:  u.GetTokensReserved(),
			RemainingReplans: max(b.GetMaxReplans()-u.GetReplans(), 0),
		},
		Mode:     run.GetMode(),
		History:  hist,
		Backend:  run.GetPlannerBackend(),
		Revision: roundOf(run).revision,
	}, nil
}

// timedOutcome is a step outcome of the planner's history with the time it
// happened, which orders the history.
type timedOutcome struct {
	at time.Time
	o  *planexv1.StepOutcome
}

// rejectedSteps are the outcomes of the steps rejected at their gate: they
// never ran, and the planner sees each as FAILED with code REJECTED, the
// rejection (who, why) as the message, so it can plan around it.
func rejectedSteps(run *planexv1.Run) []timedOutcome {
	var out []timedOutcome
	for _, g := range run.GetGates() {
		if g.GetKind() == planexv1.GateKind_GATE_KIND_PLAN || g.GetDecision() != planexv1.DecisionKind_DECISION_KIND_REJECT {
			continue
		}
		o := &planexv1.StepOutcome{
			StepId: g.GetStepId(), Status: planexv1.StepStatus_STEP_STATUS_FAILED, PlanRevision: g.GetPlanRevision(),
			Error: &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_REJECTED, Message: rejection(g, decidedOf(g))},
		}
		for _, p := range run.GetPlans() {
			if p.GetRevision() != g.GetPlanRevision() {
				continue
			}
			for _, s := range p.GetSteps() {
				if s.GetId() == g.GetStepId() {
					o.Tool, o.Args = s.GetTool(), s.GetArgs()
				}
			}
		}
		out = append(out, timedOutcome{g.GetDecidedAt().AsTime(), o})
	}
	return out
}

// decidedOf is the decision recorded on gate g.
func decidedOf(g *planexv1.Gate) *planexv1.GateDecided {
	return &planexv1.GateDecided{
		GateId: g.GetId(), Decision: g.GetDecision(), Actor: g.GetActor(), Comment: g.GetComment(),
		DecidedBy: g.GetDecidedBy(), Via: g.GetDecidedVia(), StopRun: g.GetStopRun(),
	}
}

// rejectedGate is the gate whose rejection sent the run back to the
// planner in this round, or nil: the gate of the step the replan names,
// or the current revision's plan gate.
func rejectedGate(st *runlog.State) *planexv1.Gate {
	run := st.Run
	id := runlog.PlanGateID(runlog.CurrentPlan(run).GetRevision())
	if st.ReplanStep != "" {
		id = runlog.GateID(st.ReplanStep, runlog.Step(run, st.ReplanStep).GetPlanRevision())
	}
	if g := runlog.Gate(run, id); g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_REJECT {
		return g
	}
	return nil
}

// applyPlan records a planner answer: settle the tokens, then finish
// (stop, escalate, planner error, budget), reject an invalid plan (a replan)
// or install the new revision with its lineage. A planner error ends the
// run with PLANNER_ERROR, except an exhausted token budget
// (ResourceExhausted: BUDGET_EXCEEDED) and an invalid model answer
// (Aborted: rejected like an invalid plan, so it counts as a replan).
func (e *Engine) applyPlan(ctx context.Context, tx *runlog.Tx, call *plannerCall, resp *planexv1.PlanResponse, perr error) error {
	run := tx.Run()
	b := run.GetBudget()
	used := spent(resp.GetUsage())
	if perr != nil {
		used = spent(usageOf(perr))
	}
	tokens := call.base + used
	if err := settle(tx, tokens); err != nil {
		return err
	}
	switch status.Code(perr) {
	case grpccodes.OK:
	case grpccodes.ResourceExhausted:
		return finish(tx, planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED, plannerMessage(perr), nil, planexv1.BudgetKind_BUDGET_KIND_TOKENS)
	case grpccodes.Aborted:
		return e.reject(tx, call.round.revision, []string{plannerMessage(perr)}, usageOf(perr))
	default:
		return finish(tx, planexv1.StopReason_STOP_REASON_PLANNER_ERROR, plannerMessage(perr), nil, 0)
	}
	if tokens+childTokens(run) > b.GetMaxTokens() {
		return finish(tx, planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED,
			fmt.Sprintf("the planner brought the run to %d tokens, above its budget of %d (max_tokens)", tokens, b.GetMaxTokens()),
			nil, planexv1.BudgetKind_BUDGET_KIND_TOKENS)
	}
	if resp.GetGiveUp() {
		// The planner declines to recover from the step failure that
		// caused this round: that failure is why the run stops.
		if failed := runlog.Step(run, tx.State().ReplanStep); failed != nil && failed.GetError() != nil {
			return finishStep(tx, failed, resp.GetStopMessage())
		}
		if g := rejectedGate(tx.State()); g != nil {
			// The planner has no plan without what was rejected: the
			// rejection is why the run stops.
			msg := rejection(g, decidedOf(g))
			switch m := resp.GetStopMessage(); {
			case strings.Contains(m, msg):
				msg = m
			case m != "":
				msg += "; the planner has no other plan: " + m
			}
			return finish(tx, planexv1.StopReason_STOP_REASON_REJECTED, msg, nil, 0)
		}
		msg := resp.GetStopMessage()
		if msg == "" {
			msg = "the planner gave up"
		}
		return finish(tx, planexv1.StopReason_STOP_REASON_FAILED, msg, nil, 0)
	}
	if resp.GetStop() {
		if resp.GetEscalate() {
			msg := resp.GetStopMessage()
			if msg == "" {
				msg = "the planner escalated the run to a human"
			}
			return finish(tx, planexv1.StopReason_STOP_REASON_ESCALATED, msg, nil, 0)
		}
		result := resp.GetFinalAnswer()
		if result == nil && runlog.PlanComplete(run) {
			var err error
			if result, err = e.result(ctx, run, runlog.CurrentPlan(run)); err != nil && errors.Is(err, errOutputs) {
				return err
			}
		}
		return e.succeed(ctx, tx, resp.GetStopMessage(), result)
	}
	p, problems, err := e.checkPlan(ctx, run, call.round.revision, resp.GetPlan())
	if err != nil {
		return err
	}
	if len(problems) > 0 {
		return e.reject(tx, call.round.revision, problems, resp.GetUsage())
	}
	completed := map[string]bool{}
	for _, s := range run.GetSteps() {
		if s.GetStatus() == planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
			completed[s.GetStepId()] = true
		}
	}
	if ev := e.stalled(run, p); ev != nil {
		return finishStalled(tx, ev)
	}
	d := e.planVerdict(run, p)
	if d.Action == policy.Deny {
		return e.reject(tx, call.round.revision, []string{"plan denied by " + d.Message()}, resp.GetUsage())
	}
	p.Lineage = plan.Lineage(runlog.CurrentPlan(run), p, completed)
	if err := tx.Emit(Event(&planexv1.PlanRevised{Plan: p, Backend: resp.GetBackend(), Model: resp.GetModel(), Usage: resp.GetUsage()})); err != nil {
		return err
	}
	if g := e.planGate(run, p, d); g != nil {
		return tx.Emit(Event(&planexv1.GateOpened{Gate: g}))
	}
	return nil
}

// reject sends an invalid answer back to the planner (a replan), or stops
// the run when no replan is left.
func (e *Engine) reject(tx *runlog.Tx, revision int32, problems []string, usage *planexv1.TokenUsage) error {
	run := tx.Run()
	if run.GetUsage().GetReplans() < run.GetBudget().GetMaxReplans() {
		return tx.Emit(Event(&planexv1.PlanRejected{Revision: revision, Errors: problems, Usage: usage}))
	}
	return finish(tx, planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED,
		fmt.Sprintf("plan revision %d is invalid (%s); no replan left (max_replans %d)", revision, problems[0], run.GetBudget().GetMaxReplans()),
		nil, planexv1.BudgetKind_BUDGET_KIND_REPLANS)
}

// checkPlan numbers the plan, carries completed steps over in next-step
// mode and validates it; problems are the validation errors, each naming
// the step and field.
func (e *Engine) checkPlan(ctx context.Context, run *planexv1.Run, revision int32, in *planexv1.Plan) (*planexv1.Plan, []string, error) {
	if in == nil {
		return nil, []string{"the planner returned neither a plan nor stop"}, nil
	}
	p := proto.CloneOf(in)
	p.Revision = revision
	p.Lineage = nil
	if run.GetMode() == planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP {
		if !carryOver(run, p) {
			return nil, []string{"the plan adds no step to run; answer stop when the goal is met"}, nil
		}
	}
	cat, err := e.tools.Get(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := plan.Validate(p, cat, e.cfg.PlanLimits); err != nil {
		var ve *plan.ValidationError
		if !errors.As(err, &ve) {
			return nil, []string{err.Error()}, nil
		}
		problems := make([]string, 0, len(ve.Problems))
		for _, pr := range ve.Problems {
			problems = append(problems, pr.String())
		}
		return nil, problems, nil
	}
	return p, nil, nil
}

// carryOver prepends to a next-step plan the completed steps of the current
// plan it leaves out, so references to their outputs stay valid, and
// reports whether the plan has a step left to run.
func carryOver(run *planexv1.Run, p *planexv1.Plan) bool {
	have := map[string]bool{}
	for _, s := range p.GetSteps() {
		have[s.GetId()] = true
	}
	var carried []*planexv1.Step
	for _, s := range runlog.CurrentPlan(run).GetSteps() {
		if !have[s.GetId()] && runlog.Step(run, s.GetId()).GetStatus() == planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
			carried = append(carried, s)
		}
	}
	p.Steps = append(carried, p.Steps...)
	for _, s := range p.GetSteps() {
		if runlog.Step(run, s.GetId()).GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
			return true
		}
	}
	return false
}
