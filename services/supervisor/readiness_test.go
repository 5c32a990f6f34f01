package supervisor_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor"
)

// registerOnce registers the test pool's tools as replica "gone" without
// renewing them, and returns a function that deregisters them (every
// replica of the pool stopping).
func registerOnce(t *testing.T, h *harness) (deregister func()) {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	for _, spec := range toolSpecs() {
		if _, err := h.res.Tools.Put(ctx, bus.ToolKey(spec.GetName(), "gone"), mustMarshal(spec)); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		for _, spec := range toolSpecs() {
			if err := h.res.Tools.Delete(ctx, bus.ToolKey(spec.GetName(), "gone")); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestStepOfAKnownPoolWaitsForItsReplicas: a run planned while every
// replica of a known pool is away (restarting) is not refused for an
// "unknown tool": its plan is accepted from the tool's recorded spec, its
// step waits in the pool's queue, and it succeeds once a replica is back
// (issue 27: TestConsole's "Close support ticket 400" failed this way).
func TestStepOfAKnownPoolWaitsForItsReplicas(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	nc, res := srv.Setup(t)
	h := &harness{t: t, srv: srv, nc: nc, res: res, ackWait: 2 * time.Second, planner: startPlanner(t)}
	gone := registerOnce(t, h)
	r := h.startReplica()
	// The supervisor serves the pool once (its floor and spec recorded),
	// then every replica of the pool goes away.
	tools, err := r.client.ListTools(testCtx(t, 5*time.Second), &planexv1.ListToolsRequest{Pool: "test"})
	if err != nil || len(tools.GetTools()) == 0 {
		t.Fatalf("ListTools: %v %v", tools, err)
	}
	gone()
	tools, err = r.client.ListTools(testCtx(t, 5*time.Second), &planexv1.ListToolsRequest{Pool: "test"})
	if err != nil || len(tools.GetTools()) != len(toolSpecs()) || len(tools.GetTools()[0].GetReplicas()) != 0 {
		t.Errorf("ListTools with the pool away: %v %v, want every known tool without replicas", tools, err)
	}

	id := h.runGoal(t, r, "echo while the pool restarts", always(step("a", "test.echo", map[string]any{"value": 7})))
	waitRun(t, r.client, id, 10*time.Second, "dispatched", func(run *planexv1.Run) bool {
		return len(run.GetSteps()) == 1 && run.GetSteps()[0].GetStatus() == planexv1.StepStatus_STEP_STATUS_DISPATCHED
	})
	if run := waitRun(t, r.client, id, 2*time.Second, "still running", func(run *planexv1.Run) bool { return true }); run.GetStatus() != planexv1.RunStatus_RUN_STATUS_RUNNING {
		t.Fatalf("run with the pool away: %s %q, want RUNNING with its step waiting", run.GetStatus(), run.GetStopMessage())
	}
	if n := len(h.planner.requests(id)); n != 1 {
		t.Fatalf("planner called %d times, want 1 (the plan is valid: no replan)", n)
	}

	// A replica of the pool comes back and takes the waiting step.
	h.pool = startPool(t, srv, res)
	run := succeeded(t, r, id)
	if got := h.pool.executions(id); got["a/1"] != 1 {
		t.Fatalf("executions %v, want a/1 once", got)
	}
	if run.GetUsage().GetReplans() != 0 {
		t.Fatalf("replans %d, want 0", run.GetUsage().GetReplans())
	}
}

// TestReadyWaitsForExpectedPools: with --expect-pools the supervisor
// reports NOT_SERVING and does not call OnReady until the pool has
// registered; then it is SERVING.
func TestReadyWaitsForExpectedPools(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	planner := startPlanner(t)
	_, res := srv.Setup(t)
	plis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	planexv1.RegisterPlannerServiceServer(gs, planner)
	go func() { _ = gs.Serve(plis) }()
	t.Cleanup(gs.Stop)

	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	healthAddr := hlis.Addr().String()
	_ = hlis.Close()
	cfg := parse(t, "--grpc-addr", "127.0.0.1:0", "--nats-url", srv.URL(), "--planner-addr", plis.Addr().String(),
		"--shutdown-grace", "5s", "--plaintext", "--auth-disabled", "--expect-pools", "test", "--health-addr", healthAddr)
	ready := make(chan net.Addr, 1)
	cfg.OnReady = func(a net.Addr) { ready <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- supervisor.Run(ctx, cfg, natstest.Logger(t), nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	conn, err := grpc.NewClient(healthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	status := func() healthpb.HealthCheckResponse_ServingStatus {
		resp, err := health.Check(testCtx(t, 2*time.Second), &healthpb.HealthCheckRequest{})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return resp.GetStatus()
	}
	// Up but waiting: the health listener answers NOT_SERVING.
	waitFor(t, 20*time.Second, "the health listener to answer", func() bool {
		return status() == healthpb.HealthCheckResponse_NOT_SERVING
	})
	select {
	case <-ready:
		t.Fatal("OnReady called before the expected pool registered")
	case err := <-done:
		t.Fatalf("Run: %v", err)
	default:
	}

	startPool(t, srv, res)
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("OnReady not called after the expected pool registered")
	}
	if s := status(); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %s after OnReady, want SERVING", s)
	}
}

func TestExpectPoolsValidated(t *testing.T) {
	t.Parallel()
	err := parse(t, "--plaintext", "--auth-disabled", "--expect-pools", "sql,bad pool").Validate()
	if err == nil || !strings.Contains(err.Error(), `--expect-pools "bad pool"`) {
		t.Fatalf("Validate: %v, want the bad pool named", err)
	}
}
