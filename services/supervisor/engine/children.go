package engine

// Child runs (docs/child-runs.md). A step of the built-in tool run.child
// starts another run and waits for it, as Temporal's child workflows do:
//
//   - dispatch (dispatchChild): the child's budget is carved out of what
//     the parent has left — asking for more is refused, naming the field —
//     and recorded with the child's id on the StepDispatched; the id is
//     derived from parent, step and attempt. No pool is involved.
//   - after the append (startChild, a side effect like a step request):
//     the child's RunCreated is appended with an expected last sequence of
//     0, so repeating it (after a crash, on any replica) finds the child
//     created and only repeats its deadline timer and kick, deduplicated.
//     A watch timer per attempt polls the child in case its notice is lost.
//   - the child's end (childEffects on the child's RunFinished): a
//     StepResult goes to the parent's inbox; the parent (onChildResult)
//     reads the child's log — never the notice's content — and records
//     ChildRunFinished (the child's spend, charged to the parent) with the
//     step's outcome: the child's result, or a failure naming its stop.
//   - a parent that finishes, or whose replan drops the step, cancels the
//     child (and so, recursively, the child's own children).
//   - tracing: the child's root span is a child of the parent step's span,
//     whose id is derived from parent, step and attempt, so one trace shows
//     both runs.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// isChildTool reports whether a step's tool starts a child run.
func isChildTool(tool string) bool { return tool == catalog.ChildTool }

// ChildRunID is the id of the child run that attempt of a parent's step
// starts: a ULID with the parent's creation time and entropy from a hash
// of parent, step and attempt, so every replica derives the same one.
func ChildRunID(parent *planexv1.Run, stepID string, attempt int32) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "planex child run\x00%s\x00%s\x00%d", parent.GetId(), stepID, attempt))
	id, err := ulid.New(ulid.Timestamp(parent.GetCreatedAt().AsTime()), bytes.NewReader(sum[:]))
	if err != nil {
		// A time beyond the ULID range: the hash alone.
		id, _ = ulid.New(0, bytes.NewReader(sum[:]))
	}
	return id.String()
}

// childStepSpanID is the span id of the parent step attempt that starts a
// child: derived, so the child's root span can name it as its parent
// before the step's span is written (when the attempt ends).
func childStepSpanID(runID, stepID string, attempt int32) trace.SpanID {
	sum := sha256.Sum256(fmt.Appendf(nil, "planex child step span\x00%s\x00%s\x00%d", runID, stepID, attempt))
	var id trace.SpanID
	copy(id[:], sum[:])
	if !id.IsValid() {
		id[7] = 1
	}
	return id
}

// childRootSpanID is the span id of a child run's root span.
func childRootSpanID(childID string) trace.SpanID {
	sum := sha256.Sum256([]byte("planex child root span\x00" + childID))
	var id trace.SpanID
	copy(id[:], sum[:])
	if !id.IsValid() {
		id[7] = 1
	}
	return id
}

// childParentSpan is, for a child run, the parent step's span its root
// span is a child of (invalid for other runs).
func childParentSpan(run *planexv1.Run, root trace.SpanContext) trace.SpanContext {
	if run.GetParentRunId() == "" || !root.IsValid() {
		return trace.SpanContext{}
	}
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: root.TraceID(), SpanID: childStepSpanID(run.GetParentRunId(), run.GetParentStepId(), run.GetParentAttempt()),
		TraceFlags: root.TraceFlags(), Remote: true,
	})
}

// childTokens is the planner tokens a run's children hold of its budget.
func childTokens(run *planexv1.Run) int64 {
	_, t := runlog.ChildrenCommitted(run)
	return t
}

// stepsCommitted is the step attempts a run has dispatched plus those its
// children hold.
func stepsCommitted(run *planexv1.Run) int32 {
	s, _ := runlog.ChildrenCommitted(run)
	return run.GetUsage().GetSteps() + s
}

