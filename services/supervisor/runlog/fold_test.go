package runlog_test

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(sec int) *timestamppb.Timestamp {
	return timestamppb.New(t0.Add(time.Duration(sec) * time.Second))
}

// build folds payloads into a run, numbering the events.
func build(t *testing.T, mode planexv1.PlanningMode, evs ...*planexv1.RunEvent) *planexv1.Run {
	t.Helper()
	var run *planexv1.Run
	all := append([]*planexv1.RunEvent{{RunId: "r1", Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{
		Goal: "g", Mode: mode, Budget: &planexv1.Budget{MaxSteps: 10, MaxReplans: 2},
		TraceContext: map[string]string{"traceparent": "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"},
	}}}}, evs...)
	for i, ev := range all {
		ev.RunId, ev.Sequence, ev.Time = "r1", uint64(i+1), at(i)
		var err error
		if run, err = runlog.Fold(run, ev); err != nil {
			t.Fatalf("fold event %d: %v", i+1, err)
		}
	}
	return run
}

func planEv(rev int32, lineage *planexv1.PlanLineage, steps ...*planexv1.Step) *planexv1.RunEvent {
	return &planexv1.RunEvent{Payload: &planexv1.RunEvent_PlanRevised{PlanRevised: &planexv1.PlanRevised{
		Plan: &planexv1.Plan{Revision: rev, Steps: steps, Lineage: lineage}}}}
}

func st(id string, deps ...string) *planexv1.Step {
	return &planexv1.Step{Id: id, Tool: "t.x", DependsOn: deps}
}

func dispatched(id string, attempt int32) *planexv1.RunEvent {
	return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{
		StepId: id, Attempt: attempt, PlanRevision: 1, Tool: "t.x"}}}
}

func succeeded(id string, attempt int32) *planexv1.RunEvent {
	return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{
		StepId: id, Attempt: attempt, Output: structpb.NewStringValue("out-" + id)}}}
}

func failed(id string, attempt int32, code planexv1.ErrorCode) *planexv1.RunEvent {
	return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepFailed{StepFailed: &planexv1.StepFailed{
		StepId: id, Attempt: attempt, Error: &planexv1.StepError{Code: code, Message: "x"}}}}
}

func stepOf(run *planexv1.Run, id string) *planexv1.StepState { return runlog.Step(run, id) }

