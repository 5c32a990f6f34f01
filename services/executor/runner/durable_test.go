package runner_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor/runner"
)

// TestSecondDeliveryWaitsForTheRunningOwner: a side-effecting attempt is
// delivered a second time while its first delivery still runs (its
// heartbeats were lost, say, in a NATS leader change). The second delivery
// finds the effect record started and must not escalate OUTCOME_UNKNOWN
// while the owner — on another replica or on this one — is alive and
// running it: it waits, and the attempt succeeds once, tool run once.
func TestSecondDeliveryWaitsForTheRunningOwner(t *testing.T) {
	for _, tt := range []struct {
		name     string
		replicas int
	}{
		{"owner on another replica", 2},
		{"owner on the same replica", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := natstest.Start(t)
			release := make(chan struct{})
			slow := newTool(t, "p.send", planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, func(ctx context.Context, c runner.Call) (any, error) {
				select {
				case <-release:
					return map[string]any{"sent": true}, nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			})
			for range tt.replicas {
				startRunner(t, srv, runner.Options{Tools: []runner.Tool{slow}, Concurrency: 2 / tt.replicas, MaxAckPending: 2})
			}
			_, res := srv.Setup(t)
			eng := newEngine(t, res)
			ctx := ctxT(t, 20*time.Second)

			req := step(t, "r1", "a", "p.send", map[string]any{"n": 1})
			dispatch(t, res, req)
			// The same attempt once more, as a redelivery would bring it.
			subj, _ := bus.StepSubject(req.GetTool())
			if _, err := bus.Publish(ctx, res.JS, bus.Publication{Subject: subj, Msg: req, MsgID: "second-delivery"}); err != nil {
				t.Fatal(err)
			}
			// Both deliveries are out and the tool runs once.
			cons, err := res.JS.Consumer(ctx, bus.StreamSteps, bus.PoolConsumer("p"))
			if err != nil {
				t.Fatal(err)
			}
			for {
				info, err := cons.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if info.NumAckPending == 2 && slow.calls.Load() == 1 {
					break
				}
				select {
				case <-ctx.Done():
					t.Fatalf("deliveries never both taken: %+v, tool calls %d", info, slow.calls.Load())
				case <-time.After(20 * time.Millisecond):
				}
			}
			close(release)

			// The first result the engine sees is the owner's, or the
			// waiting delivery's replay of the owner's recorded effect
			// (both are published once the owner finished; which comes
			// first is a race): either way SUCCEEDED with the owner's
			// output, never OUTCOME_UNKNOWN.
			got := eng.next(ctx)
			if got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED || !got.GetOutput().GetStructValue().GetFields()["sent"].GetBoolValue() {
				t.Fatalf("result %v, want SUCCEEDED with the owner's output", got)
			}
			for {
				info, err := cons.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if info.NumAckPending == 0 && info.NumPending == 0 {
					break
				}
				select {
				case <-ctx.Done():
					t.Fatalf("a delivery was never acknowledged: %+v", info)
				case <-time.After(20 * time.Millisecond):
				}
			}
			if n := slow.calls.Load(); n != 1 {
				t.Fatalf("tool ran %d times, want 1", n)
			}
		})
	}
}

// TestOwnerGoneEscalates: the replica that started a side effect died (its
// NATS connection closed mid-step); the redelivery finds nobody running
// the attempt and reports OUTCOME_UNKNOWN without waiting for the budget.
func TestOwnerGoneEscalates(t *testing.T) {
	srv := natstest.Start(t)
	started := make(chan struct{})
	hang := newTool(t, "p.send", planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, func(ctx context.Context, c runner.Call) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	a, ncA := startRunner(t, srv, runner.Options{Tools: []runner.Tool{hang}, AckWait: 500 * time.Millisecond})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	dispatch(t, res, step(t, "r1", "a", "p.send", map[string]any{"n": 1}))
	ctx := ctxT(t, 20*time.Second)
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("tool never started")
	}
	ncA.Close() // replica A is gone; its tool still hangs in memory
	echoTool := newTool(t, "p.send", planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, echo)
	b, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{echoTool}, AckWait: 500 * time.Millisecond})
	got := eng.next(ctx)
	if got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_OUTCOME_UNKNOWN || got.GetExecutorId() != b.ID() ||
		got.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN {
		t.Fatalf("result %v, want OUTCOME_UNKNOWN from replica B (A was %s)", got, a.ID())
	}
	if n := echoTool.calls.Load(); n != 0 {
		t.Fatalf("replica B ran the side effect again (%d calls)", n)
	}
}

