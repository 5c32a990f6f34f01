package supervisor_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// payloads lists the payload names of events, for assertions on order.
func payloads(evs []*planexv1.RunEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = payloadName(ev)
	}
	return out
}

// payloadName is the event's payload name, with ":<step>" for events
// about an attempt ("step_dispatched:a").
func payloadName(ev *planexv1.RunEvent) string {
	name := runlog.PayloadName(ev)
	if !strings.HasPrefix(name, "step_") && !strings.HasPrefix(name, "expectation_") {
		return name
	}
	m := ev.ProtoReflect()
	fd := m.WhichOneof(m.Descriptor().Oneofs().ByName("payload"))
	if fd == nil {
		return name
	}
	pm := m.Get(fd).Message()
	if f := pm.Descriptor().Fields().ByName("step_id"); f != nil {
		name += ":" + pm.Get(f).String()
	}
	return name
}

func count(evs []*planexv1.RunEvent, name string) int {
	n := 0
	for _, p := range payloads(evs) {
		if p == name {
			n++
		}
	}
	return n
}

// assertOnce checks that every dispatched attempt of a run was executed
// exactly once and that each attempt was dispatched once.
func assertOnce(t testing.TB, h *harness, runID string, evs []*planexv1.RunEvent) {
	t.Helper()
	seen := map[string]bool{}
	for _, ev := range evs {
		if d := ev.GetStepDispatched(); d != nil {
			k := fmt.Sprintf("%s/%d", d.GetStepId(), d.GetAttempt())
			if seen[k] {
				t.Errorf("run %s: attempt %s dispatched twice", runID, k)
			}
			seen[k] = true
		}
	}
	for k, n := range h.pool.executions(runID) {
		if n != 1 {
			t.Errorf("run %s: attempt %s executed %d times", runID, k, n)
		}
		if !seen[k] {
			t.Errorf("run %s: attempt %s executed but never dispatched", runID, k)
		}
	}
}

