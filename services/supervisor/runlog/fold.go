package runlog

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// ErrBadEvent is matched by errors.Is for events that cannot be folded into
// a run: an event before RunCreated, a second RunCreated, an event after
// RunFinished, or an event without payload.
var ErrBadEvent = errors.New("bad run event")

// Fold returns the run that results from applying ev to run; run is not
// modified. A nil run is the empty run before its RunCreated event. Fold
// checks only what the payload means (see [ErrBadEvent]); the sequence and
// hash chain are checked by [State.Apply].
func Fold(run *planexv1.Run, ev *planexv1.RunEvent) (*planexv1.Run, error) {
	var next *planexv1.Run
	if run != nil {
		next = proto.CloneOf(run)
	}
	f := folder{run: next}
	next, err := f.apply(ev)
	if err != nil {
		return nil, err
	}
	return next, nil
}

// Terminal reports whether a run status is final.
func Terminal(s planexv1.RunStatus) bool {
	switch s {
	case planexv1.RunStatus_RUN_STATUS_SUCCEEDED, planexv1.RunStatus_RUN_STATUS_FAILED,
		planexv1.RunStatus_RUN_STATUS_ESCALATED, planexv1.RunStatus_RUN_STATUS_CANCELLED:
		return true
	}
	return false
}

// InFlight reports whether a step status means an attempt was published and
// has not finished.
func InFlight(s planexv1.StepStatus) bool {
	return s == planexv1.StepStatus_STEP_STATUS_DISPATCHED || s == planexv1.StepStatus_STEP_STATUS_RUNNING
}

// Critiquing reports whether the step's current attempt succeeded and
// waits for the model critic's verdict (CritiquePending).
func Critiquing(st *planexv1.StepState) bool {
	c := st.GetCritiquePending()
	return c != nil && c.GetAttempt() == st.GetAttempt() && st.GetStatus() == planexv1.StepStatus_STEP_STATUS_RUNNING
}

// CurrentPlan returns the run's last plan revision, or nil before the first.
func CurrentPlan(run *planexv1.Run) *planexv1.Plan {
	if n := len(run.GetPlans()); n > 0 {
		return run.GetPlans()[n-1]
	}
	return nil
}

// Step returns the state of step id, or nil.
func Step(run *planexv1.Run, id string) *planexv1.StepState {
	if i := stepIndex(run, id); i >= 0 {
		return run.GetSteps()[i]
	}
	return nil
}

// indexAbove is the length above which a step is looked up through its
// plan's index rather than by a walk.
const indexAbove = 16

// stepIndex returns the position of step id in run.Steps, or -1. The step
// states of a run are usually in its current plan's order, so the plan's
// cached index (PlanIndex) finds the step of a long run without a walk;
// the walk is the fallback.
func stepIndex(run *planexv1.Run, id string) int {
	steps := run.GetSteps()
	if len(steps) > indexAbove {
		if p := CurrentPlan(run); p != nil {
			if i, ok := PlanIndex(p)[id]; ok && i < len(steps) && steps[i].GetStepId() == id {
				return i
			}
		}
	}
	for i, s := range steps {
		if s.GetStepId() == id {
			return i
		}
	}
	return -1
}

// Steps indexes the run's step states by id, for loops over a plan that
// would otherwise look each step up in turn (quadratic in the plan).
func Steps(run *planexv1.Run) map[string]*planexv1.StepState {
	m := make(map[string]*planexv1.StepState, len(run.GetSteps()))
	for _, s := range run.GetSteps() {
		m[s.GetStepId()] = s
	}
	return m
}

// PlanStates returns the states of the current plan's steps in plan order
// (nil for a step without one). The run's states are usually stored in
// plan order, which makes this a walk over both lists without lookups; it
// falls back to an index otherwise.
func PlanStates(run *planexv1.Run) []*planexv1.StepState {
	plan := CurrentPlan(run).GetSteps()
	states := run.GetSteps()
	out := make([]*planexv1.StepState, len(plan))
	if len(states) >= len(plan) {
		aligned := true
		for i, s := range plan {
			if states[i].GetStepId() != s.GetId() {
				aligned = false
				break
			}
			out[i] = states[i]
		}
		if aligned {
			return out
		}
	}
	idx := Steps(run)
	for i, s := range plan {
		out[i] = idx[s.GetId()]
	}
	return out
}

