package runlog_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/planex-dev/planex/internal/natstest")

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

// A snapshot that only bounds how far a load folds is written in the
// background: the run's next decisions do not wait for it, no second one
// is written meanwhile, and once written it is the state it was taken of;
// the next one due follows the log.
func TestPeriodicSnapshotDoesNotHoldTheRun(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	gated := *res
	kv := &gatedKV{KeyValue: res.Runs, open: make(chan struct{})}
	gated.Runs = kv
	l := newLog(t, &gated)
	st := create(t, l, "RUNSNAP") // a status change: created at once
	snapSeq := func() uint64 {
		t.Helper()
		got, err := newLog(t, res).Snapshot(t.Context(), "RUNSNAP")
		if err != nil {
			t.Fatal(err)
		}
		return got.GetLastSequence()
	}
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
	deadline := time.Now().Add(30 * time.Second)
	for snapSeq() != 17 {
		if time.Now().After(deadline) {
			t.Fatalf("snapshot at %d after the gate opened, want 17 (the state it was taken of)", snapSeq())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// 41 events now, 24 past the snapshot: the next decision writes one.
	st, err := appendEv(t, l, st, dispatched("last", 1))
	if err != nil {
		t.Fatal(err)
	}
	for snapSeq() != st.Run.GetLastSequence() {
		if time.Now().After(deadline) {
			t.Fatalf("snapshot at %d, want %d", snapSeq(), st.Run.GetLastSequence())
		}
		time.Sleep(10 * time.Millisecond)
	}
	got, err := newLog(t, res).Load(t.Context(), "RUNSNAP")
	if err != nil || !proto.Equal(got.Run, st.Run) {
		t.Fatalf("load from the snapshot and the log: %v", err)
	}
}
