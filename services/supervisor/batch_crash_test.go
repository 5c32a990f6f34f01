package supervisor_test

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// A replica killed right after appending one decision as one message —
// a's StepSucceeded and b's StepDispatched in a RunEventBatch:
//   - with the request published after the append (direct dispatch off,
//     or a server older than 2.11), the request never left; the replica
//     that gets the message after the ack wait publishes it from the log;
//   - with direct dispatch, the append is b's request: the pool has it
//     from the log, and the replica taking over must not publish it again.
//
// Either way b runs exactly once and the run succeeds with every attempt
// dispatched once.
func TestKilledBetweenBatchedAppendAndPublish(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		direct bool
	}{
		{"request published after the append", false},
		{"request is the append", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			killBetweenAppendAndPublish(t, tc.direct)
		})
	}
}

func killBetweenAppendAndPublish(t *testing.T, direct bool) {
	h := newHarness(t)
	h.planner.on("batch crash", always(
		step("a", "test.echo", map[string]any{"value": 1}),
		step("b", "test.echo", map[string]any{"value": 2}, "a"),
	))
	var (
		victim  *replica
		once    sync.Once
		crashed = make(chan []*planexv1.RunEvent, 1)
	)
	a := h.startReplica(func(c *engine.Config) {
		c.NoDirectDispatch = !direct
		c.Hooks.AfterAppend = func(_ string, evs []*planexv1.RunEvent) {
			var ok, dispatched bool
			for _, ev := range evs {
				ok = ok || ev.GetStepSucceeded().GetStepId() == "a"
				dispatched = dispatched || ev.GetStepDispatched().GetStepId() == "b"
			}
			if ok && dispatched {
				once.Do(func() {
					victim.nc.Close() // kill -9: nothing published, nothing acked from here on
					crashed <- evs
				})
			}
		}
	})
	victim = a
	id := start(t, a.client, &planexv1.StartRunRequest{Goal: "batch crash"})
	var batch []*planexv1.RunEvent
	select {
	case batch = <-crashed:
	case <-time.After(15 * time.Second):
		t.Fatal("the replica never appended a's success and b's dispatch together")
	}
	a.kill()
	// The decision is one message: the run's last message holds it all.
	ctx := testCtx(t, 10*time.Second)
	st, err := h.res.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	last, err := st.GetLastMsgForSubject(ctx, bus.RunLogFilter(id))
	if err != nil {
		t.Fatal(err)
	}
	inLog, err := runlog.DecodeEvents(&nats.Msg{Subject: last.Subject, Data: last.Data, Header: last.Header})
	if err != nil {
		t.Fatal(err)
	}
	if len(inLog) != len(batch) || len(batch) < 2 || inLog[0].GetSequence() != batch[0].GetSequence() {
		t.Fatalf("last message of the run log holds %d events from %d, want the decision's %d from %d",
			len(inLog), inLog[0].GetSequence(), len(batch), batch[0].GetSequence())
	}
	if direct {
		// The decision went as b's request: its pool runs b before any
		// replica takes over.
		if last.Subject != bus.DispatchSubject(id, "test") {
			t.Fatalf("decision stored on %s, want the pool's dispatch subject %s", last.Subject, bus.DispatchSubject(id, "test"))
		}
		deadline := time.Now().Add(10 * time.Second)
		for h.pool.executions(id)["b/1"] == 0 {
			if time.Now().After(deadline) {
				t.Fatal("b/1 never reached the pool from the run log")
			}
			time.Sleep(10 * time.Millisecond)
		}
	} else if n := h.pool.executions(id)["b/1"]; n != 0 {
		t.Fatalf("b/1 executed %d times before the takeover: the crash did not land before the publish", n)
	}
	b := h.startReplica(func(c *engine.Config) { c.NoDirectDispatch = !direct })
	succeeded(t, b, id)
	evs := watchAll(t, b.client, id, 1)
	assertOnce(t, h, id, evs)
	if n := h.pool.executions(id)["b/1"]; n != 1 {
		t.Fatalf("b/1 executed %d times, want 1", n)
	}
	// The batch is in the log as it was appended, in order.
	var at int
	for i, ev := range evs {
		if ev.GetSequence() == batch[0].GetSequence() {
			at = i
		}
	}
	for i, want := range batch {
		if got := evs[at+i]; got.GetSequence() != want.GetSequence() || string(got.GetHash()) != string(want.GetHash()) {
			t.Fatalf("event %d of the batch: log has sequence %d, want %d with the same hash", i, got.GetSequence(), want.GetSequence())
		}
	}
	// Every message of the run log decodes and chains (batches included).
	if got := len(h.allEvents()[id]); got != len(evs) {
		t.Fatalf("the stream holds %d events of the run, WatchRun %d", got, len(evs))
	}
}
