package runlog_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// gatedKV holds every snapshot update until open is closed, counting them.
type gatedKV struct {
	jetstream.KeyValue
	open    chan struct{}
	updates atomic.Int32
}

func (g *gatedKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	g.updates.Add(1)
	select {
	case <-g.open:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return g.KeyValue.Update(ctx, key, value, last)
}

// gatedRuns starts a server and returns its resources, and the same with
// planex-runs behind a gate (closed).
func gatedRuns(t *testing.T) (res, gated *bus.Resources, kv *gatedKV) {
	t.Helper()
	srv := natstest.Start(t)
	_, res = srv.Setup(t)
	g := *res
	kv = &gatedKV{KeyValue: res.Runs, open: make(chan struct{})}
	g.Runs = kv
	return res, &g, kv
}

// snapshotSeq returns the sequence of run id's snapshot in planex-runs.
func snapshotSeq(t *testing.T, res *bus.Resources, id string) uint64 {
	t.Helper()
	got, err := newLog(t, res).Snapshot(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return got.GetLastSequence()
}

// awaitSnapshot waits until run id's snapshot is at sequence want.
func awaitSnapshot(t *testing.T, res *bus.Resources, id string, want uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for got := snapshotSeq(t, res, id); got != want; got = snapshotSeq(t, res, id) {
		if time.Now().After(deadline) {
			t.Fatalf("snapshot of %s at %d, want %d", id, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A snapshot that only bounds how far a load folds is written in the
// background: the run's next decisions do not wait for it, no second one
// is written meanwhile, and once written it is the state it was taken of;
// the next one due follows the log.
func TestPeriodicSnapshotDoesNotHoldTheRun(t *testing.T) {
	res, gated, kv := gatedRuns(t)
	// Every 16 events, however soon (as a slow run's would be).
	l, err := runlog.New(t.Context(), gated, natstest.Logger(t), runlog.Options{SnapshotInterval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	st := create(t, l, "RUNSNAP") // a status change: created at once
	snapSeq := func() uint64 { return snapshotSeq(t, res, "RUNSNAP") }
	if got := snapSeq(); got != 1 {
		t.Fatalf("snapshot at %d after creation, want 1", got)
	}

	// 40 decisions: the first periodic snapshot falls due after 16 events
	// and waits at the gate; every decision still commits.
	done := make(chan error, 1)
	go func() {
		var err error
		for i := range 20 {
			id := fmt.Sprintf("s%d", i)
			if st, err = appendEv(t, l, st, dispatched(id, 1)); err != nil {
				break
			}
			if st, err = appendEv(t, l, st, succeeded(id, 1)); err != nil {
				break
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("decisions waited for a snapshot held at the gate")
	}
	if n := kv.updates.Load(); n != 1 {
		t.Fatalf("%d snapshot updates started while one was held, want 1", n)
	}
	if got := snapSeq(); got != 1 {
		t.Fatalf("snapshot at %d while its update is held, want 1", got)
	}

	close(kv.open)
	awaitSnapshot(t, res, "RUNSNAP", 17) // the state it was taken of
	// 41 events now, 24 past the snapshot: the next decision writes one.
	st, err = appendEv(t, l, st, dispatched("last", 1))
	if err != nil {
		t.Fatal(err)
	}
	awaitSnapshot(t, res, "RUNSNAP", st.Run.GetLastSequence())
	got, err := newLog(t, res).Load(t.Context(), "RUNSNAP")
	if err != nil || !proto.Equal(got.Run, st.Run) {
		t.Fatalf("load from the snapshot and the log: %v", err)
	}
}

// A status change's snapshot is in planex-runs when settle returns, and
// only then; the run's next decision commits while it is held.
func TestStatusSnapshotSettlesWithoutHoldingTheRun(t *testing.T) {
	res, gated, kv := gatedRuns(t)
	l := newLog(t, gated)
	created := create(t, l, "RUNSTATUS")
	before := created.Run.GetStatus()

	tx := l.Begin(created)
	if err := tx.Emit(planEv(1, &planexv1.PlanLineage{Added: []string{"a"}}, st("a"))); err != nil {
		t.Fatal(err)
	}
	running, settle, err := l.CommitDeferred(t.Context(), tx)
	if err != nil {
		t.Fatal(err)
	}
	if running.Run.GetStatus() == before {
		t.Fatalf("the plan left the run %s", before)
	}
	settled := make(chan struct{})
	go func() { settle(); close(settled) }()
	// The next decision commits while the snapshot is held.
	next, err := appendEv(t, l, running, dispatched("a", 1))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-settled:
		t.Fatal("settle returned before the status change's snapshot was written")
	default:
	}
	close(kv.open)
	<-settled
	got, err := newLog(t, res).Snapshot(t.Context(), "RUNSTATUS")
	if err != nil || got.GetStatus() != running.Run.GetStatus() || got.GetLastSequence() != running.Run.GetLastSequence() {
		t.Fatalf("snapshot after settle: %v at %d, want %s at %d (%v)", got.GetStatus(), got.GetLastSequence(), running.Run.GetStatus(), running.Run.GetLastSequence(), err)
	}
	if loaded, err := newLog(t, res).Load(t.Context(), "RUNSTATUS"); err != nil || !proto.Equal(loaded.Run, next.Run) {
		t.Fatalf("load: %v", err)
	}
}

// Between status changes, a run that moves fast writes no snapshot until
// the interval has passed, unless its snapshot lags by 1024 events.
func TestFastRunSnapshotsByIntervalOrLag(t *testing.T) {
	res, counted, kv := gatedRuns(t)
	close(kv.open)
	l, err := runlog.New(t.Context(), counted, natstest.Logger(t), runlog.Options{SnapshotInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	st := create(t, l, "RUNFAST")
	for i := 0; st.Run.GetLastSequence() < 1024; i++ {
		if st, err = appendEv(t, l, st, dispatched(fmt.Sprintf("s%d", i), 1)); err != nil {
			t.Fatal(err)
		}
	}
	if n := kv.updates.Load(); n != 0 {
		t.Fatalf("%d snapshots within the interval at a lag under 1024 events", n)
	}
	if st, err = appendEv(t, l, st, dispatched("last", 1)); err != nil {
		t.Fatal(err)
	}
	awaitSnapshot(t, res, "RUNFAST", st.Run.GetLastSequence()) // a lag of 1024 events
	if n := kv.updates.Load(); n != 1 {
		t.Fatalf("%d snapshots, want 1", n)
	}
}