func TestFold(t *testing.T) {
	added := &planexv1.PlanLineage{Added: []string{"a", "b"}}
	tests := []struct {
		name  string
		mode  planexv1.PlanningMode
		evs   []*planexv1.RunEvent
		check func(t *testing.T, run *planexv1.Run)
	}{
		{
			name: "created",
			check: func(t *testing.T, run *planexv1.Run) {
				if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_PENDING || run.GetTraceId() != "0123456789abcdef0123456789abcdef" ||
					run.GetGoal() != "g" || run.GetLastSequence() != 1 || !run.GetCreatedAt().AsTime().Equal(t0) {
					t.Fatalf("run %v", run)
				}
			},
		},
		{
			name: "plan revised makes steps pending and the run running",
			evs:  []*planexv1.RunEvent{planEv(1, added, st("a"), st("b", "a"))},
			check: func(t *testing.T, run *planexv1.Run) {
				if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_RUNNING || len(run.GetSteps()) != 2 ||
					stepOf(run, "b").GetStatus() != planexv1.StepStatus_STEP_STATUS_PENDING || stepOf(run, "b").GetPlanRevision() != 1 {
					t.Fatalf("run %v", run)
				}
			},
		},
		{
			name: "dispatch reserves a step, start and success are recorded",
			evs: []*planexv1.RunEvent{planEv(1, added, st("a"), st("b", "a")), dispatched("a", 1),
				{Payload: &planexv1.RunEvent_StepStarted{StepStarted: &planexv1.StepStarted{StepId: "a", Attempt: 1, ExecutorId: "e1"}}},
				succeeded("a", 1)},
			check: func(t *testing.T, run *planexv1.Run) {
				a := stepOf(run, "a")
				if a.GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED || a.GetOutput().GetStringValue() != "out-a" ||
					a.GetExecutorId() != "e1" || !a.GetStartedAt().AsTime().Equal(t0.Add(3*time.Second)) || run.GetUsage().GetSteps() != 1 {
					t.Fatalf("step a %v usage %v", a, run.GetUsage())
				}
			},
		},
		{
			name: "a result of an older attempt changes nothing",
			evs:  []*planexv1.RunEvent{planEv(1, added, st("a"), st("b")), dispatched("a", 1), dispatched("a", 2), succeeded("a", 1)},
			check: func(t *testing.T, run *planexv1.Run) {
				if a := stepOf(run, "a"); a.GetStatus() != planexv1.StepStatus_STEP_STATUS_DISPATCHED || a.GetAttempt() != 2 {
					t.Fatalf("step a %v", a)
				}
			},
		},
		{
			name: "unknown outcome",
			evs:  []*planexv1.RunEvent{planEv(1, added, st("a"), st("b")), dispatched("a", 1), failed("a", 1, planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN)},
			check: func(t *testing.T, run *planexv1.Run) {
				if stepOf(run, "a").GetStatus() != planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN {
					t.Fatalf("step a %v", stepOf(run, "a"))
				}
			},
		},
		{
			name: "replan keeps succeeded and in-flight steps, resets failed, skips dropped",
			evs: []*planexv1.RunEvent{
				planEv(1, &planexv1.PlanLineage{Added: []string{"a", "b", "c", "d"}}, st("a"), st("b"), st("c"), st("d")),
				dispatched("a", 1), succeeded("a", 1), dispatched("b", 1), dispatched("c", 1), failed("c", 1, planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED),
				dispatched("d", 1),
				{Payload: &planexv1.RunEvent_ReplanRequested{ReplanRequested: &planexv1.ReplanRequested{Reason: "c failed", StepId: "c"}}},
				planEv(2, &planexv1.PlanLineage{PreviousRevision: 1, Kept: []string{"a", "b", "c"}, Dropped: []string{"d"}}, st("a"), st("b"), st("c")),
			},
			check: func(t *testing.T, run *planexv1.Run) {
				a, b, c, d := stepOf(run, "a"), stepOf(run, "b"), stepOf(run, "c"), stepOf(run, "d")
				if a.GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED || a.GetOutput() == nil {
					t.Fatalf("kept succeeded step lost its output: %v", a)
				}
				if b.GetStatus() != planexv1.StepStatus_STEP_STATUS_DISPATCHED || b.GetAttempt() != 1 {
					t.Fatalf("kept in-flight step: %v", b)
				}
				if c.GetStatus() != planexv1.StepStatus_STEP_STATUS_PENDING || c.GetAttempt() != 1 || c.GetPlanRevision() != 2 || c.GetError() != nil {
					t.Fatalf("failed step not reset (attempt kept for numbering): %v", c)
				}
				if d.GetStatus() != planexv1.StepStatus_STEP_STATUS_SKIPPED {
					t.Fatalf("dropped step: %v", d)
				}
				if run.GetUsage().GetReplans() != 1 || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_RUNNING || len(run.GetPlans()) != 2 {
					t.Fatalf("run: replans %d status %s", run.GetUsage().GetReplans(), run.GetStatus())
				}
			},
		},
		{
			name: "an in-flight step whose input is recomputed starts over",
			evs: []*planexv1.RunEvent{
				planEv(1, added, st("a"), st("b", "a")), dispatched("a", 1), succeeded("a", 1), dispatched("b", 1),
				planEv(2, &planexv1.PlanLineage{PreviousRevision: 1, Kept: []string{"b"}, Changed: []string{"a"}}, st("a"), st("b", "a")),
			},
			check: func(t *testing.T, run *planexv1.Run) {
				if b := stepOf(run, "b"); b.GetStatus() != planexv1.StepStatus_STEP_STATUS_PENDING {
					t.Fatalf("step b %v", b)
				}
			},
		},
		{
			name: "next-step mode plans again when the plan is complete",
			mode: planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP,
			evs:  []*planexv1.RunEvent{planEv(1, &planexv1.PlanLineage{Added: []string{"a"}}, st("a")), dispatched("a", 1), succeeded("a", 1)},
			check: func(t *testing.T, run *planexv1.Run) {
				if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_PLANNING {
					t.Fatalf("status %s", run.GetStatus())
				}
			},
		},
		{
			name: "gate opens, waits, approves",
			evs: []*planexv1.RunEvent{
				planEv(1, added, st("a"), st("b")),
				{Payload: &planexv1.RunEvent_GateOpened{GateOpened: &planexv1.GateOpened{Gate: &planexv1.Gate{Id: "a.r1", Kind: planexv1.GateKind_GATE_KIND_STEP, StepId: "a", PlanRevision: 1}}}},
				{Payload: &planexv1.RunEvent_GateDecided{GateDecided: &planexv1.GateDecided{GateId: "a.r1", Decision: planexv1.DecisionKind_DECISION_KIND_EDIT,
					EditedArgs: &structpb.Struct{Fields: map[string]*structpb.Value{"v": structpb.NewNumberValue(1)}}, Actor: "ann"}}},
			},
			check: func(t *testing.T, run *planexv1.Run) {
				a, g := stepOf(run, "a"), runlog.Gate(run, "a.r1")
				if a.GetStatus() != planexv1.StepStatus_STEP_STATUS_PENDING || a.GetResolvedArgs().GetFields()["v"].GetNumberValue() != 1 ||
					g.GetDecision() != planexv1.DecisionKind_DECISION_KIND_EDIT || g.GetActor() != "ann" || runlog.GateOpen(run, g) ||
					run.GetStatus() != planexv1.RunStatus_RUN_STATUS_RUNNING {
					t.Fatalf("step %v gate %v status %s", a, g, run.GetStatus())
				}
			},
		},
		{
			name: "open gate makes the run wait",
			evs: []*planexv1.RunEvent{
				planEv(1, added, st("a"), st("b")),
				{Payload: &planexv1.RunEvent_GateOpened{GateOpened: &planexv1.GateOpened{Gate: &planexv1.Gate{Id: "a.r1", Kind: planexv1.GateKind_GATE_KIND_STEP, StepId: "a", PlanRevision: 1}}}},
			},
			check: func(t *testing.T, run *planexv1.Run) {
				if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING || !runlog.GateOpen(run, runlog.Gate(run, "a.r1")) {
					t.Fatalf("status %s", run.GetStatus())
				}
			},
		},
		{
			name: "budget used sets tokens only",
			evs: []*planexv1.RunEvent{dispatchedNoPlan(), {Payload: &planexv1.RunEvent_BudgetUsed{BudgetUsed: &planexv1.BudgetUsed{Usage: &planexv1.BudgetUsage{
				Steps: 99, Tokens: 40, TokensReserved: 60}}}}},
			check: func(t *testing.T, run *planexv1.Run) {
				if u := run.GetUsage(); u.GetTokens() != 40 || u.GetTokensReserved() != 60 || u.GetSteps() != 1 {
					t.Fatalf("usage %v", u)
				}
			},
		},
		{
			name: "finished skips steps that never ran",
			evs: []*planexv1.RunEvent{planEv(1, added, st("a"), st("b", "a")), dispatched("a", 1),
				{Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{Status: planexv1.RunStatus_RUN_STATUS_CANCELLED, StopReason: planexv1.StopReason_STOP_REASON_CANCELLED}}}},
			check: func(t *testing.T, run *planexv1.Run) {
				if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_CANCELLED || run.GetFinishedAt() == nil ||
					stepOf(run, "b").GetStatus() != planexv1.StepStatus_STEP_STATUS_SKIPPED || stepOf(run, "a").GetStatus() != planexv1.StepStatus_STEP_STATUS_DISPATCHED {
					t.Fatalf("run %v", run)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, build(t, tt.mode, tt.evs...))
		})
	}
}

