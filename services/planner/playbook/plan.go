package playbook

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/plan"
)

// BackendName is the name the playbook backend answers under.
const BackendName = "playbook"

var (
	// ErrNoMatch is matched by errors.Is for the [*NoMatchError] Plan
	// returns when no playbook matches the goal.
	ErrNoMatch = errors.New("no playbook matches goal")
	// ErrNoBranch is matched by errors.Is for the [*StepFailedError] Plan
	// returns when a step failed and no on_failure branch (left) recovers
	// it: there is none, or the one that matches is a fail branch.
	ErrNoBranch = errors.New("no on_failure branch for the failure")
)

// NoMatchError says that no playbook matches a goal. Its message is meant
// for the person who wrote the goal: it names the goal, lists the goals the
// loaded playbooks handle and says how to plan other goals.
type NoMatchError struct {
	// Goal as given.
	Goal string
	// Known describes each loaded playbook: "name: description (e.g.
	// "example")".
	Known []string
	// Near lists playbooks whose pattern matched but whose parameters did
	// not bind, with the reason.
	Near []string
}

// Error renders the multi-line explanation. When a playbook's pattern
// matched but a parameter was rejected, that reason comes first: it is
// what the user has to change ("n: 200 is out of range: must be from 1 to
// 100").
func (e *NoMatchError) Error() string {
	var b strings.Builder
	switch len(e.Near) {
	case 0:
		fmt.Fprintf(&b, "no playbook matches goal %q.", e.Goal)
	case 1:
		fmt.Fprintf(&b, "cannot plan goal %q: playbook %s.", e.Goal, e.Near[0])
	default:
		fmt.Fprintf(&b, "cannot plan goal %q; the playbooks whose pattern matched rejected it:", e.Goal)
		for _, n := range e.Near {
			b.WriteString("\n  - playbook ")
			b.WriteString(n)
		}
	}
	if len(e.Near) > 0 {
		return b.String()
	}
	if len(e.Known) == 0 {
		b.WriteString("\nNo playbooks are loaded.")
	} else {
		b.WriteString("\nThe loaded playbooks handle goals like:")
		for _, k := range e.Known {
			b.WriteString("\n  - ")
			b.WriteString(k)
		}
	}
	b.WriteString("\nTo plan other goals, add a playbook (a YAML file in a directory passed with --playbooks DIR) or plan with a model (--planner-backend openai or --planner-backend anthropic).")
	return b.String()
}

// Is makes errors.Is(err, ErrNoMatch) hold.
func (e *NoMatchError) Is(target error) bool { return target == ErrNoMatch }

// Name returns "playbook".
func (s *Set) Name() string { return BackendName }

// Plan answers a planning request from the first playbook that matches the
// goal. Parameters bound from the goal are substituted before the plan is
// returned. With history, a failed step selects the playbook's first
// matching on_failure branch not used yet; completed steps are kept. In
// next-step mode only the steps whose dependencies completed are returned,
// and stop with the final answer once every step completed. The plan is
// not validated against the request's catalog: the caller does that.
func (s *Set) Plan(ctx context.Context, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	inputs := req.GetInputs().AsMap()
	book, params, err := s.match(req.GetGoal(), inputs)
	if err != nil {
		return nil, err
	}
	h := readHistory(req.GetHistory())
	v, br, why, err := book.variantFor(h, params)
	if err != nil {
		return nil, err
	}
	if br != nil && br.fail != "" {
		return nil, book.failWith(br, why, params, req.GetGoal(), inputs, h)
	}
	full, err := book.assemble(v, br, params, h)
	if err != nil {
		return nil, fmt.Errorf("playbook %s (%s): %w", book.Name, book.Source, err)
	}
	full.Revision = req.GetRevision()
	full.Confidence = book.confidence
	full.Rationale = book.rationale(v, br, why)

	remaining := 0
	for _, st := range full.Steps {
		if h.done[st.GetId()] == nil {
			remaining++
		}
	}
	resp := &planexv1.PlanResponse{Backend: BackendName}
	if remaining == 0 {
		env := plan.Env{Goal: req.GetGoal(), Inputs: inputs, Outputs: h.outputs()}
		result, err := plan.Result(full, env)
		if err != nil {
			return nil, fmt.Errorf("playbook %s: final answer: %w", book.Name, err)
		}
		val, err := structpb.NewValue(result)
		if err != nil {
			return nil, fmt.Errorf("playbook %s: final answer: %w", book.Name, err)
		}
		resp.Stop = true
		resp.FinalAnswer = val
		resp.StopMessage = fmt.Sprintf("every step of playbook %s completed", book.Name)
		return resp, nil
	}
	if req.GetMode() == planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP {
		full.Steps = slices.DeleteFunc(full.Steps, func(st *planexv1.Step) bool {
			if h.done[st.GetId()] != nil {
				return false
			}
			for _, d := range st.GetDependsOn() {
				if h.done[d] == nil {
					return true
				}
			}
			return false
		})
		// The answer may read steps that come later; in this mode the
		// final answer arrives with stop instead.
		for _, id := range stepRefs(full.Answer) {
			if findStep(full, id) == nil {
				full.Answer = ""
				break
			}
		}
	}
	resp.Plan = full
	return resp, nil
}