// childArgs are a run.child step's resolved arguments.
type childArgs struct {
	goal      string
	inputs    *structpb.Struct
	labels    map[string]string
	backend   string
	maxSteps  int32
	maxTokens int64
	deadline  time.Duration
}

// parseChildArgs reads a run.child step's arguments (already checked
// against the tool's schema); an error names the field.
func parseChildArgs(args *structpb.Struct) (childArgs, string, error) {
	f := args.GetFields()
	a := childArgs{goal: f["goal"].GetStringValue(), inputs: f["inputs"].GetStructValue(), backend: f["planner_backend"].GetStringValue()}
	if strings.TrimSpace(a.goal) == "" {
		return a, "goal", errors.New("goal: must not be empty")
	}
	if l := f["labels"].GetStructValue(); l != nil {
		a.labels = map[string]string{}
		for k, v := range l.GetFields() {
			a.labels[k] = v.GetStringValue()
		}
	}
	b := f["budget"].GetStructValue().GetFields()
	if v, ok := b["max_steps"]; ok {
		a.maxSteps = int32(min(v.GetNumberValue(), 1<<30))
	}
	if v, ok := b["max_tokens"]; ok {
		a.maxTokens = int64(min(v.GetNumberValue(), 1<<60))
	}
	if v, ok := b["deadline"]; ok {
		d, err := time.ParseDuration(v.GetStringValue())
		if err != nil || d <= 0 {
			return a, "budget.deadline", fmt.Errorf("budget.deadline %q: not a positive duration such as 5m", v.GetStringValue())
		}
		a.deadline = d
	}
	return a, "", nil
}

// dispatchChild dispatches the next attempt of a run.child step: the
// child's budget is carved out of what the parent has left and recorded,
// with the child's id, on the StepDispatched (the child is created after
// the append, by startChild). A child asking for more than the parent has
// left fails the step (INVALID_ARGUMENT, naming the budget field).
func (e *Engine) dispatchChild(tx *runlog.Tx, s *planexv1.Step, st *planexv1.StepState, args *structpb.Struct) error {
	run := tx.Run()
	attempt := st.GetAttempt() + 1
	fail := func(field string, err error) error {
		return tx.Emit(Event(&planexv1.StepFailed{StepId: s.GetId(), Attempt: attempt, Error: &planexv1.StepError{
			Code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Message: err.Error(), Field: field,
		}}))
	}
	a, field, err := parseChildArgs(args)
	if err != nil {
		return fail(field, err)
	}
	b, u := run.GetBudget(), run.GetUsage()
	cSteps, cTokens := runlog.ChildrenCommitted(run)
	// This attempt is one of the parent's steps too.
	stepsLeft := b.GetMaxSteps() - u.GetSteps() - 1 - cSteps
	tokensLeft := b.GetMaxTokens() - u.GetTokens() - u.GetTokensReserved() - cTokens
	now := e.cfg.Now()
	var timeLeft time.Duration
	if dl := runDeadline(run); !dl.IsZero() {
		timeLeft = dl.Sub(now)
	}
	// Unset amounts take a share of what is left: one per child step of
	// the plan still to start, and one kept for the parent itself.
	shares := 1
	for _, ps := range runlog.CurrentPlan(run).GetSteps() {
		if isChildTool(ps.GetTool()) && tx.State().Step(ps.GetId()).GetStatus() == planexv1.StepStatus_STEP_STATUS_PENDING {
			shares++
		}
	}
	switch {
	case stepsLeft <= 0:
		return fail("budget.max_steps", fmt.Errorf("budget.max_steps: the parent run has no step attempt left to give a child (max_steps %d, %d used or held by its children)", b.GetMaxSteps(), b.GetMaxSteps()-stepsLeft))
	case a.maxSteps > stepsLeft:
		return fail("budget.max_steps", fmt.Errorf("budget.max_steps %d: more than the %d step attempts the parent run has left", a.maxSteps, stepsLeft))
	case a.maxSteps == 0:
		a.maxSteps = max(stepsLeft/int32(shares), 1)
	}
	switch {
	case tokensLeft <= 0:
		return fail("budget.max_tokens", fmt.Errorf("budget.max_tokens: the parent run has no planner token left to give a child (max_tokens %d)", b.GetMaxTokens()))
	case a.maxTokens > tokensLeft:
		return fail("budget.max_tokens", fmt.Errorf("budget.max_tokens %d: more than the %d planner tokens the parent run has left", a.maxTokens, tokensLeft))
	case a.maxTokens == 0:
		a.maxTokens = max(tokensLeft/int64(shares), 1)
	}
	if timeLeft > 0 && a.deadline > timeLeft {
		return fail("budget.deadline", fmt.Errorf("budget.deadline %s: later than the parent run's deadline, %s from now", a.deadline, timeLeft.Round(time.Second)))
	}
	budget := &planexv1.Budget{
		MaxSteps: a.maxSteps, MaxTokens: a.maxTokens, MaxReplans: b.GetMaxReplans(),
		MaxParallelism: b.GetMaxParallelism(), StepTimeout: b.GetStepTimeout(),
	}
	ev := &planexv1.StepDispatched{
		StepId: s.GetId(), Attempt: attempt, PlanRevision: runlog.CurrentPlan(run).GetRevision(), Tool: s.GetTool(),
		ResolvedArgs: args, Child: &planexv1.ChildStart{RunId: ChildRunID(run, s.GetId(), attempt), Budget: budget},
	}
	// Without a deadline of its own the child gets the parent's time left
	// when it is created (createChild): the decision does not depend on
	// the clock, so a replay decides it the same way.
	if a.deadline > 0 {
		budget.Deadline = durationpb.New(a.deadline)
		ev.StartToCloseTimeout = durationpb.New(a.deadline)
	}
	if dl := runDeadline(run); !dl.IsZero() {
		ev.Deadline = timestamppb.New(dl)
	}
	return tx.Emit(Event(ev))
}

