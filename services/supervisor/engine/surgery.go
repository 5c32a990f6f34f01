package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// Run surgery: what a reset or a fork keeps and what it runs again. Both
// rest on the engine's own rule for replans — a step that starts over keeps
// its attempt counter, so the message id of every attempt
// (<run>:<step>:<attempt>) is new and an executor can never take it for a
// repeat — and add one of their own: a reset never runs again a step whose
// side effect happened (a WRITE or EXTERNAL tool that succeeded), and asks
// the operator what to do with one whose outcome is unknown.

// SurgeryError is a refusal of a reset or fork: Field names the request
// field at fault ("" when the run's state is, which is a failed
// precondition).
type SurgeryError struct {
	// Field is the request field at fault, or "".
	Field string
	// Msg says what is wrong and what the caller can do.
	Msg string
}

func (e *SurgeryError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// Precondition reports whether the refusal is about the run's state, not
// the request.
func (e *SurgeryError) Precondition() bool { return e.Field == "" }

func refuse(field, format string, args ...any) error {
	return &SurgeryError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Surgery is what a reset or a fork does, computed from the run's state.
type Surgery struct {
	// Plan is the revision the run (or the fork) continues with; nil when
	// there is no plan to continue (the point precedes the first plan).
	Plan *planexv1.Plan
	// Rerun lists the steps that start over, in plan order.
	Rerun []string
	// Kept lists the steps whose results stand, in plan order (with
	// KeptSideEffects).
	Kept []string
	// KeptSideEffects lists the steps after the point whose results stand
	// because their side effect happened.
	KeptSideEffects []string
	// Shared are the states of the kept steps (for a fork: as they were at
	// the point).
	Shared []*planexv1.StepState
	// Unknown are the operator's decisions on steps with unknown outcomes.
	Unknown []*planexv1.UnknownOutcome
	// Replan is set when the run must plan again whatever the request
	// said: the point precedes its first plan.
	Replan bool
}

// SurgeryInput is a reset or fork request as the engine needs it.
type SurgeryInput struct {
	// Current is the run as its log ends.
	Current *planexv1.Run
	// At is the run as it was after the event the request goes back to,
	// or nil (the current state).
	At *planexv1.Run
	// FromStep is the step to run again with its dependents, or "".
	FromStep string
	// StepArgs are replacement arguments of steps that start over.
	StepArgs map[string]*structpb.Struct
	// Unknown are the decisions on steps with unknown outcomes (reset).
	Unknown []*planexv1.UnknownOutcome
	// Tool returns a tool's spec, or nil when the catalog lacks it (such a
	// tool counts as having a non-idempotent side effect: fail closed).
	Tool func(name string) *planexv1.ToolSpec
	// Catalog and Limits validate the resulting plan.
	Catalog plan.Catalog
	// Limits are the plan limits of the supervisor.
	Limits plan.Limits
}

// sideEffect reports whether a tool's success changed something outside
// planex.
func sideEffect(spec *planexv1.ToolSpec) bool {
	return spec == nil || spec.GetSideEffect() != planexv1.SideEffect_SIDE_EFFECT_READ
}

// repeatable reports whether running a tool twice is harmless: reads, and
// writes declared idempotent.
func repeatable(spec *planexv1.ToolSpec) bool {
	return spec != nil && (spec.GetSideEffect() == planexv1.SideEffect_SIDE_EFFECT_READ || spec.GetIdempotent())
}

// dependents returns id and every step of p that depends on it, directly or
// not.
func dependents(p *planexv1.Plan, id string) map[string]bool {
	out := map[string]bool{id: true}
	for changed := true; changed; {
		changed = false
		for _, s := range p.GetSteps() {
			if out[s.GetId()] {
				continue
			}
			for _, d := range s.GetDependsOn() {
				if out[d] {
					out[s.GetId()] = true
					changed = true
					break
				}
			}
		}
	}
	return out
}

func succeeded(st *planexv1.StepState) bool {
	return st.GetStatus() == planexv1.StepStatus_STEP_STATUS_SUCCEEDED
}

// unsettled reports whether a step's last attempt may have acted without
// its outcome being known: OUTCOME_UNKNOWN, or still in flight when the
// run finished.
func unsettled(st *planexv1.StepState) bool {
	return st.GetStatus() == planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN || runlog.InFlight(st.GetStatus())
}

// PlanReset computes a reset of a finished run: from the point (At, or
// FromStep, or neither: the steps that did not succeed), which steps keep
// their results and which start over, in a new revision of the plan. It
// refuses (SurgeryError) a reset that would run a side effect again or
// restart a step whose outcome is unknown without the operator's decision.
func PlanReset(in SurgeryInput) (*Surgery, error) {
	cur := in.Current
	curPlan := runlog.CurrentPlan(cur)
	base := curPlan
	if in.At != nil {
		base = runlog.CurrentPlan(in.At)
	}
	forced := false
	if base == nil {
		// The point precedes the first plan: the run plans again from its
		// goal. Nothing of the later plans runs again unless the planner
		// plans it (kept side effects stay in the history it sees).
		if len(in.StepArgs) > 0 {
			return nil, refuse("step_args", "the reset point precedes the run's first plan: there is no step to edit")
		}
		if len(in.Unknown) > 0 {
			return nil, refuse("unknown_outcomes", "the reset point precedes the run's first plan: no step is restarted")
		}
		if curPlan == nil {
			return &Surgery{Replan: true}, nil
		}
		// The current plan's steps start over, except those whose side
		// effect happened; the planner plans the run again.
		base = curPlan
		forced = true
	}
	now := runlog.Steps(cur)
	var from map[string]bool
	if in.FromStep != "" {
		if runlog.PlanStep(cur, in.FromStep) == nil && !slices.ContainsFunc(base.GetSteps(), func(s *planexv1.Step) bool { return s.GetId() == in.FromStep }) {
			return nil, refuse("from_step", "%q is not a step of the run's current plan (revision %d); its steps: %s", in.FromStep, curPlan.GetRevision(), stepList(curPlan))
		}
		from = dependents(base, in.FromStep)
		if st := now[in.FromStep]; succeeded(st) && sideEffect(in.Tool(st.GetTool())) {
			return nil, refuse("", "step %q (%s) succeeded and its side effect happened; a reset never repeats one. Reset from a step after it, or fork the run (planex runs fork) to run it again in a new run", in.FromStep, st.GetTool())
		}
	}
	keep := map[string]bool{}
	var keptSE []string
	for _, s := range base.GetSteps() {
		id := s.GetId()
		st := now[id]
		if !succeeded(st) {
			continue
		}
		switch {
		case in.At != nil:
			if was := runlog.Step(in.At, id); succeeded(was) && was.GetAttempt() == st.GetAttempt() {
				keep[id] = true
				continue
			}
		case from != nil:
			if !from[id] {
				keep[id] = true
				continue
			}
		default:
			keep[id] = true
			continue
		}
		// A step after the point that succeeded: its result stands when
		// its side effect happened.
		if sideEffect(in.Tool(st.GetTool())) {
			keep[id] = true
			keptSE = append(keptSE, id)
		}
	}
	// Steps whose outcome is unknown: a repeatable one simply runs again;
	// any other needs the operator's word.
	decided := map[string]*planexv1.UnknownOutcome{}
	for i, u := range in.Unknown {
		field := fmt.Sprintf("unknown_outcomes[%d]", i)
		if u.GetAction() == planexv1.UnknownOutcomeAction_UNKNOWN_OUTCOME_ACTION_UNSPECIFIED {
			return nil, refuse(field+".action", "set RETRY (run the step again, accepting its effect may happen twice) or DONE (it happened; the step counts as succeeded)")
		}
		if _, dup := decided[u.GetStepId()]; dup {
			return nil, refuse(field+".step_id", "step %q is decided twice", u.GetStepId())
		}
		decided[u.GetStepId()] = u
	}
	var undecided []string
	var unknown []*planexv1.UnknownOutcome
	for _, s := range base.GetSteps() {
		id := s.GetId()
		st := now[id]
		if keep[id] || st == nil || !unsettled(st) || repeatable(in.Tool(st.GetTool())) {
			continue
		}
		u, ok := decided[id]
		if !ok {
			undecided = append(undecided, fmt.Sprintf("%q (%s, attempt %d: %s)", id, st.GetTool(), st.GetAttempt(), describeUnsettled(st)))
			continue
		}
		delete(decided, id)
		unknown = append(unknown, u)
		if u.GetAction() == planexv1.UnknownOutcomeAction_UNKNOWN_OUTCOME_ACTION_DONE {
			keep[id] = true
		}
	}
	if len(undecided) > 0 {
		return nil, refuse("", "the outcome of %s is unknown and the tool is not safe to repeat: decide each in unknown_outcomes (RETRY runs it again, accepting its effect may happen twice; DONE counts it as succeeded), e.g. planex runs reset --unknown %s=done",
			strings.Join(undecided, ", "), firstID(undecided))
	}
	for id := range decided {
		return nil, refuse("unknown_outcomes", "step %q does not need a decision: its outcome is known, it keeps its result, or its tool is safe to repeat", id)
	}
	p := proto.CloneOf(base)
	p.Revision = curPlan.GetRevision() + 1
	edited, err := editArgs(p, in.StepArgs, keep)
	if err != nil {
		return nil, err
	}
	if len(p.GetSteps()) > 0 {
		if err := validate(p, in.Catalog, in.Limits); err != nil {
			return nil, err
		}
	}
	p.Lineage = lineage(curPlan, p, keep, edited)
	out := &Surgery{Plan: p, KeptSideEffects: keptSE, Unknown: unknown, Replan: forced}
	for _, s := range out.Plan.GetSteps() {
		if keep[s.GetId()] {
			out.Kept = append(out.Kept, s.GetId())
			out.Shared = append(out.Shared, now[s.GetId()])
		} else {
			out.Rerun = append(out.Rerun, s.GetId())
		}
	}
	return out, nil
}

// PlanFork computes a fork: the steps that succeeded by the point (At, or
// the current state) are shared, except FromStep and its dependents; every
// other step of the plan at the point runs in the fork, with edited
// arguments. A fork is a new run: what it runs again is what its author
// asked for, side effects included.
func PlanFork(in SurgeryInput) (*Surgery, error) {
	at := in.At
	if at == nil {
		at = in.Current
	}
	base := runlog.CurrentPlan(at)
	if base == nil {
		if in.FromStep != "" || len(in.StepArgs) > 0 {
			return nil, refuse("at_sequence", "the fork point precedes the run's first plan: there is no step to run again or edit; the fork plans from its goal")
		}
		return &Surgery{}, nil
	}
	var from map[string]bool
	if in.FromStep != "" {
		if !slices.ContainsFunc(base.GetSteps(), func(s *planexv1.Step) bool { return s.GetId() == in.FromStep }) {
			return nil, refuse("from_step", "%q is not a step of the plan at the fork point (revision %d); its steps: %s", in.FromStep, base.GetRevision(), stepList(base))
		}
		from = dependents(base, in.FromStep)
	}
	states := runlog.Steps(at)
	keep := map[string]bool{}
	for _, s := range base.GetSteps() {
		if st := states[s.GetId()]; succeeded(st) && !from[s.GetId()] {
			keep[s.GetId()] = true
		}
	}
	p := proto.CloneOf(base)
	p.Revision = 1
	p.Lineage = nil
	if _, err := editArgs(p, in.StepArgs, keep); err != nil {
		return nil, err
	}
	if err := validate(p, in.Catalog, in.Limits); err != nil {
		return nil, err
	}
	out := &Surgery{Plan: p}
	for _, s := range p.GetSteps() {
		if keep[s.GetId()] {
			out.Kept = append(out.Kept, s.GetId())
			out.Shared = append(out.Shared, proto.CloneOf(states[s.GetId()]))
		} else {
			out.Rerun = append(out.Rerun, s.GetId())
		}
	}
	return out, nil
}

// editArgs replaces the arguments of steps that start over; a step that
// keeps its result cannot be edited.
func editArgs(p *planexv1.Plan, args map[string]*structpb.Struct, keep map[string]bool) (map[string]bool, error) {
	edited := map[string]bool{}
	ids := slices.Sorted(maps.Keys(args))
	for _, id := range ids {
		field := "step_args." + id
		i := slices.IndexFunc(p.GetSteps(), func(s *planexv1.Step) bool { return s.GetId() == id })
		switch {
		case i < 0:
			return nil, refuse(field, "no step %q in the plan revision the run continues with; its steps: %s", id, stepList(p))
		case keep[id]:
			return nil, refuse(field, "step %q keeps its result; run it again (from_step %q) to give it other arguments", id, id)
		case args[id] == nil:
			return nil, refuse(field, "empty: give the step's arguments as an object")
		}
		p.Steps[i].Args = proto.CloneOf(args[id])
		edited[id] = true
	}
	return edited, nil
}

// validate checks the plan the run continues with, as a planner's would be.
func validate(p *planexv1.Plan, cat plan.Catalog, lim plan.Limits) error {
	err := plan.Validate(p, cat, lim)
	if err == nil {
		return nil
	}
	var ve *plan.ValidationError
	if !errors.As(err, &ve) {
		return refuse("step_args", "%v", err)
	}
	problems := make([]string, 0, len(ve.Problems))
	for _, pr := range ve.Problems {
		problems = append(problems, pr.String())
	}
	return refuse("step_args", "the plan would be invalid: %s", strings.Join(problems, "; "))
}

// lineage describes the reset revision against the current one: kept
// steps keep their state, every other one starts over (runlog's revise).
func lineage(prev, next *planexv1.Plan, keep, edited map[string]bool) *planexv1.PlanLineage {
	l := &planexv1.PlanLineage{PreviousRevision: prev.GetRevision()}
	inPrev := map[string]bool{}
	for _, s := range prev.GetSteps() {
		inPrev[s.GetId()] = true
	}
	inNext := map[string]bool{}
	for _, s := range next.GetSteps() {
		id := s.GetId()
		inNext[id] = true
		switch {
		case keep[id]:
			l.Kept = append(l.Kept, id)
		case !inPrev[id]:
			l.Added = append(l.Added, id)
		case edited[id]:
			l.Changed = append(l.Changed, id)
		}
	}
	for _, s := range prev.GetSteps() {
		if !inNext[s.GetId()] {
			l.Dropped = append(l.Dropped, s.GetId())
		}
	}
	return l
}

func describeUnsettled(st *planexv1.StepState) string {
	if runlog.InFlight(st.GetStatus()) {
		return "still in flight when the run finished"
	}
	if m := st.GetError().GetMessage(); m != "" {
		return m
	}
	return "outcome unknown"
}

func stepList(p *planexv1.Plan) string {
	ids := make([]string, 0, len(p.GetSteps()))
	for _, s := range p.GetSteps() {
		ids = append(ids, s.GetId())
	}
	sort.Strings(ids)
	if len(ids) > 20 {
		ids = append(ids[:20], "…")
	}
	return strings.Join(ids, ", ")
}

func firstID(undecided []string) string {
	id, _, _ := strings.Cut(undecided[0], " ")
	return strings.Trim(id, `"`)
}

// maxLinkTries bounds how often a fork's link is appended again after
// losing an append race on the original's log.
const maxLinkTries = 8

// LinkFork records a fork in its original's log (RunForked), once: a
// repeated call finds it there. ForkRun calls it after creating the fork,
// and the fork's start guard again, so a fork whose creator died before
// linking it is linked all the same.
func LinkFork(ctx context.Context, log *runlog.Log, origID string, fork *planexv1.Run) error {
	for range maxLinkTries {
		st, err := log.Load(ctx, origID)
		if err != nil {
			return fmt.Errorf("link fork %s to run %s: %w", fork.GetId(), origID, err)
		}
		if slices.Contains(st.Run.GetForks(), fork.GetId()) {
			return nil
		}
		tx := log.Begin(st)
		o := fork.GetForkedFrom()
		ev := Event(&planexv1.RunForked{ForkRunId: fork.GetId(), AtSequence: o.GetSequence(), ForkedBy: o.GetForkedBy(), Reason: o.GetReason()})
		ev.RunId = origID
		if err := tx.Emit(ev); err != nil {
			return err
		}
		_, err = log.Commit(ctx, tx)
		if errors.Is(err, runlog.ErrConflict) {
			continue // the original advanced: try on its new state
		}
		return err
	}
	return fmt.Errorf("link fork %s to run %s: gave up after %d append conflicts", fork.GetId(), origID, maxLinkTries)
}
