package supervisor_test

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/api"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// checkLog verifies a run's hash chain (audit verify) and replays it with
// the current engine (planex replay): a reset or fork must leave a log
// both understand.
func checkLog(t *testing.T, r *replica, id string) []*planexv1.RunEvent {
	t.Helper()
	events := watchAll(t, r.client, id, 0)
	if _, err := runlog.Verify(events, nil); err != nil {
		t.Fatalf("run %s: audit verify: %v", id, err)
	}
	res, err := engine.Replay(t.Context(), events, engine.ReplayConfig{Tools: toolSpecs()})
	if err != nil {
		t.Fatalf("run %s: replay: %v", id, err)
	}
	if res.Divergence != nil {
		t.Fatalf("run %s: replay diverges: %v", id, res.Divergence)
	}
	return events
}

func code(err error) codes.Code { return status.Code(err) }

// A tool was broken and is fixed: a reset re-runs only the failed step and
// its dependents; the steps that succeeded keep their results, and a
// succeeded side effect is never executed again, even by a reset from a
// step before it.
func TestResetRerunsFailedStepAndNeverRepeatsSideEffects(t *testing.T) {
	h, r := setup(t)
	ctx := testCtx(t, 60*time.Second)
	plan := planOf(
		step("a", "test.echo", map[string]any{"value": "A"}),
		step("send", "test.flakysend", map[string]any{"fail": 0}, "a"),
		// After send: the run fails with b, and a run that fails while
		// send is in flight leaves its outcome unknown (a reset must then
		// be told what to do with it: TestResetUnknownOutcomeNeedsDecision).
		noRetry(step("b", "test.flaky", map[string]any{"fail": 1, "code": "UNAVAILABLE"}, "a", "send")),
		step("c", "test.echo", map[string]any{"value": "${{ steps.b.output.attempt }}"}, "b"),
	)
	id := h.runGoal(t, r, "reset after a fix", giveUpAfter(nil, plan.GetPlan().GetSteps()...))
	failed := waitTerminal(t, r.client, id, 20*time.Second)
	if failed.GetStatus() != planexv1.RunStatus_RUN_STATUS_FAILED {
		t.Fatalf("run: %s %s %q, want FAILED", failed.GetStatus(), failed.GetStopReason(), failed.GetStopMessage())
	}

	// A dry run says what would happen and changes nothing.
	dry, err := r.client.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: id, Reason: "the flaky service is fixed", DryRun: true})
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	if !slices.Equal(dry.GetRerun(), []string{"b", "c"}) || !slices.Equal(dry.GetKept(), []string{"a", "send"}) || !dry.GetDryRun() {
		t.Fatalf("dry run: rerun %v kept %v, want [b c] and [a send]", dry.GetRerun(), dry.GetKept())
	}
	if got := waitTerminal(t, r.client, id, time.Second); got.GetLastSequence() != failed.GetLastSequence() {
		t.Fatalf("dry run appended events: last sequence %d, was %d", got.GetLastSequence(), failed.GetLastSequence())
	}

	resp, err := r.client.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: id, Reason: "the flaky service is fixed", RequestId: "fix-1", Actor: "oncall"})
	if err != nil {
		t.Fatalf("ResetRun: %v", err)
	}
	if resp.GetRun().GetResets() != 1 || runlog.Terminal(resp.GetRun().GetStatus()) {
		t.Fatalf("after the reset: resets %d status %s", resp.GetRun().GetResets(), resp.GetRun().GetStatus())
	}
	run := succeeded(t, r, id)
	if got := run.GetResult(); got == nil {
		t.Fatalf("reset run has no result")
	}
	execs := h.pool.executions(id)
	want := map[string]int{"a/1": 1, "send/1": 1, "b/1": 1, "b/2": 1, "c/1": 1}
	for k, n := range want {
		if execs[k] != n {
			t.Errorf("executions of %s: %d, want %d (all: %v)", k, execs[k], n, execs)
		}
	}
	if len(execs) != len(want) {
		t.Errorf("executions %v, want exactly %v", execs, want)
	}
	// The same request again is the same reset, not a second one.
	again, err := r.client.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: id, Reason: "the flaky service is fixed", RequestId: "fix-1"})
	if err != nil || again.GetRun().GetResets() != 1 {
		t.Fatalf("repeated request: resets %d, err %v; want the first reset", again.GetRun().GetResets(), err)
	}

	// A reset from a step before the side effect re-runs the reads and
	// keeps the mail: it happened.
	resp, err = r.client.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: id, FromStep: "a", Reason: "recompute from a"})
	if err != nil {
		t.Fatalf("ResetRun from a: %v", err)
	}
	if !slices.Equal(resp.GetKeptSideEffects(), []string{"send"}) || !slices.Equal(resp.GetRerun(), []string{"a", "b", "c"}) {
		t.Fatalf("reset from a: rerun %v, kept side effects %v; want [a b c] and [send]", resp.GetRerun(), resp.GetKeptSideEffects())
	}
	succeeded(t, r, id)
	execs = h.pool.executions(id)
	if n := execs["send/1"] + execs["send/2"] + execs["send/3"]; n != 1 {
		t.Fatalf("the side effect ran %d times, want once (executions %v)", n, execs)
	}
	if execs["a/2"] != 1 || execs["b/3"] != 1 || execs["c/2"] != 1 {
		t.Fatalf("reset from a: executions %v, want a/2, b/3 and c/2 once each", execs)
	}

	// Resetting from the side effect itself is refused, saying what to do.
	_, err = r.client.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: id, FromStep: "send", Reason: "send again"})
	if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "never repeats") || !strings.Contains(err.Error(), "fork") {
		t.Fatalf("reset from the side effect: %v, want FailedPrecondition saying a reset never repeats one and to fork", err)
	}
	// Bad requests name their field.
	for _, c := range []struct {
		req  *planexv1.ResetRunRequest
		want string
	}{
		{&planexv1.ResetRunRequest{RunId: id}, "reason: required"},
		{&planexv1.ResetRunRequest{RunId: id, Reason: "x", FromStep: "nope"}, "from_step"},
		{&planexv1.ResetRunRequest{RunId: id, Reason: "x", ToSequence: 9999}, "to_sequence 9999"},
		{&planexv1.ResetRunRequest{RunId: id, Reason: "x", FromStep: "b", StepArgs: map[string]*structpb.Struct{"a": mustStruct(map[string]any{"value": 1})}}, "step_args.a"},
		{&planexv1.ResetRunRequest{RunId: id, Reason: "x", FromStep: "b", StepArgs: map[string]*structpb.Struct{"b": mustStruct(map[string]any{"fail": "many"})}}, "step_args"},
	} {
		if _, err := r.client.ResetRun(ctx, c.req); code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ResetRun(%v): %v, want InvalidArgument naming %q", c.req, err, c.want)
		}
	}
	events := checkLog(t, r, id)
	resets := 0
	for _, ev := range events {
		if rr := ev.GetRunReset(); rr != nil {
			resets++
			if rr.GetReason() == "" || rr.GetPreviousStatus() == planexv1.RunStatus_RUN_STATUS_UNSPECIFIED {
				t.Errorf("reset event %d lacks its reason or previous status: %v", ev.GetSequence(), rr)
			}
		}
	}
	if resets != 2 {
		t.Fatalf("%d RunReset events, want 2", resets)
	}
}

