package runner_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor/runner"
)

// TestDroppedResultIsLostNotTimedOut injects a lost result on attempt 1
// of a side-effecting tool: the tool runs and its effect is recorded, but
// no result is published and the step is acknowledged (not redelivered),
// so only the supervisor's own timeouts can notice. Attempt 2 runs and
// reports normally.
func TestDroppedResultIsLostNotTimedOut(t *testing.T) {
	srv := natstest.Start(t)
	sent := newTool(t, "p.send", planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, func(_ context.Context, c runner.Call) (any, error) {
		return map[string]any{"sent": c.Attempt}, nil
	})
	faulty := runner.FaultTool(sent, func(c runner.Call) runner.Fault { return runner.Fault{Drop: c.Attempt == 1} })
	startRunner(t, srv, runner.Options{Tools: []runner.Tool{faulty}})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 15*time.Second)

	first := step(t, "r1", "a", "p.send", map[string]any{"n": 1})
	dispatch(t, res, first)
	// The effect happened and was recorded as finished before the result
	// was lost.
	var rec planexv1.StepResult
	for {
		e, err := res.Effects.Get(ctx, bus.PoolEffectKey("p", bus.EffectKey("r1", "a", 1)))
		if err == nil {
			if err := proto.Unmarshal(e.Value(), &rec); err != nil {
				t.Fatal(err)
			}
			if rec.GetStatus() == planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("attempt 1 never recorded its effect: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	second := step(t, "r1", "a", "p.send", map[string]any{"n": 1})
	second.Attempt = 2
	dispatch(t, res, second)
	// Results are read in publish order: attempt 1's would come first.
	if got := eng.next(ctx); got.GetAttempt() != 2 || got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("first result published: %v, want attempt 2's (attempt 1's is lost)", got)
	}
	if n := sent.calls.Load(); n != 2 {
		t.Fatalf("tool ran %d times, want once per attempt", n)
	}
	// Attempt 1's request was acknowledged, not left for redelivery.
	cons, err := res.JS.Consumer(ctx, bus.StreamSteps, bus.PoolConsumer("p"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			if info.NumRedelivered != 0 {
				t.Fatalf("a step was redelivered: %+v", info)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("step requests still pending: %+v", info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
