package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/internal/policy"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// maxAdvance bounds the rounds of one advance; each round emits at least
// one event or ends it, and a run has far fewer transitions in a row.
const maxAdvance = 256

// Event wraps a payload message (*planexv1.RunCreated, *planexv1.StepFailed,
// ...) in a RunEvent; any other message gives an event without payload,
// which Tx.Emit refuses.
func Event(p proto.Message) *planexv1.RunEvent {
	e := &planexv1.RunEvent{}
	switch v := p.(type) {
	case *planexv1.RunCreated:
		e.Payload = &planexv1.RunEvent_Created{Created: v}
	case *planexv1.PlanRevised:
		e.Payload = &planexv1.RunEvent_PlanRevised{PlanRevised: v}
	case *planexv1.PlanRejected:
		e.Payload = &planexv1.RunEvent_PlanRejected{PlanRejected: v}
	case *planexv1.StepDispatched:
		e.Payload = &planexv1.RunEvent_StepDispatched{StepDispatched: v}
	case *planexv1.StepStarted:
		e.Payload = &planexv1.RunEvent_StepStarted{StepStarted: v}
	case *planexv1.StepSucceeded:
		e.Payload = &planexv1.RunEvent_StepSucceeded{StepSucceeded: v}
	case *planexv1.StepFailed:
		e.Payload = &planexv1.RunEvent_StepFailed{StepFailed: v}
	case *planexv1.ExpectationFailed:
		e.Payload = &planexv1.RunEvent_ExpectationFailed{ExpectationFailed: v}
	case *planexv1.ReplanRequested:
		e.Payload = &planexv1.RunEvent_ReplanRequested{ReplanRequested: v}
	case *planexv1.GateOpened:
		e.Payload = &planexv1.RunEvent_GateOpened{GateOpened: v}
	case *planexv1.GateDecided:
		e.Payload = &planexv1.RunEvent_GateDecided{GateDecided: v}
	case *planexv1.BudgetUsed:
		e.Payload = &planexv1.RunEvent_BudgetUsed{BudgetUsed: v}
	case *planexv1.RunFinished:
		e.Payload = &planexv1.RunEvent_Finished{Finished: v}
	case *planexv1.StepRetrying:
		e.Payload = &planexv1.RunEvent_StepRetrying{StepRetrying: v}
	case *planexv1.CriticVerdict:
		e.Payload = &planexv1.RunEvent_CriticVerdict{CriticVerdict: v}
	case *planexv1.CritiquePending:
		e.Payload = &planexv1.RunEvent_CritiquePending{CritiquePending: v}
	case *planexv1.RunReset:
		e.Payload = &planexv1.RunEvent_RunReset{RunReset: v}
	case *planexv1.RunForked:
		e.Payload = &planexv1.RunEvent_RunForked{RunForked: v}
	case *planexv1.ChildRunFinished:
		e.Payload = &planexv1.RunEvent_ChildRunFinished{ChildRunFinished: v}
	}
	return e
}

// finish ends the run.
func finish(tx *runlog.Tx, reason planexv1.StopReason, msg string, result *structpb.Value, exceeded planexv1.BudgetKind) error {
	status := planexv1.RunStatus_RUN_STATUS_FAILED
	switch reason {
	case planexv1.StopReason_STOP_REASON_SUCCEEDED:
		status = planexv1.RunStatus_RUN_STATUS_SUCCEEDED
	case planexv1.StopReason_STOP_REASON_ESCALATED:
		status = planexv1.RunStatus_RUN_STATUS_ESCALATED
	case planexv1.StopReason_STOP_REASON_CANCELLED:
		status = planexv1.RunStatus_RUN_STATUS_CANCELLED
	}
	return tx.Emit(Event(&planexv1.RunFinished{Status: status, StopReason: reason, Message: msg, Result: result, ExceededBudget: exceeded}))
}

// runDeadline is when the run's deadline passes (zero: none): the budget's
// deadline after the run's creation, or after its last reset.
func runDeadline(run *planexv1.Run) time.Time {
	d := run.GetBudget().GetDeadline()
	if d == nil || d.AsDuration() <= 0 || run.GetCreatedAt() == nil {
		return time.Time{}
	}
	if r := run.GetResetAt(); r != nil {
		return r.AsTime().Add(d.AsDuration())
	}
	return run.GetCreatedAt().AsTime().Add(d.AsDuration())
}

