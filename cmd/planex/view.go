package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

var stepIcons = map[planexv1.StepStatus]string{
	planexv1.StepStatus_STEP_STATUS_PENDING:          "·",
	planexv1.StepStatus_STEP_STATUS_WAITING_APPROVAL: "⏸",
	planexv1.StepStatus_STEP_STATUS_DISPATCHED:       "→",
	planexv1.StepStatus_STEP_STATUS_RUNNING:          "⟳",
	planexv1.StepStatus_STEP_STATUS_SUCCEEDED:        "✓",
	planexv1.StepStatus_STEP_STATUS_FAILED:           "✗",
	planexv1.StepStatus_STEP_STATUS_SKIPPED:          "-",
	planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN:  "?",
}

// renderRun draws a run as text: header, the current plan as a tree, each
// step's state and duration, replans and the result.
func renderRun(r *planexv1.Run) string {
	var b strings.Builder
	fmt.Fprintf(&b, "run %s  %s", r.GetId(), statusName(r.GetStatus(), "RUN_STATUS_"))
	if r.GetTraceId() != "" {
		fmt.Fprintf(&b, "  trace %s", r.GetTraceId())
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "goal: %s\n", r.GetGoal())
	if o := r.GetForkedFrom(); o != nil {
		fmt.Fprintf(&b, "forked from: %s at event %d", o.GetRunId(), o.GetSequence())
		if o.GetFromStep() != "" {
			fmt.Fprintf(&b, ", from step %s", o.GetFromStep())
		}
		b.WriteString("\n")
	}
	if p := r.GetParentRunId(); p != "" {
		fmt.Fprintf(&b, "child of: %s, step %s (attempt %d)\n", p, r.GetParentStepId(), r.GetParentAttempt())
	}
	if n := r.GetResets(); n > 0 {
		fmt.Fprintf(&b, "reset: %d time(s), last at %s\n", n, r.GetResetAt().AsTime().Local().Format(time.DateTime))
	}
	if f := r.GetForks(); len(f) > 0 {
		fmt.Fprintf(&b, "forks: %s\n", strings.Join(f, ", "))
	}
	plans := r.GetPlans()
	if len(plans) == 0 {
		b.WriteString("planning…\n")
	} else {
		cur := plans[len(plans)-1]
		fmt.Fprintf(&b, "plan r%d", cur.GetRevision())
		if len(plans) > 1 {
			if n := len(plans) - 1; n == 1 {
				b.WriteString(" (1 replan")
			} else {
				fmt.Fprintf(&b, " (%d replans", n)
			}
			if l := cur.GetLineage(); l != nil {
				fmt.Fprintf(&b, "; kept %d, added %d, changed %d, dropped %d", len(l.GetKept()), len(l.GetAdded()), len(l.GetChanged()), len(l.GetDropped()))
			}
			b.WriteString(")")
		}
		if cur.GetRationale() != "" {
			// Not cut here: the live view fits lines to the terminal, and
			// the final screen shows the whole rationale.
			fmt.Fprintf(&b, ": %s", strings.Join(strings.Fields(cur.GetRationale()), " "))
		}
		b.WriteString("\n")
		renderTree(&b, cur, stepStates(r))
	}
	renderChildren(&b, r)
	if isTerminal(r.GetStatus()) {
		if r.GetStopReason() == planexv1.StopReason_STOP_REASON_NO_DATA && r.GetStopMessage() != "" {
			// The data says no: the message is what the user acts on,
			// alone (the reason is in the exit line and in --json).
			fmt.Fprintf(&b, "stopped: %s", r.GetStopMessage())
		} else {
			fmt.Fprintf(&b, "stopped: %s", statusName(r.GetStopReason(), "STOP_REASON_"))
			if r.GetExceededBudget() != planexv1.BudgetKind_BUDGET_KIND_UNSPECIFIED {
				fmt.Fprintf(&b, " (%s)", statusName(r.GetExceededBudget(), "BUDGET_KIND_"))
			}
			if r.GetStopMessage() != "" {
				fmt.Fprintf(&b, ": %s", r.GetStopMessage())
			}
		}
		b.WriteString("\n")
		if r.GetResult() != nil {
			fmt.Fprintf(&b, "result: %s\n", valueText(r.GetResult().AsInterface()))
		}
	}
	for _, g := range r.GetGates() {
		if g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED && g.GetKind() == planexv1.GateKind_GATE_KIND_INPUT {
			fmt.Fprintf(&b, "waiting for an answer on gate %s (%s): %s (planex runs answer %s %s)\n", g.GetId(), g.GetStepId(), g.GetInput().GetQuestion(), r.GetId(), g.GetStepId())
		} else if g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
			fmt.Fprintf(&b, "waiting for a decision on gate %s (%s): %s\n", g.GetId(), g.GetStepId(), g.GetReason())
		}
	}
	return b.String()
}

