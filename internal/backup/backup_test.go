package backup_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/backup"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
)

// seed sets planex up on nc and stores a few messages in the streams a
// backup holds: events of two runs, a queued step with a consumer that
// has it delivered and unacknowledged, an effect record and an output.
func seed(t *testing.T, nc *nats.Conn) *bus.Resources {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := bus.Setup(ctx, nc, bus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		run := fmt.Sprintf("01RUN%d", i%2)
		if _, err := res.JS.Publish(ctx, bus.RunLogSubject(run), []byte(fmt.Sprintf("event %d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := res.JS.Publish(ctx, "planex.steps.email.send", []byte("step")); err != nil {
		t.Fatal(err)
	}
	cons, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamSteps, bus.PoolConsumerConfig("email", 1, 2*time.Second, 5))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range batch.Messages() {
		// delivered, never acknowledged: redelivered after a restore
	}
	if _, err := res.Effects.Create(ctx, bus.PoolEffectKey("email", bus.EffectKey("01RUN1", "send", 1)), []byte("done")); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Outputs.PutBytes(ctx, bus.OutputName("01RUN1", "top", 1), []byte(strings.Repeat("x", 100_000))); err != nil {
		t.Fatal(err)
	}
	return res
}

func TestBackupRestoresIntoAThreeNodeCluster(t *testing.T) {
	src := natstest.Start(t)
	seed(t, src.Connect(t))
	dir := filepath.Join(t.TempDir(), "b")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	m, err := backup.Backup(ctx, src.Connect(t), backup.Options{Dir: dir, PlanexVersion: "test", Check: true})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range m.Streams {
		names = append(names, s.Name)
	}
	// The order is the consistency argument of Streams: log first, effects last.
	want := []string{"PLANEX_EVENTS", "PLANEX_ENGINE", "PLANEX_TIMERS", "PLANEX_STEPS", "KV_planex-idempotency", "KV_planex-runs", "OBJ_planex-outputs", "KV_planex-drafts", "KV_planex-effects"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("streams %v, want %v", names, want)
	}
	if _, err := backup.Verify(dir); err != nil {
		t.Fatalf("verify: %v", err)
	}

	dst := natstest.StartCluster(t, 3)
	nc := dst.Connect(t)
	res, err := backup.Restore(ctx, nc, backup.RestoreOptions{Dir: dir, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Streams) != len(want) {
		t.Fatalf("restored %d streams, want %d", len(res.Streams), len(want))
	}
	js, _ := jetstream.New(nc)
	for _, s := range m.Streams {
		str, err := js.Stream(ctx, s.Name)
		if err != nil {
			t.Fatalf("stream %s after restore: %v", s.Name, err)
		}
		info := str.CachedInfo()
		if info.Config.Replicas != 3 || info.State.Msgs != s.Messages || info.State.LastSeq != s.LastSeq {
			t.Errorf("%s: replicas %d, %d messages up to %d; want 3, %d up to %d", s.Name, info.Config.Replicas, info.State.Msgs, info.State.LastSeq, s.Messages, s.LastSeq)
		}
	}
	// The pool's consumer came back with its step still to deliver.
	cons, err := js.Consumer(ctx, bus.StreamSteps, bus.PoolConsumer("email"))
	if err != nil {
		t.Fatalf("pool consumer after restore: %v", err)
	}
	ci, _ := cons.Info(ctx)
	t.Logf("restored consumer: delivered %+v ack floor %+v pending %d ack pending %d redelivered %d", ci.Delivered, ci.AckFloor, ci.NumPending, ci.NumAckPending, ci.NumRedelivered)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for msg := range batch.Messages() {
		if string(msg.Data()) != "step" {
			t.Errorf("queued step %q", msg.Data())
		}
		got++
	}
	if got != 1 {
		t.Errorf("the unacknowledged step was not delivered after the restore")
	}
	kv, err := js.KeyValue(ctx, bus.BucketEffects)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, bus.PoolEffectKey("email", bus.EffectKey("01RUN1", "send", 1))); err != nil || string(e.Value()) != "done" {
		t.Errorf("effect record after restore: %v", err)
	}
	obj, err := js.ObjectStore(ctx, bus.ObjectOutputs)
	if err != nil {
		t.Fatal(err)
	}
	if data, err := obj.GetBytes(ctx, bus.OutputName("01RUN1", "top", 1)); err != nil || len(data) != 100_000 {
		t.Errorf("output after restore: %d bytes, %v", len(data), err)
	}
}

func TestVerifyNamesTheCorruptFile(t *testing.T) {
	src := natstest.Start(t)
	seed(t, src.Connect(t))
	dir := filepath.Join(t.TempDir(), "b")
	if _, err := backup.Backup(t.Context(), src.Connect(t), backup.Options{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "streams", "KV_planex-effects", "stream.arc.s2")
	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(archive, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = backup.Verify(dir)
	if !errors.Is(err, backup.ErrCorrupt) || !strings.Contains(err.Error(), archive) || !strings.Contains(err.Error(), "SHA-256") {
		t.Fatalf("verify of a flipped byte: %v; want ErrCorrupt naming %s", err, archive)
	}
	// Restore verifies first: nothing reaches the target.
	dst := natstest.Start(t)
	nc := dst.Connect(t)
	if _, err := backup.Restore(t.Context(), nc, backup.RestoreOptions{Dir: dir}); !errors.Is(err, backup.ErrCorrupt) {
		t.Fatalf("restore of a corrupt backup: %v", err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.Stream(t.Context(), bus.StreamEvents); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("a corrupt backup's restore wrote %s (%v)", bus.StreamEvents, err)
	}

	if err := os.Remove(filepath.Join(dir, "streams", "PLANEX_STEPS", "backup.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(archive, append(data[:0:0], data...), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := backup.Verify(dir); err == nil || !strings.Contains(err.Error(), filepath.Join("PLANEX_STEPS", "backup.json")) {
		t.Fatalf("verify without a stream's metadata: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, backup.ManifestFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := backup.Verify(dir); !errors.Is(err, backup.ErrCorrupt) || !strings.Contains(err.Error(), "no manifest") {
		t.Fatalf("verify without a manifest: %v", err)
	}
}

func TestRestoreRefusesExistingStreams(t *testing.T) {
	src := natstest.Start(t)
	seed(t, src.Connect(t))
	dir := filepath.Join(t.TempDir(), "b")
	if _, err := backup.Backup(t.Context(), src.Connect(t), backup.Options{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	dst := natstest.Start(t)
	_, res := dst.Setup(t) // a supervisor started before the restore
	if _, err := res.JS.Publish(t.Context(), bus.RunLogSubject("01NEW"), []byte("newer")); err != nil {
		t.Fatal(err)
	}
	nc := dst.Connect(t)
	for _, dry := range []bool{true, false} {
		_, err := backup.Restore(t.Context(), nc, backup.RestoreOptions{Dir: dir, DryRun: dry})
		if !errors.Is(err, backup.ErrExists) || !strings.Contains(err.Error(), "PLANEX_EVENTS (1 messages)") || !strings.Contains(err.Error(), "--replace") {
			t.Fatalf("restore (dry run %v) over existing streams: %v", dry, err)
		}
	}
	if info, err := res.JS.Stream(t.Context(), bus.StreamEvents); err != nil || info.CachedInfo().State.Msgs != 1 {
		t.Fatalf("a refused restore changed %s: %v", bus.StreamEvents, err)
	}
	dry, err := backup.Restore(t.Context(), nc, backup.RestoreOptions{Dir: dir, DryRun: true, Replace: true})
	if err != nil || len(dry.Streams) == 0 || !dry.Streams[0].Replaced {
		t.Fatalf("dry run with --replace: %+v, %v", dry, err)
	}
	if str, _ := res.JS.Stream(t.Context(), bus.StreamEvents); str.CachedInfo().State.Msgs != 1 {
		t.Fatal("a dry run replaced a stream")
	}
	done, err := backup.Restore(t.Context(), nc, backup.RestoreOptions{Dir: dir, Replace: true})
	if err != nil {
		t.Fatal(err)
	}
	if done.Streams[0].Name != bus.StreamEvents || done.Streams[0].Messages != 5 || !done.Streams[0].Replaced {
		t.Fatalf("replaced %+v, want PLANEX_EVENTS with the backup's 5 events", done.Streams[0])
	}
}

func TestBackupRefusesAnUsedDirectoryAndAMissingStream(t *testing.T) {
	src := natstest.Start(t)
	nc := src.Connect(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "old"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := backup.Backup(t.Context(), nc, backup.Options{Dir: dir}); !errors.Is(err, backup.ErrNotEmpty) {
		t.Fatalf("backup into a used directory: %v", err)
	}
	// A NATS planex never set up: no false success.
	empty := filepath.Join(t.TempDir(), "b")
	_, err := backup.Backup(t.Context(), nc, backup.Options{Dir: empty})
	if err == nil || !strings.Contains(err.Error(), "PLANEX_EVENTS") {
		t.Fatalf("backup of a NATS without planex: %v", err)
	}
	if _, err := os.Stat(filepath.Join(empty, backup.ManifestFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed backup wrote a manifest: %v", err)
	}
}

// A planex stream the backup neither takes nor skips fails it, naming the
// stream: state added by a release must never be left out silently.
func TestBackupRefusesAnUnknownPlanexStream(t *testing.T) {
	src := natstest.Start(t)
	nc, _ := src.Setup(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "planex-unheard-of"}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "b")
	_, err = backup.Backup(t.Context(), nc, backup.Options{Dir: dir, PlanexVersion: "v9.9.9"})
	if err == nil || !strings.Contains(err.Error(), "KV_planex-unheard-of") {
		t.Fatalf("backup with an unknown planex bucket: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, backup.ManifestFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused backup wrote a manifest: %v", err)
	}
}

// TestRestoreAsksAgainWhenPlacementIsRefused restores with more
// replicas than the cluster has nodes: the server refuses the placement
// (no suitable peers, 10005), which Restore asks again until its wait
// ends and then reports, naming the stream, with nothing created. A
// cluster just started on a loaded machine refuses the same way until
// the meta leader has heard from every node (CI saw it): that refusal
// ends within the wait.
func TestRestoreAsksAgainWhenPlacementIsRefused(t *testing.T) {
	src := natstest.Start(t)
	seed(t, src.Connect(t))
	dir := filepath.Join(t.TempDir(), "b")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	m, err := backup.Backup(ctx, src.Connect(t), backup.Options{Dir: dir, PlanexVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	dst := natstest.StartCluster(t, 3)
	nc := dst.Connect(t)
	var refusals []string
	defer backup.SetPlacementRefusedHook(func(stream string) { refusals = append(refusals, stream) }, 2*time.Second)()
	_, err = backup.Restore(ctx, nc, backup.RestoreOptions{Dir: dir, Replicas: 5})
	first := m.Streams[0].Name
	if err == nil || !strings.Contains(err.Error(), "restore stream "+first) || !strings.Contains(err.Error(), "no suitable peers") {
		t.Fatalf("restore with 5 replicas on 3 nodes: %v; want the placement refusal of %s", err, first)
	}
	if len(refusals) < 2 {
		t.Fatalf("refusals asked again: %v; want at least 2 for %s", refusals, first)
	}
	for _, s := range refusals {
		if s != first {
			t.Fatalf("refusal for %s: the restore went on past %s", s, first)
		}
	}
	js, _ := jetstream.New(nc)
	for name := range js.StreamNames(ctx).Name() {
		t.Errorf("stream %s exists after the refused restore", name)
	}
}
