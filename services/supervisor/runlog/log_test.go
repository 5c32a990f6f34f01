package runlog_test

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

func newLog(t *testing.T, res *bus.Resources) *runlog.Log {
	t.Helper()
	l, err := runlog.New(t.Context(), res, natstest.Logger(t), runlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// create appends RunCreated for run id.
func create(t *testing.T, l *runlog.Log, id string) *runlog.State {
	t.Helper()
	tx := l.Begin(&runlog.State{})
	if err := tx.Emit(&planexv1.RunEvent{RunId: id, Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{
		Goal: "g", Budget: &planexv1.Budget{MaxSteps: 5}}}}); err != nil {
		t.Fatal(err)
	}
	st, err := l.Commit(t.Context(), tx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func appendEv(t *testing.T, l *runlog.Log, st *runlog.State, evs ...*planexv1.RunEvent) (*runlog.State, error) {
	t.Helper()
	tx := l.Begin(st)
	for _, ev := range evs {
		if err := tx.Emit(ev); err != nil {
			t.Fatal(err)
		}
	}
	return l.Commit(t.Context(), tx)
}

func TestConcurrentWritersConflict(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	a, b := newLog(t, res), newLog(t, res)
	st := create(t, a, "RUN1")
	stB, err := b.Load(t.Context(), "RUN1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := appendEv(t, a, st, dispatched("x", 1)); err != nil {
		t.Fatal(err)
	}
	// b still holds the state before a's append: it must lose.
	if _, err := appendEv(t, b, stB, dispatched("y", 1)); !errors.Is(err, runlog.ErrConflict) {
		t.Fatalf("stale append: %v, want ErrConflict", err)
	}
	stB, err = b.Load(t.Context(), "RUN1")
	if err != nil {
		t.Fatal(err)
	}
	if stB.Run.GetLastSequence() != 2 || runlog.Step(stB.Run, "x") == nil || stB.Verified {
		t.Fatalf("reloaded state: seq %d steps %v verified %v", stB.Run.GetLastSequence(), stB.Run.GetSteps(), stB.Verified)
	}
	next, err := appendEv(t, b, stB, dispatched("y", 1))
	if err != nil {
		t.Fatalf("append after reload: %v", err)
	}
	// a's cache is stale; Load notices the new event.
	got, err := a.Load(t.Context(), "RUN1")
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got.Run, next.Run) || got.StreamSeq != next.StreamSeq {
		t.Fatalf("a loaded seq %d, want %d", got.Run.GetLastSequence(), next.Run.GetLastSequence())
	}
	// A fresh log (no cache) folds from the snapshot and the stream.
	fresh, err := newLog(t, res).Load(t.Context(), "RUN1")
	if err != nil || !proto.Equal(fresh.Run, next.Run) {
		t.Fatalf("fresh load: %v", err)
	}
}

func TestLoadUnknownRun(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	for _, id := range []string{"NOPE", "bad.id", ""} {
		if _, err := newLog(t, res).Load(t.Context(), id); !errors.Is(err, runlog.ErrRunNotFound) {
			t.Fatalf("Load(%q) = %v, want ErrRunNotFound", id, err)
		}
	}
}

func TestVerifiedOnlyAfterMarking(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	l := newLog(t, res)
	st := create(t, l, "RUN2")
	if got, _ := l.Load(t.Context(), "RUN2"); got.Verified {
		t.Fatal("committed state is verified before its side effects")
	}
	l.MarkVerified(st)
	if got, _ := l.Load(t.Context(), "RUN2"); !got.Verified {
		t.Fatal("marked state not verified")
	}
	l.Forget("RUN2")
	if got, _ := l.Load(t.Context(), "RUN2"); got.Verified {
		t.Fatal("forgotten state still verified")
	}
}

func TestCorruptSnapshotIsIgnored(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	l := newLog(t, res)
	st := create(t, l, "RUN3")
	st, err := appendEv(t, l, st, dispatched("a", 1), succeeded("a", 1))
	if err != nil {
		t.Fatal(err)
	}
	for name, value := range map[string][]byte{"garbage": []byte("not a snapshot"), "other run": snapshotOf(t, res, l, "RUN4")} {
		if _, err := res.Runs.Put(t.Context(), "RUN3", value); err != nil {
			t.Fatal(err)
		}
		got, err := newLog(t, res).Load(t.Context(), "RUN3")
		if err != nil || !proto.Equal(got.Run, st.Run) {
			t.Fatalf("%s snapshot: load = %v", name, err)
		}
	}
}

// snapshotOf creates run id and returns its snapshot bytes.
func snapshotOf(t *testing.T, res *bus.Resources, l *runlog.Log, id string) []byte {
	create(t, l, id)
	e, err := res.Runs.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return e.Value()
}

func TestTamperedLogIsRefused(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	l := newLog(t, res)
	st := create(t, l, "RUN5")
	if _, err := appendEv(t, l, st, dispatched("a", 1)); err != nil {
		t.Fatal(err)
	}
	// Someone appends an event with a forged hash directly to the log.
	forged := &planexv1.RunEvent{RunId: "RUN5", Sequence: 3, PrevHash: []byte("nope"), Hash: []byte("nope"), Payload: succeeded("a", 1).Payload}
	if _, err := bus.Publish(t.Context(), res.JS, bus.Publication{Subject: bus.RunLogSubject("RUN5"), Msg: forged, MsgID: "forged"}); err != nil {
		t.Fatal(err)
	}
	if _, err := newLog(t, res).Load(t.Context(), "RUN5"); !errors.Is(err, runlog.ErrBrokenChain) {
		t.Fatalf("load of a tampered log: %v, want ErrBrokenChain", err)
	}
}

func TestStateApplyChecksTheChain(t *testing.T) {
	l := &runlog.State{}
	tx := (&runlog.Log{}).Begin(l)
	evs := []*planexv1.RunEvent{
		{RunId: "R", Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "g"}}},
		dispatched("a", 1), succeeded("a", 1),
	}
	for _, ev := range evs {
		if err := tx.Emit(ev); err != nil {
			t.Fatal(err)
		}
	}
	good := tx.Events()
	tests := []struct {
		name   string
		mutate func(evs []*planexv1.RunEvent)
	}{
		{name: "gap", mutate: func(evs []*planexv1.RunEvent) { evs[2].Sequence = 4 }},
		{name: "content changed", mutate: func(evs []*planexv1.RunEvent) { evs[1].GetStepDispatched().Attempt = 7 }},
		{name: "prev hash", mutate: func(evs []*planexv1.RunEvent) { evs[2].PrevHash = evs[0].GetHash() }},
		{name: "other run", mutate: func(evs []*planexv1.RunEvent) { evs[1].RunId = "S" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs := make([]*planexv1.RunEvent, len(good))
			for i, ev := range good {
				evs[i] = proto.CloneOf(ev)
			}
			tt.mutate(evs)
			st := &runlog.State{}
			var err error
			for i, ev := range evs {
				if err = st.Apply(ev, uint64(i+1)); err != nil {
					break
				}
			}
			if !errors.Is(err, runlog.ErrBrokenChain) {
				t.Fatalf("err = %v, want ErrBrokenChain", err)
			}
		})
	}
	st := &runlog.State{}
	for i, ev := range good {
		if err := st.Apply(ev, uint64(i+1)); err != nil {
			t.Fatalf("intact chain refused: %v", err)
		}
	}
}

