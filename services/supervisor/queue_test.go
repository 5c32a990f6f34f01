package supervisor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
)

// registerTool puts a READ tool "<pool>.<verb>" without arguments in the
// catalog.
func (h *harness) registerTool(name string) {
	h.t.Helper()
	schema, _ := structpb.NewStruct(map[string]any{"type": "object"})
	spec := &planexv1.ToolSpec{Name: name, Pool: bus.PoolOf(name), Description: "test tool", ArgsSchema: schema, SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ}
	if _, err := h.res.Tools.Put(testCtx(h.t, 5*time.Second), bus.ToolKey(name, "raw-1"), mustMarshal(spec)); err != nil {
		h.t.Fatal(err)
	}
}

// rawPool consumes a pool's queue with its durable consumer and answers
// every request with a started notice and a success.
func (h *harness) rawPool(pool string) {
	h.t.Helper()
	ctx := testCtx(h.t, 5*time.Second)
	cons, err := h.res.JS.CreateOrUpdateConsumer(ctx, bus.StreamSteps, bus.PoolConsumerConfig(pool, 16, 30*time.Second, 5))
	if err != nil {
		h.t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		req := &planexv1.StepRequest{}
		if err := bus.Decode(bus.NatsMsg(m), req); err != nil {
			_ = m.Term()
			return
		}
		ctx := context.Background()
		id := bus.MsgID(req.GetRunId(), req.GetStepId(), fmt.Sprint(req.GetAttempt()))
		_, _ = bus.Publish(ctx, h.res.JS, bus.Publication{Subject: bus.EngineSubject(req.GetRunId(), bus.KindStarted),
			Msg: &planexv1.StepStartedNotice{RunId: req.GetRunId(), StepId: req.GetStepId(), Attempt: req.GetAttempt(), ExecutorId: "raw-1", StartedAt: timestamppb.Now()}, MsgID: id + ":started"})
		out, _ := structpb.NewValue(map[string]any{"ok": true})
		if _, err := bus.Publish(ctx, h.res.JS, bus.Publication{Subject: bus.EngineSubject(req.GetRunId(), bus.KindResult),
			Msg: &planexv1.StepResult{RunId: req.GetRunId(), StepId: req.GetStepId(), Attempt: req.GetAttempt(), Tool: req.GetTool(), ExecutorId: "raw-1",
				Status: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED, Output: out}, MsgID: id + ":result"}); err != nil {
			_ = m.Nak()
			return
		}
		_ = m.Ack()
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(cc.Stop)
}

// giveUpAfter answers the first call with a plan of steps (s and more)
// and gives up on any failure.
func giveUpAfter(s *planexv1.Step, more ...*planexv1.Step) script {
	return func(n int, _ *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
		if n == 0 {
			var steps []*planexv1.Step
			if s != nil {
				steps = append(steps, s)
			}
			return planOf(append(steps, more...)...), nil
		}
		return &planexv1.PlanResponse{Stop: true, GiveUp: true}, nil
	}
}

// Time in a pool's queue does not count toward the step's timeout: an
// attempt queued three times longer than its start-to-close timeout runs
// once an executor comes, with its first attempt.
func TestQueuedAttemptWaitsForCapacity(t *testing.T) {
	h, r := setup(t)
	h.registerTool("late.echo")
	s := step("a", "late.echo", map[string]any{})
	s.Timeout = durationpb.New(300 * time.Millisecond)
	id := h.runGoal(t, r, "queued", giveUpAfter(s))
	waitRun(t, r.client, id, 10*time.Second, "dispatched", func(run *planexv1.Run) bool {
		return len(run.GetSteps()) > 0 && run.GetSteps()[0].GetAttempt() == 1
	})
	time.Sleep(time.Second) // the backlog: no executor for three timeouts
	h.rawPool("late")
	run := succeeded(t, r, id)
	if run.GetUsage().GetSteps() != 1 {
		t.Fatalf("%d attempts, want the first to run", run.GetUsage().GetSteps())
	}
}

// A schedule-to-start timeout fails an attempt no executor starts in
// time, without retrying it.
func TestScheduleToStartTimeout(t *testing.T) {
	h, r := setup(t)
	h.registerTool("idle.echo")

	s := step("a", "idle.echo", map[string]any{})
	s.ScheduleToStartTimeout = durationpb.New(300 * time.Millisecond)
	id := h.runGoal(t, r, "nobody starts it", giveUpAfter(s))
	run := waitTerminal(t, r.client, id, 20*time.Second)
	if run.GetStopReason() != planexv1.StopReason_STOP_REASON_STEP_TIMEOUT || !contains(run.GetStopMessage(), "schedule_to_start_timeout") || run.GetUsage().GetSteps() != 1 {
		t.Fatalf("queued step: %s %q after %d attempts, want STEP_TIMEOUT by schedule_to_start_timeout, not retried", run.GetStopReason(), run.GetStopMessage(), run.GetUsage().GetSteps())
	}
}
