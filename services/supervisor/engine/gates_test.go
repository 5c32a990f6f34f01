package engine

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/policy"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// gateTools is the catalog of the gate tests: a read and a write that
// requires approval.
func gateTools() []*planexv1.ToolSpec {
	obj := &structpb.Struct{Fields: map[string]*structpb.Value{"type": structpb.NewStringValue("object")}}
	return []*planexv1.ToolSpec{
		{Name: "sql.query", Pool: "sql", Description: "reads", ArgsSchema: obj, SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ},
		{Name: "sql.exec", Pool: "sql", Description: "writes", ArgsSchema: obj, SideEffect: planexv1.SideEffect_SIDE_EFFECT_WRITE, RequiresApproval: true},
	}
}

// offlineEngine decides runs without NATS, like Replay: the tests drive
// its decisions on transactions and read the events they emit.
func offlineEngine(t *testing.T, policyYAML string) *Engine {
	t.Helper()
	cfg := Config{Now: func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }}
	if policyYAML != "" {
		p := filepath.Join(t.TempDir(), "policy.yaml")
		if err := os.WriteFile(p, []byte(policyYAML), 0o600); err != nil {
			t.Fatal(err)
		}
		w, err := policy.NewWatcher(slog.New(slog.DiscardHandler), p)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Policies = w
	}
	return &Engine{
		cfg:    cfg.withDefaults(),
		res:    &bus.Resources{JS: offlineJS{}, Outputs: noOutputs{}},
		tools:  catalog.StaticCache(catalog.Static(gateTools())),
		logger: slog.New(slog.DiscardHandler),
	}
}

