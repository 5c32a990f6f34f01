package supervisor_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// A supervisor that appended StepDispatched and died before publishing the
// step: the next replica to load the run publishes it (once) and the run
// finishes.
func TestCrashBetweenAppendAndPublishIsRepaired(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := testCtx(t, 20*time.Second)
	log, err := runlog.New(ctx, h.res, natstest.Logger(t), runlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	budget, err := engine.DefaultLimits().Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	const runID = "01DEADREPLICA"
	p := planOf(step("a", "test.echo", map[string]any{"value": "lost"})).GetPlan()
	p.Revision = 1
	p.Lineage = &planexv1.PlanLineage{Added: []string{"a"}}
	tx := log.Begin(&runlog.State{})
	created := engine.Event(&planexv1.RunCreated{Goal: "repair", Budget: budget, Mode: planexv1.PlanningMode_PLANNING_MODE_FULL})
	created.RunId = runID
	for _, ev := range []*planexv1.RunEvent{
		created,
		engine.Event(&planexv1.PlanRevised{Plan: p}),
		engine.Event(&planexv1.StepDispatched{StepId: "a", Attempt: 1, PlanRevision: 1, Tool: "test.echo",
			ResolvedArgs: mustStruct(map[string]any{"value": "lost"}), Deadline: timestamppb.New(time.Now().Add(time.Minute))}),
	} {
		if err := tx.Emit(ev); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := log.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	// The message the dead replica was handling comes back to the next one.
	if _, err := bus.Publish(ctx, h.res.JS, bus.Publication{
		Subject: bus.EngineSubject(runID, bus.KindKick), Msg: &planexv1.EngineKick{RunId: runID, Reason: "redelivered"},
		MsgID: engine.PlanKickID(runID, 1, 0),
	}); err != nil {
		t.Fatal(err)
	}
	r := h.startReplica()
	run := waitTerminal(t, r.client, runID, 10*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("status %s %q", run.GetStatus(), run.GetStopMessage())
	}
	// A second replica with a cold cache repairs again: the server drops
	// the duplicate request, the step is not executed twice.
	r2 := h.startReplica()
	if _, err := r2.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: runID}); err != nil {
		t.Fatal(err)
	}
	evs := watchAll(t, r.client, runID, 1)
	assertOnce(t, h, runID, evs)
	if n := h.pool.executions(runID)["a/1"]; n != 1 {
		t.Fatalf("a/1 executed %d times", n)
	}
}

// Killing a replica mid-run (its NATS connection closes without draining)
// leaves its messages unacknowledged; another replica finishes the run from
// the log, without repeating a step or losing an event.
func TestKilledSupervisorRunIsFinishedByAnother(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var chain []*planexv1.Step
	for i := range 6 {
		s := step(fmt.Sprintf("s%d", i), "test.sleep", map[string]any{"ms": 150})
		if i > 0 {
			s.DependsOn = []string{fmt.Sprintf("s%d", i-1)}
		}
		chain = append(chain, s)
	}
	h.planner.on("crash chain", always(chain...))
	a := h.startReplica()
	id := start(t, a.client, &planexv1.StartRunRequest{Goal: "crash chain"})
	waitRun(t, a.client, id, 10*time.Second, "two steps done", func(run *planexv1.Run) bool {
		done := 0
		for _, s := range run.GetSteps() {
			if s.GetStatus() == planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
				done++
			}
		}
		return done >= 2
	})
	a.kill()
	b := h.startReplica()
	succeeded(t, b, id)
	evs := watchAll(t, b.client, id, 1)
	assertOnce(t, h, id, evs)
	if n := len(h.pool.executions(id)); n != 6 {
		t.Fatalf("executed %d attempts, want 6: %v", n, h.pool.executions(id))
	}
}

// A replica that dies during a planner call leaves the planning kick
// unacknowledged; after the ack wait another replica calls the planner
// again and the run goes on.
func TestKilledDuringPlannerCall(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	h.planner.on("slow planner", func(n int, _ *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
		if n == 0 {
			once.Do(func() { close(entered) })
			<-release
		}
		return planOf(step("a", "test.echo", map[string]any{"value": n})), nil
	})
	a := h.startReplica()
	id := start(t, a.client, &planexv1.StartRunRequest{Goal: "slow planner"})
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("planner not called")
	}
	a.kill()
	b := h.startReplica()
	run := waitTerminal(t, b.client, id, 20*time.Second)
	close(release)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("status %s %q", run.GetStatus(), run.GetStopMessage())
	}
	// The second call answered; the dead replica's answer never landed.
	if got := run.GetResult().GetStructValue().GetFields()["a"].GetStructValue().GetFields()["value"].GetNumberValue(); got != 1 {
		t.Fatalf("result %v, want the second call's plan", run.GetResult())
	}
	evs := watchAll(t, b.client, id, 1)
	assertOnce(t, h, id, evs)
	if count(evs, "plan_revised") != 1 || len(h.planner.requests(id)) != 2 {
		t.Fatalf("plan revisions %d, planner calls %d", count(evs, "plan_revised"), len(h.planner.requests(id)))
	}
}