// childRecord is the parent's record of the child a step attempt started
// (nil: none).
func childRecord(run *planexv1.Run, stepID string, attempt int32) *planexv1.ChildRun {
	for _, c := range run.GetChildren() {
		if c.GetStepId() == stepID && c.GetAttempt() == attempt {
			return c
		}
	}
	return nil
}

// startChild creates the child run a dispatched run.child attempt starts
// (a side effect of the dispatch: any replica may repeat it) and arms the
// attempt's watch timer. It returns the wait for both.
func (e *Engine) startChild(ctx context.Context, parent *runlog.State, st *planexv1.StepState) (wait func() error) {
	run := parent.Run
	rec := childRecord(run, st.GetStepId(), st.GetAttempt())
	if rec == nil || rec.GetRunId() != st.GetChildRunId() {
		return func() error { return nil }
	}
	attrs := []attribute.KeyValue{
		attribute.String("planex.run_id", run.GetId()), attribute.String("planex.step_id", st.GetStepId()),
		attribute.Int("planex.attempt", int(st.GetAttempt())), attribute.String("planex.tool", st.GetTool()),
		attribute.String("planex.child_run_id", rec.GetRunId()),
	}
	root := runSpanContext(parent.TraceContext)
	sctx := e.runContext(ctx, parent)
	if root.IsValid() {
		// Under the step attempt's span (written when the attempt ends).
		sctx = trace.ContextWithRemoteSpanContext(ctx, childParentSpanOf(run.GetId(), st.GetStepId(), st.GetAttempt(), root))
	}
	sctx, span := e.tracer.Start(sctx, "start child run", trace.WithLinks(trace.LinkFromContext(ctx)), trace.WithAttributes(attrs...))
	err := e.createChild(sctx, parent, st, rec, root)
	if err != nil {
		span.RecordError(err)
	}
	span.End()
	if err != nil {
		return func() error { return err }
	}
	return e.startTimer(ctx, parent, &planexv1.EngineTimer{
		RunId: run.GetId(), FireAt: timestamppb.New(e.cfg.Now().Add(e.childWatch())),
		Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_STEP_TIMEOUT, StepId: st.GetStepId(), Attempt: st.GetAttempt(),
	}, "child")
}