func finishDeadline(tx *runlog.Tx) error {
	since := "creation"
	if tx.Run().GetResetAt() != nil {
		since = "its last reset"
	}
	return finish(tx, planexv1.StopReason_STOP_REASON_DEADLINE,
		fmt.Sprintf("the run's deadline (%s after %s) passed", tx.Run().GetBudget().GetDeadline().AsDuration(), since),
		nil, planexv1.BudgetKind_BUDGET_KIND_DEADLINE)
}

// onResult folds an executor's result for the current attempt of a step.
func (e *Engine) onResult(ctx context.Context, tx *runlog.Tx, res *planexv1.StepResult) error {
	if handled, err := e.onChildResult(ctx, tx, res); handled {
		return err // a run.child attempt: its child's log decides (children.go)
	}
	st := tx.State().Step(res.GetStepId())
	switch {
	case st == nil || res.GetAttempt() > st.GetAttempt():
		return errStale
	case res.GetAttempt() < st.GetAttempt() || !runlog.InFlight(st.GetStatus()):
		e.logger.DebugContext(ctx, "ignoring result of a stale or finished attempt", "step_id", res.GetStepId(), "attempt", res.GetAttempt(), "current", st.GetAttempt(), "status", st.GetStatus())
		return errIgnore
	case runlog.Critiquing(st):
		// A redelivered result of an attempt the model critic is judging.
		return errIgnore
	}
	if st.GetStatus() == planexv1.StepStatus_STEP_STATUS_RUNNING && res.GetExecutorId() != "" &&
		st.GetExecutorId() != "" && res.GetExecutorId() != st.GetExecutorId() {
		// Another executor ran the attempt again after a redelivery and its
		// result came before its restart notice was handled (started
		// notices are not on the critical path): record the restart with
		// the result, so the log shows the repeated execution.
		if err := tx.Emit(Event(&planexv1.StepStarted{StepId: st.GetStepId(), Attempt: st.GetAttempt(), ExecutorId: res.GetExecutorId(), Restart: true})); err != nil {
			return err
		}
		st = tx.State().Step(res.GetStepId())
	}
	// A stored output must be this attempt's own, in its pool's bucket: an
	// executor naming another pool's bucket or another run's object would
	// have the supervisor read that object into this run.
	if ref := res.GetOutputRef(); ref != nil {
		if err := bus.CheckStepOutputRef(ref, bus.PoolOf(st.GetTool()), tx.Run().GetId(), st.GetStepId(), st.GetAttempt()); err != nil {
			e.logger.WarnContext(ctx, "refusing a step result whose output reference is not the attempt's own", "tool", st.GetTool(),
				"step_id", st.GetStepId(), "attempt", st.GetAttempt(), "executor_id", res.GetExecutorId(), "err", err)
			return tx.Emit(Event(&planexv1.StepFailed{StepId: st.GetStepId(), Attempt: st.GetAttempt(), Duration: res.GetDuration(), ExecutorId: res.GetExecutorId(),
				Error: &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_INTERNAL, Message: "the executor returned an output reference that is not this attempt's own: " + err.Error()}}))
		}
	}
	// Nothing that looks like a secret reaches the run log (outputmask.go).
	res, err := e.maskResult(ctx, tx.Run().GetId(), st.GetTool(), res)
	if err != nil {
		return err
	}
	switch res.GetStatus() {
	case planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED:
		if st.GetStatus() == planexv1.StepStatus_STEP_STATUS_DISPATCHED {
			// The result came before the started notice was handled:
			// record the start with it (the notice is dropped later).
			if err := tx.Emit(Event(&planexv1.StepStarted{StepId: st.GetStepId(), Attempt: st.GetAttempt(), ExecutorId: res.GetExecutorId()})); err != nil {
				return err
			}
			st = tx.State().Step(res.GetStepId())
		}
		return e.onSucceeded(ctx, tx, st, res)
	case planexv1.StepResultStatus_STEP_RESULT_STATUS_OUTCOME_UNKNOWN:
		serr := res.GetError()
		if serr == nil {
			serr = &planexv1.StepError{Message: "the executor could not tell whether the step ran"}
		}
		serr = &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN, Message: serr.GetMessage(), Field: serr.GetField()}
		return tx.Emit(Event(&planexv1.StepFailed{StepId: st.GetStepId(), Attempt: st.GetAttempt(), Error: serr, Duration: res.GetDuration(), ExecutorId: res.GetExecutorId()}))
	default:
		serr := res.GetError()
		if serr == nil {
			serr = &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_INTERNAL, Message: fmt.Sprintf("executor reported status %s without an error", res.GetStatus())}
		}
		return tx.Emit(Event(&planexv1.StepFailed{StepId: st.GetStepId(), Attempt: st.GetAttempt(), Error: serr, Duration: res.GetDuration(), ExecutorId: res.GetExecutorId()}))
	}
}

