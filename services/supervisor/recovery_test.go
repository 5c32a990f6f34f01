package supervisor_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// Issue 12's reproduction: a burst of 60 runs on two replicas, one killed
// (its NATS connection closed without acking) 0.6s in, while it holds
// prefetched step results. Step timeouts (1s) are shorter than the engine
// ack wait (3s) after which the results come back, and retries are off,
// so only the timeout's look at the inbox keeps succeeded steps from
// failing: every run must succeed, each attempt executed once.
func TestKilledReplicaDuringBurstFailsNoRun(t *testing.T) {
	// Not parallel: its timing (timeouts against the ack wait) must not
	// compete with the package's load tests.
	h := newHarness(t)
	h.ackWait = 3 * time.Second
	h.planner.on("burst*", always(
		noRetry(step("a", "test.sleep", map[string]any{"ms": 300})),
		noRetry(step("b", "test.sleep", map[string]any{"ms": 300}, "a")),
	))
	a, b := h.startReplica(), h.startReplica()
	const runs = 60
	ids := make([]string, runs)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = start(t, b.client, &planexv1.StartRunRequest{
				Goal: fmt.Sprintf("burst %d", i), Budget: &planexv1.Budget{StepTimeout: durationpb.New(time.Second)},
			})
		}()
	}
	time.Sleep(600 * time.Millisecond) // the timing: kill 0.6s into the burst
	pending := h.ackPending()
	a.kill()
	wg.Wait()
	t.Logf("engine messages unacknowledged when the replica died: %d", pending)
	if pending == 0 {
		t.Fatal("the killed replica held no engine message: the crash did not land mid-burst")
	}
	failed := 0
	for _, id := range ids {
		run := waitTerminal(t, b.client, id, 60*time.Second)
		if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || run.GetUsage().GetReplans() != 0 {
			failed++
			t.Errorf("run %s: %s %s %q", id, run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d runs did not succeed", failed, runs)
	}
	logs := h.allEvents()
	for _, id := range ids {
		assertOnce(t, h, id, logs[id])
		if n := len(h.pool.executions(id)); n != 2 {
			t.Fatalf("run %s: %d attempts executed, want 2", id, n)
		}
	}
}

// ackPending is the number of delivered, unacknowledged messages of both
// engine consumers.
func (h *harness) ackPending() int {
	h.t.Helper()
	n := 0
	for _, name := range []string{bus.ConsumerEngine, engine.ConsumerTimers} {
		c, err := h.res.JS.Consumer(testCtx(h.t, 5*time.Second), bus.StreamEngine, name)
		if err != nil {
			h.t.Fatal(err)
		}
		ci, err := c.Info(testCtx(h.t, 5*time.Second))
		if err != nil {
			h.t.Fatal(err)
		}
		n += ci.NumAckPending
	}
	return n
}

// commitEvents appends events to a new run's log as a supervisor would,
// and returns the state after them.
func commitEvents(t *testing.T, h *harness, log *runlog.Log, st *runlog.State, evs ...*planexv1.RunEvent) *runlog.State {
	t.Helper()
	tx := log.Begin(st)
	for _, ev := range evs {
		if err := tx.Emit(ev); err != nil {
			t.Fatal(err)
		}
	}
	next, err := log.Commit(testCtx(t, 10*time.Second), tx)
	if err != nil {
		t.Fatal(err)
	}
	return next
}

// createdRun returns the first events of a run whose first plan is p.
func createdRun(t *testing.T, runID, goal string, p *planexv1.Plan) []*planexv1.RunEvent {
	t.Helper()
	budget, err := engine.DefaultLimits().Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Revision = 1
	var ids []string
	for _, s := range p.GetSteps() {
		ids = append(ids, s.GetId())
	}
	p.Lineage = &planexv1.PlanLineage{Added: ids}
	created := engine.Event(&planexv1.RunCreated{Goal: goal, Budget: budget, Mode: planexv1.PlanningMode_PLANNING_MODE_FULL})
	created.RunId = runID
	return []*planexv1.RunEvent{created, engine.Event(&planexv1.PlanRevised{Plan: p})}
}

// A run whose log ends at ReplanRequested and whose planning kick was
// lost (nothing in its inbox) is found by the sweeper and finishes.
func TestSweeperFinishesAStrandedRun(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := testCtx(t, 30*time.Second)
	log, err := runlog.New(ctx, h.res, natstest.Logger(t), runlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const runID = "01STRANDEDREPLAN"
	h.planner.on("stranded", always(step("b", "test.echo", map[string]any{"value": "recovered"})))
	evs := createdRun(t, runID, "stranded", planOf(step("a", "test.fail", map[string]any{"message": "boom"})).GetPlan())
	evs = append(evs,
		engine.Event(&planexv1.StepDispatched{StepId: "a", Attempt: 1, PlanRevision: 1, Tool: "test.fail",
			ResolvedArgs: mustStruct(map[string]any{"message": "boom"}), Deadline: timestamppb.New(time.Now().Add(time.Minute))}),
		engine.Event(&planexv1.StepFailed{StepId: "a", Attempt: 1, Error: &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, Message: "tool failed: boom"}}),
		engine.Event(&planexv1.ReplanRequested{Reason: "step a failed", StepId: "a"}),
	)
	st := commitEvents(t, h, log, &runlog.State{}, evs...)
	if st.Run.GetStatus() != planexv1.RunStatus_RUN_STATUS_PLANNING {
		t.Fatalf("stranded run is %s, want PLANNING", st.Run.GetStatus())
	}
	// The shape of the issue: no kick, no timer, nothing pending.
	if n := h.inboxMessages(runID); n != 0 {
		t.Fatalf("%d engine messages pending for the stranded run", n)
	}
	r := h.startReplica(func(c *engine.Config) {
		c.SweepInterval = 200 * time.Millisecond
		c.StrandedAfter = 500 * time.Millisecond
	})
	run := waitTerminal(t, r.client, runID, 20*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("stranded run: %s %s %q", run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
	reqs := h.planner.requests(runID)
	if len(reqs) != 1 || reqs[0].GetRevision() != 2 || reqs[0].GetHistory().GetReplanReason() == "" {
		t.Fatalf("planner requests %d (revision %d, reason %q), want one replan for revision 2", len(reqs), reqs[0].GetRevision(), reqs[0].GetHistory().GetReplanReason())
	}
	assertOnce(t, h, runID, watchAll(t, r.client, runID, 1))
}

// inboxMessages counts the messages on the run's engine subjects.
func (h *harness) inboxMessages(runID string) int {
	h.t.Helper()
	st, err := h.res.JS.Stream(testCtx(h.t, 5*time.Second), bus.StreamEngine)
	if err != nil {
		h.t.Fatal(err)
	}
	n := 0
	for _, subj := range []string{bus.EngineSubject(runID, "*"), bus.EngineSubject(runID, bus.KindTimer)} {
		info, err := st.Info(testCtx(h.t, 5*time.Second), jetstream.WithSubjectFilter(subj))
		if err != nil {
			h.t.Fatal(err)
		}
		for _, c := range info.State.Subjects {
			n += int(c)
		}
	}
	return n
}

// A replica killed right after appending a run's RunFinished, before its
// snapshot write: ListRuns still finds the stale RUNNING snapshot, checks
// the log, answers SUCCEEDED and repairs the snapshot.
func TestListRunsConvergesAfterAReplicaDiedAtTheFinalEvent(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := testCtx(t, 30*time.Second)
	log, err := runlog.New(ctx, h.res, natstest.Logger(t), runlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const runID = "01DIEDATFINISH"
	evs := createdRun(t, runID, "died at finish", planOf(step("a", "test.echo", map[string]any{"value": 1})).GetPlan())
	evs = append(evs,
		engine.Event(&planexv1.StepDispatched{StepId: "a", Attempt: 1, PlanRevision: 1, Tool: "test.echo",
			ResolvedArgs: mustStruct(map[string]any{"value": 1}), Deadline: timestamppb.New(time.Now().Add(time.Minute))}),
		engine.Event(&planexv1.StepSucceeded{StepId: "a", Attempt: 1, Output: mustValue(map[string]any{"value": 1})}),
	)
	st := commitEvents(t, h, log, &runlog.State{}, evs...)
	// The dying replica appends the last event and nothing else.
	tx := log.Begin(st)
	if err := tx.Emit(engine.Event(&planexv1.RunFinished{Status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, StopReason: planexv1.StopReason_STOP_REASON_SUCCEEDED})); err != nil {
		t.Fatal(err)
	}
	last := tx.Events()[0]
	seq := st.StreamSeq
	if _, err := bus.Publish(ctx, h.res.JS, bus.Publication{
		Subject: bus.RunLogSubject(runID), Msg: last, MsgID: bus.MsgID(runID, "ev", fmt.Sprint(last.GetSequence())),
		ExpectLastSubjectSeq: &seq, ExpectLastSubjectSeqFilter: bus.RunLogFilter(runID),
	}); err != nil {
		t.Fatal(err)
	}
	fresh, err := runlog.New(ctx, h.res, natstest.Logger(t), runlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if snap, err := fresh.Snapshot(ctx, runID); err != nil || snap.GetStatus() != planexv1.RunStatus_RUN_STATUS_RUNNING {
		t.Fatalf("snapshot before ListRuns: %s %v, want the stale RUNNING", snap.GetStatus(), err)
	}
	r := h.startReplica()
	resp, err := r.client.ListRuns(ctx, &planexv1.ListRunsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetRuns()) != 1 || resp.GetRuns()[0].GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("ListRuns: %v", resp.GetRuns())
	}
	if snap, err := fresh.Snapshot(ctx, runID); err != nil || snap.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("snapshot after ListRuns: %s %v, want it repaired", snap.GetStatus(), err)
	}
	// Filtering by status sees the truth too.
	resp, err = r.client.ListRuns(ctx, &planexv1.ListRunsRequest{Statuses: []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_RUNNING}})
	if err != nil || len(resp.GetRuns()) != 0 {
		t.Fatalf("ListRuns RUNNING: %v %v", resp.GetRuns(), err)
	}
}

// A leaf sql.query-like step returning ~2 MB, with no answer expression:
// the run's result exceeds the NATS payload limit, goes to the object
// store by reference, and the run finishes; GetRun returns the result.
func TestLargeResultFinishesTheRun(t *testing.T) {
	h, r := setup(t)
	const size = 2_000_000
	id := h.runGoal(t, r, "big result", always(step("rows", "test.big", map[string]any{"bytes": size})))
	run := succeeded(t, r, id)
	if got := len(run.GetResult().GetStructValue().GetFields()["rows"].GetStructValue().GetFields()["data"].GetStringValue()); got != size {
		t.Fatalf("result data %d bytes, want %d", got, size)
	}
	if ref := run.GetResultRef(); ref == nil || ref.GetSize() < size {
		t.Fatalf("result_ref %v, want the stored result", ref)
	}
	evs := watchAll(t, r.client, id, 1)
	fin := evs[len(evs)-1].GetFinished()
	if fin.GetResult() != nil || fin.GetResultRef() == nil {
		t.Fatalf("RunFinished carries the result inline")
	}
}

func mustValue(v any) *structpb.Value {
	out, err := structpb.NewValue(v)
	if err != nil {
		panic(err)
	}
	return out
}

// The deterministic form of the burst. Every step waits on a gate; once
// all are running, replica b is killed, and a zombie replica (a consumer on
// the shared durable that fetches and never acks) is the only one pulling
// when the gate opens: it takes every step result and dies. A fresh
// replica c then handles the steps' start-to-close timers (3s), which fall
// due while the results wait out the 6s ack wait: the timers find them in
// the inbox and wait, and every run succeeds with its first attempt. (With
// the inbox check removed, every run times out and replans.)
func TestTimeoutWaitsForResultsADeadReplicaHeld(t *testing.T) {
	// Not parallel: its timing (timeouts against the ack wait) must not
	// compete with the package's load tests.
	h := newHarness(t)
	h.ackWait = 6 * time.Second
	h.planner.on("held*", always(noRetry(step("a", "test.gate", map[string]any{}))))
	b := h.startReplica()
	const runs = 10
	ids := make([]string, runs)
	for i := range runs {
		ids[i] = start(t, b.client, &planexv1.StartRunRequest{
			Goal: fmt.Sprintf("held %d", i), Budget: &planexv1.Budget{StepTimeout: durationpb.New(3 * time.Second)},
		})
	}
	for _, id := range ids {
		waitRun(t, b.client, id, 10*time.Second, "step running", func(run *planexv1.Run) bool {
			return runlog.Step(run, "a").GetStatus() == planexv1.StepStatus_STEP_STATUS_RUNNING
		})
	}
	b.kill()
	nc := h.srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(testCtx(t, 5*time.Second), bus.StreamEngine, bus.ConsumerEngine)
	if err != nil {
		t.Fatal(err)
	}
	h.pool.openGate()
	held := 0
	for end := time.Now().Add(5 * time.Second); held < runs && time.Now().Before(end); {
		batch, err := cons.Fetch(100, jetstream.FetchMaxWait(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if _, kind, _ := bus.ParseEngineSubject(m.Subject()); kind == bus.KindResult {
				held++
			}
		}
	}
	nc.Close()
	t.Logf("the dead replica held %d of %d step results", held, runs)
	if held != runs {
		t.Fatal("the dead replica did not hold every step result: the crash did not land where claimed")
	}
	c := h.startReplica()
	for _, id := range ids {
		run := waitTerminal(t, c.client, id, 30*time.Second)
		if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || run.GetUsage().GetSteps() != 1 || run.GetUsage().GetReplans() != 0 {
			t.Errorf("run %s: %s %s %q after %d attempts and %d replans, want SUCCEEDED with its first attempt",
				id, run.GetStatus(), run.GetStopReason(), run.GetStopMessage(), run.GetUsage().GetSteps(), run.GetUsage().GetReplans())
		}
	}
}
