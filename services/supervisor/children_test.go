package supervisor_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/telemetry"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// childStep is a run.child step starting a run of goal.
func childStep(id, goal string, budget map[string]any, deps ...string) *planexv1.Step {
	args := map[string]any{"goal": goal}
	if budget != nil {
		args["budget"] = budget
	}
	return step(id, "run.child", args, deps...)
}

// giveUp answers the planner's calls after the first with a give-up, so
// that a run whose first plan fails stops FAILED at once.
func giveUp(first *planexv1.PlanResponse) script {
	return func(n int, _ *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
		if n == 0 {
			return first, nil
		}
		return &planexv1.PlanResponse{Stop: true, GiveUp: true, StopMessage: "no way around it", Usage: &planexv1.TokenUsage{InputTokens: 3, OutputTokens: 2}, Backend: "fake"}, nil
	}
}

// A parent starts three child runs; one fails, the parent replans and the
// replacement child succeeds. The parent succeeds with the children's
// results as its steps' outputs, one trace covers all five runs (each
// child's root span under its parent step's span), and the budgets are
// accounted: the parent's spend is its own plus each child's. Not
// parallel: it swaps the global tracer provider.
func TestChildRunsReplanAccountAndTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithIDGenerator(telemetry.IDGenerator()), sdktrace.WithSpanProcessor(telemetry.SpanProcessor(rec)))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
		_ = tp.Shutdown(testCtx(t, 5*time.Second))
	})

	h := newHarness(t)
	r := h.startReplica()
	h.planner.on("child ok*", func(_ int, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
		return withAnswer(planOf(step("e", "test.echo", map[string]any{"value": req.GetGoal()})), "steps.e.output.value"), nil
	})
	h.planner.on("child broken", giveUp(planOf(noRetry(step("f", "test.fail", map[string]any{"message": "the child's tool broke"})))))
	h.planner.on("parent", sequence(
		withAnswer(planOf(
			childStep("c1", "child ok 1", nil), childStep("c2", "child broken", map[string]any{"max_steps": 3}), childStep("c3", "child ok 3", nil),
		), "[steps.c1.output, steps.c2.output, steps.c3.output]"),
		withAnswer(planOf(
			childStep("c1", "child ok 1", nil), childStep("c2b", "child ok 2", nil), childStep("c3", "child ok 3", nil),
		), "[steps.c1.output, steps.c2b.output, steps.c3.output]"),
	))
	id := start(t, r.client, &planexv1.StartRunRequest{Goal: "parent", Budget: &planexv1.Budget{MaxSteps: 40, MaxTokens: 1000}})
	run := succeeded(t, r, id)

	if got := run.GetResult().AsInterface(); !strings.Contains(fmt.Sprint(got), "child ok 1") || !strings.Contains(fmt.Sprint(got), "child ok 2") || !strings.Contains(fmt.Sprint(got), "child ok 3") {
		t.Fatalf("result %v: want the three children's answers", got)
	}
	if n := len(run.GetChildren()); n != 4 {
		t.Fatalf("parent records %d children, want 4 (c1, c2, c3, c2b)", n)
	}
	var steps int32
	var tokens int64
	byGoal := map[string]*planexv1.Run{}
	for _, c := range run.GetChildren() {
		child := waitTerminal(t, r.client, c.GetRunId(), 10*time.Second)
		byGoal[child.GetGoal()] = child
		if child.GetParentRunId() != id || child.GetParentStepId() != c.GetStepId() || child.GetParentAttempt() != c.GetAttempt() {
			t.Fatalf("child %s: parent %s/%s/%d, want %s/%s/%d", child.GetId(), child.GetParentRunId(), child.GetParentStepId(), child.GetParentAttempt(), id, c.GetStepId(), c.GetAttempt())
		}
		if c.GetStatus() != child.GetStatus() {
			t.Fatalf("parent records child %s as %s, the child is %s", child.GetId(), c.GetStatus(), child.GetStatus())
		}
		if child.GetBudget().GetMaxSteps() > 40 || child.GetBudget().GetMaxTokens() > 1000 {
			t.Fatalf("child %s budget %v exceeds the parent's", child.GetId(), child.GetBudget())
		}
		if child.GetCreatedAt().AsTime().Add(child.GetBudget().GetDeadline().AsDuration()).After(run.GetCreatedAt().AsTime().Add(run.GetBudget().GetDeadline().AsDuration())) {
			t.Fatalf("child %s's deadline is later than its parent's", child.GetId())
		}
		if child.GetTraceId() != run.GetTraceId() {
			t.Fatalf("child %s has trace %s, the parent %s", child.GetId(), child.GetTraceId(), run.GetTraceId())
		}
		steps += child.GetUsage().GetSteps()
		tokens += child.GetUsage().GetTokens()
	}
	if b := byGoal["child broken"]; b.GetStatus() != planexv1.RunStatus_RUN_STATUS_FAILED || b.GetBudget().GetMaxSteps() != 3 {
		t.Fatalf("broken child: %s %s, budget %v; want FAILED with max_steps 3", b.GetStatus(), b.GetStopReason(), b.GetBudget())
	}
	c2 := runlog.Step(run, "c2")
	if c2.GetStatus() != planexv1.StepStatus_STEP_STATUS_FAILED || !strings.Contains(c2.GetError().GetMessage(), "child run "+byGoal["child broken"].GetId()+" stopped "+strings.TrimPrefix(byGoal["child broken"].GetStopReason().String(), "STOP_REASON_")) {
		t.Fatalf("step c2: %s %q; want FAILED naming the child's stop", c2.GetStatus(), c2.GetError().GetMessage())
	}
	cu := run.GetChildrenUsage()
	if cu.GetSteps() != steps || cu.GetTokens() != tokens || steps < 4 || tokens == 0 {
		t.Fatalf("children_usage %v; the children spent %d steps, %d tokens", cu, steps, tokens)
	}
	if own := run.GetUsage(); own.GetSteps() != 4 || own.GetTokens() != 30 {
		t.Fatalf("parent's own usage %v: want 4 step attempts and 30 tokens (two plans)", own)
	}

	// One trace: the parent's root, and under each child step's span
	// the child's root.
	waitFor(t, 5*time.Second, "the five root spans", func() bool {
		n := 0
		for _, s := range rec.Ended() {
			if s.Name() == "run" && s.SpanContext().TraceID().String() == run.GetTraceId() && hasAttr(s, string(telemetry.RunStatusKey)) {
				n++
			}
		}
		return n == 5
	})
	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byID[s.SpanContext().SpanID().String()] = s
	}
	roots := 0
	for _, s := range rec.Ended() {
		if s.Name() != "run" || !hasAttr(s, string(telemetry.RunStatusKey)) {
			continue
		}
		if s.SpanContext().TraceID().String() != run.GetTraceId() {
			t.Fatalf("root span of %s is in another trace", attr(s, "planex.run_id"))
		}
		if !s.Parent().IsValid() {
			roots++
			continue
		}
		parent, ok := byID[s.Parent().SpanID().String()]
		if !ok || !strings.HasPrefix(parent.Name(), "step c") || attr(parent, "planex.child_run_id") != attr(s, "planex.run_id") {
			t.Fatalf("child root span of %s: parent span %v is not its parent step's", attr(s, "planex.run_id"), s.Parent().SpanID())
		}
	}
	if roots != 1 {
		t.Fatalf("%d root spans without a parent in the trace, want 1 (the parent run's)", roots)
	}
	for _, s := range rec.Ended() {
		if s.Name() == "dispatch step" && attr(s, "planex.tool") == "test.echo" && s.SpanContext().TraceID().String() != run.GetTraceId() {
			t.Fatalf("a child's step dispatch is in another trace")
		}
	}

	// A replay decides the parent's log (and a child's) as recorded: the
	// children's ends are inputs, like executor results.
	for _, runID := range []string{id, byGoal["child ok 2"].GetId()} {
		res, err := engine.Replay(t.Context(), watchAll(t, r.client, runID, 0), engine.ReplayConfig{Tools: toolSpecs()})
		if err != nil || res.Divergence != nil {
			t.Fatalf("replay of %s: %v, divergence %+v", runID, err, res.Divergence)
		}
	}

	// ListRuns filters by parent.
	resp, err := r.client.ListRuns(testCtx(t, 5*time.Second), &planexv1.ListRunsRequest{Filter: &planexv1.RunFilter{ParentRunId: id}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetRuns()) != 4 {
		t.Fatalf("ListRuns parent_run_id %s: %d runs, want 4", id, len(resp.GetRuns()))
	}
}