func dispatchedNoPlan() *planexv1.RunEvent { return dispatched("x", 1) }

func TestFoldIsPure(t *testing.T) {
	run := build(t, 0, planEv(1, &planexv1.PlanLineage{Added: []string{"a"}}, st("a")))
	before := proto.CloneOf(run)
	next, err := runlog.Fold(run, &planexv1.RunEvent{RunId: "r1", Sequence: 3, Time: at(3), Payload: dispatched("a", 1).Payload})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(run, before) || stepOf(next, "a").GetStatus() != planexv1.StepStatus_STEP_STATUS_DISPATCHED {
		t.Fatal("Fold modified its input or did not apply the event")
	}
}

func TestFoldRefusesBadEvents(t *testing.T) {
	finished := build(t, 0, &planexv1.RunEvent{Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{Status: planexv1.RunStatus_RUN_STATUS_FAILED}}})
	running := build(t, 0)
	tests := []struct {
		name string
		run  *planexv1.Run
		ev   *planexv1.RunEvent
	}{
		{name: "before created", ev: dispatched("a", 1)},
		{name: "second created", run: running, ev: &planexv1.RunEvent{Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{}}}},
		{name: "after finished", run: finished, ev: dispatched("a", 1)},
		{name: "no payload", run: running, ev: &planexv1.RunEvent{}},
		{name: "finished without terminal status", run: running, ev: &planexv1.RunEvent{Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{Status: planexv1.RunStatus_RUN_STATUS_RUNNING}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := runlog.Fold(tt.run, tt.ev); !errors.Is(err, runlog.ErrBadEvent) {
				t.Fatalf("err = %v, want ErrBadEvent", err)
			}
		})
	}
}