// TestBackendHealthFromStepsAndProbe: a backend outage is reported (the
// OnBackend callback, Runner.Backend) without stopping the replica, from
// a failing step, and its end is noticed by the probe without traffic.
func TestBackendHealthFromStepsAndProbe(t *testing.T) {
	srv := natstest.Start(t)
	var down atomic.Bool
	down.Store(true)
	backendErr := errors.New("dial tcp 127.0.0.1:25: connect: connection refused")
	tool := newTool(t, "p.mail", planexv1.SideEffect_SIDE_EFFECT_READ, func(context.Context, runner.Call) (any, error) {
		if down.Load() {
			return nil, runner.Unavailable(backendErr, "SMTP relay unreachable")
		}
		return map[string]any{"ok": true}, nil
	})
	changes := make(chan bool, 16)
	probeCalls := make(chan struct{}, 1)
	r, _ := startRunner(t, srv, runner.Options{
		Tools: []runner.Tool{tool}, MaxDeliver: 1, ProbeInterval: 50 * time.Millisecond,
		Probe: func(context.Context) error {
			select {
			case probeCalls <- struct{}{}:
			default:
			}
			if down.Load() {
				return backendErr
			}
			return nil
		},
		OnBackend: func(up bool, reason string) { changes <- up },
	})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 15*time.Second)
	next := func(want bool) {
		t.Helper()
		for {
			select {
			case up := <-changes:
				if up == want {
					return
				}
			case <-ctx.Done():
				t.Fatalf("backend never reported up=%v", want)
			}
		}
	}
	next(false)
	dispatch(t, res, step(t, "r1", "a", "p.mail", map[string]any{"n": 1}))
	got := eng.next(ctx)
	if got.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE || !got.GetError().GetRetryable() {
		t.Fatalf("result %v, want a retryable UNAVAILABLE", got)
	}
	if up, reason, _ := r.Backend(); up || reason == "" {
		t.Fatalf("Backend() = %v %q during the outage", up, reason)
	}
	down.Store(false)
	next(true)
	if up, _, _ := r.Backend(); !up {
		t.Fatal("Backend() still down after the probe succeeded")
	}
	dispatch(t, res, step(t, "r1", "b", "p.mail", map[string]any{"n": 2}))
	if got := eng.next(ctx); got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("result after the outage %v", got)
	}
}

// TestBackendHealthWithoutProbe: a pool without a probe (sql) is marked
// down by an UNAVAILABLE step and up again by the next successful one.
func TestBackendHealthWithoutProbe(t *testing.T) {
	srv := natstest.Start(t)
	var down atomic.Bool
	down.Store(true)
	tool := newTool(t, "p.q", planexv1.SideEffect_SIDE_EFFECT_READ, func(context.Context, runner.Call) (any, error) {
		if down.Load() {
			return nil, runner.Unavailable(errors.New("connection refused"), "database unreachable")
		}
		return map[string]any{"ok": true}, nil
	})
	r, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool}, MaxDeliver: 1})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 15*time.Second)
	if up, _, _ := r.Backend(); !up {
		t.Fatal("backend down before any step")
	}
	dispatch(t, res, step(t, "r1", "a", "p.q", map[string]any{"n": 1}))
	eng.next(ctx)
	if up, reason, _ := r.Backend(); up || !strings.Contains(reason, "database unreachable") {
		t.Fatalf("Backend() = %v %q after an UNAVAILABLE step", up, reason)
	}
	down.Store(false)
	dispatch(t, res, step(t, "r1", "b", "p.q", map[string]any{"n": 2}))
	eng.next(ctx)
	if up, _, _ := r.Backend(); !up {
		t.Fatal("Backend() still down after a successful step")
	}
}