func stepStates(r *planexv1.Run) map[string]*planexv1.StepState {
	m := make(map[string]*planexv1.StepState, len(r.GetSteps()))
	for _, s := range r.GetSteps() {
		m[s.GetStepId()] = s
	}
	return m
}

// renderTree prints steps under their first dependency; a step joining
// several branches is printed once and names the others.
func renderTree(b *strings.Builder, p *planexv1.Plan, states map[string]*planexv1.StepState) {
	children := map[string][]*planexv1.Step{}
	var roots, joins []*planexv1.Step
	for _, s := range p.GetSteps() {
		switch len(s.GetDependsOn()) {
		case 0:
			roots = append(roots, s)
		case 1:
			children[s.GetDependsOn()[0]] = append(children[s.GetDependsOn()[0]], s)
		default:
			// A join is drawn after the branches it waits for, at the top
			// level, naming them.
			joins = append(joins, s)
		}
	}
	seen := map[string]bool{}
	var walk func(s *planexv1.Step, prefix string, last bool, depth int)
	walk = func(s *planexv1.Step, prefix string, last bool, depth int) {
		if seen[s.GetId()] {
			return
		}
		seen[s.GetId()] = true
		branch, next := "", prefix
		if depth > 0 {
			if last {
				branch, next = "└─ ", prefix+"   "
			} else {
				branch, next = "├─ ", prefix+"│  "
			}
		}
		st := states[s.GetId()]
		icon, status, dur := "·", "pending", ""
		if st != nil {
			icon = stepIcons[st.GetStatus()]
			status = statusName(st.GetStatus(), "STEP_STATUS_")
			if d := st.GetDuration(); d != nil && d.AsDuration() > 0 {
				dur = d.AsDuration().Round(time.Millisecond).String()
			} else if st.GetDispatchedAt() != nil && st.GetFinishedAt() != nil {
				dur = st.GetFinishedAt().AsTime().Sub(st.GetDispatchedAt().AsTime()).Round(time.Millisecond).String()
			}
			if st.GetAttempt() > 1 {
				status += fmt.Sprintf(" (attempt %d)", st.GetAttempt())
			}
			if at := st.GetRetryAt(); at != nil && st.GetStatus() == planexv1.StepStatus_STEP_STATUS_PENDING {
				status = fmt.Sprintf("retrying after attempt %d at %s", st.GetAttempt(), at.AsTime().Local().Format(time.TimeOnly))
			}
		}
		line := fmt.Sprintf("  %s%s%s %s  %s  %s", prefix, branch, icon, s.GetId(), s.GetTool(), status)
		if dur != "" {
			line += "  " + dur
		}
		if extra := s.GetDependsOn(); len(extra) > 1 {
			line += "  (joins " + strings.Join(extra, ", ") + ")"
		}
		b.WriteString(line + "\n")
		if st != nil && st.GetError() != nil {
			fmt.Fprintf(b, "  %s%s   error: %s\n", prefix, strings.Repeat(" ", len([]rune(branch))), oneLineText(st.GetError().GetMessage(), 120))
		}
		kids := children[s.GetId()]
		for i, k := range kids {
			walk(k, next, i == len(kids)-1, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, "", true, 0)
	}
	for _, j := range joins {
		walk(j, "", true, 0)
	}
	// Steps unreachable from a root (a cycle would have been rejected) are
	// still shown.
	for _, s := range p.GetSteps() {
		walk(s, "", true, 0)
	}
}

// eventLine describes one run event on one line, for non-terminal output.
func eventLine(ev *planexv1.RunEvent) string {
	ts := ev.GetTime().AsTime().Local().Format("15:04:05.000")
	var what string
	switch p := ev.GetPayload().(type) {
	case *planexv1.RunEvent_Created:
		what = fmt.Sprintf("run created: %s", p.Created.GetGoal())
	case *planexv1.RunEvent_PlanRevised:
		var ids []string
		for _, s := range p.PlanRevised.GetPlan().GetSteps() {
			ids = append(ids, s.GetId()+"("+s.GetTool()+")")
		}
		what = fmt.Sprintf("plan r%d: %s", p.PlanRevised.GetPlan().GetRevision(), strings.Join(ids, ", "))
	case *planexv1.RunEvent_PlanRejected:
		what = fmt.Sprintf("plan r%d rejected: %s", p.PlanRejected.GetRevision(), strings.Join(p.PlanRejected.GetErrors(), "; "))
	case *planexv1.RunEvent_StepDispatched:
		what = fmt.Sprintf("step %s dispatched (attempt %d)", p.StepDispatched.GetStepId(), p.StepDispatched.GetAttempt())
		if c := p.StepDispatched.GetChild(); c != nil {
			what += ": child run " + c.GetRunId()
		}
	case *planexv1.RunEvent_ChildRunFinished:
		c := p.ChildRunFinished
		what = fmt.Sprintf("child run %s of step %s %s; charged %d steps, %d tokens", c.GetChildRunId(), c.GetStepId(),
			statusAndReason(c.GetStatus(), c.GetStopReason()), c.GetUsage().GetSteps(), c.GetUsage().GetTokens())
	case *planexv1.RunEvent_StepStarted:
		what = fmt.Sprintf("step %s started", p.StepStarted.GetStepId())
		if p.StepStarted.GetRestart() {
			what = fmt.Sprintf("step %s started again on %s after a redelivery (attempt %d)", p.StepStarted.GetStepId(), p.StepStarted.GetExecutorId(), p.StepStarted.GetAttempt())
		}
	case *planexv1.RunEvent_StepSucceeded:
		what = fmt.Sprintf("step %s succeeded in %s", p.StepSucceeded.GetStepId(), p.StepSucceeded.GetDuration().AsDuration().Round(time.Millisecond))
	case *planexv1.RunEvent_StepFailed:
		what = fmt.Sprintf("step %s failed: %s", p.StepFailed.GetStepId(), p.StepFailed.GetError().GetMessage())
	case *planexv1.RunEvent_StepRetrying:
		r := p.StepRetrying
		what = fmt.Sprintf("step %s attempt %d failed, retry %d at %s: %s", r.GetStepId(), r.GetAttempt(), r.GetRetry(),
			r.GetRetryAt().AsTime().Local().Format(time.TimeOnly), r.GetError().GetMessage())
	case *planexv1.RunEvent_ExpectationFailed:
		what = fmt.Sprintf("step %s expectation failed: %s", p.ExpectationFailed.GetStepId(), p.ExpectationFailed.GetMessage())
	case *planexv1.RunEvent_ReplanRequested:
		what = fmt.Sprintf("replanning: %s", p.ReplanRequested.GetReason())
	case *planexv1.RunEvent_GateOpened:
		what = fmt.Sprintf("gate %s opened: %s", p.GateOpened.GetGate().GetId(), p.GateOpened.GetGate().GetReason())
	case *planexv1.RunEvent_GateDecided:
		what = fmt.Sprintf("gate %s: %s", p.GateDecided.GetGateId(), statusName(p.GateDecided.GetDecision(), "DECISION_KIND_"))
		if via := p.GateDecided.GetVia(); via != "" {
			what += " (" + via + ")"
		}
	case *planexv1.RunEvent_CriticVerdict:
		v := p.CriticVerdict
		what = fmt.Sprintf("critic %s on step %s: %s (%s)", v.GetVerifier(), v.GetStepId(), v.GetReason(), v.GetAction())
		if n := v.GetUsage().GetInputTokens() + v.GetUsage().GetOutputTokens(); n > 0 {
			what += fmt.Sprintf(", %d tokens", n)
		}
	case *planexv1.RunEvent_CritiquePending:
		what = fmt.Sprintf("step %s succeeded, waiting for the %s critic", p.CritiquePending.GetStepId(), p.CritiquePending.GetBackend())
	case *planexv1.RunEvent_BudgetUsed:
		// The engine records usage twice around each planner call: a
		// reservation of the tokens left before it, the settled account
		// after it.
		u := p.BudgetUsed.GetUsage()
		what = fmt.Sprintf("budget: %d steps, %d replans, %d tokens used", u.GetSteps(), u.GetReplans(), u.GetTokens())
		if r := u.GetTokensReserved(); r > 0 {
			what += fmt.Sprintf("; %d tokens reserved for the planner call", r)
		}
	case *planexv1.RunEvent_Finished:
		what = "run " + statusAndReason(p.Finished.GetStatus(), p.Finished.GetStopReason())
		if m := p.Finished.GetMessage(); m != "" {
			what += ": " + m
		}
	default:
		what = "event"
	}
	return fmt.Sprintf("%s #%d %s", ts, ev.GetSequence(), what)
}

// liveView redraws the run in place on a terminal, or prints one line per
// event elsewhere.
type liveView struct {
	w     io.Writer
	tty   bool
	lines int
}

func (v *liveView) event(ev *planexv1.RunEvent, r *planexv1.Run) {
	if !v.tty {
		fmt.Fprintln(v.w, eventLine(ev))
		return
	}
	v.draw(r)
}

func (v *liveView) draw(r *planexv1.Run) {
	if r == nil {
		return
	}
	v.clear()
	// Lines are cut to the terminal's width so the next redraw moves the
	// cursor up by exactly the lines drawn.
	text := fitLines(renderRun(r), terminalWidth())
	v.lines = strings.Count(text, "\n")
	fmt.Fprint(v.w, text)
}

// clear erases what the last draw printed.
func (v *liveView) clear() {
	if v.lines > 0 {
		fmt.Fprintf(v.w, "\x1b[%dA\x1b[J", v.lines)
		v.lines = 0
	}
}

// final prints the run in full (long lines wrap; nothing is redrawn after).
func (v *liveView) final(r *planexv1.Run) {
	if v.tty {
		v.clear()
	}
	fmt.Fprint(v.w, renderRun(r))
}

// terminalWidth is stdout's width in columns (80 when unknown).
func terminalWidth() int {
	if w, _, err := term.GetSize(int(os.Stdout.Fd())); err == nil && w > 0 {
		return w
	}
	return 80
}

// fitLines cuts every line of text to at most width-1 runes.
func fitLines(text string, width int) string {
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	for i, l := range lines {
		if r := []rune(l); len(r) >= width {
			lines[i] = string(r[:max(width-2, 1)]) + "…"
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

// stopDetailLine is the "detail: …" line of a stopped run (the failed
// step, tool, attempts and error behind its stop message) for `runs get`,
// or "" when the run has none. `planex run` leaves it out: there the stop
// message stands alone.
func stopDetailLine(r *planexv1.Run) string {
	if d := r.GetStopDetail(); d != "" && isTerminal(r.GetStatus()) {
		return "detail: " + d + "\n"
	}
	return ""
}

// statusAndReason is "failed (planner_error)", or just "succeeded" when
// the stop reason only repeats the status.
func statusAndReason(status planexv1.RunStatus, reason planexv1.StopReason) string {
	st, why := statusName(status, "RUN_STATUS_"), statusName(reason, "STOP_REASON_")
	if why == st || reason == planexv1.StopReason_STOP_REASON_UNSPECIFIED {
		return st
	}
	return st + " (" + why + ")"
}

func valueText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func oneLineText(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}

// renderChildren lists a run's child runs under the step that started
// each, with their status as the run knows it, and the spend they were
// charged.
func renderChildren(b *strings.Builder, r *planexv1.Run) {
	if len(r.GetChildren()) == 0 {
		return
	}
	b.WriteString("children:\n")
	byStep := map[string][]*planexv1.ChildRun{}
	var order []string
	for _, c := range r.GetChildren() {
		if _, ok := byStep[c.GetStepId()]; !ok {
			order = append(order, c.GetStepId())
		}
		byStep[c.GetStepId()] = append(byStep[c.GetStepId()], c)
	}
	for i, step := range order {
		branch, next := "├─ ", "│  "
		if i == len(order)-1 {
			branch, next = "└─ ", "   "
		}
		fmt.Fprintf(b, "%sstep %s\n", branch, step)
		for j, c := range byStep[step] {
			leaf := "├─ "
			if j == len(byStep[step])-1 {
				leaf = "└─ "
			}
			status := "running"
			if c.GetStatus() != planexv1.RunStatus_RUN_STATUS_UNSPECIFIED {
				status = statusAndReason(c.GetStatus(), c.GetStopReason())
			}
			fmt.Fprintf(b, "%s%sattempt %d: run %s  %s", next, leaf, c.GetAttempt(), c.GetRunId(), status)
			if u := c.GetUsage(); u != nil {
				fmt.Fprintf(b, "  (%d steps, %d tokens)", u.GetSteps(), u.GetTokens())
			} else {
				fmt.Fprintf(b, "  (budget %d steps, %d tokens)", c.GetBudget().GetMaxSteps(), c.GetBudget().GetMaxTokens())
			}
			b.WriteString("\n")
		}
	}
	if u := r.GetChildrenUsage(); u != nil {
		fmt.Fprintf(b, "spent: %d steps, %d tokens (own %d, %d; children %d, %d)\n",
			r.GetUsage().GetSteps()+u.GetSteps(), r.GetUsage().GetTokens()+u.GetTokens(),
			r.GetUsage().GetSteps(), r.GetUsage().GetTokens(), u.GetSteps(), u.GetTokens())
	}
}
