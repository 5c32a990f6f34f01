package supervisor_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

// askCustomer is a plan that asks a person which customer to report on
// (an object with a string customer) and echoes the answer.
func askCustomer() []*planexv1.Step {
	return []*planexv1.Step{
		step("ask", catalog.HumanInput, map[string]any{
			"question": "Which customer should the report cover?",
			"schema": map[string]any{"type": "object", "required": []any{"customer"},
				"properties": map[string]any{"customer": map[string]any{"type": "string", "minLength": 1}}},
		}),
		step("report", "test.echo", map[string]any{"value": "${{ steps.ask.output.customer }}"}, "ask"),
	}
}

func answer(t *testing.T, r *replica, id, gate string, v any) (*planexv1.Run, error) {
	t.Helper()
	a, err := structpb.NewValue(v)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := r.client.Decide(testCtx(t, 10*time.Second), &planexv1.DecideRequest{RunId: id, GateId: gate, Answer: a, Actor: "alice"})
	return resp.GetRun(), err
}

// TestHumanInputAnswerBecomesTheStepOutput: a ready human.input step opens
// an input gate (no pool runs it); a wrong-typed answer is refused naming
// the path and the schema's message, and the run keeps waiting; a valid
// answer is the step's output, used by the next step; the log replays.
func TestHumanInputAnswerBecomesTheStepOutput(t *testing.T) {
	h, r := setup(t)
	id := h.runGoal(t, r, "ask", always(askCustomer()...))
	run := waiting(t, r, id, 1)
	g := run.GetGates()[0]
	if g.GetKind() != planexv1.GateKind_GATE_KIND_INPUT || g.GetId() != "ask.r1" || g.GetStepId() != "ask" ||
		g.GetInput().GetQuestion() != "Which customer should the report cover?" || g.GetInput().GetSchema().GetFields()["type"].GetStringValue() != "object" {
		t.Fatalf("gate %v, want the input gate of ask", g)
	}
	if n := len(h.pool.executions(id)); n != 0 {
		t.Fatalf("%d executions before the answer", n)
	}

	for _, tt := range []struct {
		name   string
		answer any
		want   string
	}{
		{"wrong type", map[string]any{"customer": 7}, "answer.customer: expected string, got number 7"},
		{"missing property", map[string]any{}, "answer.customer: missing required field"},
		{"not an object", "acme", `answer: expected object, got string "acme"`},
	} {
		_, err := answer(t, r, id, "ask.r1", tt.answer)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
			t.Fatalf("%s: Decide: %v, want InvalidArgument with %q", tt.name, err, tt.want)
		}
	}
	// Nothing was recorded: the run waits at the same gate.
	run = waiting(t, r, id, 1)
	if run.GetGates()[0].GetDecision() != planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
		t.Fatalf("gate decided by a refused answer: %v", run.GetGates()[0])
	}
	// An input gate is not approved without an answer.
	_, err := r.client.Decide(testCtx(t, 5*time.Second), &planexv1.DecideRequest{RunId: id, GateId: "ask.r1", Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "answer: required") {
		t.Fatalf("approve without answer: %v", err)
	}

	if _, err := answer(t, r, id, "ask.r1", map[string]any{"customer": "acme"}); err != nil {
		t.Fatal(err)
	}
	run = succeeded(t, r, id)
	if got := h.pool.argsOf(id, "report", 1).GetFields()["value"].GetStringValue(); got != "acme" {
		t.Fatalf("report ran with %q, want the answer acme", got)
	}
	g = run.GetGates()[0]
	if g.GetDecision() != planexv1.DecisionKind_DECISION_KIND_APPROVE || g.GetAnswer().GetStructValue().GetFields()["customer"].GetStringValue() != "acme" || g.GetActor() != "alice" {
		t.Fatalf("decided gate %v", g)
	}
	var ask *planexv1.StepState
	for _, st := range run.GetSteps() {
		if st.GetStepId() == "ask" {
			ask = st
		}
	}
	if ask.GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED || ask.GetOutput().GetStructValue().GetFields()["customer"].GetStringValue() != "acme" {
		t.Fatalf("ask %v, want SUCCEEDED with the answer", ask)
	}
	if _, ok := h.pool.executions(id)["ask"]; ok {
		t.Fatal("a pool ran the human.input step")
	}
	res, err := engine.Replay(t.Context(), watchAll(t, r.client, id, 0), engine.ReplayConfig{Tools: toolSpecs()})
	if err != nil || res.Divergence != nil {
		t.Fatalf("replay: %v %v", err, res.Divergence)
	}
}