// PlanIndex returns the position of every step of p by id. Plans never
// change once revised, so the index is computed once per plan (a few
// thousand recent plans are kept).
func PlanIndex(p *planexv1.Plan) map[string]int {
	planIndexes.mu.Lock()
	defer planIndexes.mu.Unlock()
	if m, ok := planIndexes.m[p]; ok {
		return m
	}
	m := make(map[string]int, len(p.GetSteps()))
	for i, s := range p.GetSteps() {
		m[s.GetId()] = i
	}
	if len(planIndexes.m) >= 4096 {
		clear(planIndexes.m)
	}
	planIndexes.m[p] = m
	return m
}

var planIndexes = struct {
	mu sync.Mutex
	m  map[*planexv1.Plan]map[string]int
}{m: map[*planexv1.Plan]map[string]int{}}

// PlanStep returns the definition of step id in the current plan, or nil.
func PlanStep(run *planexv1.Run, id string) *planexv1.Step {
	if p := CurrentPlan(run); len(p.GetSteps()) > indexAbove {
		if i, ok := PlanIndex(p)[id]; ok {
			return p.GetSteps()[i]
		}
		return nil
	}
	for _, s := range CurrentPlan(run).GetSteps() {
		if s.GetId() == id {
			return s
		}
	}
	return nil
}

// GateID is the id of the gate that holds back step id in plan revision
// rev. A step is gated at most once per revision, because a revision
// dispatches each of its steps at most once.
func GateID(stepID string, rev int32) string { return fmt.Sprintf("%s.r%d", stepID, rev) }

// PlanGateID is the id of the gate of plan revision rev.
func PlanGateID(rev int32) string { return fmt.Sprintf("plan.r%d", rev) }

// GateOpen reports whether gate g still holds its step back: undecided, and
// the step waits on this gate's revision (a replan that resets the step
// makes older gates moot).
func GateOpen(run *planexv1.Run, g *planexv1.Gate) bool {
	if g == nil || g.GetDecision() != planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
		return false
	}
	if g.GetKind() == planexv1.GateKind_GATE_KIND_PLAN {
		// A plan gate holds its revision back while it is current.
		return !Terminal(run.GetStatus()) && CurrentPlan(run).GetRevision() == g.GetPlanRevision() && CurrentPlan(run) != nil
	}
	st := Step(run, g.GetStepId())
	return st.GetStatus() == planexv1.StepStatus_STEP_STATUS_WAITING_APPROVAL && st.GetPlanRevision() == g.GetPlanRevision()
}

// Gate returns the gate with id, or nil.
func Gate(run *planexv1.Run, id string) *planexv1.Gate {
	for _, g := range run.GetGates() {
		if g.GetId() == id {
			return g
		}
	}
	return nil
}