func childParentSpanOf(runID, stepID string, attempt int32, root trace.SpanContext) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: root.TraceID(), SpanID: childStepSpanID(runID, stepID, attempt), TraceFlags: root.TraceFlags(), Remote: true,
	})
}

// childDeadlineMargin is how much earlier than its parent's a child's
// deadline passes, at the latest.
const childDeadlineMargin = time.Second

// childWatch is how often a child step's watch timer looks at its child:
// it catches a notice lost in a crash.
func (e *Engine) childWatch() time.Duration { return e.cfg.StrandedAfter }

// createChild appends the child's RunCreated unless it exists, then
// publishes its deadline timer and first planning kick (both
// deduplicated). The child runs in the parent's tenant: this engine's
// account.
func (e *Engine) createChild(ctx context.Context, parent *runlog.State, st *planexv1.StepState, rec *planexv1.ChildRun, root trace.SpanContext) error {
	run := parent.Run
	id := rec.GetRunId()
	child, err := e.log.Load(ctx, id)
	switch {
	case err == nil:
	case errors.Is(err, runlog.ErrRunNotFound):
		a, _, perr := parseChildArgs(st.GetResolvedArgs())
		if perr != nil {
			return fmt.Errorf("start child run %s: %w", id, perr)
		}
		budget := proto.CloneOf(rec.GetBudget())
		// The child's deadline counts from its creation (about now): it
		// ends a margin before the parent's, so that the parent still
		// hears of it (and its creation time, set by the append, may be
		// a little later than now).
		if dl := runDeadline(run); !dl.IsZero() {
			left := dl.Sub(e.cfg.Now()) - childDeadlineMargin
			if left <= 0 {
				return nil // the parent's deadline finishes it (and abandons the step)
			}
			if budget.GetDeadline() == nil || budget.GetDeadline().AsDuration() > left {
				budget.Deadline = durationpb.New(left)
			}
		}
		backend := a.backend
		if backend == "" {
			backend = run.GetPlannerBackend()
		}
		created := &planexv1.RunCreated{
			Goal: a.goal, Inputs: a.inputs, Budget: budget, Labels: a.labels, Mode: run.GetMode(),
			PlannerBackend: backend, StartedBy: run.GetStartedBy(), ApprovePlans: run.GetApprovePlans(),
			Parent: &planexv1.ChildOrigin{RunId: run.GetId(), StepId: st.GetStepId(), Attempt: st.GetAttempt()},
		}
		if root.IsValid() {
			sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: root.TraceID(), SpanID: childRootSpanID(id), TraceFlags: root.TraceFlags()})
			tc := propagation.MapCarrier{}
			propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), tc)
			created.TraceContext = tc
			sid := childStepSpanID(run.GetId(), st.GetStepId(), st.GetAttempt())
			created.Parent.SpanId = hex.EncodeToString(sid[:])
		}
		ev := Event(created)
		ev.RunId = id
		tx := e.log.Begin(&runlog.State{})
		if err := tx.Emit(ev); err != nil {
			return err
		}
		child, err = e.log.Commit(ctx, tx)
		if errors.Is(err, runlog.ErrConflict) {
			// Another replica (or this one before a crash) created it.
			child, err = e.log.Load(ctx, id)
		}
		if err != nil {
			return fmt.Errorf("create child run %s of step %s: %w", id, st.GetStepId(), err)
		}
		e.logger.InfoContext(ctx, "child run started", "run_id", run.GetId(), "step_id", st.GetStepId(), "child_run_id", id)
		if h := e.cfg.Hooks.AfterChildCreate; h != nil {
			h(run.GetId(), id)
		}
	default:
		return fmt.Errorf("read child run %s: %w", id, err)
	}
	if child.Run.GetStatus() != planexv1.RunStatus_RUN_STATUS_PENDING {
		return nil
	}
	cctx := RunContext(ctx, child.TraceContext)
	if err := PublishDeadline(cctx, e.res, child.Run); err != nil {
		return err
	}
	if _, err := bus.Publish(cctx, e.res.JS, bus.Publication{
		Subject: bus.EngineSubject(id, bus.KindKick),
		Msg:     &planexv1.EngineKick{RunId: id, Reason: "plan revision 1"},
		MsgID:   PlanKickID(id, 1, 0),
		Attrs:   []attribute.KeyValue{attribute.String("planex.run_id", id)},
	}); err != nil {
		return fmt.Errorf("kick child run %s: %w", id, err)
	}
	return nil
}