func (e *Engine) onSucceeded(ctx context.Context, tx *runlog.Tx, st *planexv1.StepState, res *planexv1.StepResult) error {
	runID := tx.Run().GetId()
	var output any
	expect := tx.State().PlanStep(st.GetStepId()).GetExpect()
	if expect != "" {
		out, err := e.outputOf(ctx, res.GetOutput(), res.GetOutputRef())
		if err != nil {
			return err
		}
		output = out
		ok, err := plan.CheckExpect(expect, output, st.GetResolvedArgs().AsMap())
		if err != nil || !ok {
			msg := "evaluated to false"
			if err != nil {
				msg = err.Error()
			}
			return tx.Emit(Event(&planexv1.ExpectationFailed{StepId: st.GetStepId(), Attempt: st.GetAttempt(), Expect: expect, Message: msg}))
		}
	}
	if e.policies().Has(policy.ScopeResult) {
		if expect == "" {
			out, err := e.outputOf(ctx, res.GetOutput(), res.GetOutputRef())
			if err != nil {
				return err
			}
			output = out
		}
		if failed, err := e.critique(ctx, tx, st, output); err != nil || failed {
			return err
		}
	}
	value, ref := res.GetOutput(), res.GetOutputRef()
	if ref == nil && value != nil {
		var err error
		if value, ref, err = e.keepSmall(ctx, runID, st, value); err != nil {
			return err
		}
	}
	ok := &planexv1.StepSucceeded{
		StepId: st.GetStepId(), Attempt: st.GetAttempt(), Output: value, OutputRef: ref,
		Truncated: res.GetTruncated(), Duration: res.GetDuration(), ExecutorId: res.GetExecutorId(),
	}
	if held, err := e.holdForCritique(tx, st, ok); held || err != nil {
		return err
	}
	return tx.Emit(Event(ok))
}

func (e *Engine) onStarted(tx *runlog.Tx, n *planexv1.StepStartedNotice) error {
	st := tx.State().Step(n.GetStepId())
	switch {
	case st == nil || n.GetAttempt() > st.GetAttempt():
		return errStale
	case n.GetAttempt() != st.GetAttempt() || st.GetStatus() != planexv1.StepStatus_STEP_STATUS_DISPATCHED:
		return errIgnore
	}
	return tx.Emit(Event(&planexv1.StepStarted{StepId: n.GetStepId(), Attempt: n.GetAttempt(), ExecutorId: n.GetExecutorId()}))
}

// onRestarted records that another executor started a running attempt
// again after a redelivery, once: a repeated notice is no later than the
// recorded start.
func (e *Engine) onRestarted(tx *runlog.Tx, n *planexv1.StepStartedNotice) error {
	st := tx.State().Step(n.GetStepId())
	if st == nil || st.GetAttempt() != n.GetAttempt() || st.GetStatus() != planexv1.StepStatus_STEP_STATUS_RUNNING ||
		st.GetStartedAt() == nil || n.GetStartedAt() == nil || !n.GetStartedAt().AsTime().After(st.GetStartedAt().AsTime()) {
		return errIgnore
	}
	return tx.Emit(Event(&planexv1.StepStarted{StepId: n.GetStepId(), Attempt: n.GetAttempt(), ExecutorId: n.GetExecutorId(), Restart: true}))
}