// Cancelling a parent cancels its running child, and the child's own
// running child (recursively).
func TestCancelPropagatesToChildren(t *testing.T) {
	h, r := setup(t)
	h.planner.on("grandparent", always(childStep("c", "middle", nil)))
	h.planner.on("middle", always(childStep("g", "leaf", nil)))
	h.planner.on("leaf", always(step("wait", "test.gate", map[string]any{})))
	id := start(t, r.client, &planexv1.StartRunRequest{Goal: "grandparent"})
	var middle, leaf string
	waitFor(t, 10*time.Second, "the grandchild to run", func() bool {
		p := waitRun(t, r.client, id, 5*time.Second, "any", func(*planexv1.Run) bool { return true })
		if len(p.GetChildren()) == 0 {
			return false
		}
		middle = p.GetChildren()[0].GetRunId()
		m, err := r.client.GetRun(testCtx(t, 5*time.Second), &planexv1.GetRunRequest{RunId: middle})
		if err != nil || len(m.GetRun().GetChildren()) == 0 {
			return false
		}
		leaf = m.GetRun().GetChildren()[0].GetRunId()
		l, err := r.client.GetRun(testCtx(t, 5*time.Second), &planexv1.GetRunRequest{RunId: leaf})
		return err == nil && runlog.Step(l.GetRun(), "wait").GetStatus() != planexv1.StepStatus_STEP_STATUS_UNSPECIFIED &&
			runlog.InFlight(runlog.Step(l.GetRun(), "wait").GetStatus())
	})
	if _, err := r.client.CancelRun(testCtx(t, 10*time.Second), &planexv1.CancelRunRequest{RunId: id, Reason: "enough"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{id, middle, leaf} {
		run := waitTerminal(t, r.client, c, 10*time.Second)
		if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_CANCELLED {
			t.Fatalf("run %s: %s %q, want CANCELLED", c, run.GetStatus(), run.GetStopMessage())
		}
	}
	m := waitTerminal(t, r.client, middle, time.Second)
	if !strings.Contains(m.GetStopMessage(), "its parent run "+id+" stopped (CANCELLED)") {
		t.Fatalf("middle child's stop message %q does not name its parent's stop", m.GetStopMessage())
	}
	h.pool.openGate()
}

// A supervisor killed while it starts a child run does not lose the
// child nor create a second one. Two crash points: right after the
// parent's StepDispatched (naming the child) was appended, before the
// child was created; and right after the child's RunCreated was appended,
// before the child was kicked and the parent's message acknowledged. The
// replica that handles the redelivered message derives the same child id
// and creates the child, or finds it created.
func TestChildCreatedOnceAcrossCrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		childCreated bool // at the crash
	}{
		{name: "after the dispatch", childCreated: false},
		{name: "after the child's creation", childCreated: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.planner.on("crash parent", withAnswerScript(always(childStep("c", "crash child", nil)), "steps.c.output"))
			h.planner.on("crash child", func(int, *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
				return withAnswer(planOf(step("e", "test.echo", map[string]any{"value": "done"})), "steps.e.output.value"), nil
			})
			var victim *replica
			var once sync.Once
			crashed := make(chan [2]string, 1)
			crash := func(parent, child string) {
				once.Do(func() {
					victim.nc.Close() // kill -9: nothing published or acknowledged from here on
					crashed <- [2]string{parent, child}
				})
			}
			victim = h.startReplica(func(c *engine.Config) {
				if tc.childCreated {
					c.Hooks.AfterChildCreate = crash
					return
				}
				c.Hooks.AfterAppend = func(runID string, evs []*planexv1.RunEvent) {
					for _, ev := range evs {
						if c := ev.GetStepDispatched().GetChild(); c != nil {
							crash(runID, c.GetRunId())
						}
					}
				}
			})
			id := start(t, victim.client, &planexv1.StartRunRequest{Goal: "crash parent"})
			var ids [2]string
			select {
			case ids = <-crashed:
			case <-time.After(15 * time.Second):
				t.Fatal("the replica never reached the crash point")
			}
			victim.kill()
			if ids[0] != id {
				t.Fatalf("crash in run %s, want %s", ids[0], id)
			}
			// The crash point: the parent recorded the dispatch naming the
			// child; the child exists (pending: never kicked) or not.
			ctx := testCtx(t, 10*time.Second)
			log, err := runlog.New(ctx, h.res, natstest.Logger(t), runlog.Options{})
			if err != nil {
				t.Fatal(err)
			}
			parent, err := log.Load(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if st := runlog.Step(parent.Run, "c"); st.GetChildRunId() != ids[1] || st.GetStatus() != planexv1.StepStatus_STEP_STATUS_DISPATCHED {
				t.Fatalf("parent's step c at the crash: %s child %q, want DISPATCHED naming %s", st.GetStatus(), st.GetChildRunId(), ids[1])
			}
			child, err := log.Load(ctx, ids[1])
			switch {
			case tc.childCreated && err != nil:
				t.Fatalf("the child was not created before the crash: %v", err)
			case tc.childCreated && child.Run.GetStatus() != planexv1.RunStatus_RUN_STATUS_PENDING:
				t.Fatalf("child %s at the crash: %s, want PENDING", ids[1], child.Run.GetStatus())
			case !tc.childCreated && !errors.Is(err, runlog.ErrRunNotFound):
				t.Fatalf("the child exists before the crash point: %v", err)
			}

			r := h.startReplica()
			run := succeeded(t, r, id)
			if run.GetResult().GetStringValue() != "done" {
				t.Fatalf("result %v", run.GetResult())
			}
			created := 0
			for runID, evs := range h.allEvents() {
				if c := evs[0].GetCreated(); c.GetParent().GetRunId() == id {
					created++
					if runID != ids[1] {
						t.Fatalf("a second child %s of %s was created", runID, id)
					}
				}
			}
			if created != 1 || len(run.GetChildren()) != 1 {
				t.Fatalf("%d children created, %d recorded; want 1", created, len(run.GetChildren()))
			}
		})
	}
}