func normalizeGoal(g string) string { return strings.Join(strings.Fields(g), " ") }

// match finds the first playbook whose pattern matches the goal and whose
// parameters bind.
func (s *Set) match(goal string, inputs map[string]any) (*Playbook, map[string]any, error) {
	g := normalizeGoal(goal)
	var near []string
	for _, b := range s.books {
		params, err := b.bind(g, inputs)
		if err == nil {
			return b, params, nil
		}
		if !errors.Is(err, errNoPattern) {
			near = append(near, fmt.Sprintf("%s: %v", b.Name, err))
		}
	}
	known := make([]string, 0, len(s.books))
	for _, b := range s.books {
		k := b.Name + ": " + b.Description
		if len(b.Examples) > 0 {
			k += fmt.Sprintf(" (e.g. %q)", b.Examples[0])
		}
		known = append(known, k)
	}
	return nil, nil, &NoMatchError{Goal: goal, Known: known, Near: near}
}

var errNoPattern = errors.New("no pattern matches")

// bind tries the patterns in order; the first that matches and whose
// parameters bind wins. It returns errNoPattern when no pattern matches, or
// the binding error of the first pattern that matched: patterns go from
// the most specific to the loosest, and a loose one's captures ("account
// team a summary of") explain less.
func (b *Playbook) bind(goal string, inputs map[string]any) (map[string]any, error) {
	err := errNoPattern
	for _, pt := range b.patterns {
		m := pt.re.FindStringSubmatchIndex(goal)
		if m == nil {
			continue
		}
		params, berr := b.bindParams(pt, goal, m, inputs)
		if berr == nil {
			return params, nil
		}
		if err == errNoPattern {
			err = berr
		}
	}
	return nil, err
}

func (b *Playbook) bindParams(pt pattern, goal string, m []int, inputs map[string]any) (map[string]any, error) {
	captures := map[string]string{}
	for i, name := range pt.re.SubexpNames() {
		if name != "" && m[2*i] >= 0 {
			captures[name] = goal[m[2*i]:m[2*i+1]]
		}
	}
	params := make(map[string]any, len(b.params))
	for _, name := range b.paramOrder {
		c, captured := captures[name]
		v, present, err := b.params[name].bind(c, captured, inputs)
		if err != nil {
			return nil, err
		}
		if present {
			params[name] = v
		} else {
			params[name] = nil
		}
	}
	return params, nil
}

// history is what a plan request tells about the run so far.
type history struct {
	// done holds the latest succeeded outcome of each step.
	done map[string]*planexv1.StepOutcome
	// defs holds the definition a completed step ran with.
	defs map[string]*planexv1.Step
	// failures are the failed steps that did not succeed later, in
	// completion order.
	failures []*planexv1.StepOutcome
	order    []string
	// revisions are the run's plans, oldest first.
	revisions []*planexv1.Plan
}

func readHistory(hp *planexv1.PlanHistory) *history {
	h := &history{done: map[string]*planexv1.StepOutcome{}, defs: map[string]*planexv1.Step{}, revisions: hp.GetRevisions()}
	for _, o := range hp.GetSteps() {
		id := o.GetStepId()
		switch o.GetStatus() {
		case planexv1.StepStatus_STEP_STATUS_SUCCEEDED:
			if h.done[id] == nil {
				h.order = append(h.order, id)
			}
			h.done[id] = o
			h.failures = slices.DeleteFunc(h.failures, func(f *planexv1.StepOutcome) bool { return f.GetStepId() == id })
		case planexv1.StepStatus_STEP_STATUS_FAILED:
			h.failures = append(h.failures, o)
		}
	}
	revs := hp.GetRevisions()
	for id, o := range h.done {
		// Prefer the revision the step ran in, else the latest holding it.
		for i := len(revs) - 1; i >= 0; i-- {
			st := findStep(revs[i], id)
			if st == nil {
				continue
			}
			if h.defs[id] == nil || revs[i].GetRevision() == o.GetPlanRevision() {
				h.defs[id] = st
			}
		}
	}
	return h
}