// onTimer fires a timer that is due and still relevant.
func (e *Engine) onTimer(ctx context.Context, tx *runlog.Tx, t *planexv1.EngineTimer) error {
	now := e.cfg.Now()
	run := tx.Run()
	switch t.GetKind() {
	case planexv1.EngineTimerKind_ENGINE_TIMER_KIND_DEADLINE:
		dl := runDeadline(run)
		if dl.IsZero() {
			return errIgnore
		}
		if now.Before(dl) {
			return notYet{dl.Sub(now)}
		}
		return finishDeadline(tx)
	case planexv1.EngineTimerKind_ENGINE_TIMER_KIND_STEP_TIMEOUT,
		planexv1.EngineTimerKind_ENGINE_TIMER_KIND_SCHEDULE_TO_START,
		planexv1.EngineTimerKind_ENGINE_TIMER_KIND_HEARTBEAT:
		if childRecord(run, t.GetStepId(), t.GetAttempt()) != nil {
			return e.onChildTimer(ctx, tx, t) // a child step's watch (children.go)
		}
		return e.onStepTimer(ctx, tx, t)
	case planexv1.EngineTimerKind_ENGINE_TIMER_KIND_RETRY:
		st := tx.State().Step(t.GetStepId())
		if st == nil || t.GetAttempt() > st.GetAttempt() {
			return errStale
		}
		if at := st.GetRetryAt(); at != nil && st.GetStatus() == planexv1.StepStatus_STEP_STATUS_PENDING && now.Before(at.AsTime()) {
			return notYet{at.AsTime().Sub(now)}
		}
		// Due (or moot): advancing the run dispatches the retry.
		return errIgnore
	case planexv1.EngineTimerKind_ENGINE_TIMER_KIND_GATE_SLA:
		return e.onGateSLA(ctx, tx, t)
	case planexv1.EngineTimerKind_ENGINE_TIMER_KIND_START_GUARD:
		// Nothing to decide: loading the run and advancing it republishes
		// the planning kick of a run still pending (StartRun died before
		// its kick), deduplicated when the kick was sent, or dispatches
		// the steps of a reset or forked run whose creator died before
		// its kick. A fork's creator may also have died before linking
		// it to its original.
		if o := run.GetForkedFrom(); o != nil && e.log != nil {
			if err := LinkFork(ctx, e.log, o.GetRunId(), run); err != nil {
				return err
			}
		}
		return errIgnore
	default:
		return fmt.Errorf("%w: timer kind %s", errDecode, t.GetKind())
	}
}

func (e *Engine) onCancel(tx *runlog.Tx, k *planexv1.EngineKick) error {
	msg := "cancelled by a client"
	if r := k.GetCancelReason(); r != "" {
		msg += ": " + r
	}
	return finish(tx, planexv1.StopReason_STOP_REASON_CANCELLED, msg, nil, 0)
}

// advance emits what the run's state calls for until it calls for nothing
// more: finish on deadline, escalate unknown outcomes, replan failures,
// finish a complete plan, open gates and dispatch ready steps.
func (e *Engine) advance(ctx context.Context, tx *runlog.Tx) error {
	for range maxAdvance {
		n := len(tx.Events())
		if err := e.step(ctx, tx); err != nil {
			return err
		}
		if len(tx.Events()) == n {
			return nil
		}
	}
	return fmt.Errorf("run %s: no steady state after %d transitions", tx.Run().GetId(), maxAdvance)
}

func (e *Engine) step(ctx context.Context, tx *runlog.Tx) error {
	run := tx.Run()
	if runlog.Terminal(run.GetStatus()) {
		return nil
	}
	if dl := runDeadline(run); !dl.IsZero() && !e.cfg.Now().Before(dl) {
		return finishDeadline(tx)
	}
	switch run.GetStatus() {
	case planexv1.RunStatus_RUN_STATUS_PENDING, planexv1.RunStatus_RUN_STATUS_PLANNING:
		return nil // a planning kick (a side effect) takes it from here
	}
	cur := runlog.CurrentPlan(run)
	state := tx.State()
	var failed *planexv1.StepState
	for _, i := range state.Failed() {
		s, st := cur.GetSteps()[i], state.PlanState(i)
		switch st.GetStatus() {
		case planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN:
			// A read has no outcome to lose: its policy may retry it.
			if retried, err := e.retry(ctx, tx, s, st); err != nil || retried {
				return err
			}
			return finish(tx, planexv1.StopReason_STOP_REASON_ESCALATED,
				fmt.Sprintf("the outcome of attempt %d of step %q (%s) is unknown: %s", st.GetAttempt(), st.GetStepId(), st.GetTool(), st.GetError().GetMessage()),
				nil, 0)
		case planexv1.StepStatus_STEP_STATUS_FAILED:
			retried, err := e.retry(ctx, tx, s, st)
			if err != nil {
				return err
			}
			if retried {
				return nil // one event per round; the next round goes on
			}
			if failed == nil {
				failed = st
			}
		}
	}
	if failed != nil {
		return e.replanOrStop(tx, failed)
	}
	if state.PlanComplete() {
		result, err := e.result(ctx, run, cur)
		if err != nil {
			if errors.Is(err, errOutputs) {
				return err
			}
			return finish(tx, planexv1.StopReason_STOP_REASON_FAILED, fmt.Sprintf("evaluate the plan's answer: %v", err), nil, 0)
		}
		return e.succeed(ctx, tx, "", result)
	}
	return e.schedule(ctx, tx)
}