// A reset to an event goes back to the state after it: what succeeded by
// then keeps its result, and the run continues with the plan current then.
func TestResetToEvent(t *testing.T) {
	h, r := setup(t)
	plan := planOf(
		step("a", "test.echo", map[string]any{"value": 1}),
		step("b", "test.echo", map[string]any{"value": 2}, "a"),
		step("c", "test.echo", map[string]any{"value": 3}, "b"),
	)
	id := h.runGoal(t, r, "reset to an event", always(plan.GetPlan().GetSteps()...))
	succeeded(t, r, id)
	var after uint64
	for _, ev := range watchAll(t, r.client, id, 0) {
		if s := ev.GetStepSucceeded(); s != nil && s.GetStepId() == "a" {
			after = ev.GetSequence()
		}
	}
	resp, err := r.client.ResetRun(testCtx(t, 10*time.Second), &planexv1.ResetRunRequest{RunId: id, ToSequence: after, Reason: "redo after a"})
	if err != nil {
		t.Fatalf("ResetRun: %v", err)
	}
	if !slices.Equal(resp.GetKept(), []string{"a"}) || !slices.Equal(resp.GetRerun(), []string{"b", "c"}) {
		t.Fatalf("reset to event %d: kept %v rerun %v, want [a] and [b c]", after, resp.GetKept(), resp.GetRerun())
	}
	succeeded(t, r, id)
	if e := h.pool.executions(id); e["a/1"] != 1 || e["a/2"] != 0 || e["b/2"] != 1 || e["c/2"] != 1 {
		t.Fatalf("executions %v, want a once and b, c twice", e)
	}
	checkLog(t, r, id)
}