func TestDroppedFailedStepStaysInOutcomes(t *testing.T) {
	run := build(t, planexv1.PlanningMode_PLANNING_MODE_FULL,
		planEv(1, nil, st("a")),
		dispatched("a", 1),
		failed("a", 1, planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED),
		planEv(2, &planexv1.PlanLineage{PreviousRevision: 1, Added: []string{"b"}, Dropped: []string{"a"}}, st("b")),
	)
	outs := runlog.Outcomes(run)
	if len(outs) != 1 || outs[0].GetStepId() != "a" || outs[0].GetStatus() != planexv1.StepStatus_STEP_STATUS_FAILED {
		t.Fatalf("outcomes after dropping a failed step = %v, want a FAILED", outs)
	}
	if outs[0].GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED {
		t.Fatalf("dropped step lost its error: %v", outs[0].GetError())
	}
}

// State.Clone shares the run's plans and step states and copies the rest
// field by field; a repeated or map field added to Run must be handled
// there (shared only if the fold never changes it in place).
func TestCloneKnowsEveryCollectionOfRun(t *testing.T) {
	handled := map[string]bool{"plans": true, "steps": true, "gates": true, "labels": true, "forks": true, "children": true}
	fields := (&planexv1.Run{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if (fd.IsList() || fd.IsMap()) && !handled[string(fd.Name())] {
			t.Errorf("Run.%s is a collection State.Clone does not copy: handle it in cloneRun", fd.Name())
		}
	}
}

// Changing a clone (by folding events into it) never changes the original,
// although they share step states.
func TestCloneIsolatesTheFold(t *testing.T) {
	var l runlog.Log
	emit := func(st *runlog.State, evs ...*planexv1.RunEvent) *runlog.State {
		t.Helper()
		tx := l.Begin(st)
		for _, ev := range evs {
			if err := tx.Emit(ev); err != nil {
				t.Fatal(err)
			}
		}
		return tx.State()
	}
	orig := emit(&runlog.State{},
		&planexv1.RunEvent{RunId: "R", Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "g", Budget: &planexv1.Budget{MaxSteps: 5}}}},
		planEv(1, nil, st("x"), st("y", "x")),
		dispatched("x", 1),
	)
	// The progress ledger is changed in place by the fold (a success
	// resets its replan counter).
	orig.Run.Progress = &planexv1.ProgressLedger{ReplansSinceSuccess: 2}
	before := proto.CloneOf(orig.Run)
	next := emit(orig, succeeded("x", 1), dispatched("y", 1))
	if !proto.Equal(orig.Run, before) {
		t.Fatalf("folding into a clone changed the original run")
	}
	// The progress ledger (changed in place by replans and revisions).
	replanned := emit(orig, &planexv1.RunEvent{Payload: &planexv1.RunEvent_ReplanRequested{ReplanRequested: &planexv1.ReplanRequested{Reason: "r"}}},
		planEv(2, nil, st("z")))
	if !proto.Equal(orig.Run, before) {
		t.Fatalf("a replan folded into a clone changed the original run's progress ledger: %v", orig.Run.GetProgress())
	}
	if replanned.Run.GetProgress().GetReplansSinceSuccess() != 3 || len(replanned.Run.GetProgress().GetPlanHashes()) != 1 {
		t.Fatalf("clone's progress ledger %v, want three replans since success and one plan hash", replanned.Run.GetProgress())
	}
	if next.Run.GetProgress().GetReplansSinceSuccess() != 0 {
		t.Fatalf("clone's replans since success %d, want 0", next.Run.GetProgress().GetReplansSinceSuccess())
	}
	// Deadlines are kept for attempts in flight only, and the original's
	// map is not changed by the clone's fold.
	if _, ok := orig.Deadlines["x"]; !ok {
		t.Fatalf("original lost x's deadline: %v", orig.Deadlines)
	}
	if _, ok := next.Deadlines["x"]; ok {
		t.Fatalf("clone keeps the deadline of x, whose attempt ended: %v", next.Deadlines)
	}
	if _, ok := next.Deadlines["y"]; !ok {
		t.Fatalf("clone has no deadline for y in flight: %v", next.Deadlines)
	}
	if runlog.Step(next.Run, "x").GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED ||
		runlog.Step(orig.Run, "x").GetStatus() != planexv1.StepStatus_STEP_STATUS_DISPATCHED || next.Run.GetUsage().GetSteps() != 2 {
		t.Fatalf("clone x %s steps %d, original x %s", runlog.Step(next.Run, "x").GetStatus(), next.Run.GetUsage().GetSteps(), runlog.Step(orig.Run, "x").GetStatus())
	}
}