// A replan that drops a step whose child is running cancels the child;
// the child's spend is still charged to the parent.
func TestReplanDroppingAStepCancelsItsChild(t *testing.T) {
	h, r := setup(t)
	h.planner.on("blocked child", always(step("wait", "test.gate", map[string]any{})))
	// x waits for c0, a quick step, so that the child is running when x
	// fails.
	h.planner.on("dropper", sequence(
		planOf(childStep("c", "blocked child", nil), step("c0", "test.sleep", map[string]any{"ms": 200}), noRetry(step("x", "test.fail", map[string]any{"message": "x broke"}, "c0"))),
		planOf(step("y", "test.sleep", map[string]any{"ms": 1500})),
	))
	t.Cleanup(h.pool.openGate)
	id := start(t, r.client, &planexv1.StartRunRequest{Goal: "dropper"})
	run := succeeded(t, r, id)
	if len(run.GetChildren()) != 1 {
		t.Fatalf("%d children, want 1", len(run.GetChildren()))
	}
	rec := run.GetChildren()[0]
	child := waitTerminal(t, r.client, rec.GetRunId(), 5*time.Second)
	if child.GetStatus() != planexv1.RunStatus_RUN_STATUS_CANCELLED || !strings.Contains(child.GetStopMessage(), "no longer waits for it") {
		t.Fatalf("child %s: %s %q; want CANCELLED by the replan", child.GetId(), child.GetStatus(), child.GetStopMessage())
	}
	if rec.GetStatus() != planexv1.RunStatus_RUN_STATUS_CANCELLED || run.GetChildrenUsage().GetSteps() != child.GetUsage().GetSteps() ||
		run.GetChildrenUsage().GetTokens() != child.GetUsage().GetTokens() || child.GetUsage().GetSteps() == 0 {
		t.Fatalf("parent records the child as %s and charged %v; the child spent %v", rec.GetStatus(), run.GetChildrenUsage(), child.GetUsage())
	}
	if st := runlog.Step(run, "c"); st.GetStatus() != planexv1.StepStatus_STEP_STATUS_SKIPPED {
		t.Fatalf("dropped step c: %s, want SKIPPED", st.GetStatus())
	}
}