// apply folds ev into f.run in place (nil before RunCreated) and returns
// the run. Every check happens before the first change, so on error the
// run is unchanged.
func (f *folder) apply(ev *planexv1.RunEvent) (*planexv1.Run, error) {
	run := f.run
	if ev.GetPayload() == nil {
		return nil, fmt.Errorf("%w: event %d has no payload", ErrBadEvent, ev.GetSequence())
	}
	created := ev.GetCreated()
	switch {
	case run == nil && created == nil:
		return nil, fmt.Errorf("%w: event %d (%s) before RunCreated", ErrBadEvent, ev.GetSequence(), PayloadName(ev))
	case run != nil && created != nil:
		return nil, fmt.Errorf("%w: event %d: second RunCreated", ErrBadEvent, ev.GetSequence())
	case run != nil && Terminal(run.GetStatus()) && ev.GetRunReset() == nil && ev.GetRunForked() == nil:
		return nil, fmt.Errorf("%w: event %d (%s) after RunFinished", ErrBadEvent, ev.GetSequence(), PayloadName(ev))
	case ev.GetRunReset() != nil && !Terminal(run.GetStatus()):
		return nil, fmt.Errorf("%w: event %d: RunReset of a run that has not finished (%s)", ErrBadEvent, ev.GetSequence(), run.GetStatus())
	case ev.GetRunReset() != nil && ev.GetRunReset().GetPlan() == nil && CurrentPlan(run) != nil:
		return nil, fmt.Errorf("%w: event %d: RunReset without the plan revision the run continues with", ErrBadEvent, ev.GetSequence())
	case ev.GetRunReset() != nil && ev.GetRunReset().GetPlan() != nil && ev.GetRunReset().GetPlan().GetRevision() != CurrentPlan(run).GetRevision()+1:
		return nil, fmt.Errorf("%w: event %d: RunReset revision %d does not follow revision %d", ErrBadEvent, ev.GetSequence(), ev.GetRunReset().GetPlan().GetRevision(), CurrentPlan(run).GetRevision())
	case ev.GetFinished() != nil && !Terminal(ev.GetFinished().GetStatus()):
		return nil, fmt.Errorf("%w: event %d: RunFinished with non-terminal status %s", ErrBadEvent, ev.GetSequence(), ev.GetFinished().GetStatus())
	}
	at := ev.GetTime()
	if created != nil {
		run = &planexv1.Run{
			Id:             ev.GetRunId(),
			Goal:           created.GetGoal(),
			Inputs:         created.GetInputs(),
			Status:         planexv1.RunStatus_RUN_STATUS_PENDING,
			Budget:         created.GetBudget(),
			Usage:          &planexv1.BudgetUsage{},
			Labels:         created.GetLabels(),
			TraceId:        TraceID(created.GetTraceContext()),
			CreatedAt:      at,
			IdempotencyKey: created.GetIdempotencyKey(),
			Mode:           created.GetMode(),
			PlannerBackend: created.GetPlannerBackend(),
			StartedBy:      created.GetStartedBy(),
			ApprovePlans:   created.GetApprovePlans(),
		}
		if o := created.GetParent(); o != nil {
			run.ParentRunId, run.ParentStepId, run.ParentAttempt = o.GetRunId(), o.GetStepId(), o.GetAttempt()
		}
		if o := created.GetForkOf(); o != nil {
			run.ForkedFrom = &planexv1.ForkOrigin{RunId: o.GetRunId(), Sequence: o.GetSequence(), Hash: o.GetHash(), FromStep: o.GetFromStep(), ForkedBy: o.GetForkedBy(), Reason: o.GetReason()}
		}
		f.run = run
		f.rebuild = true
		if p := created.GetForkPlan(); p != nil {
			f.fork(p, created.GetForkSteps(), created.GetForkReplan())
		}
	}
	if run.Usage == nil {
		run.Usage = &planexv1.BudgetUsage{}
	}
	switch p := ev.GetPayload().(type) {
	case *planexv1.RunEvent_Created:
	case *planexv1.RunEvent_PlanRevised:
		f.revise(p.PlanRevised.GetPlan())
		f.rebuild = true
		l := ledger(run)
		l.PlanHashes = append(l.PlanHashes, PlanHash(p.PlanRevised.GetPlan()))
	case *planexv1.RunEvent_PlanRejected:
		ledger(run).ReplansSinceSuccess++
		run.Usage.Replans++
		run.Status = planexv1.RunStatus_RUN_STATUS_PLANNING
	case *planexv1.RunEvent_StepDispatched:
		d := p.StepDispatched
		st := f.stepState(d.GetStepId())
		st.Tool = d.GetTool()
		st.Status = planexv1.StepStatus_STEP_STATUS_DISPATCHED
		st.Attempt = d.GetAttempt()
		st.PlanRevision = d.GetPlanRevision()
		st.ResolvedArgs = d.GetResolvedArgs()
		st.DispatchedAt = at
		st.StartToCloseTimeout = d.GetStartToCloseTimeout()
		st.ScheduleToStartTimeout = d.GetScheduleToStartTimeout()
		st.HeartbeatTimeout = d.GetHeartbeatTimeout()
		st.RetryAt = nil
		clearOutcome(st)
		st.ChildRunId = d.GetChild().GetRunId()
		if c := d.GetChild(); c != nil {
			run.Children = append(slices.Clip(run.Children), &planexv1.ChildRun{RunId: c.GetRunId(), StepId: d.GetStepId(), Attempt: d.GetAttempt(), Budget: c.GetBudget()})
		}
		run.Usage.Steps++
	case *planexv1.RunEvent_StepStarted:
		s := p.StepStarted
		st := f.step(s.GetStepId())
		switch {
		case st == nil || st.GetAttempt() != s.GetAttempt():
		case st.GetStatus() == planexv1.StepStatus_STEP_STATUS_DISPATCHED,
			s.GetRestart() && st.GetStatus() == planexv1.StepStatus_STEP_STATUS_RUNNING:
			st = f.own(s.GetStepId())
			st.Status = planexv1.StepStatus_STEP_STATUS_RUNNING
			st.StartedAt = at
			st.ExecutorId = s.GetExecutorId()
		}
	case *planexv1.RunEvent_StepSucceeded:
		s := p.StepSucceeded
		if st := f.step(s.GetStepId()); st != nil && st.GetAttempt() == s.GetAttempt() {
			st = f.own(s.GetStepId())
			st.Output = s.GetOutput()
			st.OutputRef = s.GetOutputRef()
			st.OutputTruncated = s.GetTruncated()
			finish(st, planexv1.StepStatus_STEP_STATUS_SUCCEEDED, s.GetDuration(), s.GetExecutorId(), at)
			ledger(run).ReplansSinceSuccess = 0
		}
	case *planexv1.RunEvent_StepFailed:
		sf := p.StepFailed
		st := f.stepState(sf.GetStepId())
		if sf.GetAttempt() >= st.GetAttempt() {
			st.Attempt = sf.GetAttempt()
			st.Error = sf.GetError()
			status := planexv1.StepStatus_STEP_STATUS_FAILED
			if sf.GetError().GetCode() == planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN {
				status = planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN
			}
			finish(st, status, sf.GetDuration(), sf.GetExecutorId(), at)
			noteFailure(run, sf.GetStepId())
		}
	case *planexv1.RunEvent_ExpectationFailed:
		x := p.ExpectationFailed
		if st := f.step(x.GetStepId()); st != nil && st.GetAttempt() == x.GetAttempt() {
			st = f.own(x.GetStepId())
			st.Error = &planexv1.StepError{
				Code:    planexv1.ErrorCode_ERROR_CODE_EXPECTATION_FAILED,
				Message: fmt.Sprintf("expect %q: %s", x.GetExpect(), x.GetMessage()),
			}
			finish(st, planexv1.StepStatus_STEP_STATUS_FAILED, st.GetDuration(), "", at)
			noteFailure(run, x.GetStepId())
		}
	case *planexv1.RunEvent_StepRetrying:
		r := p.StepRetrying
		if st := f.step(r.GetStepId()); st != nil && st.GetAttempt() == r.GetAttempt() &&
			(st.GetStatus() == planexv1.StepStatus_STEP_STATUS_FAILED || st.GetStatus() == planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN) {
			st = f.own(r.GetStepId())
			st.Status = planexv1.StepStatus_STEP_STATUS_PENDING
			st.Retries = r.GetRetry()
			st.RetryAt = r.GetRetryAt()
		}
	case *planexv1.RunEvent_ReplanRequested:
		ledger(run).ReplansSinceSuccess++
		run.Usage.Replans++
		run.Status = planexv1.RunStatus_RUN_STATUS_PLANNING
	case *planexv1.RunEvent_GateOpened:
		g := proto.CloneOf(p.GateOpened.GetGate())
		if g.OpenedAt == nil {
			g.OpenedAt = at
		}
		run.Gates = append(run.Gates, g)
		if g.GetKind() == planexv1.GateKind_GATE_KIND_STEP || g.GetKind() == planexv1.GateKind_GATE_KIND_INPUT {
			// An input gate holds its human.input step back like a step
			// gate; its answer comes with the step's success.
			if st := f.step(g.GetStepId()); st != nil && st.GetStatus() == planexv1.StepStatus_STEP_STATUS_PENDING {
				f.own(g.GetStepId()).Status = planexv1.StepStatus_STEP_STATUS_WAITING_APPROVAL
			}
		}
	case *planexv1.RunEvent_GateDecided:
		f.decide(p.GateDecided, at)
	case *planexv1.RunEvent_CriticVerdict:
		// A verdict is a record; a failing one is followed by the event
		// that acts on it (ExpectationFailed, RunFinished), a passing one
		// of the model critic by the StepSucceeded it held. It ends the
		// critique it answers and counts the critic's tokens.
		v := p.CriticVerdict
		run.CriticTokens += v.GetUsage().GetInputTokens() + v.GetUsage().GetOutputTokens()
		if c := f.step(v.GetStepId()).GetCritiquePending(); c != nil && c.GetAttempt() == v.GetAttempt() {
			f.own(v.GetStepId()).CritiquePending = nil
		}
	case *planexv1.RunEvent_CritiquePending:
		c := p.CritiquePending
		if st := f.step(c.GetStepId()); st != nil && st.GetAttempt() == c.GetAttempt() && st.GetStatus() == planexv1.StepStatus_STEP_STATUS_RUNNING {
			f.own(c.GetStepId()).CritiquePending = c
		}
	case *planexv1.RunEvent_RunReset:
		f.reset(p.RunReset, at)
		f.rebuild = true
	case *planexv1.RunEvent_RunForked:
		run.Forks = append(slices.Clip(run.Forks), p.RunForked.GetForkRunId())
	case *planexv1.RunEvent_ChildRunFinished:
		childFinished(run, p.ChildRunFinished)
	case *planexv1.RunEvent_BudgetUsed:
		// Steps and replans are counted by their own events; BudgetUsed
		// carries the token account, which only planner calls change.
		run.Usage.Tokens = p.BudgetUsed.GetUsage().GetTokens()
		run.Usage.TokensReserved = p.BudgetUsed.GetUsage().GetTokensReserved()
	case *planexv1.RunEvent_Finished:
		fin := p.Finished
		run.Status = fin.GetStatus()
		run.StopReason = fin.GetStopReason()
		run.StopMessage = fin.GetMessage()
		run.StopDetail = fin.GetDetail()
		run.Result = fin.GetResult()
		run.ResultRef = fin.GetResultRef()
		run.ExceededBudget = fin.GetExceededBudget()
		run.FinishedAt = at
		run.Usage.TokensReserved = 0
		for _, st := range run.Steps {
			switch st.GetStatus() {
			case planexv1.StepStatus_STEP_STATUS_PENDING, planexv1.StepStatus_STEP_STATUS_WAITING_APPROVAL:
				f.own(st.GetStepId()).Status = planexv1.StepStatus_STEP_STATUS_SKIPPED
			}
		}
	default:
		return nil, fmt.Errorf("%w: event %d: unknown payload %T", ErrBadEvent, ev.GetSequence(), p)
	}
	run.LastSequence = ev.GetSequence()
	run.UpdatedAt = at
	f.reindex()
	f.deriveStatus()
	return run, nil
}