func TestLinearPlan(t *testing.T) {
	h, r := setup(t)
	h.planner.on("linear", always(
		step("a", "test.echo", map[string]any{"value": "${{ inputs.name }}"}),
		step("b", "test.echo", map[string]any{"value": "hello ${{ steps.a.output.value }}"}, "a"),
		step("c", "test.echo", map[string]any{"value": "${{ [steps.b.output.value, goal] }}"}, "b"),
	))
	inputs, _ := structInputs(map[string]any{"name": "ada"})
	id := start(t, r.client, &planexv1.StartRunRequest{Goal: "linear", Inputs: inputs, Labels: map[string]string{"team": "core"}})
	run := waitTerminal(t, r.client, id, 20*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || run.GetStopReason() != planexv1.StopReason_STOP_REASON_SUCCEEDED {
		t.Fatalf("status %s %s %q, want SUCCEEDED", run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
	// No answer expression: the result maps the leaf step to its output.
	got := run.GetResult().GetStructValue().GetFields()["c"].GetStructValue().GetFields()["value"].GetListValue().AsSlice()
	if want := []any{"hello ada", "linear"}; !slices.Equal(got, want) {
		t.Fatalf("result c.value = %v, want %v", got, want)
	}
	evs := watchAll(t, r.client, id, 1)
	// Started notices race results (either may be handled first), so they
	// are left out of the order check.
	want := []string{"created", "budget_used", "budget_used", "plan_revised",
		"step_dispatched:a", "step_succeeded:a", "step_dispatched:b", "step_succeeded:b", "step_dispatched:c", "step_succeeded:c", "finished"}
	order := slices.DeleteFunc(payloads(evs), func(p string) bool { return strings.HasPrefix(p, "step_started:") })
	if !slices.Equal(order, want) {
		t.Fatalf("events\n got %v\nwant %v", order, want)
	}
	assertOnce(t, h, id, evs)
	if n := len(h.pool.executions(id)); n != 3 {
		t.Fatalf("executions = %d, want 3", n)
	}
	if u := run.GetUsage(); u.GetSteps() != 3 || u.GetTokens() != 15 || u.GetTokensReserved() != 0 || u.GetReplans() != 0 {
		t.Fatalf("usage = %v, want 3 steps, 15 tokens, nothing reserved", u)
	}
	req := h.planner.requests(id)[0]
	tools := 0 // the executors' tools; the supervisor's own come on top
	for _, spec := range req.GetTools() {
		if !catalog.Builtin(spec.GetName()) {
			tools++
		}
	}
	if req.GetConstraints().GetMaxSteps() != 50 || req.GetRevision() != 1 || tools != len(toolSpecs()) {
		t.Fatalf("planner request: constraints %v revision %d tools %d", req.GetConstraints(), req.GetRevision(), len(req.GetTools()))
	}
}

func TestDiamondRunsIndependentStepsInParallel(t *testing.T) {
	h, r := setup(t)
	id := h.runGoal(t, r, "diamond", sequence(withAnswer(planOf(
		step("a", "test.echo", map[string]any{"value": 1}),
		step("b", "test.sleep", map[string]any{"ms": 1000}, "a"),
		step("c", "test.sleep", map[string]any{"ms": 1000}, "a"),
		step("d", "test.echo", map[string]any{"value": "${{ steps.b.output.slept_ms + steps.c.output.slept_ms }}"}, "b", "c"),
	), "steps.d.output.value")))
	run := succeeded(t, r, id)
	if got := run.GetResult().GetNumberValue(); got != 2000 {
		t.Fatalf("result = %v, want 2000", run.GetResult())
	}
	step := func(id string) *planexv1.StepState {
		for _, s := range run.GetSteps() {
			if s.GetStepId() == id {
				return s
			}
		}
		t.Fatalf("no state for step %s", id)
		return nil
	}
	b, c := step("b"), step("c")
	// The two sleeps overlap: each started before the other finished.
	if !b.GetStartedAt().AsTime().Before(c.GetFinishedAt().AsTime()) || !c.GetStartedAt().AsTime().Before(b.GetFinishedAt().AsTime()) {
		t.Fatalf("b [%v, %v] and c [%v, %v] did not overlap", b.GetStartedAt().AsTime(), b.GetFinishedAt().AsTime(), c.GetStartedAt().AsTime(), c.GetFinishedAt().AsTime())
	}
	d := step("d")
	if d.GetDispatchedAt().AsTime().Before(b.GetFinishedAt().AsTime()) || d.GetDispatchedAt().AsTime().Before(c.GetFinishedAt().AsTime()) {
		t.Fatal("d was dispatched before both of its dependencies finished")
	}
	evs := watchAll(t, r.client, id, 1)
	assertOnce(t, h, id, evs)
	// b and c were dispatched by the same decision, before either started.
	pl := payloads(evs)
	ib, ic := slices.Index(pl, "step_dispatched:b"), slices.Index(pl, "step_dispatched:c")
	if ib < 0 || ic < 0 || ic-ib != 1 && ib-ic != 1 {
		t.Fatalf("b and c not dispatched together: %v", pl)
	}
}

func TestFailedStepReplansAndKeepsCompletedSteps(t *testing.T) {
	h, r := setup(t)
	id := h.runGoal(t, r, "replan", sequence(
		planOf(
			step("a", "test.echo", map[string]any{"value": "x"}),
			step("b", "test.fail", map[string]any{"message": "boom"}, "a"),
			step("c", "test.echo", map[string]any{"value": "${{ steps.b.output }}"}, "b"),
		),
		planOf(
			step("a", "test.echo", map[string]any{"value": "x"}),
			step("b2", "test.echo", map[string]any{"value": "${{ steps.a.output.value + 'y' }}"}, "a"),
			step("c", "test.echo", map[string]any{"value": "${{ steps.b2.output.value }}"}, "b2"),
		),
	))
	run := succeeded(t, r, id)
	if got := run.GetResult().GetStructValue().GetFields()["c"].GetStructValue().GetFields()["value"].GetStringValue(); got != "xy" {
		t.Fatalf("result = %v, want c.value xy", run.GetResult())
	}
	if len(run.GetPlans()) != 2 || run.GetUsage().GetReplans() != 1 {
		t.Fatalf("plans %d replans %d, want 2 and 1", len(run.GetPlans()), run.GetUsage().GetReplans())
	}
	lin := run.GetPlans()[1].GetLineage()
	if lin.GetPreviousRevision() != 1 || !slices.Equal(lin.GetKept(), []string{"a"}) || !slices.Equal(lin.GetAdded(), []string{"b2"}) ||
		!slices.Equal(lin.GetChanged(), []string{"c"}) || !slices.Equal(lin.GetDropped(), []string{"b"}) {
		t.Fatalf("lineage = %v, want kept [a] added [b2] changed [c] dropped [b]", lin)
	}
	execs := h.pool.executions(id)
	if execs["a/1"] != 1 || execs["a/2"] != 0 {
		t.Fatalf("kept step a ran again: %v", execs)
	}
	evs := watchAll(t, r.client, id, 1)
	assertOnce(t, h, id, evs)
	if count(evs, "replan_requested") != 1 || count(evs, "step_failed:b") != 1 {
		t.Fatalf("events: %v", payloads(evs))
	}
	reqs := h.planner.requests(id)
	if len(reqs) != 2 {
		t.Fatalf("planner calls = %d, want 2", len(reqs))
	}
	hist := reqs[1].GetHistory()
	if hist.GetReplanReason() == "" || len(hist.GetRevisions()) != 1 || reqs[1].GetRevision() != 2 {
		t.Fatalf("replan history: reason %q revisions %d revision %d", hist.GetReplanReason(), len(hist.GetRevisions()), reqs[1].GetRevision())
	}
	var failed *planexv1.StepOutcome
	for _, o := range hist.GetSteps() {
		if o.GetStepId() == "b" {
			failed = o
		}
	}
	if failed.GetStatus() != planexv1.StepStatus_STEP_STATUS_FAILED || failed.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED {
		t.Fatalf("history lacks b's failure: %v", hist.GetSteps())
	}
	if reqs[1].GetConstraints().GetRemainingReplans() != 2 {
		t.Fatalf("remaining replans = %d, want 2", reqs[1].GetConstraints().GetRemainingReplans())
	}
}

func TestInvalidPlansGoBackToThePlanner(t *testing.T) {
	h, r := setup(t)
	valid := planOf(step("ok", "test.echo", map[string]any{"value": 1}))
	tests := []struct {
		name    string
		invalid *planexv1.PlanResponse
		want    string // in the rejection errors
	}{
		{
			name: "cycle",
			invalid: planOf(
				step("x", "test.echo", map[string]any{"value": 1}, "y"),
				step("y", "test.echo", map[string]any{"value": 2}, "x"),
			),
			want: "x -> y -> x",
		},
		{
			name:    "unknown tool",
			invalid: planOf(step("x", "test.nope", map[string]any{"value": 1})),
			want:    "test.nope",
		},
		{
			name:    "schema mismatch",
			invalid: planOf(step("x", "test.sleep", map[string]any{"ms": "soon"})),
			want:    "args.ms",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			goal := "invalid " + tt.name
			id := h.runGoal(t, r, goal, sequence(tt.invalid, valid))
			run := succeeded(t, r, id)
			evs := watchAll(t, r.client, id, 1)
			var rej *planexv1.PlanRejected
			for _, ev := range evs {
				if ev.GetPlanRejected() != nil {
					rej = ev.GetPlanRejected()
				}
			}
			if rej == nil || rej.GetRevision() != 1 || !containsAny(rej.GetErrors(), tt.want) {
				t.Fatalf("rejection %v does not mention %q", rej, tt.want)
			}
			if run.GetUsage().GetReplans() != 1 || len(run.GetPlans()) != 1 || run.GetPlans()[0].GetRevision() != 1 {
				t.Fatalf("replans %d plans %d", run.GetUsage().GetReplans(), len(run.GetPlans()))
			}
			for k := range h.pool.executions(id) {
				if k != "ok/1" {
					t.Fatalf("a step of the invalid plan reached the executor: %s", k)
				}
			}
			reqs := h.planner.requests(id)
			if len(reqs) != 2 || !containsAny(reqs[1].GetHistory().GetValidationErrors(), tt.want) {
				t.Fatalf("second planner call did not carry the validation errors")
			}
		})
	}
}

func TestBudgetStops(t *testing.T) {
	h, r := setup(t)
	five := []*planexv1.Step{}
	for i := range 5 {
		five = append(five, step(fmt.Sprintf("s%d", i), "test.echo", map[string]any{"value": i}))
	}
	tests := []struct {
		name     string
		budget   *planexv1.Budget
		script   script
		reason   planexv1.StopReason
		exceeded planexv1.BudgetKind
		check    func(t *testing.T, id string, run *planexv1.Run, evs []*planexv1.RunEvent)
	}{
		{
			name:     "steps",
			budget:   &planexv1.Budget{MaxSteps: 3, MaxParallelism: 5},
			script:   always(five...),
			reason:   planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED,
			exceeded: planexv1.BudgetKind_BUDGET_KIND_STEPS,
			check: func(t *testing.T, id string, run *planexv1.Run, evs []*planexv1.RunEvent) {
				if n := len(h.pool.executions(id)); n != 3 || run.GetUsage().GetSteps() != 3 {
					t.Fatalf("executed %d, usage %d; want 3 and 3", n, run.GetUsage().GetSteps())
				}
			},
		},
		{
			name:     "replans",
			budget:   &planexv1.Budget{MaxReplans: 1},
			script:   always(step("f", "test.fail", map[string]any{"message": "always"})),
			reason:   planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED,
			exceeded: planexv1.BudgetKind_BUDGET_KIND_REPLANS,
			check: func(t *testing.T, id string, run *planexv1.Run, evs []*planexv1.RunEvent) {
				if run.GetUsage().GetReplans() != 1 || count(evs, "step_failed:f") != 2 {
					t.Fatalf("replans %d, failures %d; want 1 and 2", run.GetUsage().GetReplans(), count(evs, "step_failed:f"))
				}
			},
		},
		{
			name:   "tokens",
			budget: &planexv1.Budget{MaxTokens: 100},
			script: func(int, *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
				p := planOf(five[0])
				p.Usage = &planexv1.TokenUsage{InputTokens: 120, OutputTokens: 30}
				return p, nil
			},
			reason:   planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED,
			exceeded: planexv1.BudgetKind_BUDGET_KIND_TOKENS,
			check: func(t *testing.T, id string, run *planexv1.Run, evs []*planexv1.RunEvent) {
				if run.GetUsage().GetTokens() != 150 || len(h.pool.executions(id)) != 0 {
					t.Fatalf("tokens %d executions %d", run.GetUsage().GetTokens(), len(h.pool.executions(id)))
				}
				if req := h.planner.requests(id)[0]; req.GetConstraints().GetRemainingTokens() != 100 {
					t.Fatalf("planner was offered %d tokens, want 100", req.GetConstraints().GetRemainingTokens())
				}
			},
		},
		{
			name:     "deadline",
			budget:   &planexv1.Budget{Deadline: durationpb.New(time.Second)},
			script:   always(step("slow", "test.sleep", map[string]any{"ms": 5000})),
			reason:   planexv1.StopReason_STOP_REASON_DEADLINE,
			exceeded: planexv1.BudgetKind_BUDGET_KIND_DEADLINE,
			check: func(t *testing.T, id string, run *planexv1.Run, evs []*planexv1.RunEvent) {
				if d := run.GetFinishedAt().AsTime().Sub(run.GetCreatedAt().AsTime()); d < time.Second || d > 4*time.Second {
					t.Fatalf("finished %s after creation, want about 1s", d)
				}
			},
		},
		{
			name:   "step timeout, then the replan also times out",
			budget: &planexv1.Budget{StepTimeout: durationpb.New(300 * time.Millisecond), MaxReplans: 1},
			script: always(noRetry(step("slow", "test.sleep", map[string]any{"ms": 3000}))),
			reason: planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED, exceeded: planexv1.BudgetKind_BUDGET_KIND_REPLANS,
			check: func(t *testing.T, id string, run *planexv1.Run, evs []*planexv1.RunEvent) {
				timeouts := 0
				for _, ev := range evs {
					if ev.GetStepFailed().GetError().GetCode() == planexv1.ErrorCode_ERROR_CODE_TIMEOUT {
						timeouts++
					}
				}
				if timeouts != 2 {
					t.Fatalf("timeouts = %d, want 2 (attempts 1 and 2)", timeouts)
				}
			},
		},
		{
			name: "planner error",
			script: func(int, *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
				return nil, plannerErr("no playbook matches the goal")
			},
			reason: planexv1.StopReason_STOP_REASON_PLANNER_ERROR,
			check: func(t *testing.T, id string, run *planexv1.Run, evs []*planexv1.RunEvent) {
				if run.GetStopMessage() != "planner: no playbook matches the goal" {
					t.Fatalf("stop message %q", run.GetStopMessage())
				}
			},
		},
		{
			name: "planner escalates",
			script: func(int, *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
				return &planexv1.PlanResponse{Stop: true, Escalate: true, StopMessage: "not sure"}, nil
			},
			reason: planexv1.StopReason_STOP_REASON_ESCALATED,
		},
		{
			name:   "unknown outcome escalates",
			script: always(step("u", "test.unknown", map[string]any{})),
			reason: planexv1.StopReason_STOP_REASON_ESCALATED,
			check: func(t *testing.T, id string, run *planexv1.Run, evs []*planexv1.RunEvent) {
				if n := h.pool.executions(id)["u/1"]; n != 1 || len(h.pool.executions(id)) != 1 {
					t.Fatalf("an unknown outcome was repeated: %v", h.pool.executions(id))
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			goal := "budget " + tt.name
			h.planner.on(goal, tt.script)
			id := start(t, r.client, &planexv1.StartRunRequest{Goal: goal, Budget: tt.budget})
			run := waitTerminal(t, r.client, id, 20*time.Second)
			if run.GetStopReason() != tt.reason || run.GetExceededBudget() != tt.exceeded {
				t.Fatalf("stop %s exceeded %s (%q), want %s %s", run.GetStopReason(), run.GetExceededBudget(), run.GetStopMessage(), tt.reason, tt.exceeded)
			}
			if run.GetStatus() == planexv1.RunStatus_RUN_STATUS_SUCCEEDED || run.GetStopMessage() == "" {
				t.Fatalf("status %s message %q", run.GetStatus(), run.GetStopMessage())
			}
			evs := watchAll(t, r.client, id, 1)
			assertOnce(t, h, id, evs)
			if tt.check != nil {
				tt.check(t, id, run, evs)
			}
		})
	}
}

func TestStepTimeoutReplansAndRecovers(t *testing.T) {
	h, r := setup(t)
	h.planner.on("timeout recovers", sequence(
		planOf(noRetry(&planexv1.Step{Id: "slow", Tool: "test.sleep", Args: mustStruct(map[string]any{"ms": 1500}), Timeout: durationpb.New(200 * time.Millisecond)})),
		planOf(step("fast", "test.echo", map[string]any{"value": "done"})),
	))
	id := start(t, r.client, &planexv1.StartRunRequest{Goal: "timeout recovers"})
	succeeded(t, r, id)
	evs := watchAll(t, r.client, id, 1)
	var timedOut bool
	for _, ev := range evs {
		if f := ev.GetStepFailed(); f != nil && f.GetStepId() == "slow" && f.GetError().GetCode() == planexv1.ErrorCode_ERROR_CODE_TIMEOUT {
			timedOut = true
		}
	}
	if !timedOut || count(evs, "replan_requested") != 1 {
		t.Fatalf("events %v: want a TIMEOUT failure and a replan", payloads(evs))
	}
	// The late result of the timed-out attempt is ignored.
	waitFor(t, 5*time.Second, "the slow attempt to report", func() bool { return h.pool.reported(id, "slow", 1) })
	h.waitEngineIdle()
	after := watchAll(t, r.client, id, 1)
	if len(after) != len(evs) {
		t.Fatalf("events appended after the run finished")
	}
}

func containsAny(list []string, sub string) bool {
	for _, s := range list {
		if contains(s, sub) {
			return true
		}
	}
	return false
}

func TestStepFailuresBeforeAndAfterRunningReplan(t *testing.T) {
	h, r := setup(t)
	fixed := planOf(step("fixed", "test.echo", map[string]any{"value": "ok"}))
	tests := []struct {
		name  string
		plan  *planexv1.PlanResponse
		event string             // the failure event
		code  planexv1.ErrorCode // the failed step's error code
		ran   map[string]int     // attempts that reached the executor
	}{
		{
			name:  "expectation failed",
			plan:  planOf(&planexv1.Step{Id: "a", Tool: "test.echo", Args: mustStruct(map[string]any{"value": 1}), Expect: "output.value == 2"}),
			event: "expectation_failed:a",
			code:  planexv1.ErrorCode_ERROR_CODE_EXPECTATION_FAILED,
			ran:   map[string]int{"a/1": 1, "fixed/1": 1},
		},
		{
			name: "reference to a missing output field",
			plan: planOf(
				step("a", "test.echo", map[string]any{"value": 1}),
				step("b", "test.echo", map[string]any{"value": "${{ steps.a.output.missing }}"}, "a"),
			),
			event: "step_failed:b",
			code:  planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT,
			ran:   map[string]int{"a/1": 1, "fixed/1": 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			goal := "failure " + tt.name
			id := h.runGoal(t, r, goal, sequence(tt.plan, fixed))
			run := waitTerminal(t, r.client, id, 10*time.Second)
			if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || run.GetUsage().GetReplans() != 1 {
				t.Fatalf("status %s replans %d %q", run.GetStatus(), run.GetUsage().GetReplans(), run.GetStopMessage())
			}
			evs := watchAll(t, r.client, id, 1)
			if count(evs, tt.event) != 1 {
				t.Fatalf("events %v lack %s", payloads(evs), tt.event)
			}
			hist := h.planner.requests(id)[1].GetHistory()
			var code planexv1.ErrorCode
			for _, o := range hist.GetSteps() {
				if o.GetStatus() == planexv1.StepStatus_STEP_STATUS_FAILED {
					code = o.GetError().GetCode()
				}
			}
			if code != tt.code {
				t.Fatalf("failure code in history %s, want %s", code, tt.code)
			}
			got := h.pool.executions(id)
			if len(got) != len(tt.ran) {
				t.Fatalf("executions %v, want %v", got, tt.ran)
			}
			for k, n := range tt.ran {
				if got[k] != n {
					t.Fatalf("executions %v, want %v", got, tt.ran)
				}
			}
		})
	}
}

func TestPlannerErrors(t *testing.T) {
	h, r := setup(t)
	ok := planOf(step("a", "test.echo", map[string]any{"value": 1}))
	failOnce := func(code codes.Code, msg string) script {
		return func(n int, _ *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
			if n == 0 {
				st, err := status.New(code, msg).WithDetails(&planexv1.TokenUsage{InputTokens: 40, OutputTokens: 2})
				if err != nil {
					return nil, err
				}
				return nil, st.Err()
			}
			return proto.CloneOf(ok), nil
		}
	}
	tests := []struct {
		name    string
		script  script
		status  planexv1.RunStatus
		reason  planexv1.StopReason
		message string
		tokens  int64 // 42 for the failed call, 15 for the answer
		calls   int
	}{
		{
			name:   "unavailable is retried",
			script: failOnce(codes.Unavailable, "planner: model provider unavailable"),
			status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, reason: planexv1.StopReason_STOP_REASON_SUCCEEDED,
			tokens: 57, calls: 2,
		},
		{
			name:   "an invalid model answer counts as a replan",
			script: failOnce(codes.Aborted, "planner: the model answered an invalid plan"),
			status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, reason: planexv1.StopReason_STOP_REASON_SUCCEEDED,
			tokens: 57, calls: 2,
		},
		{
			name:   "token budget exhausted",
			script: failOnce(codes.ResourceExhausted, "planner: token budget exhausted"),
			status: planexv1.RunStatus_RUN_STATUS_FAILED, reason: planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED,
			message: "planner: token budget exhausted", tokens: 42, calls: 1,
		},
		{
			name:   "no playbook",
			script: failOnce(codes.FailedPrecondition, "planner: no playbook matches the goal"),
			status: planexv1.RunStatus_RUN_STATUS_FAILED, reason: planexv1.StopReason_STOP_REASON_PLANNER_ERROR,
			message: "planner: no playbook matches the goal", tokens: 42, calls: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := h.runGoal(t, r, "planner error "+tt.name, tt.script)
			run := waitTerminal(t, r.client, id, 20*time.Second)
			if run.GetStatus() != tt.status || run.GetStopReason() != tt.reason || (tt.message != "" && run.GetStopMessage() != tt.message) {
				t.Fatalf("run: %s %s %q", run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
			}
			if run.GetUsage().GetTokens() != tt.tokens || run.GetUsage().GetTokensReserved() != 0 {
				t.Fatalf("tokens %d reserved %d, want %d and 0", run.GetUsage().GetTokens(), run.GetUsage().GetTokensReserved(), tt.tokens)
			}
			if n := len(h.planner.requests(id)); n != tt.calls {
				t.Fatalf("planner calls %d, want %d", n, tt.calls)
			}
		})
	}
}