// A side-effecting step whose outcome is unknown needs the operator's
// decision before a reset restarts the run.
func TestResetUnknownOutcomeNeedsDecision(t *testing.T) {
	h, r := setup(t)
	ctx := testCtx(t, 30*time.Second)
	plan := planOf(
		step("send", "test.unknown", map[string]any{}),
		step("after", "test.echo", map[string]any{"value": "done"}, "send"),
	)
	id := h.runGoal(t, r, "unknown outcome", always(plan.GetPlan().GetSteps()...))
	run := waitTerminal(t, r.client, id, 20*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_ESCALATED {
		t.Fatalf("run %s %s, want ESCALATED", run.GetStatus(), run.GetStopReason())
	}
	_, err := r.client.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: id, Reason: "checked the mail server"})
	if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `"send"`) || !strings.Contains(err.Error(), "unknown_outcomes") {
		t.Fatalf("reset without a decision: %v, want FailedPrecondition naming step send and unknown_outcomes", err)
	}
	_, err = r.client.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: id, Reason: "x", UnknownOutcomes: []*planexv1.UnknownOutcome{{StepId: "after", Action: planexv1.UnknownOutcomeAction_UNKNOWN_OUTCOME_ACTION_RETRY}, {StepId: "send", Action: planexv1.UnknownOutcomeAction_UNKNOWN_OUTCOME_ACTION_DONE}}})
	if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"after"`) {
		t.Fatalf("a decision for a step that needs none: %v, want InvalidArgument naming it", err)
	}
	if _, err := r.client.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: id, Reason: "the mail went out (checked the server log)",
		UnknownOutcomes: []*planexv1.UnknownOutcome{{StepId: "send", Action: planexv1.UnknownOutcomeAction_UNKNOWN_OUTCOME_ACTION_DONE}}}); err != nil {
		t.Fatalf("reset with a decision: %v", err)
	}
	done := succeeded(t, r, id)
	if st := runlog.Step(done, "send"); st.GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
		t.Fatalf("send: %s, want SUCCEEDED by the operator's decision", st.GetStatus())
	}
	if e := h.pool.executions(id); e["send/1"] != 1 || e["send/2"] != 0 || e["after/1"] != 1 {
		t.Fatalf("executions %v: send must not run again", e)
	}
	checkLog(t, r, id)
}

// A fork with edited arguments is a new run sharing the original's
// results up to the point: they are not executed again.
func TestForkWithEditedArgs(t *testing.T) {
	h, r := setup(t)
	ctx := testCtx(t, 30*time.Second)
	plan := planOf(
		step("a", "test.echo", map[string]any{"value": "A"}),
		step("b", "test.echo", map[string]any{"value": "B"}, "a"),
		step("c", "test.echo", map[string]any{"value": "${{ steps.b.output.value }}"}, "b"),
	)
	id := h.runGoal(t, r, "fork me", always(plan.GetPlan().GetSteps()...))
	succeeded(t, r, id)
	resp, err := r.client.ForkRun(ctx, &planexv1.ForkRunRequest{
		RunId: id, FromStep: "b", Reason: "try another value", RequestId: "fork-1",
		StepArgs: map[string]*structpb.Struct{"b": mustStruct(map[string]any{"value": "edited"})},
		Labels:   map[string]string{"experiment": "b-edited"},
	})
	if err != nil {
		t.Fatalf("ForkRun: %v", err)
	}
	if !slices.Equal(resp.GetShared(), []string{"a"}) || !slices.Equal(resp.GetRerun(), []string{"b", "c"}) {
		t.Fatalf("fork: shared %v rerun %v, want [a] and [b c]", resp.GetShared(), resp.GetRerun())
	}
	fork := succeeded(t, r, resp.GetRun().GetId())
	if fork.GetForkedFrom().GetRunId() != id || fork.GetLabels()["experiment"] != "b-edited" {
		t.Fatalf("fork: forked_from %v labels %v", fork.GetForkedFrom(), fork.GetLabels())
	}
	if e := h.pool.executions(fork.GetId()); e["a/1"] != 0 || e["b/1"] != 1 || e["c/1"] != 1 {
		t.Fatalf("fork executions %v: a is shared, b and c run", e)
	}
	if got := h.pool.argsOf(fork.GetId(), "c", 1).GetFields()["value"].GetStringValue(); got != "edited" {
		t.Fatalf("fork: c got %q from the edited b, want edited", got)
	}
	orig := waitTerminal(t, r.client, id, time.Second)
	if !slices.Equal(orig.GetForks(), []string{fork.GetId()}) {
		t.Fatalf("original's forks %v, want [%s]", orig.GetForks(), fork.GetId())
	}
	// The same request again returns the fork it made.
	again, err := r.client.ForkRun(ctx, &planexv1.ForkRunRequest{
		RunId: id, FromStep: "b", Reason: "try another value", RequestId: "fork-1",
		StepArgs: map[string]*structpb.Struct{"b": mustStruct(map[string]any{"value": "edited"})},
		Labels:   map[string]string{"experiment": "b-edited"},
	})
	if err != nil || again.GetRun().GetId() != fork.GetId() || !again.GetExisting() {
		t.Fatalf("repeated fork: %v existing %v err %v", again.GetRun().GetId(), again.GetExisting(), err)
	}
	if o := waitTerminal(t, r.client, id, time.Second); len(o.GetForks()) != 1 {
		t.Fatalf("original's forks after a repeated request: %v", o.GetForks())
	}
	// The same request id with other edits is refused, naming request_id.
	_, err = r.client.ForkRun(ctx, &planexv1.ForkRunRequest{
		RunId: id, FromStep: "b", Reason: "try another value", RequestId: "fork-1",
		StepArgs: map[string]*structpb.Struct{"b": mustStruct(map[string]any{"value": "other"})},
	})
	if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `request_id "fork-1" was already used to fork run `+id) || strings.Contains(err.Error(), "idempotency_key") {
		t.Fatalf("request id reused with other edits: %v, want FailedPrecondition naming request_id", err)
	}
	checkLog(t, r, fork.GetId())
	checkLog(t, r, id)
}

// A reset survives its supervisor dying after the RunReset is in the log
// and before it kicked the engine: the reset's guard timer starts the run
// on another replica; a kill while the reset run's step is running is
// survived like any other.
func TestResetSurvivesSupervisorKill(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	crash := errors.New("crashed after the append")
	h.apiCfg = func(c *api.Config) {
		c.StartGuard = 300 * time.Millisecond
		c.Hooks.AfterResetAppend = func(string) error { return crash }
	}
	r1 := h.startReplica()
	h.apiCfg = nil
	r2 := h.startReplica()
	plan := planOf(
		step("a", "test.echo", map[string]any{"value": 1}),
		noRetry(step("b", "test.flaky", map[string]any{"fail": 1, "code": "UNAVAILABLE"}, "a")),
		step("g", "test.gate", map[string]any{}, "b"),
	)
	id := h.runGoal(t, r2, "reset then crash", giveUpAfter(nil, plan.GetPlan().GetSteps()...))
	if run := waitTerminal(t, r2.client, id, 20*time.Second); run.GetStatus() != planexv1.RunStatus_RUN_STATUS_FAILED {
		t.Fatalf("run %s, want FAILED", run.GetStatus())
	}
	_, err := r1.client.ResetRun(testCtx(t, 10*time.Second), &planexv1.ResetRunRequest{RunId: id, Reason: "fixed"})
	if err == nil {
		t.Fatalf("ResetRun on the crashing replica succeeded")
	}
	r1.kill()
	// The crash landed after the append: the call failed, yet the log
	// holds the reset.
	waitRun(t, r2.client, id, 5*time.Second, "reset", func(r *planexv1.Run) bool { return r.GetResets() == 1 })
	// The guard timer (on r2) starts it: b runs again, then g, which
	// waits at the pool's gate.
	waitRun(t, r2.client, id, 20*time.Second, "g running", func(r *planexv1.Run) bool {
		return runlog.Step(r, "g").GetStatus() == planexv1.StepStatus_STEP_STATUS_RUNNING
	})
	// Kill the replica driving it while g runs; a third takes over.
	r3 := h.startReplica()
	r2.kill()
	h.pool.openGate()
	succeeded(t, r3, id)
	if e := h.pool.executions(id); e["a/1"] != 1 || e["a/2"] != 0 || e["b/1"] != 1 || e["b/2"] != 1 || e["g/1"] != 1 {
		t.Fatalf("executions %v: a once, b twice (attempts 1 and 2), g once", e)
	}
	checkLog(t, r3, id)
}

// A fork survives its creator dying after the fork's first event is in
// the log and before it was linked and kicked: its start guard, on
// another replica, links it to the original and starts it.
func TestForkSurvivesSupervisorKill(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var created string
	h.apiCfg = func(c *api.Config) {
		c.StartGuard = 300 * time.Millisecond
		c.Hooks.AfterForkCreate = func(id string) error { created = id; return errors.New("crashed after creating the fork") }
	}
	r1 := h.startReplica()
	h.apiCfg = nil
	r2 := h.startReplica()
	plan := planOf(
		step("a", "test.echo", map[string]any{"value": 1}),
		step("b", "test.echo", map[string]any{"value": 2}, "a"),
	)
	id := h.runGoal(t, r2, "fork then crash", always(plan.GetPlan().GetSteps()...))
	succeeded(t, r2, id)
	if _, err := r1.client.ForkRun(testCtx(t, 10*time.Second), &planexv1.ForkRunRequest{RunId: id, FromStep: "b", Reason: "again"}); err == nil {
		t.Fatalf("ForkRun on the crashing replica succeeded")
	}
	r1.kill()
	if created == "" {
		t.Fatalf("the crash hook did not run")
	}
	fork := succeeded(t, r2, created)
	if fork.GetForkedFrom().GetRunId() != id {
		t.Fatalf("fork's origin %v", fork.GetForkedFrom())
	}
	waitRun(t, r2.client, id, 10*time.Second, "linked to its fork", func(r *planexv1.Run) bool { return slices.Contains(r.GetForks(), created) })
	if e := h.pool.executions(created); e["a/1"] != 0 || e["b/1"] != 1 {
		t.Fatalf("fork executions %v: a shared, b once", e)
	}
	checkLog(t, r2, created)
	// The original: untouched but for one record of its fork, and still
	// verifying and replaying.
	if e := h.pool.executions(id); e["a/1"] != 1 || e["b/1"] != 1 || len(e) != 2 {
		t.Fatalf("original's executions %v: a and b once each", e)
	}
	forked := 0
	for _, ev := range checkLog(t, r2, id) {
		if f := ev.GetRunForked(); f != nil {
			forked++
			if f.GetForkRunId() != created {
				t.Fatalf("original records fork %s, want %s", f.GetForkRunId(), created)
			}
		}
	}
	if forked != 1 {
		t.Fatalf("original records %d forks, want 1", forked)
	}
}

// A batch reset by label re-opens every selected failed run from its
// failed steps, and each run's log records the batch.
func TestBatchResetByLabel(t *testing.T) {
	h, r := setup(t)
	ctx := testCtx(t, 60*time.Second)
	plan := planOf(
		step("a", "test.echo", map[string]any{"value": 1}),
		noRetry(step("b", "test.flaky", map[string]any{"fail": 1, "code": "UNAVAILABLE"}, "a")),
	)
	h.planner.on("batch reset", giveUpAfter(nil, plan.GetPlan().GetSteps()...))
	var ids []string
	for range 3 {
		ids = append(ids, start(t, r.client, &planexv1.StartRunRequest{Goal: "batch reset", Labels: map[string]string{"wave": "w1"}}))
	}
	other := start(t, r.client, &planexv1.StartRunRequest{Goal: "batch reset", Labels: map[string]string{"wave": "w2"}})
	for _, id := range append(ids, other) {
		if run := waitTerminal(t, r.client, id, 20*time.Second); run.GetStatus() != planexv1.RunStatus_RUN_STATUS_FAILED {
			t.Fatalf("run %s: %s, want FAILED", id, run.GetStatus())
		}
	}
	filter := &planexv1.RunFilter{LabelSelector: "wave=w1", Statuses: []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_FAILED}}
	batch := func(req *planexv1.RunBatchRequest) *planexv1.RunBatchResponse {
		t.Helper()
		stream, err := r.client.RunBatch(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var last *planexv1.RunBatchResponse
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("RunBatch: %v", err)
			}
			last = m
		}
		return last
	}
	op := &planexv1.RunBatchRequest_Reset_{Reset_: &planexv1.BatchReset{}}
	dry := batch(&planexv1.RunBatchRequest{Filter: filter, Operation: op, DryRun: true})
	if dry.GetMatched() != 3 {
		t.Fatalf("dry run matched %d, want 3", dry.GetMatched())
	}
	done := batch(&planexv1.RunBatchRequest{Filter: filter, Operation: op, ExpectedCount: 3, Reason: "the flaky service is fixed", BatchId: "fix-w1"})
	if !done.GetFinished() || done.GetDone() != 3 || done.GetFailed() != 0 {
		t.Fatalf("batch: %v", done)
	}
	for _, id := range ids {
		succeeded(t, r, id)
		var found bool
		for _, ev := range watchAll(t, r.client, id, 0) {
			if rr := ev.GetRunReset(); rr != nil && rr.GetBatchId() == "fix-w1" {
				found = true
			}
		}
		if !found {
			t.Fatalf("run %s: no RunReset recording batch fix-w1", id)
		}
	}
	if run := waitTerminal(t, r.client, other, time.Second); run.GetResets() != 0 || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_FAILED {
		t.Fatalf("run outside the filter was touched: resets %d, %s", run.GetResets(), run.GetStatus())
	}
}