// revise installs a new plan revision: kept steps keep their state (and
// output), every other step of the plan starts over as pending with its
// attempt counter preserved (attempt numbers never repeat for a step id, so
// dispatch message ids stay unique), dropped steps are marked skipped.
func (f *folder) revise(p *planexv1.Plan) {
	run := f.run
	run.Plans = append(run.Plans, p)
	rev := p.GetRevision()
	lin := p.GetLineage()
	kept := make(map[string]bool, len(lin.GetKept()))
	for _, id := range lin.GetKept() {
		kept[id] = true
	}
	for _, s := range p.GetSteps() {
		st := f.stepState(s.GetId())
		st.Tool = s.GetTool()
		keep := kept[s.GetId()]
		switch {
		case keep && st.GetStatus() == planexv1.StepStatus_STEP_STATUS_SUCCEEDED:
		case keep && InFlight(st.GetStatus()):
			// An attempt in flight stays valid unless an input it was
			// resolved from is recomputed by this revision.
			for _, d := range s.GetDependsOn() {
				if !kept[d] {
					keep = false
				}
			}
		default:
			keep = false
		}
		if !keep {
			st.Status = planexv1.StepStatus_STEP_STATUS_PENDING
			st.PlanRevision = rev
			st.ResolvedArgs = nil
			st.DispatchedAt = nil
			st.Retries = 0
			st.RetryAt = nil
			clearOutcome(st)
		}
	}
	for _, id := range lin.GetDropped() {
		// A dropped step that finished keeps its outcome, so the planner's
		// history still shows the failure that caused the replan; one that
		// never finished is skipped.
		if st := f.step(id); st != nil && !finished(st.GetStatus()) {
			f.own(id).Status = planexv1.StepStatus_STEP_STATUS_SKIPPED
		}
	}
	run.Status = planexv1.RunStatus_RUN_STATUS_RUNNING
}