// replanOrStop sends a run with a failed step back to the planner, or stops
// it when no replan is left.
func (e *Engine) replanOrStop(tx *runlog.Tx, failed *planexv1.StepState) error {
	run := tx.Run()
	reason := fmt.Sprintf("step %q (%s) attempt %d failed: %s: %s", failed.GetStepId(), failed.GetTool(), failed.GetAttempt(),
		failed.GetError().GetCode(), failed.GetError().GetMessage())
	if run.GetUsage().GetReplans() < run.GetBudget().GetMaxReplans() {
		return tx.Emit(Event(&planexv1.ReplanRequested{Reason: reason, StepId: failed.GetStepId()}))
	}
	if run.GetBudget().GetMaxReplans() == 0 {
		// The run allows no replan: the step's failure is the reason.
		return finishStep(tx, failed, "")
	}
	return finish(tx, planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED,
		fmt.Sprintf("%s; no replan left (max_replans %d)", reason, run.GetBudget().GetMaxReplans()),
		nil, planexv1.BudgetKind_BUDGET_KIND_REPLANS)
}

// schedule opens gates and dispatches ready steps within the parallelism
// and step budgets. Its work depends on the steps it schedules, not on the
// plan's length: the run's state knows which steps are ready and how many
// are in flight (runlog.State).
func (e *Engine) schedule(ctx context.Context, tx *runlog.Tx) error {
	run := tx.Run()
	state := tx.State()
	cur := runlog.CurrentPlan(run)
	if g := runlog.Gate(run, runlog.PlanGateID(cur.GetRevision())); g != nil && runlog.GateOpen(run, g) {
		return nil // the whole revision waits for its plan gate
	}
	now := e.cfg.Now()
	var cat *catalog.Catalog
	outOfSteps, anyReady := false, false
	var poolFull map[string]bool // pools whose limit holds this run's next steps back
	for i := range state.Ready() {
		s, st := cur.GetSteps()[i], state.PlanState(i)
		if backingOff(st, now) {
			continue // its retry timer brings it back
		}
		anyReady = true
		if cat == nil {
			var err error
			if cat, err = e.tools.Get(ctx); err != nil {
				return err
			}
		}
		spec, _ := cat.Tool(s.GetTool())
		id := s.GetId()
		g := runlog.Gate(run, runlog.GateID(id, st.GetPlanRevision()))
		edited := g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_EDIT
		if g != nil && g.GetDecision() != planexv1.DecisionKind_DECISION_KIND_APPROVE && !edited {
			continue // undecided; a rejection was handled with the decision
		}
		if s.GetTool() == catalog.HumanInput {
			// Asks a person instead of a pool (input.go).
			if err := e.scheduleInput(ctx, tx, s, st, spec, g); err != nil {
				return err
			}
			continue
		}
		if g != nil || !e.staticGate(s, spec) {
			// The step would be dispatched now unless a policy holds it
			// back: resolve it only when the budgets have room. (Steps that
			// need a gate anyway open it first, whatever is in flight.)
			if state.InFlight() >= int(run.GetBudget().GetMaxParallelism()) {
				break
			}
			if stepsCommitted(run) >= run.GetBudget().GetMaxSteps() { // children's share included
				outOfSteps = true
				break
			}
		}
		args, failure, err := e.resolve(ctx, state, s, st, spec, edited)
		if err != nil {
			return err
		}
		if failure == nil {
			// Policies see the resolved arguments. An approved gate
			// settles require_approval; a deny still holds (edited
			// arguments are checked again).
			d := e.stepVerdict(run, s, args, spec)
			switch {
			case d.Action == policy.Deny:
				failure = denied(s, st.GetAttempt()+1, d)
			case g == nil:
				if gate := e.stepGate(s, st, spec, d); gate != nil {
					if err := tx.Emit(Event(&planexv1.GateOpened{Gate: gate})); err != nil {
						return err
					}
					continue
				}
			}
		}
		if failure != nil {
			return tx.Emit(Event(failure)) // the failure is handled in the next round
		}
		if pool := bus.PoolOf(s.GetTool()); e.poolLimit(pool) > 0 {
			// The tenant's steps in flight in this pool are limited: the
			// step waits for a place, and so do the run's later steps of
			// the pool (in plan order).
			if poolFull[pool] {
				continue
			}
			ok, err := e.pools.acquire(ctx, pool, e.poolLimit(pool), run.GetId(), id, st.GetAttempt()+1)
			if err != nil {
				return err
			}
			if !ok {
				if poolFull == nil {
					poolFull = map[string]bool{}
				}
				poolFull[pool] = true
				continue
			}
		}
		if err := e.dispatch(ctx, tx, s, st, spec, args); err != nil {
			return err
		}
	}
	if !anyReady {
		for _, i := range state.Retrying() {
			if backingOff(state.PlanState(i), now) {
				return nil
			}
		}
		return e.checkStuck(tx)
	}
	if outOfSteps && state.InFlight() == 0 {
		return finish(tx, planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED,
			fmt.Sprintf("step %q is ready but the run already dispatched %d step attempts (max_steps %d)", firstPending(state, now), run.GetUsage().GetSteps(), run.GetBudget().GetMaxSteps()),
			nil, planexv1.BudgetKind_BUDGET_KIND_STEPS)
	}
	return nil
}

