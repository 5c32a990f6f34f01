package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

// engineBound reads the main engine consumer's MaxAckPending.
func (h *harness) engineBound() int {
	h.t.Helper()
	c, err := h.res.JS.Consumer(testCtx(h.t, 5*time.Second), bus.StreamEngine, bus.ConsumerEngine)
	if err != nil {
		h.t.Fatal(err)
	}
	return c.CachedInfo().Config.MaxAckPending
}

// waitEngineBound waits until the engine consumer's MaxAckPending is want.
func (h *harness) waitEngineBound(want int, what string) {
	h.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for got := h.engineBound(); got != want; got = h.engineBound() {
		if time.Now().After(deadline) {
			h.t.Fatalf("engine consumer MaxAckPending %d, want %d (%s)", got, want, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopReplica stops a replica gracefully, as the cleanup of startReplica
// does.
func stopReplica(t *testing.T, r *replica) {
	t.Helper()
	r.once.Do(func() {
		r.gs.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.stop(ctx); err != nil {
			t.Errorf("stop replica: %v", err)
		}
		r.nc.Close()
	})
}

// With --engine-max-ack-pending 0 the engine consumer's bound follows the
// live supervisor replicas: one replica of 16 workers may hold 16 × 16
// messages, a second doubles the bound, a graceful stop shrinks it at once
// (deregistration), a killed replica's share goes when its registration
// expires; an explicit value is kept as set, without registering.
func TestEngineMaxAckPendingScalesWithReplicas(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// Registrations live 3 s here (renewed every second), so that a killed
	// replica's share goes within the test.
	ctx := testCtx(t, 60*time.Second)
	res, err := bus.Setup(ctx, h.nc, bus.Options{SupervisorsTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := res.SupervisorsBucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const share = 16 * 16 // the harness' 16 workers × 16 messages each
	scaled := func(c *engine.Config) { c.MaxAckPending = 0 }

	a := h.startReplica(scaled)
	h.waitEngineBound(share, "one replica")
	b := h.startReplica(scaled)
	h.waitEngineBound(2*share, "two replicas")
	// The replicas still work with the scaled bound.
	succeeded(t, a, h.runGoal(t, b, "scaled", always(step("a", "test.echo", map[string]any{"value": 1}))))

	stopReplica(t, b)
	h.waitEngineBound(share, "after b deregistered")

	c := h.startReplica(scaled)
	h.waitEngineBound(2*share, "a and c")
	c.kill()
	h.waitEngineBound(share, "after c's registration expired")

	stopReplica(t, a) // the last one leaves the bound as it is
	// a deregistered itself; c's registration goes when the bucket's
	// TTL removes it, which can come after a already stopped counting c
	// (a replica ignores registrations older than the TTL): wait for it.
	var keys []string
	waitFor(t, 10*time.Second, "every registration gone", func() bool {
		keys = listKeys(t, kv)
		return len(keys) == 0
	})

	h.startReplica(func(c *engine.Config) { c.MaxAckPending = 300 })
	if got := h.engineBound(); got != 300 {
		t.Fatalf("explicit --engine-max-ack-pending: consumer has %d, want 300", got)
	}
	if keys := listKeys(t, kv); len(keys) != 0 {
		t.Fatalf("a replica with an explicit bound registered: %v", keys)
	}
}

func listKeys(t *testing.T, kv jetstream.KeyValue) []string {
	t.Helper()
	l, err := kv.ListKeys(testCtx(t, 5*time.Second))
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	return keys
}

// One run whose messages pile up on its lock must not hold up the other
// runs of a replica: while a decision of run "hot" is blocked (holding its
// run lock and one of the two workers) and two dozen more of its messages
// arrive — more than the replica's 16 places in hand — another run is
// delivered, planned, executed and finished. Before a run's places were
// bounded, the hot run's messages filled the hand and the consume callback
// blocked with the other run's messages behind them.
func TestHotRunDoesNotHoldUpOtherRunsOnReplica(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var (
		mu  sync.Mutex
		hot string
	)
	entered := make(chan string, 1)
	release := make(chan struct{})
	var releaseOnce sync.Once
	r := h.startReplica(func(c *engine.Config) {
		c.Workers = 2
		c.MaxAckPending = 256 // the replica's hand is under test, not the consumer's bound
		c.Hooks.AfterAppend = func(runID string, _ []*planexv1.RunEvent) {
			mu.Lock()
			first := hot == ""
			if first {
				hot = runID
			}
			mu.Unlock()
			if first {
				entered <- runID
				<-release
			}
		}
	})
	// Registered after the replica's cleanup, so it runs before it.
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })

	hotID := h.runGoal(t, r, "hot", always(step("a", "test.echo", map[string]any{"value": "hot"})))
	select {
	case id := <-entered:
		if id != hotID {
			t.Fatalf("blocked run %s, want the hot run %s", id, hotID)
		}
	case <-testCtx(t, 20*time.Second).Done():
		t.Fatal("the hot run's first decision never reached the hook")
	}
	ctx := testCtx(t, 20*time.Second)
	for i := range 24 {
		if _, err := bus.Publish(ctx, h.res.JS, bus.Publication{
			Subject: bus.EngineSubject(hotID, bus.KindKick),
			Msg:     &planexv1.EngineKick{RunId: hotID, Cancel: true, CancelReason: "flood"},
			MsgID:   fmt.Sprintf("flood-%d", i),
		}); err != nil {
			t.Fatal(err)
		}
	}

	cold := h.runGoal(t, r, "cold", always(
		step("a", "test.echo", map[string]any{"value": 1}),
		step("b", "test.echo", map[string]any{"value": 2}, "a"),
	))
	succeeded(t, r, cold)

	// The hot run is still held by its blocked decision; released, its
	// queued messages are handled: the first cancel stops it.
	run, err := r.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: hotID})
	if err != nil {
		t.Fatal(err)
	}
	if s := run.GetRun().GetStatus(); s != planexv1.RunStatus_RUN_STATUS_PENDING {
		t.Fatalf("hot run %s while its first decision is blocked, want PENDING", s)
	}
	releaseOnce.Do(func() { close(release) })
	if run := waitTerminal(t, r.client, hotID, 20*time.Second); run.GetStatus() != planexv1.RunStatus_RUN_STATUS_CANCELLED {
		t.Fatalf("hot run %s %q, want CANCELLED by the flood", run.GetStatus(), run.GetStopMessage())
	}
	h.waitEngineIdle()
}