// reset re-opens a finished run (RunReset): steps whose outcome the
// operator declared done succeed with the given output, the stop is
// cleared, and the reset's plan is installed as a new revision whose
// lineage keeps the steps whose results stand — every other step starts
// over with its attempt counter kept (revise), so no attempt's message id
// repeats. A reset that replans leaves the run PLANNING on that revision.
func (f *folder) reset(r *planexv1.RunReset, at *timestamppb.Timestamp) {
	run := f.run
	for _, u := range r.GetUnknownOutcomes() {
		if u.GetAction() != planexv1.UnknownOutcomeAction_UNKNOWN_OUTCOME_ACTION_DONE {
			continue
		}
		if st := f.own(u.GetStepId()); st != nil {
			st.Error = nil
			st.CritiquePending = nil
			st.Output = u.GetOutput()
			if st.Output == nil {
				st.Output = structpb.NewNullValue()
			}
			st.OutputRef = nil
			st.Status = planexv1.StepStatus_STEP_STATUS_SUCCEEDED
			if st.FinishedAt == nil {
				st.FinishedAt = at
			}
		}
	}
	run.StopReason = planexv1.StopReason_STOP_REASON_UNSPECIFIED
	run.StopMessage, run.StopDetail = "", ""
	run.Result, run.ResultRef = nil, nil
	run.ExceededBudget = planexv1.BudgetKind_BUDGET_KIND_UNSPECIFIED
	run.FinishedAt = nil
	if b := r.GetBudget(); b != nil {
		run.Budget = b
	}
	run.Resets++
	run.ResetAt = at
	if p := r.GetPlan(); p != nil {
		f.revise(p)
		l := ledger(run)
		l.PlanHashes = append(l.PlanHashes, PlanHash(p))
	}
	run.Status = planexv1.RunStatus_RUN_STATUS_RUNNING
	if r.GetReplan() || CurrentPlan(run) == nil {
		// A new planning round (the replan counter is part of a round's
		// identity, so its kick never repeats an earlier round's).
		run.Usage.Replans++
		run.Status = planexv1.RunStatus_RUN_STATUS_PLANNING
	}
}

