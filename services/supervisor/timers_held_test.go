package supervisor_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
)

// With --hold-timers a run's deadline is a message schedule in
// PLANEX_TIMERS (not a pending delivery of the timers consumer): it is
// stored there while the run waits, fires after the replica that set it
// died, finishes the run with DEADLINE no earlier than its budget, and
// leaves nothing behind in the stream.
func TestHeldDeadlineFiresAfterReplicaRestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.busOpts = bus.Options{HoldTimers: true, TimersAfter: time.Second}
	h.planner.on("slow held run", always(step("slow", "test.sleep", map[string]any{"ms": 20000})))
	a := h.startReplica()
	id := start(t, a.client, &planexv1.StartRunRequest{Goal: "slow held run", Budget: &planexv1.Budget{Deadline: durationpb.New(3 * time.Second)}})
	waitRun(t, a.client, id, 10*time.Second, "slow step dispatched", func(run *planexv1.Run) bool {
		for _, s := range run.GetSteps() {
			if s.GetStepId() == "slow" && s.GetAttempt() == 1 {
				return true
			}
		}
		return false
	})
	ctx := testCtx(t, 30*time.Second)
	timers, err := h.res.JS.Stream(ctx, bus.StreamTimers)
	if err != nil {
		t.Fatal(err)
	}
	held, err := timers.GetLastMsgForSubject(ctx, bus.LaterSubject(id, bus.MsgID(id, "timer", "deadline")))
	if err != nil {
		t.Fatalf("the run's deadline is not held in %s: %v", bus.StreamTimers, err)
	}
	if got := held.Header.Get("Nats-Schedule-Target"); got != bus.DueSubject(id) {
		t.Fatalf("held deadline targets %q, want %s", got, bus.DueSubject(id))
	}
	a.kill()
	b := h.startReplica()
	run := waitTerminal(t, b.client, id, 20*time.Second)
	if run.GetStopReason() != planexv1.StopReason_STOP_REASON_DEADLINE {
		t.Fatalf("run stopped with %s %q, want the deadline", run.GetStopReason(), run.GetStopMessage())
	}
	if took := run.GetFinishedAt().AsTime().Sub(run.GetCreatedAt().AsTime()); took < 3*time.Second || took > 15*time.Second {
		t.Fatalf("deadline fired after %v: want after the 3s budget, well before the 20s step ends", took)
	}
	waitFor(t, 10*time.Second, "PLANEX_TIMERS empty (schedule removed, fired timer acknowledged)", func() bool {
		info, err := timers.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
}
