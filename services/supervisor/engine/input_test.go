package engine

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// inputRun is a run whose plan asks (human.input with args) and then
// reads (sql.query with the answer), advanced once.
func inputRun(t *testing.T, e *Engine, args map[string]any) *runlog.Tx {
	t.Helper()
	var l runlog.Log
	tx := l.Begin(&runlog.State{})
	created := Event(&planexv1.RunCreated{Goal: "report", Budget: &planexv1.Budget{MaxSteps: 10, MaxReplans: 2, MaxParallelism: 4, MaxTokens: 1000}})
	created.RunId = "run-input"
	emit(t, tx, created)
	emit(t, tx, Event(&planexv1.PlanRevised{Plan: &planexv1.Plan{Revision: 1, Steps: []*planexv1.Step{
		{Id: "ask", Tool: catalog.HumanInput, Args: mustStruct(t, args)},
		{Id: "read", Tool: "sql.query", Args: mustStruct(t, map[string]any{"customer": "${{ steps.ask.output }}"}), DependsOn: []string{"ask"}},
	}}}))
	if err := e.advance(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	return tx
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestInputGateOpensAndTheAnswerIsTheOutput(t *testing.T) {
	e := offlineEngine(t, "")
	tx := inputRun(t, e, map[string]any{"question": "Which customer?", "choices": []any{"acme", "globex"}})
	run := tx.Run()
	g := runlog.Gate(run, "ask.r1")
	if g.GetKind() != planexv1.GateKind_GATE_KIND_INPUT || !runlog.GateOpen(run, g) || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING ||
		len(g.GetInput().GetSchema().GetFields()["enum"].GetListValue().GetValues()) != 2 || !g.GetReplanOnReject() {
		t.Fatalf("run %s, gate %v", run.GetStatus(), g)
	}
	for _, ev := range tx.Events() {
		if ev.GetStepDispatched() != nil {
			t.Fatalf("dispatched before the answer: %v", ev)
		}
	}
	log := tx.Events()

	// A decision without an answer is not acted on (the API refuses it).
	var l runlog.Log
	bad := l.Begin(fold(t, log))
	if err := e.onDecision(bad, &planexv1.GateDecided{GateId: "ask.r1", Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE}); !errors.Is(err, errIgnore) || len(bad.Events()) != 0 {
		t.Fatalf("approve without an answer: %v, %d events", err, len(bad.Events()))
	}

	dtx := decide(t, e, log, &planexv1.GateDecided{GateId: "ask.r1", Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, Answer: structpb.NewStringValue("globex"), Actor: "alice"})
	var kinds []string
	for _, ev := range dtx.Events() {
		kinds = append(kinds, runlog.PayloadName(ev))
	}
	ask, read := dtx.State().Step("ask"), dtx.State().Step("read")
	if ask.GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED || ask.GetOutput().GetStringValue() != "globex" || ask.GetTool() != catalog.HumanInput ||
		read.GetStatus() != planexv1.StepStatus_STEP_STATUS_DISPATCHED || read.GetResolvedArgs().GetFields()["customer"].GetStringValue() != "globex" {
		t.Fatalf("events %v: ask %v, read %v", kinds, ask, read)
	}
	if g := runlog.Gate(dtx.Run(), "ask.r1"); g.GetAnswer().GetStringValue() != "globex" || g.GetDecision() != planexv1.DecisionKind_DECISION_KIND_APPROVE {
		t.Fatalf("gate after the answer: %v", g)
	}
	log = append(log, dtx.Events()...)
	res, err := Replay(t.Context(), log, ReplayConfig{Tools: gateTools()})
	if err != nil || res.Divergence != nil || res.Events != len(log) {
		t.Fatalf("replay: %v %v, %d of %d events", err, res.Divergence, res.Events, len(log))
	}
}

func TestInputStepWithABadSchemaFails(t *testing.T) {
	e := offlineEngine(t, "")
	tx := inputRun(t, e, map[string]any{"question": "Which?", "schema": map[string]any{"type": "no-such-type"}})
	var failed *planexv1.StepFailed
	for _, ev := range tx.Events() {
		if f := ev.GetStepFailed(); f != nil {
			failed = f
		}
	}
	if failed.GetStepId() != "ask" || failed.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || failed.GetError().GetField() != "args.schema" ||
		runlog.Gate(tx.Run(), "ask.r1") != nil {
		t.Fatalf("failure %v, gates %v", failed, tx.Run().GetGates())
	}
}