// fork installs a fork's first plan revision (RunCreated.fork_plan): the
// shared steps as they succeeded in the original, every other step
// pending.
func (f *folder) fork(p *planexv1.Plan, shared []*planexv1.StepState, replan bool) {
	run := f.run
	run.Plans = append(run.Plans, p)
	byID := make(map[string]*planexv1.StepState, len(shared))
	for _, st := range shared {
		byID[st.GetStepId()] = st
	}
	for _, s := range p.GetSteps() {
		st := &planexv1.StepState{StepId: s.GetId(), Tool: s.GetTool(), Status: planexv1.StepStatus_STEP_STATUS_PENDING, PlanRevision: p.GetRevision()}
		if c, ok := byID[s.GetId()]; ok && c.GetStatus() == planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
			st = proto.CloneOf(c)
			st.PlanRevision = p.GetRevision()
		}
		run.Steps = append(run.Steps, st)
	}
	l := ledger(run)
	l.PlanHashes = append(l.PlanHashes, PlanHash(p))
	run.Status = planexv1.RunStatus_RUN_STATUS_RUNNING
	if replan {
		run.Status = planexv1.RunStatus_RUN_STATUS_PLANNING
	}
}

func (f *folder) decide(d *planexv1.GateDecided, at *timestamppb.Timestamp) {
	run := f.run
	i := slices.IndexFunc(run.GetGates(), func(g *planexv1.Gate) bool { return g.GetId() == d.GetGateId() })
	if i < 0 || run.Gates[i].GetDecision() != planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
		return
	}
	// Gates are shared with clones (State.Clone): decide on a copy.
	g := proto.CloneOf(run.Gates[i])
	run.Gates[i] = g
	g.Decision = d.GetDecision()
	g.Actor = d.GetActor()
	g.DecidedBy = d.GetDecidedBy()
	g.Comment = d.GetComment()
	g.DecidedVia = d.GetVia()
	g.StopRun = d.GetStopRun()
	g.Answer = d.GetAnswer()
	g.DecidedAt = at
	st := f.step(g.GetStepId())
	if st == nil || st.GetStatus() != planexv1.StepStatus_STEP_STATUS_WAITING_APPROVAL || st.GetPlanRevision() != g.GetPlanRevision() {
		return
	}
	st = f.own(g.GetStepId())
	switch d.GetDecision() {
	case planexv1.DecisionKind_DECISION_KIND_APPROVE:
		st.Status = planexv1.StepStatus_STEP_STATUS_PENDING
	case planexv1.DecisionKind_DECISION_KIND_EDIT:
		st.Status = planexv1.StepStatus_STEP_STATUS_PENDING
		st.ResolvedArgs = d.GetEditedArgs()
	case planexv1.DecisionKind_DECISION_KIND_REJECT:
		st.Status = planexv1.StepStatus_STEP_STATUS_SKIPPED
	}
}