func findStep(p *planexv1.Plan, id string) *planexv1.Step {
	steps := p.GetSteps()
	if i := slices.IndexFunc(steps, func(s *planexv1.Step) bool { return s.GetId() == id }); i >= 0 {
		return steps[i]
	}
	return nil
}

func (h *history) outputs() map[string]any {
	out := make(map[string]any, len(h.done))
	for id, o := range h.done {
		out[id] = o.GetOutput().AsInterface()
	}
	return out
}

// variantFor finds the steps the next revision follows. A branch is in
// use once a revision of the run holds one of its own steps (the history
// may no longer list the failure that led to it); the latest such branch is
// the current variant. A failure is new while the latest revision still
// holds the failed step as it failed: it selects the first branch that
// matches it and is not in use yet, or fails with ErrNoBranch.
func (b *Playbook) variantFor(h *history, params map[string]any) (*variant, *branch, *planexv1.StepOutcome, error) {
	v, cur := &b.main, (*branch)(nil)
	var why *planexv1.StepOutcome
	used := map[*branch]bool{}
	for _, br := range b.appliedBranches(h.revisions, params) {
		used[br] = true
		v, cur = &br.variant, br
	}
	for _, f := range h.failures {
		if !h.pending(f) {
			continue
		}
		br := b.branchFor(f, used)
		if br == nil {
			return nil, nil, nil, b.noBranch(f)
		}
		used[br] = true
		v, cur, why = &br.variant, br, f
		if br.fail != "" {
			return v, br, f, nil
		}
	}
	if cur != nil && why == nil {
		why = h.lastFailure()
	}
	return v, cur, why, nil
}

// pending reports whether a failure still waits for a replan: the latest
// revision holds the failed step with the definition it failed with. A
// history without revisions cannot tell, so every failure is pending.
func (h *history) pending(f *planexv1.StepOutcome) bool {
	if len(h.revisions) == 0 {
		return true
	}
	cur := findStep(h.revisions[len(h.revisions)-1], f.GetStepId())
	if cur == nil {
		return false
	}
	for _, r := range h.revisions {
		if r.GetRevision() == f.GetPlanRevision() {
			if ran := findStep(r, f.GetStepId()); ran != nil {
				return sameStep(ran, cur)
			}
		}
	}
	return true
}

func (h *history) lastFailure() *planexv1.StepOutcome {
	if len(h.failures) == 0 {
		return nil
	}
	return h.failures[len(h.failures)-1]
}

// appliedBranches returns the branches whose own steps (not defined the
// same way by the main steps) appear in the revisions, in order of first
// appearance.
func (b *Playbook) appliedBranches(revs []*planexv1.Plan, params map[string]any) []*branch {
	if len(revs) == 0 || len(b.branches) == 0 {
		return nil
	}
	main := map[string]*planexv1.Step{}
	for _, s := range b.main.steps {
		if st, err := s.build(params); err == nil {
			main[s.id] = st
		}
	}
	own := map[*branch][]*planexv1.Step{}
	for _, br := range b.branches {
		for _, s := range br.steps {
			st, err := s.build(params)
			if err == nil && (main[s.id] == nil || !sameStep(main[s.id], st)) {
				own[br] = append(own[br], st)
			}
		}
	}
	var out []*branch
	for _, r := range revs {
		for _, br := range b.branches {
			if slices.Contains(out, br) {
				continue
			}
			for _, st := range own[br] {
				if ran := findStep(r, st.GetId()); ran != nil && sameStep(ran, st) {
					out = append(out, br)
					break
				}
			}
		}
	}
	return out
}

// sameStep reports whether two steps with the same id are defined alike,
// by the engine's own rule (plan.Lineage keeps a step only then).
func sameStep(a, c *planexv1.Step) bool {
	l := plan.Lineage(&planexv1.Plan{Steps: []*planexv1.Step{a}}, &planexv1.Plan{Steps: []*planexv1.Step{c}}, nil)
	return len(l.GetKept()) == 1
}

