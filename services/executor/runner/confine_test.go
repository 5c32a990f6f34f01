package runner_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor/runner"
)

// TestRunnerWithinItsGrants runs a replica of the sql pool as
// executor-sql under the generated permissions: it starts (registration,
// consumers, replica count), runs a step from the queue whose large output
// goes to planex-outputs-sql, which the supervisor's code reads back;
// redeliveries of an attempt store their outputs without replacing (no
// purge right), and a side-effecting step records its effect under the
// pool's key and honours a record of the layout before pools. The
// connection reports no permissions violation throughout.
func TestRunnerWithinItsGrants(t *testing.T) {
	connect := natstest.Confined(t, "sql", "email")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sup, err := bus.Setup(ctx, connect("supervisor", make(chan error, 8)), bus.Options{Update: true})
	if err != nil {
		t.Fatalf("supervisor sets up JetStream: %v", err)
	}
	errs := make(chan error, 16)
	res, err := bus.Setup(ctx, connect("executor-sql", errs), bus.Options{})
	if err != nil {
		t.Fatalf("executor-sql sets up JetStream: %v", err)
	}

	var version atomic.Int32
	big := newTool(t, "sql.big", planexv1.SideEffect_SIDE_EFFECT_READ, func(context.Context, runner.Call) (any, error) {
		return map[string]any{"rows": strings.Repeat("r", 200<<10), "version": version.Load()}, nil
	})
	write := newTool(t, "sql.write", planexv1.SideEffect_SIDE_EFFECT_WRITE, func(_ context.Context, c runner.Call) (any, error) {
		return map[string]any{"written": c.StepID}, nil
	})
	r, err := runner.New(res, runner.Options{Pool: "sql", Tools: []runner.Tool{big, write}, AckWait: 5 * time.Second,
		InlineOutputBytes: 1000, MaxOutputBytes: 1 << 20, Logger: natstest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatalf("runner starts as executor-sql: %v", err)
	}
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = r.Stop(sctx)
	})

	// A step from the queue: its result names planex-outputs-sql, and the
	// supervisor reads the output from there.
	eng, err := sup.JS.CreateOrUpdateConsumer(ctx, bus.StreamEngine, jetstream.ConsumerConfig{
		Durable: "test-engine", FilterSubject: bus.SubjectEnginePrefix + "*." + bus.KindResult, AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	dispatch(t, sup, step(t, "RUN1", "q", "sql.big", map[string]any{"n": 1}))
	var got *planexv1.StepResult
	for got == nil && ctx.Err() == nil {
		batch, err := eng.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			got = &planexv1.StepResult{}
			if err := bus.Decode(bus.NatsMsg(m), got); err != nil {
				t.Fatal(err)
			}
			_ = m.Ack()
		}
	}
	ref := got.GetOutputRef()
	if got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED || ref.GetBucket() != bus.OutputBucket("sql") {
		t.Fatalf("result %v, want SUCCEEDED with an output in %s", got, bus.OutputBucket("sql"))
	}
	if err := bus.CheckStepOutputRef(ref, "sql", "RUN1", "q", 1); err != nil {
		t.Fatal(err)
	}
	data, err := sup.ReadOutput(ctx, ref)
	if err != nil || int64(len(data)) != ref.GetSize() || !strings.Contains(string(data), strings.Repeat("r", 1000)) {
		t.Fatalf("supervisor reads the output: %d bytes, %v", len(data), err)
	}

	// Redeliveries of one attempt: the same output reuses the object, a
	// different one gets its own name; both stay readable.
	again, err := r.Execute(ctx, step(t, "RUN1", "q", "sql.big", map[string]any{"n": 1}))
	if err != nil || again.GetOutputRef().GetName() != ref.GetName() {
		t.Fatalf("redelivery with the same output: %v %v, want the object %s reused", again.GetOutputRef(), err, ref.GetName())
	}
	version.Store(1)
	changed, err := r.Execute(ctx, step(t, "RUN1", "q", "sql.big", map[string]any{"n": 1}))
	if err != nil || changed.GetOutputRef().GetName() == ref.GetName() {
		t.Fatalf("redelivery with another output: %v %v, want a distinct object", changed.GetOutputRef(), err)
	}
	for _, ref := range []*planexv1.OutputRef{ref, changed.GetOutputRef()} {
		if _, err := sup.ReadOutput(ctx, ref); err != nil {
			t.Errorf("read %s: %v", ref.GetName(), err)
		}
	}

	// A side effect: recorded under the pool's key, replayed on redelivery.
	first, err := r.Execute(ctx, step(t, "RUN1", "w", "sql.write", map[string]any{"n": 1}))
	if err != nil || first.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("write step: %v %v", first, err)
	}
	if _, err := sup.Effects.Get(ctx, bus.PoolEffectKey("sql", bus.EffectKey("RUN1", "w", 1))); err != nil {
		t.Fatalf("effect record under the pool's key: %v", err)
	}
	if _, err := sup.Effects.Get(ctx, bus.EffectKey("RUN1", "w", 1)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("effect record under the layout before pools: %v, want none written", err)
	}
	second, err := r.Execute(ctx, step(t, "RUN1", "w", "sql.write", map[string]any{"n": 1}))
	if err != nil || !second.GetReplayed() || write.calls.Load() != 1 {
		t.Fatalf("redelivered write: %v %v (tool ran %d times), want a replay", second, err, write.calls.Load())
	}
	// A record written before the upgrade (attempt key only, by the
	// previous layout) is honoured: the effect is not repeated.
	old, _ := proto.Marshal(&planexv1.StepResult{RunId: "RUN1", StepId: "v", Attempt: 1, ExecutorId: "old-replica", StartedAt: timestamppb.Now(),
		Status: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED})
	if _, err := sup.Effects.Create(ctx, bus.EffectKey("RUN1", "v", 1), old); err != nil {
		t.Fatal(err)
	}
	replayed, err := r.Execute(ctx, step(t, "RUN1", "v", "sql.write", map[string]any{"n": 1}))
	if err != nil || !replayed.GetReplayed() || write.calls.Load() != 1 {
		t.Fatalf("attempt recorded before the upgrade: %v %v (tool ran %d times), want the old record replayed", replayed, err, write.calls.Load())
	}

	// Async errors arrive in order: once a violation provoked now is
	// reported, any the runner caused would have been.
	sentinel := "planex.sentinel.never-granted"
	if err := res.JS.Conn().Publish(sentinel, nil); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case err := <-errs:
			if strings.Contains(err.Error(), sentinel) {
				return
			}
			t.Fatalf("executor-sql's connection reported %v", err)
		case <-ctx.Done():
			t.Fatal("the sentinel's permissions violation was never reported")
		}
	}
}