// deriveStatus sets the status of a non-terminal run from its steps: a run
// in next-step mode whose plan is complete goes back to planning; a running
// run with a step waiting for approval is waiting.
func (f *folder) deriveStatus() {
	run := f.run
	switch run.GetStatus() {
	case planexv1.RunStatus_RUN_STATUS_RUNNING, planexv1.RunStatus_RUN_STATUS_WAITING:
	default:
		return
	}
	waiting := false
	if g := Gate(run, PlanGateID(CurrentPlan(run).GetRevision())); g != nil && GateOpen(run, g) {
		waiting = true
	}
	var complete bool
	if ix := f.ix; ix != nil && !ix.degenerate {
		waiting = waiting || ix.waiting > 0
		complete = ix.complete()
	} else {
		for _, st := range run.GetSteps() {
			if st.GetStatus() == planexv1.StepStatus_STEP_STATUS_WAITING_APPROVAL && PlanStep(run, st.GetStepId()) != nil {
				waiting = true
				break
			}
		}
		complete = PlanComplete(run)
	}
	switch {
	case run.GetMode() == planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP && complete:
		run.Status = planexv1.RunStatus_RUN_STATUS_PLANNING
	case waiting:
		run.Status = planexv1.RunStatus_RUN_STATUS_WAITING
	default:
		run.Status = planexv1.RunStatus_RUN_STATUS_RUNNING
	}
}

// PlanComplete reports whether every step of the current plan succeeded.
func PlanComplete(run *planexv1.Run) bool {
	p := CurrentPlan(run)
	if p == nil {
		return false
	}
	for _, st := range PlanStates(run) {
		if st.GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
			return false
		}
	}
	return true
}

// folder folds events into a run in place, keeping the index of its state
// (if any) up to date.
type folder struct {
	run *planexv1.Run
	// ix is the index of the state being folded into; nil when a bare
	// run is folded (Fold), whose lookups walk the run.
	ix  *index
	tok *owner // the state's owner
	// sharedSteps points at the state's flag telling that run.Steps is
	// shared with another state and must be copied before a write (nil:
	// never shared).
	sharedSteps *bool
	// touched are the steps whose state the event replaced, with the
	// state before (nil: appended), for the index; rebuild asks for the
	// index to be computed again instead (a new run or plan).
	touched []touched
	rebuild bool
}

type touched struct {
	id  string
	old *planexv1.StepState
}

// lookup returns the position of step id in run.Steps, or -1.
func (f *folder) lookup(id string) int {
	if f.ix != nil {
		return f.ix.lookup(id)
	}
	return stepIndex(f.run, id)
}

// step returns the state of step id, or nil.
func (f *folder) step(id string) *planexv1.StepState {
	if i := f.lookup(id); i >= 0 {
		return f.run.Steps[i]
	}
	return nil
}

// steps returns run.Steps ready to be written: the state's own copy.
func (f *folder) steps() []*planexv1.StepState {
	if f.sharedSteps != nil && *f.sharedSteps {
		f.run.Steps = slices.Clone(f.run.Steps)
		*f.sharedSteps = false
	}
	return f.run.Steps
}

// stepState returns the state of step id made private to the run (see
// own), creating a pending one.
func (f *folder) stepState(id string) *planexv1.StepState {
	if st := f.own(id); st != nil {
		return st
	}
	st := &planexv1.StepState{StepId: id, Status: planexv1.StepStatus_STEP_STATUS_PENDING}
	f.run.Steps = append(f.steps(), st)
	if f.ix != nil {
		f.ix.added(id, len(f.run.Steps)-1)
	}
	f.touch(touched{id: id})
	return st
}

// own replaces the state of step id in the run with a copy and returns
// it, or returns nil. A run cloned with State.Clone shares its step
// states (and its step slice, until the first write) with the original;
// the fold writes only to copies made here, so a state shared with the
// cache is never modified and Clone stays cheap for long plans.
func (f *folder) own(id string) *planexv1.StepState {
	i := f.lookup(id)
	if i < 0 {
		return nil
	}
	old := f.run.Steps[i]
	c := proto.CloneOf(old)
	f.steps()[i] = c
	f.touch(touched{id: id, old: old})
	return c
}

func (f *folder) touch(t touched) {
	if f.touched == nil {
		f.touched = make([]touched, 0, 2) // an event changes one step, or two
	}
	f.touched = append(f.touched, t)
}

// reindex brings the index up to date with the event just folded.
func (f *folder) reindex() {
	switch {
	case f.ix == nil && !f.rebuild:
	case f.rebuild && (f.ix == nil || f.ix.run != f.run):
		if f.sharedSteps != nil { // a state's fold; Fold keeps no index
			f.ix = buildIndex(f.run, f.tok)
		}
	case f.rebuild:
		f.ix.setPlan(CurrentPlan(f.run))
	default:
		for i, t := range f.touched {
			// A step changed twice by one event: compare its first
			// state with its last.
			if !slices.ContainsFunc(f.touched[:i], func(u touched) bool { return u.id == t.id }) {
				f.ix.touch(t.id, t.old)
			}
		}
	}
	f.touched, f.rebuild = f.touched[:0], false
}