// TestHumanInputChoicesAndReject: choices become the schema's enum; a
// rejection sends the run back to the planner, whose next plan runs.
func TestHumanInputChoicesAndReject(t *testing.T) {
	h, r := setup(t)
	id := h.runGoal(t, r, "choose", sequence(
		planOf(step("pick", catalog.HumanInput, map[string]any{"question": "Which region?", "choices": []any{"eu", "us"}})),
		planOf(step("e", "test.echo", map[string]any{"value": "default"})),
	))
	run := waiting(t, r, id, 1)
	if enum := run.GetGates()[0].GetInput().GetSchema().GetFields()["enum"].GetListValue().GetValues(); len(enum) != 2 {
		t.Fatalf("schema %v, want the choices as enum", run.GetGates()[0].GetInput().GetSchema())
	}
	if _, err := answer(t, r, id, "pick.r1", "asia"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `answer: expected one of ["eu","us"], got string "asia"`) {
		t.Fatalf("answer outside the choices: %v", err)
	}
	if _, err := r.client.Decide(testCtx(t, 10*time.Second), &planexv1.DecideRequest{RunId: id, GateId: "pick.r1",
		Decision: planexv1.DecisionKind_DECISION_KIND_REJECT, Comment: "use the default"}); err != nil {
		t.Fatal(err)
	}
	run = succeeded(t, r, id)
	if run.GetUsage().GetReplans() != 1 || !strings.Contains(h.planner.requests(id)[1].GetHistory().GetReplanReason(), `gate pick.r1 (step "pick") rejected`) {
		t.Fatalf("replans %d, replan reason %q", run.GetUsage().GetReplans(), h.planner.requests(id)[1].GetHistory().GetReplanReason())
	}
}

const inputSLA = `name: input-sla
rules:
  - name: answer-quickly
    when: step.tool == "human.input"
    action: require_approval
    reason: someone must answer within a second
    gate_timeout: 1s
    on_timeout: reject
`

// TestHumanInputSLARejects: a policy gives input gates an SLA; unanswered,
// the gate is rejected and the run replans.
func TestHumanInputSLARejects(t *testing.T) {
	h, r := setup(t, withPolicy(t, inputSLA))
	id := h.runGoal(t, r, "sla", sequence(
		planOf(step("ask", catalog.HumanInput, map[string]any{"question": "Anyone?"})),
		planOf(step("e", "test.echo", map[string]any{"value": "nobody answered"})),
	))
	run := succeeded(t, r, id)
	g := run.GetGates()[0]
	if g.GetKind() != planexv1.GateKind_GATE_KIND_INPUT || g.GetSlaAt() == nil || g.GetDecidedVia() != engine.ViaSLA ||
		g.GetDecision() != planexv1.DecisionKind_DECISION_KIND_REJECT || g.GetPolicy() != "input-sla" {
		t.Fatalf("gate %v, want the input gate rejected by its SLA", g)
	}
	if run.GetUsage().GetReplans() != 1 {
		t.Fatalf("replans %d, want 1", run.GetUsage().GetReplans())
	}
}

// TestHumanInputSurvivesASupervisorRestart: the replica that opened the
// input gate dies; another one takes the answer and finishes the run.
func TestHumanInputSurvivesASupervisorRestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	a := h.startReplica()
	id := h.runGoal(t, a, "restart", always(askCustomer()...))
	waiting(t, a, id, 1)
	a.kill()
	b := h.startReplica()
	if run := waiting(t, b, id, 1); run.GetGates()[0].GetKind() != planexv1.GateKind_GATE_KIND_INPUT {
		t.Fatalf("after the restart: %v", run.GetGates())
	}
	if _, err := answer(t, b, id, "ask.r1", map[string]any{"customer": 7}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("wrong answer after the restart: %v", err)
	}
	if _, err := answer(t, b, id, "ask.r1", map[string]any{"customer": "globex"}); err != nil {
		t.Fatal(err)
	}
	succeeded(t, b, id)
	if got := h.pool.argsOf(id, "report", 1).GetFields()["value"].GetStringValue(); got != "globex" {
		t.Fatalf("report ran with %q, want globex", got)
	}
}