// Two replicas share the engine consumers and process 200 concurrent runs:
// every run ends, none is advanced twice (contiguous sequences, each
// attempt dispatched and executed once).
func TestTwoReplicasProcess200ConcurrentRuns(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("200 runs: skipped in -short")
	}
	h := newHarness(t)
	h.planner.on("many*", always(
		step("a", "test.echo", map[string]any{"value": "${{ goal }}"}),
		step("b", "test.echo", map[string]any{"value": "${{ steps.a.output.value }}"}, "a"),
		step("c", "test.echo", map[string]any{"value": 3}, "a"),
	))
	replicas := []*replica{h.startReplica(), h.startReplica()}
	const runs = 200
	t0 := time.Now()
	ids := make([]string, runs)
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := replicas[i%2].client.StartRun(testCtx(t, 20*time.Second), &planexv1.StartRunRequest{
				Goal: fmt.Sprintf("many %d", i), Budget: &planexv1.Budget{StepTimeout: durationpb.New(30 * time.Second)},
			})
			if err != nil {
				errs <- err
				return
			}
			ids[i] = resp.GetRun().GetId()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("started %d runs in %s", runs, time.Since(t0))
	for i, id := range ids {
		run := waitTerminal(t, replicas[(i+1)%2].client, id, 40*time.Second)
		if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
			t.Fatalf("run %d (%s): %s %q", i, id, run.GetStatus(), run.GetStopMessage())
		}
		if got := run.GetResult().GetStructValue().GetFields()["b"].GetStructValue().GetFields()["value"].GetStringValue(); got != fmt.Sprintf("many %d", i) {
			t.Fatalf("run %d result %v", i, run.GetResult())
		}
	}
	t.Logf("all terminal after %s", time.Since(t0))
	logs := h.allEvents()
	t.Logf("verified after %s", time.Since(t0))
	for _, id := range ids {
		evs := logs[id]
		assertOnce(t, h, id, evs)
		if n := count(evs, "plan_revised"); n != 1 {
			t.Fatalf("run %s: %d plan revisions", id, n)
		}
		if n := len(h.pool.executions(id)); n != 3 {
			t.Fatalf("run %s: %d executions", id, n)
		}
	}
}

// Timers are persisted messages: a run's deadline still fires when the
// replica that set it died and another replica took over.
func TestDeadlineFiresAfterReplicaRestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.planner.on("slow run", always(step("slow", "test.sleep", map[string]any{"ms": 20000})))
	a := h.startReplica()
	id := start(t, a.client, &planexv1.StartRunRequest{Goal: "slow run", Budget: &planexv1.Budget{Deadline: durationpb.New(2 * time.Second)}})
	waitRun(t, a.client, id, 10*time.Second, "slow step dispatched", func(run *planexv1.Run) bool {
		for _, s := range run.GetSteps() {
			if s.GetStepId() == "slow" && s.GetAttempt() == 1 {
				return true
			}
		}
		return false
	})
	a.kill()
	b := h.startReplica()
	run := waitTerminal(t, b.client, id, 20*time.Second)
	if run.GetStopReason() != planexv1.StopReason_STOP_REASON_DEADLINE {
		t.Fatalf("run stopped with %s %q, want the deadline", run.GetStopReason(), run.GetStopMessage())
	}
	if took := run.GetFinishedAt().AsTime().Sub(run.GetCreatedAt().AsTime()); took < 2*time.Second {
		t.Fatalf("deadline fired after %v, before the 2s budget", took)
	}
}

// A StartRun that died after appending RunCreated but before kicking the
// engine leaves a pending run; the start guard timer it published first
// kicks it. A guard for a run that was never created is dropped.
func TestStartGuardKicksARunStartRunLeftPending(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.planner.on("guarded", always(step("a", "test.echo", map[string]any{"value": "ok"})))
	r := h.startReplica()
	ctx := testCtx(t, 20*time.Second)
	log, err := runlog.New(ctx, h.res, natstest.Logger(t), runlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	budget, err := engine.DefaultLimits().Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	const runID, ghost = "01STARTGUARD", "01NEVERCREATED"
	for _, id := range []string{runID, ghost} {
		if err := engine.PublishStartGuard(ctx, h.res.JS, id, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	tx := log.Begin(&runlog.State{})
	created := engine.Event(&planexv1.RunCreated{Goal: "guarded", Budget: budget, Mode: planexv1.PlanningMode_PLANNING_MODE_FULL})
	created.RunId = runID
	if err := tx.Emit(created); err != nil {
		t.Fatal(err)
	}
	if _, err := log.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	// No kick: StartRun "died" here.
	run := waitTerminal(t, r.client, runID, 15*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("guarded run: %s %q", run.GetStatus(), run.GetStopMessage())
	}
	if got := len(h.planner.requests(runID)); got != 1 {
		t.Fatalf("planner called %d times, want 1", got)
	}
	if _, err := r.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: ghost}); status.Code(err) != codes.NotFound {
		t.Fatalf("the ghost run's guard created something: %v", err)
	}
}
