package supervisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// errorRecorder is a slog handler that keeps the ERROR records.
type errorRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *errorRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *errorRecorder) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level >= slog.LevelError {
		r.mu.Lock()
		r.records = append(r.records, rec.Clone())
		r.mu.Unlock()
	}
	return nil
}

func (r *errorRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *errorRecorder) WithGroup(string) slog.Handler      { return r }

// about counts the ERROR records with attribute run_id = id.
func (r *errorRecorder) about(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.records {
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "run_id" && a.Value.String() == id {
				n++
			}
			return true
		})
	}
	return n
}

// startLoggedReplica is startReplica with the replica's logger.
func (h *harness) startLoggedReplica(logger *slog.Logger) *replica {
	h.t.Helper()
	return h.startReplicaWith(logger, nil)
}

// terminated is a JetStream advisory of an engine message terminated by
// the engine.
type terminated struct {
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Reason     string `json:"reason"`
}

// TestCorruptRunLogIsReportedAndContained appends garbage to the log of a
// run waiting at a gate: a message that is not protobuf, an event with a
// forged hash, and a valid event of another run. GetRun and WatchRun
// answer DataLoss naming the run, the entry and the command to inspect it;
// ListRuns lists it marked corrupt and ListGates drops its gate; the
// engine terminates the run's messages (one delivery each, nothing left
// pending) rather than redelivering them, and appends nothing; the
// process logs it once at ERROR; runs started before and after succeed.
func TestCorruptRunLogIsReportedAndContained(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rec := &errorRecorder{}
	r := h.startLoggedReplica(slog.New(rec))
	ctx := testCtx(t, 60*time.Second)

	before := h.runGoal(t, r, "before the corruption", always(step("a", "test.echo", map[string]any{"value": "ok"})))
	succeeded(t, r, before)
	beforeEvents, err := runlog.ReadStored(ctx, h.res.JS, before)
	if err != nil {
		t.Fatal(err)
	}

	advisories, err := h.nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + bus.StreamEngine + ".>")
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name    string
		garbage func(run *planexv1.Run) []byte
		want    string // in the DataLoss message, after "run <id> is corrupt: "
	}{
		{"not protobuf", func(*planexv1.Run) []byte { return []byte("\xff\xfe not a planex event") }, "the entry at stream sequence %d, where event %d belongs, is not a planex event"},
		{"forged hash", func(run *planexv1.Run) []byte {
			ev := &planexv1.RunEvent{RunId: run.GetId(), Sequence: run.GetLastSequence() + 1, PrevHash: []byte("x"), Hash: []byte("y"),
				Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{Status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED}}}
			return mustMarshal(ev)
		}, "hash chain broken at stream sequence %d, event %d"},
		{"event of another run", func(run *planexv1.Run) []byte {
			for _, ev := range beforeEvents {
				if ev.GetSequence() == run.GetLastSequence()+1 {
					return mustMarshal(ev)
				}
			}
			t.Fatalf("run %s has no event %d", before, run.GetLastSequence()+1)
			return nil
		}, "hash chain broken at stream sequence %d, event %d: the event stored there belongs to run " + before},
	}
	for _, tt := range cases {
		victim := h.runGoal(t, r, "victim "+tt.name, always(step("send", "test.approve", map[string]any{"value": "x"})))
		run := waitRun(t, r.client, victim, 10*time.Second, "waiting", func(run *planexv1.Run) bool {
			return run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING
		})
		h.waitEngineIdle()
		ack, err := h.res.JS.Publish(ctx, bus.RunLogSubject(victim), tt.garbage(run))
		if err != nil {
			t.Fatal(err)
		}
		// Any engine message of the run: the engine loads it.
		if _, err := bus.Publish(ctx, h.res.JS, bus.Publication{
			Subject: bus.EngineSubject(victim, bus.KindKick),
			Msg:     &planexv1.EngineKick{RunId: victim, Reason: "test: after the corruption"},
			MsgID:   bus.MsgID(victim, "test-kick"),
		}); err != nil {
			t.Fatal(err)
		}

		want := fmt.Sprintf("run %s is corrupt: "+tt.want, victim, ack.Sequence, run.GetLastSequence()+1)
		checkLoss := func(what string, err error) {
			t.Helper()
			st, _ := status.FromError(err)
			if st.Code() != codes.DataLoss || !strings.Contains(st.Message(), want) || !strings.Contains(st.Message(), "planex audit verify "+victim) {
				t.Fatalf("%s: %s %q, want DataLoss with %q and the audit command", tt.name+": "+what, st.Code(), st.Message(), want)
			}
		}
		for range 2 {
			_, err = r.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: victim})
			checkLoss("GetRun", err)
		}
		stream, err := r.client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: victim})
		if err != nil {
			t.Fatal(err)
		}
		_, err = stream.Recv()
		checkLoss("WatchRun", err)
		_, err = r.client.Decide(ctx, &planexv1.DecideRequest{RunId: victim, GateId: run.GetGates()[0].GetId(), Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE})
		checkLoss("Decide", err)

		// The engine terminated the kick (one delivery) and holds nothing.
		for {
			m, err := advisories.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("%s: no termination advisory: %v", tt.name, err)
			}
			var adv terminated
			if err := json.Unmarshal(m.Data, &adv); err != nil {
				t.Fatal(err)
			}
			if adv.Deliveries != 1 {
				t.Fatalf("%s: engine message terminated after %d deliveries, want 1", tt.name, adv.Deliveries)
			}
			if adv.Reason == fmt.Sprintf("run log corrupt at stream sequence %d", ack.Sequence) {
				break
			}
		}
		h.waitEngineIdle()

		listed, err := r.client.ListRuns(ctx, &planexv1.ListRunsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, lr := range listed.GetRuns() {
			if lr.GetId() == victim {
				found = true
				if !runlog.CorruptListing(lr) || lr.GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING || !strings.Contains(lr.GetStopMessage(), want) {
					t.Fatalf("%s: listed as %s %q, want WAITING marked corrupt", tt.name, lr.GetStatus(), lr.GetStopMessage())
				}
			}
		}
		if !found {
			t.Fatalf("%s: ListRuns does not list the corrupt run", tt.name)
		}
		gates, err := r.client.ListGates(ctx, &planexv1.ListGatesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range gates.GetGates() {
			if g.GetRunId() == victim {
				t.Fatalf("%s: ListGates lists the gate of the corrupt run", tt.name)
			}
		}

		// Nothing was appended after the garbage.
		stored, err := h.res.JS.Stream(ctx, bus.StreamEvents)
		if err != nil {
			t.Fatal(err)
		}
		if last, err := stored.GetLastMsgForSubject(ctx, bus.RunLogFilter(victim)); err != nil || last.Sequence != ack.Sequence {
			t.Fatalf("%s: last entry of the run log: %v, want the garbage at %d", tt.name, err, ack.Sequence)
		}
		if n := rec.about(victim); n != 1 {
			t.Fatalf("%s: %d ERROR records about the run, want 1", tt.name, n)
		}

		after := h.runGoal(t, r, "after "+tt.name, always(step("a", "test.echo", map[string]any{"value": "ok"})))
		succeeded(t, r, after)
	}
	if _, err := r.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: before}); err != nil {
		t.Fatalf("run started before: %v", err)
	}
}