// A child asking for more than its parent has left is refused, naming the
// budget field; the parent (no replan allowed) stops with that failure.
func TestChildBudgetCarving(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.startReplica()
	for _, tc := range []struct {
		name, field, want string
		budget            map[string]any
	}{
		{name: "steps", field: "budget.max_steps", budget: map[string]any{"max_steps": 50}, want: "budget.max_steps 50: more than the 9 step attempts the parent run has left"},
		{name: "tokens", field: "budget.max_tokens", budget: map[string]any{"max_tokens": 5000}, want: "budget.max_tokens 5000: more than the"},
		{name: "deadline", field: "budget.deadline", budget: map[string]any{"deadline": "2h"}, want: "budget.deadline 2h0m0s: later than the parent run's deadline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			goal := "greedy " + tc.name
			h.planner.on(goal, always(childStep("c", "never started", tc.budget)))
			id := start(t, r.client, &planexv1.StartRunRequest{Goal: goal, Budget: &planexv1.Budget{
				MaxSteps: 10, MaxTokens: 1000, Deadline: durationpb.New(time.Minute), MaxReplans: 0,
			}})
			run := waitTerminal(t, r.client, id, 10*time.Second)
			st := runlog.Step(run, "c")
			if st.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || st.GetError().GetField() != tc.field ||
				!strings.Contains(st.GetError().GetMessage(), tc.want) {
				t.Fatalf("step c: %v; want INVALID_ARGUMENT on %s: %q", st.GetError(), tc.field, tc.want)
			}
			if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_FAILED || len(run.GetChildren()) != 0 {
				t.Fatalf("run %s %s with %d children; want FAILED without a child", run.GetStatus(), run.GetStopReason(), len(run.GetChildren()))
			}
		})
	}
}

