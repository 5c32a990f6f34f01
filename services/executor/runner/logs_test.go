package runner_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor/runner"
)

// On NATS 2.11+ a pool takes its steps from PLANEX_EVENTS: a routed run's
// decision that dispatches one of its steps (the request is built from
// the StepDispatched), and requests published apart. A decision that is no
// request of this pool is terminated, never run.
func TestStepsFromTheRunLog(t *testing.T) {
	srv := natstest.Start(t)
	tool := newTool(t, "p.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo)
	r, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool}})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 20*time.Second)
	info, err := res.JS.Consumer(ctx, bus.StreamEvents, bus.PoolConsumer("p"))
	if err != nil {
		t.Fatalf("the runner did not create its consumer on %s: %v", bus.StreamEvents, err)
	}
	if got := info.CachedInfo().Config.FilterSubject; got != bus.DispatchFilter("p") {
		t.Fatalf("consumer filter %q, want %q", got, bus.DispatchFilter("p"))
	}

	dispatched := func(run, step, tool string, a map[string]any) *planexv1.RunEvent {
		return &planexv1.RunEvent{RunId: run, Sequence: 5, Time: timestamppb.Now(), Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{
			StepId: step, Attempt: 1, PlanRevision: 1, Tool: tool, ResolvedArgs: args(t, a),
			StartToCloseTimeout: durationpb.New(5 * time.Second), ScheduleToStartTimeout: durationpb.New(time.Minute),
		}}}
	}
	succeeded := &planexv1.RunEvent{RunId: "RUNA", Sequence: 4, Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{StepId: "a", Attempt: 1}}}
	publish := func(subject, id string, msg proto.Message) {
		t.Helper()
		if _, err := bus.Publish(ctx, res.JS, bus.Publication{Subject: subject, Msg: msg, MsgID: id}); err != nil {
			t.Fatal(err)
		}
	}
	// A chain's next step: a's success and b's dispatch, b's request.
	publish(bus.DispatchSubject("RUNA", "p"), "RUNA:ev:4", &planexv1.RunEventBatch{Events: []*planexv1.RunEvent{succeeded, dispatched("RUNA", "b", "p.echo", map[string]any{"n": 3})}})
	got := eng.next(ctx)
	if got.GetRunId() != "RUNA" || got.GetStepId() != "b" || got.GetAttempt() != 1 || got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED ||
		got.GetOutput().GetStructValue().GetFields()["n"].GetNumberValue() != 3 || got.GetExecutorId() != r.ID() {
		t.Fatalf("result of the dispatching decision: %v", got)
	}
	// A request published apart.
	publish(bus.RequestSubject("p"), "RUNB:c:1", step(t, "RUNB", "c", "p.echo", map[string]any{"n": 4}))
	if got := eng.next(ctx); got.GetRunId() != "RUNB" || got.GetStepId() != "c" || got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("result of the request: %v", got)
	}
	calls := tool.calls.Load()
	// Not requests of this pool: two dispatches in one decision, a tool of
	// another pool, a run id that is not the subject's.
	publish(bus.DispatchSubject("RUNC", "p"), "RUNC:ev:5", &planexv1.RunEventBatch{Events: []*planexv1.RunEvent{
		dispatched("RUNC", "x", "p.echo", map[string]any{"n": 1}), dispatched("RUNC", "y", "p.echo", map[string]any{"n": 1})}})
	publish(bus.DispatchSubject("RUND", "p"), "RUND:ev:5", dispatched("RUND", "x", "q.echo", map[string]any{"n": 1}))
	publish(bus.DispatchSubject("RUNE", "p"), "RUNE:ev:5", dispatched("RUNX", "x", "p.echo", map[string]any{"n": 1}))
	// Then a valid one: once it is done, the three before it were handled.
	publish(bus.DispatchSubject("RUNF", "p"), "RUNF:ev:5", dispatched("RUNF", "z", "p.echo", map[string]any{"n": 5}))
	if got := eng.next(ctx); got.GetRunId() != "RUNF" {
		t.Fatalf("a refused decision produced a result: %v", got)
	}
	if n := tool.calls.Load() - calls; n != 1 {
		t.Fatalf("tool ran %d times, want once (refused decisions never run)", n)
	}
	// Every message is settled: the refused ones terminated, the others
	// acknowledged (after their result is published, so wait for it).
	for {
		ci, err := info.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumAckPending == 0 && ci.NumPending == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("consumer on %s: %d pending, %d unacknowledged; want every message settled", bus.StreamEvents, ci.NumPending, ci.NumAckPending)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An executor that cannot create or update its consumer on PLANEX_EVENTS
// (a NATS configuration from before this version that does not grant it,
// or a consumer it may not change) takes its steps from PLANEX_STEPS
// instead of failing to start; supervisors send them there while the pool
// has no usable consumer on the run log stream.
func TestStepsFromPlanexStepsWithoutALogConsumer(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	ctx := ctxT(t, 20*time.Second)
	// A consumer the runner cannot update: its deliver policy is fixed.
	other := bus.DispatchConsumerConfig("p", 4, time.Second, 3)
	other.DeliverPolicy = jetstream.DeliverAllPolicy
	if _, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEvents, other); err != nil {
		t.Fatal(err)
	}
	tool := newTool(t, "p.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo)
	startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool}})
	eng := newEngine(t, res)
	dispatch(t, res, step(t, "RUNOLD", "a", "p.echo", map[string]any{"n": 2}))
	if got := eng.next(ctx); got.GetRunId() != "RUNOLD" || got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("step from %s: %v", bus.StreamSteps, got)
	}
}

// A pool's consumers deleted under a running replica (`nats consumer rm`,
// a stream restored) are made again by the replica, which then runs the
// steps sent to either: before, its fetches failed until it restarted.
func TestDeletedPoolConsumersAreMadeAgain(t *testing.T) {
	srv := natstest.Start(t)
	tool := newTool(t, "p.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo)
	startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool}})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 30*time.Second)
	streams := []string{bus.StreamEvents, bus.StreamSteps}
	for _, stream := range streams {
		if err := res.JS.DeleteConsumer(ctx, stream, bus.PoolConsumer("p")); err != nil {
			t.Fatalf("delete %s on %s: %v", bus.PoolConsumer("p"), stream, err)
		}
	}
	// The consumer on PLANEX_EVENTS delivers only what is appended after
	// its creation: the test sends its step once it is back.
	deadline := time.Now().Add(15 * time.Second)
	for _, stream := range streams {
		for {
			if _, err := res.JS.Consumer(ctx, stream, bus.PoolConsumer("p")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s on %s not made again within 15s", bus.PoolConsumer("p"), stream)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if _, err := bus.Publish(ctx, res.JS, bus.Publication{Subject: bus.RequestSubject("p"), Msg: step(t, "RUNA", "a", "p.echo", map[string]any{"n": 1}), MsgID: "RUNA:a:1"}); err != nil {
		t.Fatal(err)
	}
	dispatch(t, res, step(t, "RUNB", "b", "p.echo", map[string]any{"n": 2}))
	got := map[string]bool{}
	for range 2 {
		r := eng.next(ctx)
		if r.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
			t.Fatalf("result %v, want SUCCEEDED", r)
		}
		got[r.GetRunId()+"/"+r.GetStepId()] = true
	}
	if !got["RUNA/a"] || !got["RUNB/b"] {
		t.Fatalf("results of %v, want RUNA/a (from %s) and RUNB/b (from %s)", got, bus.StreamEvents, bus.StreamSteps)
	}
}