// childEffects are the side effects of child runs a committed state calls
// for: a finished child's notice to its parent, and the cancellation of
// children no step waits for any more (the parent finished, or a replan
// dropped or restarted their step). On an unverified state they are
// repeated (deduplicated by message id).
func (e *Engine) childEffects(ctx context.Context, base, next *runlog.State, events []*planexv1.RunEvent) []func() error {
	run := next.Run
	var jobs []func() error
	finished, orphaning, reset := !base.Verified, !base.Verified, !base.Verified
	for _, ev := range events {
		switch ev.GetPayload().(type) {
		case *planexv1.RunEvent_Finished:
			finished, orphaning = true, true
		case *planexv1.RunEvent_PlanRevised:
			orphaning = true
		case *planexv1.RunEvent_RunReset:
			orphaning, reset = true, true
		}
	}
	if p := run.GetParentRunId(); p != "" && runlog.Terminal(run.GetStatus()) && finished {
		jobs = append(jobs, func() error {
			return e.notify(ctx, next, p, run.GetParentStepId(), run.GetParentAttempt(), run.GetId(), bus.MsgID(p, run.GetParentStepId(), fmt.Sprint(run.GetParentAttempt()), "child"))
		})
	}
	if !orphaning {
		return jobs
	}
	for _, c := range run.GetChildren() {
		if c.GetStatus() != planexv1.RunStatus_RUN_STATUS_UNSPECIFIED || waitedFor(run, c) {
			continue
		}
		if reset {
			// A reset re-opened the run: the children it cancelled when it
			// stopped told it while it was finished, which recorded
			// nothing. Asking again (it reads their logs) charges them and
			// ends their reservations.
			jobs = append(jobs, func() error {
				return e.notify(ctx, next, run.GetId(), c.GetStepId(), c.GetAttempt(), c.GetRunId(),
					bus.MsgID(run.GetId(), c.GetStepId(), fmt.Sprint(c.GetAttempt()), "child", "reset", fmt.Sprint(run.GetResets())))
			})
		}
		reason := fmt.Sprintf("its parent run %s no longer waits for it: step %q was replanned", run.GetId(), c.GetStepId())
		if runlog.Terminal(run.GetStatus()) {
			reason = fmt.Sprintf("its parent run %s stopped (%s)", run.GetId(), strings.TrimPrefix(run.GetStopReason().String(), "STOP_REASON_"))
		}
		jobs = append(jobs, func() error {
			_, err := bus.Publish(e.runContext(ctx, next), e.res.JS, bus.Publication{
				Subject: bus.EngineSubject(c.GetRunId(), bus.KindKick),
				Msg:     &planexv1.EngineKick{RunId: c.GetRunId(), Reason: "cancel", Cancel: true, CancelReason: reason},
				MsgID:   bus.MsgID(c.GetRunId(), "cancel"),
				Attrs:   []attribute.KeyValue{attribute.String("planex.run_id", c.GetRunId())},
			})
			if err != nil {
				return fmt.Errorf("cancel child run %s: %w", c.GetRunId(), err)
			}
			return nil
		})
	}
	return jobs
}