func clearOutcome(st *planexv1.StepState) {
	st.CritiquePending = nil
	st.Output = nil
	st.OutputRef = nil
	st.OutputTruncated = false
	st.Error = nil
	st.StartedAt = nil
	st.FinishedAt = nil
	st.Duration = nil
	st.ExecutorId = ""
}

// finish ends an attempt with status; when no StepStarted was seen (the
// result overtook the notice) the start is derived from the duration.
func finish(st *planexv1.StepState, status planexv1.StepStatus, d *durationpb.Duration, executor string, at *timestamppb.Timestamp) {
	st.Status = status
	st.CritiquePending = nil
	st.Duration = d
	if executor != "" {
		st.ExecutorId = executor
	}
	st.FinishedAt = at
	if st.StartedAt == nil && at != nil {
		start := at.AsTime()
		if d := st.GetDuration(); d != nil {
			start = start.Add(-d.AsDuration())
		}
		st.StartedAt = timestamppb.New(start)
	}
}

// TraceID extracts the hex trace id from a W3C traceparent in a
// RunCreated.trace_context map ("00-<trace id>-<span id>-<flags>").
func TraceID(tc map[string]string) string {
	parts := strings.Split(tc["traceparent"], "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}

// PayloadName is the short name of an event's payload ("step_dispatched"),
// for logs and errors.
func PayloadName(ev *planexv1.RunEvent) string {
	if ev.GetPayload() == nil {
		return "none"
	}
	fd := ev.ProtoReflect().WhichOneof(ev.ProtoReflect().Descriptor().Oneofs().ByName("payload"))
	if fd == nil {
		return "none"
	}
	return string(fd.Name())
}

// Outcomes lists the finished attempts of a run in completion order, for the
// planner's history.
func Outcomes(run *planexv1.Run) []*planexv1.StepState {
	var out []*planexv1.StepState
	for _, s := range run.GetSteps() {
		switch s.GetStatus() {
		case planexv1.StepStatus_STEP_STATUS_SUCCEEDED, planexv1.StepStatus_STEP_STATUS_FAILED,
			planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN:
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b *planexv1.StepState) int {
		return a.GetFinishedAt().AsTime().Compare(b.GetFinishedAt().AsTime())
	})
	return out
}

// finished reports whether a step status is a final outcome of an attempt.
func finished(s planexv1.StepStatus) bool {
	switch s {
	case planexv1.StepStatus_STEP_STATUS_SUCCEEDED, planexv1.StepStatus_STEP_STATUS_FAILED,
		planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN:
		return true
	}
	return false
}

// childFinished records a child's end in its parent (ChildRunFinished):
// the child is marked finished and what it spent is charged to the
// parent, once (a repeated record of the same child changes nothing).
func childFinished(run *planexv1.Run, c *planexv1.ChildRunFinished) {
	i := slices.IndexFunc(run.GetChildren(), func(r *planexv1.ChildRun) bool { return r.GetRunId() == c.GetChildRunId() })
	if i < 0 || run.Children[i].GetStatus() != planexv1.RunStatus_RUN_STATUS_UNSPECIFIED {
		return
	}
	// Child records are shared with clones (State.Clone): change a copy.
	r := proto.CloneOf(run.Children[i])
	r.Status, r.StopReason, r.Usage = c.GetStatus(), c.GetStopReason(), c.GetUsage()
	run.Children = slices.Clone(run.Children)
	run.Children[i] = r
	u := run.GetChildrenUsage()
	run.ChildrenUsage = &planexv1.BudgetUsage{
		Steps: u.GetSteps() + c.GetUsage().GetSteps(), Replans: u.GetReplans() + c.GetUsage().GetReplans(),
		Tokens: u.GetTokens() + c.GetUsage().GetTokens(),
	}
}

// ChildrenCommitted is what a run's child runs hold of its budget: the
// spend of the finished ones (Run.children_usage) and the budgets carved
// for the others.
func ChildrenCommitted(run *planexv1.Run) (steps int32, tokens int64) {
	steps, tokens = run.GetChildrenUsage().GetSteps(), run.GetChildrenUsage().GetTokens()
	for _, c := range run.GetChildren() {
		if c.GetStatus() == planexv1.RunStatus_RUN_STATUS_UNSPECIFIED {
			steps += c.GetBudget().GetMaxSteps()
			tokens += c.GetBudget().GetMaxTokens()
		}
	}
	return steps, tokens
}