func TestWatchFromSequence(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	l := newLog(t, res)
	st := create(t, l, "RUN6")
	st, err := appendEv(t, l, st, dispatched("a", 1))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan uint64, 10)
	done := make(chan error, 1)
	go func() {
		done <- l.Watch(t.Context(), "RUN6", 2, func(ev *planexv1.RunEvent) error {
			got <- ev.GetSequence()
			return nil
		})
	}()
	if s := <-got; s != 2 {
		t.Fatalf("first watched event %d, want 2", s)
	}
	// Live events follow, and the watch ends after RunFinished.
	if _, err := appendEv(t, l, st, succeeded("a", 1), &planexv1.RunEvent{Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{
		Status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, StopReason: planexv1.StopReason_STOP_REASON_SUCCEEDED}}}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(got)
	var rest []uint64
	for s := range got {
		rest = append(rest, s)
	}
	if len(rest) != 2 || rest[0] != 3 || rest[1] != 4 {
		t.Fatalf("live events %v, want [3 4]", rest)
	}
}

// A decision of several events is one message on the run's subject; every
// reader (a cold Load, Watch, LoadTrusted after a conflict) sees the same
// events, chained, and a stale writer is refused as a whole.
func TestBatchedDecisionIsOneMessage(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	a, b := newLog(t, res), newLog(t, res)
	st := create(t, a, "RUN2")
	stB, err := b.Load(t.Context(), "RUN2")
	if err != nil {
		t.Fatal(err)
	}
	next, err := appendEv(t, a, st, dispatched("x", 1), dispatched("y", 1), dispatched("z", 1))
	if err != nil {
		t.Fatal(err)
	}
	if next.StreamSeq != st.StreamSeq+1 {
		t.Fatalf("three events took stream sequences %d..%d, want one message", st.StreamSeq+1, next.StreamSeq)
	}
	// b's state is stale: its whole decision is refused, nothing of it is
	// appended.
	if _, err := appendEv(t, b, stB, dispatched("w", 1), dispatched("v", 1)); !errors.Is(err, runlog.ErrConflict) {
		t.Fatalf("stale batched append: %v, want ErrConflict", err)
	}
	cold := newLog(t, res)
	got, err := cold.Load(t.Context(), "RUN2")
	if err != nil {
		t.Fatal(err)
	}
	if got.Run.GetLastSequence() != 4 || !proto.Equal(got.Run, next.Run) || string(got.Hash) != string(next.Hash) {
		t.Fatalf("cold load: sequence %d, want the committed state (4)", got.Run.GetLastSequence())
	}
	// b catches up from its stale state across the batch.
	gotB, err := b.LoadTrusted(t.Context(), "RUN2")
	if err != nil {
		t.Fatal(err)
	}
	if gotB.Run.GetLastSequence() != 4 || runlog.Step(gotB.Run, "w") != nil {
		t.Fatalf("b after the conflict: sequence %d, steps %v", gotB.Run.GetLastSequence(), gotB.Run.GetSteps())
	}
	var seqs []uint64
	stop := errors.New("stop")
	err = cold.Watch(t.Context(), "RUN2", 2, func(ev *planexv1.RunEvent) error {
		seqs = append(seqs, ev.GetSequence())
		if len(seqs) == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || len(seqs) != 3 || seqs[0] != 2 || seqs[2] != 4 {
		t.Fatalf("Watch from 2: %v, sequences %v", err, seqs)
	}
}

// A watch's consumer does not outlive it by long: WatchRun on a busy API
// must not pile up consumers up to the stream's limit.
func TestWatchLeavesNoConsumer(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	l := newLog(t, res)
	create(t, l, "RUN3")
	stop := errors.New("stop")
	if err := l.Watch(t.Context(), "RUN3", 1, func(*planexv1.RunEvent) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("Watch: %v", err)
	}
	st, err := res.JS.Stream(t.Context(), bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := st.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Consumers == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d consumers on %s 20s after the watch ended", info.State.Consumers, bus.StreamEvents)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// NotFinished drops a run this process saw finish, whatever the index
// says, and keeps a run it never saw (another replica's) or saw running.
func TestNotFinishedDropsRunsSeenFinishing(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	l, other := newLog(t, res), newLog(t, res)
	st := create(t, l, "RUNDONE")
	create(t, l, "RUNLIVE")
	if got := l.NotFinished([]string{"RUNDONE", "RUNLIVE", "RUNELSEWHERE"}); len(got) != 3 {
		t.Fatalf("before the finish: %v, want all three", got)
	}
	if _, err := appendEv(t, l, st, &planexv1.RunEvent{Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{
		Status: planexv1.RunStatus_RUN_STATUS_CANCELLED, StopReason: planexv1.StopReason_STOP_REASON_CANCELLED}}}); err != nil {
		t.Fatal(err)
	}
	ids := []string{"RUNDONE", "RUNLIVE", "RUNELSEWHERE"}
	if got := l.NotFinished(ids); len(got) != 2 || got[0] != "RUNLIVE" || got[1] != "RUNELSEWHERE" {
		t.Fatalf("after the finish: %v, want [RUNLIVE RUNELSEWHERE]", got)
	}
	if len(ids) != 3 || ids[0] != "RUNDONE" {
		t.Fatalf("NotFinished changed its argument: %v", ids)
	}
	// Another process that never loaded the run keeps it (its index
	// decides).
	if got := other.NotFinished([]string{"RUNDONE"}); len(got) != 1 {
		t.Fatalf("a process that never saw the run: %v, want it kept", got)
	}
}

// CountUnfinished reads the runs the index lists as unfinished from their
// logs: a run whose finish is in its log while its snapshot in planex-runs
// still shows it running (the snapshot is written while GetRun can already
// show the finish) is not counted, even by a process that never saw it
// finish; above the bound it confirms, the index's count stands.
func TestCountUnfinishedReadsTheLogs(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	ctx := t.Context()
	l := newLog(t, res)
	st := create(t, l, "RUNDONE")
	create(t, l, "RUNLIVE")
	stale, err := res.Runs.Get(ctx, "RUNDONE")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := appendEv(t, l, st, &planexv1.RunEvent{Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{
		Status: planexv1.RunStatus_RUN_STATUS_CANCELLED, StopReason: planexv1.StopReason_STOP_REASON_CANCELLED}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Runs.Put(ctx, "RUNDONE", stale.Value()); err != nil { // the snapshot lags the log
		t.Fatal(err)
	}
	other := newLog(t, res)
	if _, err := other.WaitIndexed(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := other.CountNotFinished(false, 0); err != nil || n != 2 {
		t.Fatalf("the index counts %d (%v), want 2: the finished run's snapshot should lag", n, err)
	}
	if n, err := other.CountUnfinished(ctx, 1); err != nil || n != 2 {
		t.Fatalf("CountUnfinished over its bound = %d (%v), want the index's 2", n, err)
	}
	if n, err := other.CountUnfinished(ctx, 10); err != nil || n != 1 {
		t.Fatalf("CountUnfinished = %d (%v), want 1 (RUNLIVE)", n, err)
	}
}