// gateRun is a run with one revision, "read" then "close" (sql.exec),
// advanced until close waits at its gate: opened by the engine, or the
// recorded gate old when set (a record of earlier code). It returns the
// log so far.
func gateRun(t *testing.T, e *Engine, maxReplans int32, old *planexv1.Gate) []*planexv1.RunEvent {
	t.Helper()
	var l runlog.Log
	tx := l.Begin(&runlog.State{})
	created := Event(&planexv1.RunCreated{Goal: "close ticket 7", Budget: &planexv1.Budget{MaxSteps: 10, MaxReplans: maxReplans, MaxParallelism: 4, MaxTokens: 1000}})
	created.RunId = "run-gates"
	emit(t, tx, created)
	emit(t, tx, Event(&planexv1.PlanRevised{Plan: &planexv1.Plan{Revision: 1, Steps: []*planexv1.Step{
		{Id: "read", Tool: "sql.query", Args: &structpb.Struct{}},
		{Id: "close", Tool: "sql.exec", Args: &structpb.Struct{}, DependsOn: []string{"read"}, RequiresApproval: true},
	}}}))
	if err := e.advance(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	emit(t, tx, Event(&planexv1.StepSucceeded{StepId: "read", Attempt: 1, Output: structpb.NewNumberValue(1)}))
	if old != nil {
		emit(t, tx, Event(&planexv1.GateOpened{Gate: old}))
	}
	if err := e.advance(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	g := runlog.Gate(tx.Run(), runlog.GateID("close", 1))
	if g == nil || !runlog.GateOpen(tx.Run(), g) {
		t.Fatalf("close does not wait at its gate: %v", tx.Run().GetGates())
	}
	return tx.Events()
}

func emit(t *testing.T, tx *runlog.Tx, ev *planexv1.RunEvent) {
	t.Helper()
	if err := tx.Emit(ev); err != nil {
		t.Fatal(err)
	}
}

// fold folds a log into a state.
func fold(t *testing.T, events []*planexv1.RunEvent) *runlog.State {
	t.Helper()
	st := &runlog.State{}
	for i, ev := range events {
		if err := st.Apply(ev, uint64(i)+1); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// decide records d as the engine does (decision, then advance) and returns
// the transaction.
func decide(t *testing.T, e *Engine, events []*planexv1.RunEvent, d *planexv1.GateDecided) *runlog.Tx {
	t.Helper()
	var l runlog.Log
	tx := l.Begin(fold(t, events))
	if err := e.onDecision(tx, d); err != nil {
		t.Fatal(err)
	}
	if err := e.advance(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	return tx
}

const onRejectStop = `name: strict
rules:
  - name: exec-stops
    when: step.tool == "sql.exec"
    action: require_approval
    reason: sql.exec changes the database
    on_reject: stop
`

func TestRejectionReplansUnlessStopped(t *testing.T) {
	reject := func(stop bool) *planexv1.GateDecided {
		return &planexv1.GateDecided{GateId: "close.r1", Decision: planexv1.DecisionKind_DECISION_KIND_REJECT, Actor: "alice", Comment: "wrong ticket", StopRun: stop}
	}
	tests := []struct {
		name       string
		policy     string
		maxReplans int32
		old        *planexv1.Gate // a gate record of earlier code
		decision   *planexv1.GateDecided
		replan     bool
		message    string // in the stop message or the replan reason
	}{
		{name: "default replans", maxReplans: 2, decision: reject(false), replan: true,
			message: `gate close.r1 (step "close") rejected by alice: wrong ticket`},
		{name: "on_reject stop", policy: onRejectStop, maxReplans: 2, decision: reject(false),
			message: "wrong ticket; the gate's rule says on_reject: stop"},
		{name: "decider stops the run", maxReplans: 2, decision: reject(true),
			message: "wrong ticket; the run was stopped at the decider's request"},
		{name: "no replan left", maxReplans: 0, decision: reject(false),
			message: "wrong ticket; no replan left (max_replans 0)"},
		{name: "SLA rejection replans", maxReplans: 1, replan: true,
			decision: &planexv1.GateDecided{GateId: "close.r1", Decision: planexv1.DecisionKind_DECISION_KIND_REJECT, Actor: "planex", Via: ViaSLA, Comment: "not decided"},
			message:  "was not decided within its SLA and is rejected: not decided"},
		{name: "old tool gate stops", maxReplans: 2, decision: reject(false),
			old:     &planexv1.Gate{Id: "close.r1", Kind: planexv1.GateKind_GATE_KIND_STEP, StepId: "close", PlanRevision: 1, Reason: "the plan asks for approval", StopOnReject: true},
			message: `gate close.r1 (step "close") rejected by alice: wrong ticket`},
		{name: "old gate without policy stops", maxReplans: 2, decision: reject(false),
			old:     &planexv1.Gate{Id: "close.r1", Kind: planexv1.GateKind_GATE_KIND_STEP, StepId: "close", PlanRevision: 1, Reason: "tool sql.exec requires approval"},
			message: `gate close.r1 (step "close") rejected by alice: wrong ticket`},
		{name: "old policy gate replans", maxReplans: 2, decision: reject(false), replan: true,
			old:     &planexv1.Gate{Id: "close.r1", Kind: planexv1.GateKind_GATE_KIND_STEP, StepId: "close", PlanRevision: 1, Reason: "by policy", Policy: "p", Rule: "r"},
			message: "rejected by alice: wrong ticket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := offlineEngine(t, tt.policy)
			log := gateRun(t, e, tt.maxReplans, tt.old)
			g := runlog.Gate(fold(t, log).Run, "close.r1")
			if tt.old == nil && (g.GetReplanOnReject() == g.GetStopOnReject() || g.GetStopOnReject() != (tt.policy != "")) {
				t.Fatalf("gate opened with replan_on_reject %v stop_on_reject %v", g.GetReplanOnReject(), g.GetStopOnReject())
			}
			tx := decide(t, e, log, tt.decision)
			run := tx.Run()
			if tt.replan {
				if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_PLANNING || run.GetUsage().GetReplans() != 1 ||
					!strings.Contains(tx.State().ReplanReason, tt.message) || tx.State().ReplanStep != "close" {
					t.Fatalf("run %s replans %d, replan %q of step %q; want a replan of close with %q",
						run.GetStatus(), run.GetUsage().GetReplans(), tx.State().ReplanReason, tx.State().ReplanStep, tt.message)
				}
				return
			}
			if run.GetStopReason() != planexv1.StopReason_STOP_REASON_REJECTED || !strings.Contains(run.GetStopMessage(), tt.message) || run.GetUsage().GetReplans() != 0 {
				t.Fatalf("run %s %s %q, want REJECTED with %q", run.GetStatus(), run.GetStopReason(), run.GetStopMessage(), tt.message)
			}
			if g := runlog.Gate(run, "close.r1"); g.GetStopRun() != tt.decision.GetStopRun() {
				t.Fatalf("gate stop_run %v, want %v", g.GetStopRun(), tt.decision.GetStopRun())
			}
		})
	}
}

// TestRejectedStepReachesThePlanner checks what the planner sees after a
// rejection (the step as FAILED with code REJECTED), that a planner with
// no other plan stops the run REJECTED naming the rejection, and that the
// whole log replays as recorded.
func TestRejectedStepReachesThePlanner(t *testing.T) {
	e := offlineEngine(t, "")
	log := gateRun(t, e, 2, nil)
	tx := decide(t, e, log, &planexv1.GateDecided{GateId: "close.r1", Decision: planexv1.DecisionKind_DECISION_KIND_REJECT, Actor: "alice", Comment: "wrong ticket"})
	log = append(log, tx.Events()...)
	req, err := e.planRequest(t.Context(), tx.State())
	if err != nil {
		t.Fatal(err)
	}
	var rejected *planexv1.StepOutcome
	for _, o := range req.GetHistory().GetSteps() {
		if o.GetStepId() == "close" {
			rejected = o
		}
	}
	if rejected.GetStatus() != planexv1.StepStatus_STEP_STATUS_FAILED || rejected.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_REJECTED ||
		rejected.GetTool() != "sql.exec" || rejected.GetPlanRevision() != 1 ||
		rejected.GetError().GetMessage() != `gate close.r1 (step "close") rejected by alice: wrong ticket` {
		t.Fatalf("history outcome of the rejected step: %v", rejected)
	}
	if steps := req.GetHistory().GetSteps(); len(steps) != 2 || steps[0].GetStepId() != "read" {
		t.Fatalf("history %v, want read then the rejected close", steps)
	}

	var l runlog.Log
	ptx := l.Begin(fold(t, log))
	call := &plannerCall{req: req, round: roundOf(ptx.Run())}
	giveUp := &planexv1.PlanResponse{Stop: true, GiveUp: true, StopMessage: `step "close" (sql.exec) was rejected: no other way to close it`}
	if err := e.applyPlan(t.Context(), ptx, call, giveUp, nil); err != nil {
		t.Fatal(err)
	}
	run := ptx.Run()
	if run.GetStopReason() != planexv1.StopReason_STOP_REASON_REJECTED ||
		!strings.Contains(run.GetStopMessage(), "rejected by alice: wrong ticket; the planner has no other plan: ") {
		t.Fatalf("run %s %q, want REJECTED naming the rejection", run.GetStopReason(), run.GetStopMessage())
	}
	log = append(log, ptx.Events()...)

	res, err := Replay(t.Context(), log, ReplayConfig{Tools: gateTools()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Divergence != nil || res.Events != len(log) {
		t.Fatalf("replayed %d of %d events: %v", res.Events, len(log), res.Divergence)
	}
}