// backingOff reports whether a pending step waits for the retry time of
// its next attempt.
func backingOff(st *planexv1.StepState, now time.Time) bool {
	at := st.GetRetryAt()
	return at != nil && st.GetStatus() == planexv1.StepStatus_STEP_STATUS_PENDING && now.Before(at.AsTime())
}

// checkStuck finishes a running run that can make no progress: nothing in
// flight, nothing ready, no gate open, plan not complete. A valid plan never
// gets there; this keeps a broken one from hanging until its deadline.
func (e *Engine) checkStuck(tx *runlog.Tx) error {
	run := tx.Run()
	if tx.State().InFlight() > 0 || run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING {
		return nil
	}
	return finish(tx, planexv1.StopReason_STOP_REASON_FAILED, "the plan cannot make progress: no step is ready or running", nil, 0)
}

// firstPending is the first step of the plan ready to be dispatched (not
// backing off).
func firstPending(state *runlog.State, now time.Time) string {
	for i := range state.Ready() {
		if st := state.PlanState(i); !backingOff(st, now) {
			return runlog.CurrentPlan(state.Run).GetSteps()[i].GetId()
		}
	}
	return ""
}

// resolve resolves a step's arguments (or takes the edited ones) and checks
// them against the tool's schema and the size a request may carry; a
// failure is the StepFailed (INVALID_ARGUMENT, with the field) to emit
// instead of a dispatch.
func (e *Engine) resolve(ctx context.Context, state *runlog.State, s *planexv1.Step, st *planexv1.StepState, spec *planexv1.ToolSpec, edited bool) (*structpb.Struct, *planexv1.StepFailed, error) {
	attempt := st.GetAttempt() + 1
	fail := func(field, msg string) (*structpb.Struct, *planexv1.StepFailed, error) {
		return nil, &planexv1.StepFailed{StepId: s.GetId(), Attempt: attempt, Error: &planexv1.StepError{
			Code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Message: msg, Field: field,
		}}, nil
	}
	args := st.GetResolvedArgs()
	if !edited {
		env, err := e.env(ctx, state, s)
		if err != nil {
			return nil, nil, err
		}
		if args, err = plan.ResolveArgs(s.GetArgs(), env); err != nil {
			var ee *plan.EvalError
			if errors.As(err, &ee) {
				return fail(ee.Field, err.Error())
			}
			return fail("args", err.Error())
		}
	}
	if spec != nil {
		if err := plan.ValidateArgs(spec, args); err != nil {
			return fail("args", err.Error())
		}
	}
	if limit := e.maxArgsBytes(); proto.Size(args) > limit {
		// The request (and the event) could never be published.
		return fail("args", fmt.Sprintf("resolved arguments are %d bytes, above the %d a step request may carry (NATS max payload); pass large data by reference", proto.Size(args), limit))
	}
	return args, nil, nil
}

