package runner_test

import (
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor/runner"
)

// With MaxAckPending left zero, the pool's consumer bound follows the
// replicas registered: one replica of concurrency 3 gives 3, a second one
// 6; an explicit MaxAckPending is kept as set.
func TestMaxAckPendingScalesWithReplicas(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	tool := func() runner.Tool { return newTool(t, "p.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo) }
	bound := func() int {
		t.Helper()
		c, err := res.JS.Consumer(ctxT(t, 5*time.Second), bus.StreamSteps, bus.PoolConsumer("p"))
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctxT(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return info.Config.MaxAckPending
	}
	waitBound := func(want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for got := bound(); got != want; got = bound() {
			if time.Now().After(deadline) {
				t.Fatalf("pool consumer MaxAckPending %d, want %d", got, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool()}, Concurrency: 3})
	waitBound(3)
	startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool()}, Concurrency: 3})
	waitBound(6)

	startRunner(t, srv, runner.Options{Pool: "q", Tools: []runner.Tool{newTool(t, "q.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo)}, Concurrency: 3, MaxAckPending: 5})
	c, err := res.JS.Consumer(ctxT(t, 5*time.Second), bus.StreamSteps, bus.PoolConsumer("q"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.MaxAckPending; got != 5 {
		t.Fatalf("explicit MaxAckPending: consumer has %d, want 5", got)
	}
}
