package supervisor_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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

// With --hold-timers a gate's SLA is held too: the schedule is in
// PLANEX_TIMERS while the gate waits, fires after the replica that armed
// it died, escalates the run without running the gated step, and is gone
// from the stream once fired.
func TestHeldGateSLAFiresAfterTheReplicaThatArmedItDies(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.busOpts = bus.Options{HoldTimers: true, TimersAfter: time.Second}
	a := h.startReplica(withPolicy(t, slaPolicy))
	id := h.runGoal(t, a, "held sla", always(step("e", "test.echo", map[string]any{"value": 1})))
	run := waiting(t, a, id, 1)
	gate := run.GetGates()[0]
	ctx := testCtx(t, 30*time.Second)
	timers, err := h.res.JS.Stream(ctx, bus.StreamTimers)
	if err != nil {
		t.Fatal(err)
	}
	subject := bus.LaterSubject(id, bus.MsgID(id, "timer", "gate", gate.GetId()))
	held, err := timers.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatalf("gate %s's SLA is not held in %s: %v", gate.GetId(), bus.StreamTimers, err)
	}
	if got := held.Header.Get("Nats-Schedule-Target"); got != bus.DueSubject(id) {
		t.Fatalf("held SLA targets %q, want %s", got, bus.DueSubject(id))
	}
	escalatedAfterKill(t, h, a, id, gate)
	waitFor(t, 10*time.Second, "the fired SLA's schedule gone from "+bus.StreamTimers, func() bool {
		_, err := timers.GetLastMsgForSubject(ctx, subject)
		return errors.Is(err, jetstream.ErrMsgNotFound)
	})
}
