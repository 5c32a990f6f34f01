package runlog

import (
	"bufio"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"google.golang.org/protobuf/encoding/prototext"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
)

// checkpointRun is a run of a shape the index summarizes: a ULID id
// (or text), a goal with capitals of either kind, labels, tools, a
// waiting gate, a fork or child origin.
func checkpointRun(i int, id string, status planexv1.RunStatus) *planexv1.Run {
	goals := []string{"refund acme", "Refund ACME", "Überweisung prüfen", ""}
	run := searchRun(id, goals[i%len(goals)], status, map[string]string{"team": fmt.Sprintf("t%d", i%3), "env": "prod"}, "sql.query", fmt.Sprintf("tool.%d", i%2))
	run.Plans[0].Steps[0].Id = "a"
	run.Steps = []*planexv1.StepState{{StepId: "a", Status: planexv1.StepStatus_STEP_STATUS_SUCCEEDED}, {StepId: "s1", Status: planexv1.StepStatus_STEP_STATUS_PENDING}}
	switch i % 5 {
	case 1:
		run.ForkedFrom = &planexv1.ForkOrigin{RunId: "01JAAAAAAAAAAAAAAAAAAAAAAA", Sequence: 4}
	case 2:
		run.ParentRunId = "01JBBBBBBBBBBBBBBBBBBBBBBB"
	}
	if status == planexv1.RunStatus_RUN_STATUS_WAITING {
		run.Gates = []*planexv1.Gate{{Id: "g1", Kind: planexv1.GateKind_GATE_KIND_PLAN, PlanRevision: 1}}
	}
	if status == planexv1.RunStatus_RUN_STATUS_FAILED {
		run.StopReason = planexv1.StopReason_STOP_REASON_BUDGET_EXCEEDED
	}
	return run
}

// checkpointServer is an embedded NATS server with planex's buckets and
// the run index's checkpoint store.
func checkpointServer(t *testing.T) (*natstest.Server, *bus.Resources, jetstream.ObjectStore) {
	t.Helper()
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	store, err := res.RunIndexBucket(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return srv, res, store
}

// putRun writes run's snapshot to planex-runs and returns its revision.
func putRun(ctx context.Context, res *bus.Resources, run *planexv1.Run) (uint64, error) {
	v, err := SnapshotValue(run)
	if err != nil {
		return 0, err
	}
	return res.Runs.Put(ctx, run.GetId(), v)
}

// dumpIndex lists every summary of x as text, in order.
func dumpIndex(x *searchIndex) []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []string
	for i := range x.runs {
		s := &x.runs[i]
		name := func(p *istr) string {
			if p == nil {
				return "-"
			}
			return p.s
		}
		out = append(out, fmt.Sprintf("%s rev=%d text=%q lower=%q steps=%d/%d waiting=%v by=%s fork=%s parent=%s labels=%v tools=%v basic={%s}",
			s.id, s.rev, s.text(), s.lowerGoal(), s.done, s.steps, s.waiting, name(s.startedBy), name(s.forkedFrom), name(s.parent),
			s.labels.pairsOrNil(), s.tools.pairsOrNil(), prototext.Format(s.basic())))
	}
	return out
}