// dispatch emits StepDispatched for the next attempt of a step with its
// resolved arguments (the request is published as a side effect after the
// append).
func (e *Engine) dispatch(ctx context.Context, tx *runlog.Tx, s *planexv1.Step, st *planexv1.StepState, spec *planexv1.ToolSpec, args *structpb.Struct) error {
	if isChildTool(s.GetTool()) {
		return e.dispatchChild(tx, s, st, args) // no pool: the engine starts a child run (children.go)
	}
	run := tx.Run()
	attempt := st.GetAttempt() + 1
	t := e.timeouts(s, run.GetBudget(), spec)
	ev := &planexv1.StepDispatched{
		StepId: s.GetId(), Attempt: attempt, PlanRevision: runlog.CurrentPlan(run).GetRevision(), Tool: s.GetTool(),
		ResolvedArgs: args, StartToCloseTimeout: durationpb.New(t.startToClose),
	}
	if t.scheduleToStart > 0 {
		ev.ScheduleToStartTimeout = durationpb.New(t.scheduleToStart)
	}
	if t.heartbeat > 0 {
		ev.HeartbeatTimeout = durationpb.New(t.heartbeat)
	}
	// The executor drops an attempt it could not finish by this time:
	// the queue wait allowed plus the run time, within the run deadline.
	var deadline time.Time
	if t.scheduleToStart > 0 {
		deadline = e.cfg.Now().Add(t.scheduleToStart + t.startToClose)
	}
	if dl := runDeadline(run); !dl.IsZero() && (deadline.IsZero() || dl.Before(deadline)) {
		deadline = dl
	}
	if !deadline.IsZero() {
		ev.Deadline = timestamppb.New(deadline)
	}
	return tx.Emit(Event(ev))
}

// env is what a step's argument references see: goal, inputs and the
// outputs of the step's transitive dependencies.
// Only the outputs the arguments reference are read (a chain's last step
// would otherwise read every output before it, at every dispatch), and the
// dependencies are walked only until those are found (a chain's step
// referencing the previous one looks at one step, not at the chain).
func (e *Engine) env(ctx context.Context, state *runlog.State, s *planexv1.Step) (plan.Env, error) {
	run := state.Run
	refs, ok := plan.ArgSteps(s.GetArgs())
	if ok && len(refs) == 0 {
		return plan.Env{Goal: run.GetGoal(), Inputs: run.GetInputs().AsMap(), Outputs: map[string]any{}}, nil
	}
	cur := runlog.CurrentPlan(run)
	pos := runlog.PlanIndex(cur)
	want := map[string]bool{} // references not found among the dependencies yet
	for _, id := range refs {
		want[id] = true
	}
	deps := map[string]bool{}
	stack := []*planexv1.Step{s}
	for len(stack) > 0 && (!ok || len(want) > 0) {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, d := range n.GetDependsOn() {
			if deps[d] {
				continue
			}
			deps[d] = true
			delete(want, d)
			if i, found := pos[d]; found {
				stack = append(stack, cur.GetSteps()[i])
			}
		}
	}
	if ok {
		used := map[string]bool{}
		for _, id := range refs {
			if deps[id] {
				used[id] = true
			}
		}
		deps = used
	}
	return e.envOf(ctx, run, state.Step, deps)
}

// envOf reads the outputs of steps ids, looked up with step.
func (e *Engine) envOf(ctx context.Context, run *planexv1.Run, step func(id string) *planexv1.StepState, ids map[string]bool) (plan.Env, error) {
	env := plan.Env{Goal: run.GetGoal(), Inputs: run.GetInputs().AsMap(), Outputs: map[string]any{}}
	for id := range ids {
		st := step(id)
		if st.GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
			continue
		}
		out, err := e.outputOf(ctx, st.GetOutput(), st.GetOutputRef())
		if err != nil {
			return plan.Env{}, err
		}
		env.Outputs[id] = out
	}
	return env, nil
}

// result is the value of a complete plan: its answer expression, or the
// outputs of its leaves.
func (e *Engine) result(ctx context.Context, run *planexv1.Run, p *planexv1.Plan) (*structpb.Value, error) {
	ids := map[string]bool{}
	for _, s := range p.GetSteps() {
		ids[s.GetId()] = true
	}
	steps := runlog.Steps(run)
	env, err := e.envOf(ctx, run, func(id string) *planexv1.StepState { return steps[id] }, ids)
	if err != nil {
		return nil, err
	}
	v, err := plan.Result(p, env)
	if err != nil {
		return nil, err
	}
	out, err := structpb.NewValue(v)
	if err != nil {
		return nil, fmt.Errorf("encode result: %w", err)
	}
	return out, nil
}