func (b *Playbook) branchFor(f *planexv1.StepOutcome, used map[*branch]bool) *branch {
	for _, br := range b.branches {
		if used[br] {
			continue
		}
		w := br.when
		if len(w.steps) > 0 && !slices.Contains(w.steps, f.GetStepId()) {
			continue
		}
		if len(w.codes) > 0 && !slices.Contains(w.codes, f.GetError().GetCode()) {
			continue
		}
		if w.message != nil && !w.message.MatchString(f.GetError().GetMessage()) {
			continue
		}
		return br
	}
	return nil
}

func describeError(e *planexv1.StepError) string {
	code := strings.TrimPrefix(e.GetCode().String(), "ERROR_CODE_")
	if e.GetMessage() == "" {
		return code
	}
	return code + ": " + e.GetMessage()
}

// assemble builds the full plan of a variant: for the main steps all of
// them; for a branch its steps plus what they and the answer need from the
// main steps. Completed steps are always kept, as they ran, so that their
// outputs stay available and the engine does not run them again.
func (b *Playbook) assemble(v *variant, br *branch, params map[string]any, h *history) (*planexv1.Plan, error) {
	defs := map[string]*stepDef{}
	var order []string
	add := func(steps []*stepDef) {
		for _, s := range steps {
			if defs[s.id] == nil {
				order = append(order, s.id)
			}
			defs[s.id] = s
		}
	}
	add(b.main.steps)
	want := map[string]bool{}
	answer := v.answer
	if br == nil {
		for _, s := range b.main.steps {
			want[s.id] = true
		}
	} else {
		add(br.steps)
		if answer == "" {
			answer = b.main.answer
		}
		var need func(id string)
		need = func(id string) {
			if want[id] || defs[id] == nil {
				return
			}
			want[id] = true
			if h.done[id] != nil && h.defs[id] != nil {
				return // its dependencies completed before it
			}
			for _, d := range defs[id].dependsOn {
				need(d)
			}
		}
		for _, s := range br.steps {
			need(s.id)
		}
		for _, id := range stepRefs(answer) {
			need(id)
		}
	}
	for _, id := range h.order {
		if h.defs[id] != nil {
			if !want[id] && defs[id] == nil {
				order = append(order, id)
			}
			want[id] = true
		}
	}

	p := &planexv1.Plan{}
	for _, id := range order {
		if !want[id] {
			continue
		}
		if st := h.defs[id]; st != nil {
			p.Steps = append(p.Steps, st)
			continue
		}
		st, err := defs[id].build(params)
		if err != nil {
			return nil, fmt.Errorf("step %q: %w", id, err)
		}
		p.Steps = append(p.Steps, st)
	}
	a, err := inlineParams(answer, params)
	if err != nil {
		return nil, fmt.Errorf("answer: %w", err)
	}
	p.Answer = a
	return p, nil
}

// build turns a step definition into a plan step, substituting parameters.
func (s *stepDef) build(params map[string]any) (*planexv1.Step, error) {
	args, err := substArgs(s.args, params)
	if err != nil {
		return nil, err
	}
	expect, err := inlineParams(s.expect, params)
	if err != nil {
		return nil, fmt.Errorf("expect: %w", err)
	}
	desc, err := substString(s.description, params, "description")
	if err != nil {
		return nil, err
	}
	st := &planexv1.Step{
		Id:               s.id,
		Description:      text(desc.AsInterface()),
		Tool:             s.tool,
		Args:             args,
		DependsOn:        slices.Clone(s.dependsOn),
		Expect:           expect,
		RequiresApproval: s.requiresApproval,
	}
	if s.timeout > 0 {
		st.Timeout = durationpb.New(s.timeout)
	}
	return st, nil
}

func (b *Playbook) rationale(v *variant, br *branch, why *planexv1.StepOutcome) string {
	r := v.rationale
	if r == "" {
		r = b.Description
	}
	if br == nil {
		return fmt.Sprintf("playbook %s: %s", b.Name, r)
	}
	if why == nil {
		return fmt.Sprintf("playbook %s, on_failure branch %s: %s", b.Name, br.name, r)
	}
	return fmt.Sprintf("playbook %s, on_failure branch %s after step %q failed (%s): %s", b.Name, br.name, why.GetStepId(), describeError(why.GetError()), r)
}