func withAnswerScript(s script, answer string) script {
	return func(n int, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
		resp, err := s(n, req)
		if resp != nil {
			resp.Plan.Answer = answer
		}
		return resp, err
	}
}

func hasAttr(s sdktrace.ReadOnlySpan, key string) bool {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return true
		}
	}
	return false
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// A parent cancelled while its child ran, then reset: the cancelled
// child (whose end the finished parent could not record) is charged when
// the reset re-opens the parent, and the step that starts over gets a new
// child.
func TestResetParentChargesCancelledChild(t *testing.T) {
	h, r := setup(t)
	t.Cleanup(h.pool.openGate)
	h.planner.on("blocked child", always(step("wait", "test.gate", map[string]any{})))
	h.planner.on("quick child", func(int, *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
		return withAnswer(planOf(step("e", "test.echo", map[string]any{"value": "quick"})), "steps.e.output.value"), nil
	})
	h.planner.on("reset parent", withAnswerScript(always(childStep("c", "blocked child", nil)), "steps.c.output"))
	id := start(t, r.client, &planexv1.StartRunRequest{Goal: "reset parent"})
	first := waitRun(t, r.client, id, 10*time.Second, "running its child", func(run *planexv1.Run) bool { return len(run.GetChildren()) == 1 }).GetChildren()[0]
	waitRun(t, r.client, first.GetRunId(), 10*time.Second, "running its step", func(run *planexv1.Run) bool {
		return runlog.InFlight(runlog.Step(run, "wait").GetStatus())
	})
	if _, err := r.client.CancelRun(testCtx(t, 10*time.Second), &planexv1.CancelRunRequest{RunId: id}); err != nil {
		t.Fatal(err)
	}
	if c := waitTerminal(t, r.client, first.GetRunId(), 10*time.Second); c.GetStatus() != planexv1.RunStatus_RUN_STATUS_CANCELLED {
		t.Fatalf("child %s: %s", c.GetId(), c.GetStatus())
	}
	args := mustStruct(map[string]any{"goal": "quick child"})
	if _, err := r.client.ResetRun(testCtx(t, 10*time.Second), &planexv1.ResetRunRequest{
		RunId: id, Reason: "try a quicker child", StepArgs: map[string]*structpb.Struct{"c": args},
		UnknownOutcomes: []*planexv1.UnknownOutcome{{StepId: "c", Action: planexv1.UnknownOutcomeAction_UNKNOWN_OUTCOME_ACTION_RETRY}},
	}); err != nil {
		t.Fatal(err)
	}
	run := waitRun(t, r.client, id, 20*time.Second, "succeeded with both children recorded", func(run *planexv1.Run) bool {
		if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || len(run.GetChildren()) != 2 {
			return false
		}
		for _, c := range run.GetChildren() {
			if c.GetStatus() == planexv1.RunStatus_RUN_STATUS_UNSPECIFIED {
				return false
			}
		}
		return true
	})
	if run.GetResult().GetStringValue() != "quick" {
		t.Fatalf("result %v", run.GetResult())
	}
	var steps int32
	var tokens int64
	for _, c := range run.GetChildren() {
		child := waitTerminal(t, r.client, c.GetRunId(), time.Second)
		steps += child.GetUsage().GetSteps()
		tokens += child.GetUsage().GetTokens()
	}
	if u := run.GetChildrenUsage(); u.GetSteps() != steps || u.GetTokens() != tokens {
		t.Fatalf("children_usage %v; the two children spent %d steps, %d tokens", u, steps, tokens)
	}
}

