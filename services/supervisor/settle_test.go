package supervisor_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// heldRuns holds every update of planex-runs (the snapshots written after
// a run's creation) until open is closed.
type heldRuns struct {
	jetstream.KeyValue
	open chan struct{}
	held chan string
}

func (k *heldRuns) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	select {
	case k.held <- key:
	default:
	}
	select {
	case <-k.open:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return k.KeyValue.Update(ctx, key, value, last)
}

// A decision that changes the run's status settles (is acknowledged) only
// once its snapshot is in planex-runs, but the engine lets go of the run
// first: the run's next decisions commit while that snapshot is held.
func TestStatusSnapshotDoesNotHoldTheRunsNextDecisions(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	kv := &heldRuns{open: make(chan struct{}), held: make(chan string, 1)}
	r := h.startReplicaOn(func(res *bus.Resources) *bus.Resources {
		held := *res
		kv.KeyValue = res.Runs
		held.Runs = kv
		return &held
	})
	id := h.runGoal(t, r, "settle", always(
		step("a", "test.echo", map[string]any{"value": 1}),
		step("b", "test.echo", map[string]any{"value": 2}, "a"),
	))
	ctx := testCtx(t, 30*time.Second)
	select {
	case <-kv.held: // the snapshot of PLANNING -> RUNNING waits at the gate
	case <-ctx.Done():
		t.Fatal("no snapshot update reached planex-runs")
	}
	// With that snapshot held, both steps run and the run's log reaches
	// its end: each of those decisions took the run's lock after the
	// planning decision let go of it.
	var payloads []string
	for !slices.Contains(payloads, "finished") {
		if ctx.Err() != nil {
			t.Fatalf("with the RUNNING snapshot held, the log reached only %v: the run's next decisions waited for it", payloads)
		}
		evs, err := runlog.ReadStored(ctx, h.res.JS, id)
		if err != nil {
			t.Fatal(err)
		}
		payloads = payloads[:0]
		for _, ev := range evs {
			payloads = append(payloads, runlog.PayloadName(ev))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Once the gate opens the snapshots follow: the run is listed as
	// succeeded.
	close(kv.open)
	run := waitTerminal(t, r.client, id, 20*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run %s, want SUCCEEDED", run.GetStatus())
	}
	for {
		list, err := r.client.ListRuns(ctx, &planexv1.ListRunsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(list.GetRuns(), func(r *planexv1.Run) bool { return r.GetId() == id })
		if i >= 0 && list.GetRuns()[i].GetStatus() == planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("ListRuns never showed the run succeeded")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