// waitedFor reports whether a live run's step still waits for child c.
func waitedFor(run *planexv1.Run, c *planexv1.ChildRun) bool {
	if runlog.Terminal(run.GetStatus()) {
		return false
	}
	st := runlog.Step(run, c.GetStepId())
	return st.GetAttempt() == c.GetAttempt() && st.GetChildRunId() == c.GetRunId() && runlog.InFlight(st.GetStatus())
}

// notify sends a parent the notice that its child (of step and attempt)
// finished: a StepResult in its inbox, with message id msgID
// ("<parent>:<step>:<attempt>:child" from the child). The parent reads
// the outcome from the child's log, not from the notice.
func (e *Engine) notify(ctx context.Context, st *runlog.State, parent, stepID string, attempt int32, childID, msgID string) error {
	_, err := bus.Publish(e.runContext(ctx, st), e.res.JS, bus.Publication{
		Subject: bus.EngineSubject(parent, bus.KindResult),
		Msg:     &planexv1.StepResult{RunId: parent, StepId: stepID, Attempt: attempt, Status: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED, ExecutorId: "child:" + childID},
		MsgID:   msgID,
		Attrs:   []attribute.KeyValue{attribute.String("planex.run_id", parent), attribute.String("planex.child_run_id", childID)},
	})
	if err != nil {
		return fmt.Errorf("notify parent run %s of child %s: %w", parent, childID, err)
	}
	return nil
}

// onChildResult handles a result for a run.child attempt (handled false:
// not one). The child's own log says how it ended; a notice for a child
// that has not finished (a forged or early one) changes nothing.
func (e *Engine) onChildResult(ctx context.Context, tx *runlog.Tx, res *planexv1.StepResult) (handled bool, err error) {
	rec := childRecord(tx.Run(), res.GetStepId(), res.GetAttempt())
	if rec == nil || e.log == nil {
		// Not a child's attempt; or a replay (no log), which judges the
		// recorded result as the engine's result handling does.
		return false, nil
	}
	if rec.GetStatus() != planexv1.RunStatus_RUN_STATUS_UNSPECIFIED {
		return true, errIgnore
	}
	child, err := e.log.Load(ctx, rec.GetRunId())
	if errors.Is(err, runlog.ErrRunNotFound) {
		return true, errIgnore
	}
	if err != nil {
		return true, fmt.Errorf("read child run %s: %w", rec.GetRunId(), err)
	}
	if !runlog.Terminal(child.Run.GetStatus()) {
		e.logger.WarnContext(ctx, "ignoring a child step result whose child run has not finished", "step_id", res.GetStepId(), "attempt", res.GetAttempt(), "child_run_id", rec.GetRunId())
		return true, errIgnore
	}
	return true, e.childEnded(ctx, tx, rec, child.Run)
}

// onChildTimer is a run.child attempt's watch timer: it applies the
// child's end if its notice was lost, or waits another round.
func (e *Engine) onChildTimer(ctx context.Context, tx *runlog.Tx, t *planexv1.EngineTimer) error {
	st := tx.State().Step(t.GetStepId())
	if st == nil || t.GetAttempt() > st.GetAttempt() {
		return errStale
	}
	rec := childRecord(tx.Run(), t.GetStepId(), t.GetAttempt())
	if rec == nil || rec.GetStatus() != planexv1.RunStatus_RUN_STATUS_UNSPECIFIED {
		return errIgnore
	}
	child, err := e.log.Load(ctx, rec.GetRunId())
	switch {
	case errors.Is(err, runlog.ErrRunNotFound):
		return notYet{e.childWatch()} // its creation is repeated with the dispatch's effects
	case err != nil:
		return fmt.Errorf("read child run %s: %w", rec.GetRunId(), err)
	case !runlog.Terminal(child.Run.GetStatus()):
		return notYet{e.childWatch()}
	}
	return e.childEnded(ctx, tx, rec, child.Run)
}