// A child's deadline passes before its parent's: the child stops with
// DEADLINE and its step fails with TIMEOUT while the parent can still act
// on it (here the planner gives up, so it stops).
func TestChildDeadlineEndsBeforeParents(t *testing.T) {
	h, r := setup(t)
	t.Cleanup(h.pool.openGate)
	h.planner.on("slow child", always(step("wait", "test.gate", map[string]any{})))
	h.planner.on("short parent", giveUp(planOf(childStep("c", "slow child", nil))))
	id := start(t, r.client, &planexv1.StartRunRequest{Goal: "short parent", Budget: &planexv1.Budget{Deadline: durationpb.New(3 * time.Second)}})
	run := waitTerminal(t, r.client, id, 15*time.Second)
	if len(run.GetChildren()) != 1 {
		t.Fatalf("parent has %d children, want 1", len(run.GetChildren()))
	}
	child := waitTerminal(t, r.client, run.GetChildren()[0].GetRunId(), 10*time.Second)
	if child.GetStopReason() != planexv1.StopReason_STOP_REASON_DEADLINE {
		t.Fatalf("child: %s %s %q, want stopped by its deadline", child.GetStatus(), child.GetStopReason(), child.GetStopMessage())
	}
	if end, pend := child.GetCreatedAt().AsTime().Add(child.GetBudget().GetDeadline().AsDuration()), run.GetCreatedAt().AsTime().Add(3*time.Second); end.After(pend) {
		t.Fatalf("child's deadline %s is after its parent's %s", end, pend)
	}
	if st := runlog.Step(run, "c"); st.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_TIMEOUT || run.GetStopReason() != planexv1.StopReason_STOP_REASON_STEP_TIMEOUT {
		t.Fatalf("parent %s, step c %v; want STEP_TIMEOUT from the child's deadline", run.GetStopReason(), st.GetError())
	}
}

// A child's notice to its parent lost in a crash (the replica died right
// after appending the child's RunFinished) is caught by the parent step's
// watch timer, which reads the child's log.
func TestLostChildNoticeCaughtByWatchTimer(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.planner.on("watched parent", withAnswerScript(always(childStep("c", "watched child", nil)), "steps.c.output"))
	h.planner.on("watched child", func(int, *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
		return withAnswer(planOf(step("e", "test.echo", map[string]any{"value": "seen"})), "steps.e.output.value"), nil
	})
	var victim *replica
	var once sync.Once
	crashed := make(chan string, 1)
	watch := func(c *engine.Config) { c.StrandedAfter = time.Second }
	victim = h.startReplica(watch, func(c *engine.Config) {
		c.Hooks.AfterAppend = func(runID string, evs []*planexv1.RunEvent) {
			for _, ev := range evs {
				if ev.GetFinished() != nil && runID != "" {
					once.Do(func() {
						victim.nc.Close() // the notice is never published
						crashed <- runID
					})
				}
			}
		}
	})
	id := start(t, victim.client, &planexv1.StartRunRequest{Goal: "watched parent"})
	var finished string
	select {
	case finished = <-crashed:
	case <-time.After(15 * time.Second):
		t.Fatal("no run finished")
	}
	victim.kill()
	if finished == id {
		t.Fatalf("the parent finished first")
	}
	r := h.startReplica(watch)
	run := succeeded(t, r, id)
	if run.GetResult().GetStringValue() != "seen" || run.GetChildren()[0].GetRunId() != finished {
		t.Fatalf("result %v, children %v", run.GetResult(), run.GetChildren())
	}
	// The notice really was lost: its message id was never used (the
	// server's duplicate window would report a repeat).
	ack, err := h.res.JS.Publish(testCtx(t, 5*time.Second), bus.EngineSubject(id, bus.KindResult),
		mustMarshal(&planexv1.StepResult{RunId: id, StepId: "c", Attempt: 1}), jetstream.WithMsgID(bus.MsgID(id, "c", "1", "child")))
	if err != nil {
		t.Fatal(err)
	}
	if ack.Duplicate {
		t.Fatal("the child's notice was published: the watch timer was not what delivered the child's end")
	}
}
