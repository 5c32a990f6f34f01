package supervisor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// A redelivered attempt started again by another executor replica (its
// started notice carries the delivery count in its message id) is the same
// attempt, timed from the new start: a live new owner is not timed out on
// the first owner's clock, and one that keeps heartbeating is still bounded
// by the start-to-close timeout counted from its own start.
func TestRestartedAttemptIsTimedFromItsNewStart(t *testing.T) {
	h, r := setup(t)
	const stc = 3 * time.Second
	withTimeout := func(s *planexv1.Step, hb time.Duration) *planexv1.Step {
		s.Timeout = durationpb.New(stc)
		if hb > 0 {
			s.HeartbeatTimeout = durationpb.New(hb)
		}
		return noRetry(s)
	}
	giveUp := func(s *planexv1.Step) script {
		return func(n int, _ *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
			if n == 0 {
				return planOf(s), nil
			}
			return &planexv1.PlanResponse{Stop: true, GiveUp: true}, nil
		}
	}
	// a: the fake executor finishes 4.2s after its start, past the first
	// start's 3s timeout but within the restart's.
	a := h.runGoal(t, r, "restarted, then succeeds", giveUp(withTimeout(step("a", "test.sleep", map[string]any{"ms": 4200}), 0)))
	// b: never finishes; the new owner heartbeats every 250ms.
	b := h.runGoal(t, r, "restarted, heartbeats, never ends", giveUp(withTimeout(step("b", "test.gate", map[string]any{}), 2500*time.Millisecond)))
	running := func(id, stepID string) time.Time {
		run := waitRun(t, r.client, id, 10*time.Second, "running", func(run *planexv1.Run) bool {
			return runlog.Step(run, stepID).GetStatus() == planexv1.StepStatus_STEP_STATUS_RUNNING
		})
		return runlog.Step(run, stepID).GetStartedAt().AsTime()
	}
	startA, startB := running(a, "a"), running(b, "b")

	ctx := testCtx(t, 30*time.Second)
	notice := func(runID, stepID string, n int, hb bool) {
		t.Helper()
		now := time.Now()
		msg := &planexv1.StepStartedNotice{RunId: runID, StepId: stepID, Attempt: 1, ExecutorId: "fake-2", StartedAt: timestamppb.New(restartAt(startA, startB, runID == a))}
		id := bus.MsgID(runID, stepID, "1", bus.KindStarted, "2")
		if hb {
			msg.Heartbeat, msg.HeartbeatAt = true, timestamppb.New(now)
			id = bus.MsgID(runID, stepID, "1", "hb", fmt.Sprint(n))
		}
		if _, err := bus.Publish(ctx, h.res.JS, bus.Publication{Subject: bus.EngineSubject(runID, bus.KindStarted), Msg: msg, MsgID: id}); err != nil {
			t.Fatal(err)
		}
	}
	// Both attempts are redelivered and started again 2s after their
	// first start.
	waitUntil(ctx, restartAt(startA, startB, true))
	notice(a, "a", 0, false)
	waitUntil(ctx, restartAt(startA, startB, false))
	notice(b, "b", 0, false)

	beats := make(chan struct{})
	go func() {
		defer close(beats)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for n := 1; ctx.Err() == nil; n++ {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
			resp, err := r.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: b})
			if err == nil && runlog.Terminal(resp.GetRun().GetStatus()) {
				return
			}
			notice(b, "b", n, true)
		}
	}()

	succeeded(t, r, a)
	if st := runlog.Step(waitTerminal(t, r.client, a, time.Second), "a"); st.GetAttempt() != 1 || st.GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
		t.Fatalf("step a: attempt %d %s, want attempt 1 SUCCEEDED", st.GetAttempt(), st.GetStatus())
	}
	run := waitTerminal(t, r.client, b, 20*time.Second)
	<-beats
	st := runlog.Step(run, "b")
	if run.GetStopReason() != planexv1.StopReason_STOP_REASON_STEP_TIMEOUT || !contains(st.GetError().GetMessage(), "start_to_close_timeout") {
		t.Fatalf("run b: %s %q, step error %v; want STEP_TIMEOUT by start_to_close_timeout", run.GetStopReason(), run.GetStopMessage(), st.GetError())
	}
	if restart := restartAt(startA, startB, false); st.GetFinishedAt().AsTime().Before(restart.Add(stc)) {
		t.Fatalf("step b timed out at %v, before the restart at %v plus its %v timeout", st.GetFinishedAt().AsTime(), restart, stc)
	}
}

// restartAt is when the test restarts attempt a (first) or b: 2s after
// its first start.
func restartAt(startA, startB time.Time, first bool) time.Time {
	if first {
		return startA.Add(2 * time.Second)
	}
	return startB.Add(2 * time.Second)
}

// waitUntil blocks until the wall clock reaches at (or ctx ends).
func waitUntil(ctx context.Context, at time.Time) {
	select {
	case <-time.After(time.Until(at)):
	case <-ctx.Done():
	}
}