// childEnded records a finished child in its parent (ChildRunFinished,
// charging its spend) and, when its step's attempt still waits for it,
// the step's outcome: the child's result, or a failure with its stop.
func (e *Engine) childEnded(ctx context.Context, tx *runlog.Tx, rec *planexv1.ChildRun, child *planexv1.Run) error {
	u := child.GetUsage()
	cu := child.GetChildrenUsage()
	if err := tx.Emit(Event(&planexv1.ChildRunFinished{
		ChildRunId: child.GetId(), StepId: rec.GetStepId(), Attempt: rec.GetAttempt(), Status: child.GetStatus(), StopReason: child.GetStopReason(),
		Usage: &planexv1.BudgetUsage{Steps: u.GetSteps() + cu.GetSteps(), Replans: u.GetReplans() + cu.GetReplans(), Tokens: u.GetTokens() + cu.GetTokens()},
	})); err != nil {
		return err
	}
	st := tx.State().Step(rec.GetStepId())
	if st.GetAttempt() != rec.GetAttempt() || st.GetChildRunId() != child.GetId() || !runlog.InFlight(st.GetStatus()) {
		return nil // replanned away: only the spend is recorded
	}
	executor := "child:" + child.GetId()
	if st.GetStatus() == planexv1.StepStatus_STEP_STATUS_DISPATCHED {
		if err := tx.Emit(Event(&planexv1.StepStarted{StepId: st.GetStepId(), Attempt: st.GetAttempt(), ExecutorId: executor})); err != nil {
			return err
		}
		st = tx.State().Step(rec.GetStepId())
	}
	var took *durationpb.Duration
	if child.GetFinishedAt() != nil && child.GetCreatedAt() != nil {
		took = durationpb.New(child.GetFinishedAt().AsTime().Sub(child.GetCreatedAt().AsTime()))
	}
	if child.GetStatus() == planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		res := &planexv1.StepResult{
			RunId: tx.Run().GetId(), StepId: st.GetStepId(), Attempt: st.GetAttempt(), Status: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED,
			Output: child.GetResult(), OutputRef: child.GetResultRef(), Duration: took, ExecutorId: executor,
		}
		if res.Output == nil && res.OutputRef == nil {
			res.Output = structpb.NewNullValue()
		}
		res, err := e.maskResult(ctx, tx.Run().GetId(), st.GetTool(), res)
		if err != nil {
			return err
		}
		return e.onSucceeded(ctx, tx, st, res)
	}
	code := planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED
	switch child.GetStopReason() {
	case planexv1.StopReason_STOP_REASON_CANCELLED:
		code = planexv1.ErrorCode_ERROR_CODE_CANCELLED
	case planexv1.StopReason_STOP_REASON_DEADLINE:
		code = planexv1.ErrorCode_ERROR_CODE_TIMEOUT
	case planexv1.StopReason_STOP_REASON_REJECTED:
		code = planexv1.ErrorCode_ERROR_CODE_REJECTED
	}
	msg := fmt.Sprintf("child run %s stopped %s", child.GetId(), strings.TrimPrefix(child.GetStopReason().String(), "STOP_REASON_"))
	if b := child.GetExceededBudget(); b != planexv1.BudgetKind_BUDGET_KIND_UNSPECIFIED {
		msg += " (" + strings.TrimPrefix(b.String(), "BUDGET_KIND_") + ")"
	}
	if m := child.GetStopMessage(); m != "" {
		msg += ": " + m
	}
	return tx.Emit(Event(&planexv1.StepFailed{StepId: st.GetStepId(), Attempt: st.GetAttempt(), Duration: took, ExecutorId: executor,
		Error: &planexv1.StepError{Code: code, Message: msg}}))
}
