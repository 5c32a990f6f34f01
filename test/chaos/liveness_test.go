package chaos

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/supervisor"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

// The executor runtime's heartbeats and the engine's heartbeat timeout
// work together (in process, not behind -chaos): a step that runs 2.5s
// with a 600ms heartbeat timeout succeeds with its first attempt, kept
// alive by the runtime's heartbeats alone; a step whose executor is killed
// (its NATS connection closed: no heartbeat, no result) while it runs
// fails TIMEOUT by heartbeat_timeout, long before its 30s start-to-close
// timeout.
func TestHeartbeatsKeepAttemptsAliveEndToEnd(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	long := &blockingTool{name: "p.long", d: 2500 * time.Millisecond}
	hang := &blockingTool{name: "q.hang"}
	startExecutor(t, srv, "p", long)
	_, victim := startExecutor(t, srv, "q", hang)

	_, res := srv.Setup(t)
	gs := grpc.NewServer()
	stop, err := supervisor.Start(context.Background(), supervisor.Components{
		Bus: res, Logger: natstest.Logger(t), Planner: &oneStepPlanner{calls: map[string]int{}}, GRPC: gs,
		Engine: engine.Config{Workers: 4, AckWait: 2 * time.Second, MaxAckPending: 256},
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() {
		gs.Stop()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stop(sctx)
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := planexv1.NewSupervisorServiceClient(conn)

	startRun := func(tool string) string {
		t.Helper()
		for ctx.Err() == nil { // the catalog picks the tools up within a second
			resp, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: tool})
			if err == nil {
				return resp.GetRun().GetId()
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("start run of %s: %v", tool, ctx.Err())
		return ""
	}
	getRun := func(id string, until func(*planexv1.Run) bool) *planexv1.Run {
		t.Helper()
		var last *planexv1.Run
		for ctx.Err() == nil {
			resp, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
			if err == nil {
				if last = resp.GetRun(); until(last) {
					return last
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("run %s: last state %v", id, last)
		return nil
	}
	terminal := func(r *planexv1.Run) bool {
		s := r.GetStatus()
		return s == planexv1.RunStatus_RUN_STATUS_SUCCEEDED || s == planexv1.RunStatus_RUN_STATUS_FAILED ||
			s == planexv1.RunStatus_RUN_STATUS_ESCALATED || s == planexv1.RunStatus_RUN_STATUS_CANCELLED
	}

	alive := startRun("p.long")
	silent := startRun("q.hang")
	hang.waitStarted(t, ctx)
	// The kill lands on an attempt the supervisor knows started (its
	// heartbeat timer armed from the start), not one still DISPATCHED.
	getRun(silent, func(r *planexv1.Run) bool {
		return len(r.GetSteps()) > 0 && r.GetSteps()[0].GetStatus() == planexv1.StepStatus_STEP_STATUS_RUNNING
	})
	victim() // kill -9 of the executor while its tool runs

	run := getRun(alive, terminal)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("long step with heartbeats: %s %s %q, want SUCCEEDED", run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
	for _, s := range run.GetSteps() {
		if s.GetAttempt() != 1 {
			t.Fatalf("long step needed attempt %d", s.GetAttempt())
		}
	}
	run = getRun(silent, terminal)
	if run.GetStopReason() != planexv1.StopReason_STOP_REASON_STEP_TIMEOUT || !strings.Contains(run.GetStopMessage(), "heartbeat_timeout") {
		t.Fatalf("killed executor: %s %s %q, want STEP_TIMEOUT by heartbeat_timeout", run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
}

// startExecutor runs a runner of pool with tool on its own connection;
// kill closes that connection as kill -9 would.
func startExecutor(t *testing.T, srv *natstest.Server, pool string, tool runner.Tool) (*runner.Runner, func()) {
	t.Helper()
	nc, res := srv.Setup(t)
	r, err := runner.New(res, runner.Options{Pool: pool, Tools: []runner.Tool{tool}, AckWait: 2 * time.Second, Logger: natstest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Start(sctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return r, nc.Close
}

// blockingTool runs for d (forever when 0) or until its context ends.
type blockingTool struct {
	name    string
	d       time.Duration
	once    sync.Once
	started chan struct{}
	mu      sync.Mutex
}

func (b *blockingTool) init() { b.once.Do(func() { b.started = make(chan struct{}) }) }

func (b *blockingTool) Spec() *planexv1.ToolSpec {
	schema, _ := structpb.NewStruct(map[string]any{"type": "object", "additionalProperties": false})
	return &planexv1.ToolSpec{
		Name: b.name, Pool: strings.SplitN(b.name, ".", 2)[0], Description: "blocks", ArgsSchema: schema,
		SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ,
	}
}

func (b *blockingTool) Run(ctx context.Context, _ runner.Call) (any, error) {
	b.init()
	b.mu.Lock()
	select {
	case <-b.started:
	default:
		close(b.started)
	}
	b.mu.Unlock()
	var done <-chan time.Time
	if b.d > 0 {
		done = time.After(b.d)
	}
	select {
	case <-done:
		return map[string]any{"ok": true}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (b *blockingTool) waitStarted(t *testing.T, ctx context.Context) {
	t.Helper()
	b.init()
	select {
	case <-b.started:
	case <-ctx.Done():
		t.Fatalf("%s never started", b.name)
	}
}

// oneStepPlanner plans one step calling the tool named by the goal, with
// a 600ms heartbeat timeout, a 30s start-to-close timeout and no retry,
// and gives up when asked again (after a failure).
type oneStepPlanner struct {
	mu    sync.Mutex
	calls map[string]int
}

func (p *oneStepPlanner) Plan(_ context.Context, req *planexv1.PlanRequest, _ ...grpc.CallOption) (*planexv1.PlanResponse, error) {
	p.mu.Lock()
	p.calls[req.GetRunId()]++
	n := p.calls[req.GetRunId()]
	p.mu.Unlock()
	if n > 1 {
		return &planexv1.PlanResponse{Stop: true, GiveUp: true}, nil
	}
	args, _ := structpb.NewStruct(map[string]any{})
	return &planexv1.PlanResponse{
		Plan: &planexv1.Plan{Steps: []*planexv1.Step{{
			Id: "s", Tool: req.GetGoal(), Args: args,
			Timeout: durationpb.New(30 * time.Second), HeartbeatTimeout: durationpb.New(600 * time.Millisecond),
			Retry: &planexv1.RetryPolicy{MaxAttempts: 1},
		}}, Confidence: 0.9, Rationale: "test"},
		Usage: &planexv1.TokenUsage{InputTokens: 1, OutputTokens: 1}, Backend: "fake",
	}, nil
}