// loadIndex starts a Log on res (with checkpoints in store when not nil)
// and waits for its index.
func loadIndex(t *testing.T, ctx context.Context, res *bus.Resources, store jetstream.ObjectStore) *Log {
	t.Helper()
	l, err := New(ctx, res, natstest.Logger(t), Options{IndexCheckpoints: IndexCheckpoints{Store: store, MinRuns: 1, MinChanges: 1, Every: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.WaitIndexed(ctx); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestIndexCheckpoint: a restarted index loaded from a checkpoint and the
// writes since (new runs, status changes, deletions, writes made
// while the checkpoint was being written) is the index a full load of the
// bucket builds, runs whose last write expired after the checkpoint
// included; a damaged checkpoint, one of a re-created bucket and one
// ahead of the bucket are not used, and the index is loaded from the
// bucket instead.
func TestIndexCheckpoint(t *testing.T) {
	srv, res, store := checkpointServer(t)
	ctx := t.Context()
	put := func(run *planexv1.Run) {
		t.Helper()
		if _, err := putRun(ctx, res, run); err != nil {
			t.Fatal(err)
		}
	}
	statuses := []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_RUNNING, planexv1.RunStatus_RUN_STATUS_WAITING,
		planexv1.RunStatus_RUN_STATUS_SUCCEEDED, planexv1.RunStatus_RUN_STATUS_FAILED}
	var ids []string
	// The first 40 runs are never written again: the "expired" ones below.
	for i := range 400 {
		id := ulid.Make().String()
		if i == 7 {
			id = "text-id-7" // not a ULID
		}
		ids = append(ids, id)
		put(checkpointRun(i, id, statuses[i%len(statuses)]))
	}

	// A checkpoint written while runs keep being written.
	first := loadIndex(t, ctx, res, store)
	var (
		wg      sync.WaitGroup
		lastRev uint64
	)
	wg.Go(func() {
		for i := 40; i < 140; i++ {
			rev, err := putRun(ctx, res, checkpointRun(i+1, ids[i], statuses[(i+1)%len(statuses)]))
			if err != nil {
				t.Error(err)
				return
			}
			lastRev = rev
		}
	})
	n, err := first.CheckpointIndex(ctx)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if n < 400 {
		t.Fatalf("checkpoint of %d runs, want at least 400", n)
	}
	// Once the index has applied those writes, one more checkpoint takes
	// them (if the first did not), and then nothing is left to write.
	waitFor(t, func() bool {
		first.index.mu.RLock()
		defer first.index.mu.RUnlock()
		return first.index.applied >= lastRev
	})
	if _, err := first.CheckpointIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := first.CheckpointIndex(ctx); err != nil || n != 0 {
		t.Fatalf("a checkpoint with nothing changed: %d runs, %v", n, err)
	}

	// After it: new runs, status changes, deletions.
	for i := 400; i < 450; i++ {
		id := ulid.Make().String()
		ids = append(ids, id)
		put(checkpointRun(i, id, statuses[i%len(statuses)]))
	}
	for i := 200; i < 260; i++ {
		put(checkpointRun(i+2, ids[i], planexv1.RunStatus_RUN_STATUS_CANCELLED))
	}
	if err := res.Runs.Delete(ctx, ids[300]); err != nil {
		t.Fatal(err)
	}
	if err := res.Runs.Delete(ctx, ids[301]); err != nil {
		t.Fatal(err)
	}
	// Expiry: the bucket's oldest messages go, as MaxAge removes them
	// (no marker): the first 40 runs, written once before everything else.
	kvStream, err := res.JS.Stream(ctx, "KV_"+bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	info, err := kvStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := kvStream.Purge(ctx, jetstream.WithPurgeSequence(info.State.FirstSeq+40)); err != nil {
		t.Fatal(err)
	}

	want := dumpIndex(&loadIndex(t, ctx, res, nil).index)
	if len(want) != 450-40-2 {
		t.Fatalf("the full load indexed %d runs, want %d", len(want), 450-40-2)
	}
	restarted := loadIndex(t, ctx, res, store)
	if n, _ := restarted.IndexRestored(); n < 400 {
		t.Fatalf("the restarted index loaded %d runs from the checkpoint, want at least 400", n)
	}
	if got := dumpIndex(&restarted.index); !slices.Equal(got, want) {
		t.Fatalf("restarted from the checkpoint:\n%s\nwant (a full load):\n%s", strings.Join(diffLines(got, want), "\n"), strings.Join(diffLines(want, got), "\n"))
	}
	// It follows the bucket as a loaded index does.
	put(checkpointRun(3, ids[450-1], planexv1.RunStatus_RUN_STATUS_SUCCEEDED))
	waitFor(t, func() bool {
		got, _ := restarted.SearchRuns(&Query{Statuses: []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_SUCCEEDED}, RunIDs: map[string]bool{ids[449]: true}}, "", 0)
		return len(got) == 1
	})

	unused := func(what string) {
		t.Helper()
		want := dumpIndex(&loadIndex(t, ctx, res, nil).index)
		l := loadIndex(t, ctx, res, store)
		if n, _ := l.IndexRestored(); n != 0 {
			t.Fatalf("%s: the index loaded %d runs from the checkpoint", what, n)
		}
		if got := dumpIndex(&l.index); !slices.Equal(got, want) {
			t.Fatalf("%s: the index differs from a full load:\n%s", what, strings.Join(diffLines(got, want), "\n"))
		}
	}
	// Damaged: the object store's digest holds, the content does not.
	if _, err := store.PutBytes(ctx, checkpointName, []byte("planex-run-index\n\x01garbage")); err != nil {
		t.Fatal(err)
	}
	unused("a damaged checkpoint")

	// Ahead of the bucket (a restore of an older backup).
	if _, err := restarted.CheckpointIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.GetInfo(ctx, checkpointName); err != nil {
		t.Fatal(err)
	}
	// Re-created: a bucket of the same name, other runs.
	if err := res.JS.DeleteKeyValue(ctx, bus.BucketRuns); err != nil {
		t.Fatal(err)
	}
	_, res2 := srv.Setup(t)
	res.Runs = res2.Runs
	for i := range 5 {
		put(checkpointRun(i, ulid.Make().String(), planexv1.RunStatus_RUN_STATUS_RUNNING))
	}
	unused("a checkpoint of a re-created bucket")
}

// TestIndexCheckpointAheadOfTheBucket: a checkpoint holding a revision
// the bucket does not (a restore of an older backup keeps the stream but
// not its later writes) is not used.
func TestIndexCheckpointAheadOfTheBucket(t *testing.T) {
	x := &searchIndex{}
	x.init()
	x.put(checkpointRun(0, ulid.Make().String(), planexv1.RunStatus_RUN_STATUS_WAITING), 90)
	x.complete(0)
	var b strings.Builder
	if _, err := x.encodeCheckpoint(&b, checkpointHeader{rev: 80, created: 1, runs: 1}); err != nil {
		t.Fatal(err)
	}
	decode := func(bs bucketState) error {
		_, _, _, err := decodeCheckpoint(newBufReader(b.String()), bs)
		return err
	}
	if err := decode(bucketState{created: 1, lastSeq: 100}); err != nil {
		t.Fatalf("a checkpoint the bucket holds: %v", err)
	}
	for _, bs := range []bucketState{{created: 1, lastSeq: 85}, {created: 1, lastSeq: 70}, {created: 2, lastSeq: 100}} {
		if err := decode(bs); err == nil || !strings.Contains(err.Error(), errStaleCheckpoint.Error()) {
			t.Fatalf("bucket %+v: %v, want a stale checkpoint", bs, err)
		}
	}
	// Cut anywhere, it is refused, never half loaded.
	full := b.String()
	for cut := range len(full) {
		if _, _, _, err := decodeCheckpoint(newBufReader(full[:cut]), bucketState{created: 1, lastSeq: 100}); err == nil {
			t.Fatalf("a checkpoint cut at %d of %d bytes was accepted", cut, len(full))
		}
	}
}

func newBufReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }

func diffLines(a, b []string) []string {
	var out []string
	for _, l := range a {
		if !slices.Contains(b, l) {
			out = append(out, l)
		}
	}
	return out
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestIndexCheckpointSweepsOrphans: chunks no checkpoint names (what two
// replicas replacing the checkpoint at once leave behind) are purged once
// older than orphanAge, and kept while younger (a checkpoint another
// replica is writing); the checkpoint written beside them loads.
func TestIndexCheckpointSweepsOrphans(t *testing.T) {
	_, res, store := checkpointServer(t)
	ctx := t.Context()
	for i := range 20 {
		if _, err := putRun(ctx, res, checkpointRun(i, ulid.Make().String(), planexv1.RunStatus_RUN_STATUS_WAITING)); err != nil {
			t.Fatal(err)
		}
	}
	orphan := "$O." + bus.ObjectRunIndex + ".C.orphanedchunks"
	if _, err := res.JS.Publish(ctx, orphan, []byte("chunk of a checkpoint that lost the race")); err != nil {
		t.Fatal(err)
	}
	chunks := func() []string {
		t.Helper()
		stream, err := res.JS.Stream(ctx, "OBJ_"+bus.ObjectRunIndex)
		if err != nil {
			t.Fatal(err)
		}
		si, err := stream.Info(ctx, jetstream.WithSubjectFilter("$O."+bus.ObjectRunIndex+".C.>"))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for s := range si.State.Subjects {
			out = append(out, s)
		}
		slices.Sort(out)
		return out
	}
	write := func(orphanAge time.Duration) {
		t.Helper()
		l, err := New(ctx, res, natstest.Logger(t), Options{IndexCheckpoints: IndexCheckpoints{Store: store, MinRuns: 1, MinChanges: 1, Every: time.Hour, orphanAge: orphanAge}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.WaitIndexed(ctx); err != nil {
			t.Fatal(err)
		}
		if n, err := l.CheckpointIndex(ctx); err != nil || n == 0 {
			t.Fatalf("checkpoint: %d runs, %v", n, err)
		}
	}
	write(time.Hour)
	if got := chunks(); len(got) != 2 || !slices.Contains(got, orphan) {
		t.Fatalf("chunk subjects %v: want the young orphan kept beside the checkpoint's", got)
	}
	// Another run, so that the next checkpoint is needed.
	if _, err := putRun(ctx, res, checkpointRun(0, ulid.Make().String(), planexv1.RunStatus_RUN_STATUS_WAITING)); err != nil {
		t.Fatal(err)
	}
	write(time.Nanosecond)
	got := chunks()
	info, err := store.GetInfo(ctx, checkpointName)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"$O." + bus.ObjectRunIndex + ".C." + info.NUID}; !slices.Equal(got, want) {
		t.Fatalf("chunk subjects %v, want only the checkpoint's %v", got, want)
	}
	if n, _ := loadIndex(t, ctx, res, store).IndexRestored(); n != 21 {
		t.Fatalf("the index loaded %d runs from the checkpoint, want 21", n)
	}
}
