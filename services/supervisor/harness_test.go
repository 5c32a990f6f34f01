package supervisor_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor"
	"github.com/planex-dev/planex/services/supervisor/api"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// harness is one embedded JetStream server with a scripted planner (real
// gRPC on loopback), a fake executor pool "test" consuming PLANEX_STEPS
// through the real pool consumer, and any number of supervisor replicas.
type harness struct {
	t       testing.TB
	srv     *natstest.Server
	nc      *nats.Conn
	res     *bus.Resources
	planner *fakePlanner
	pool    *fakePool
	ackWait time.Duration
	// apiCfg, when set, adjusts the API config of replicas started next.
	apiCfg func(*api.Config)
	// busOpts are the replicas' bus options (zero: the defaults).
	busOpts bus.Options
	// natsURL, when set, is where replicas started next connect (a proxy
	// in front of srv); empty: srv itself.
	natsURL string
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	srv := natstest.Start(t)
	nc, res := srv.Setup(t)
	h := &harness{t: t, srv: srv, nc: nc, res: res, ackWait: 2 * time.Second}
	h.planner = startPlanner(t)
	h.pool = startPool(t, srv, res)
	return h
}

// setup starts a parallel test with a harness and one replica.
func setup(t *testing.T, opts ...func(*engine.Config)) (*harness, *replica) {
	t.Helper()
	t.Parallel()
	h := newHarness(t)
	return h, h.startReplica(opts...)
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// replica is one supervisor (engine + API) on its own NATS connection.
type replica struct {
	client planexv1.SupervisorServiceClient
	nc     *nats.Conn
	gs     *grpc.Server
	stop   func(context.Context) error
	once   sync.Once
}

// kill stops the replica abruptly, as kill -9 would: the NATS connection
// closes without draining, unacknowledged engine messages wait for their
// ack wait and go to another replica.
func (r *replica) kill() {
	r.once.Do(func() {
		r.nc.Close()
		r.gs.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = r.stop(ctx)
	})
}

func (h *harness) startReplica(opts ...func(*engine.Config)) *replica {
	h.t.Helper()
	return h.startReplicaOn(nil, opts...)
}

// startReplicaOn is startReplica with the replica's bus resources passed
// through wrap first (nil: as they are), e.g. to hold planex-runs.
func (h *harness) startReplicaOn(wrap func(*bus.Resources) *bus.Resources, opts ...func(*engine.Config)) *replica {
	h.t.Helper()
	return h.startReplicaWith(natstest.Logger(h.t), wrap, opts...)
}

// startReplicaWith is startReplicaOn with the replica's logger.
func (h *harness) startReplicaWith(logger *slog.Logger, wrap func(*bus.Resources) *bus.Resources, opts ...func(*engine.Config)) *replica {
	t := h.t
	t.Helper()
	url := h.srv.URL()
	if h.natsURL != "" {
		url = h.natsURL
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 10*time.Second)
	res, err := bus.Setup(ctx, nc, h.busOpts)
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		res = wrap(res)
	}
	cfg := engine.Config{Workers: 16, AckWait: h.ackWait, MaxAckPending: 2048}
	for _, o := range opts {
		o(&cfg)
	}
	gs := grpc.NewServer()
	acfg := api.Config{Limits: cfg.Limits}
	if h.apiCfg != nil {
		h.apiCfg(&acfg)
	}
	stop, err := supervisor.Start(context.Background(), supervisor.Components{
		Bus: res, Logger: logger, Planner: h.planner.client, GRPC: gs, Engine: cfg,
		API: acfg,
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{client: planexv1.NewSupervisorServiceClient(conn), nc: nc, gs: gs, stop: stop}
	t.Cleanup(func() {
		_ = conn.Close()
		r.once.Do(func() {
			gs.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := stop(ctx); err != nil {
				t.Errorf("stop replica: %v", err)
			}
			nc.Close()
		})
	})
	return r
}

// runGoal scripts the planner for goal and starts a run of it.
func (h *harness) runGoal(t testing.TB, r *replica, goal string, s script) string {
	t.Helper()
	h.planner.on(goal, s)
	return start(t, r.client, &planexv1.StartRunRequest{Goal: goal})
}

// succeeded waits for the run to end and fails the test unless it
// succeeded.
func succeeded(t testing.TB, r *replica, id string) *planexv1.Run {
	t.Helper()
	run := waitTerminal(t, r.client, id, 20*time.Second)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run %s: status %s %s %q, want SUCCEEDED", id, run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
	return run
}

// start starts a run and returns its id.
func start(t testing.TB, c planexv1.SupervisorServiceClient, req *planexv1.StartRunRequest) string {
	t.Helper()
	resp, err := c.StartRun(testCtx(t, 10*time.Second), req)
	if err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	return resp.GetRun().GetId()
}

// waitRun polls GetRun until cond holds.
func waitRun(t testing.TB, c planexv1.SupervisorServiceClient, id string, d time.Duration, what string, cond func(*planexv1.Run) bool) *planexv1.Run {
	t.Helper()
	deadline := time.Now().Add(d)
	var last *planexv1.Run
	for time.Now().Before(deadline) {
		resp, err := c.GetRun(testCtx(t, 5*time.Second), &planexv1.GetRunRequest{RunId: id})
		if err == nil {
			last = resp.GetRun()
			if cond(last) {
				return last
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	var steps []string
	for _, s := range last.GetSteps() {
		steps = append(steps, fmt.Sprintf("%s/%d %s %v", s.GetStepId(), s.GetAttempt(), s.GetStatus(), s.GetError()))
	}
	t.Fatalf("run %s: not %s within %s; last state: status %s stop %s %q, sequence %d, steps %v", id, what, d, last.GetStatus(), last.GetStopReason(), last.GetStopMessage(), last.GetLastSequence(), steps)
	return nil
}

func waitTerminal(t testing.TB, c planexv1.SupervisorServiceClient, id string, d time.Duration) *planexv1.Run {
	t.Helper()
	return waitRun(t, c, id, d, "terminal", func(r *planexv1.Run) bool {
		switch r.GetStatus() {
		case planexv1.RunStatus_RUN_STATUS_SUCCEEDED, planexv1.RunStatus_RUN_STATUS_FAILED,
			planexv1.RunStatus_RUN_STATUS_ESCALATED, planexv1.RunStatus_RUN_STATUS_CANCELLED:
			return true
		}
		return false
	})
}

// watchAll returns a run's events from `from` to its end through WatchRun,
// checking the sequences are contiguous.
func watchAll(t testing.TB, c planexv1.SupervisorServiceClient, id string, from uint64) []*planexv1.RunEvent {
	t.Helper()
	stream, err := c.WatchRun(testCtx(t, 30*time.Second), &planexv1.WatchRunRequest{RunId: id, FromSequence: from})
	if err != nil {
		t.Fatalf("WatchRun: %v", err)
	}
	var out []*planexv1.RunEvent
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("WatchRun %s: %v", id, err)
		}
		out = append(out, resp.GetEvent())
	}
	want := max(from, 1)
	for _, ev := range out {
		if ev.GetSequence() != want {
			t.Fatalf("run %s: event sequence %d, want %d", id, ev.GetSequence(), want)
		}
		want++
	}
	last := len(out) - 1
	for last > 0 && out[last].GetRunForked() != nil {
		last-- // fork links may follow the end
	}
	if len(out) == 0 || out[last].GetFinished() == nil {
		t.Fatalf("run %s: watch did not end with RunFinished", id)
	}
	return out
}

// allEvents reads every run log in PLANEX_EVENTS with one ordered
// consumer, verifying each run's hash chain and contiguous sequences, and
// returns the events by run.
func (h *harness) allEvents() map[string][]*planexv1.RunEvent {
	h.t.Helper()
	ctx := testCtx(h.t, 30*time.Second)
	cons, err := h.res.JS.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{})
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string][]*planexv1.RunEvent{}
	states := map[string]*runlog.State{}
	for {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			h.t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if _, ok := bus.RunOfLogSubject(m.Subject()); !ok {
				continue // a step request published apart, no run's log
			}
			evs, err := runlog.DecodeEvents(bus.NatsMsg(m))
			if err != nil {
				h.t.Fatal(err)
			}
			md, _ := m.Metadata()
			for _, ev := range evs {
				st := states[ev.GetRunId()]
				if st == nil {
					st = &runlog.State{}
					states[ev.GetRunId()] = st
				}
				if err := st.Apply(ev, md.Sequence.Stream); err != nil {
					h.t.Fatalf("run %s: %v", ev.GetRunId(), err)
				}
				out[ev.GetRunId()] = append(out[ev.GetRunId()], ev)
			}
		}
		if n == 0 {
			return out
		}
	}
}

// --- scripted planner -------------------------------------------------

// script answers the n-th (0-based) planner call of a run.
type script func(n int, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error)

type fakePlanner struct {
	planexv1.UnimplementedPlannerServiceServer
	client planexv1.PlannerServiceClient

	mu      sync.Mutex
	scripts map[string]script // by goal
	calls   map[string][]*planexv1.PlanRequest
	// critic answers Critique calls (critic_test.go); critiques records
	// them by run.
	critic    func(n int, req *planexv1.CritiqueRequest) (*planexv1.CritiqueResponse, error)
	critiques map[string][]*planexv1.CritiqueRequest
}

func startPlanner(t testing.TB) *fakePlanner {
	t.Helper()
	p := &fakePlanner{scripts: map[string]script{}, calls: map[string][]*planexv1.PlanRequest{}, critiques: map[string][]*planexv1.CritiqueRequest{}}
	gs := grpc.NewServer()
	planexv1.RegisterPlannerServiceServer(gs, p)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	p.client = planexv1.NewPlannerServiceClient(conn)
	return p
}

// on scripts the planner for runs with this goal.
func (p *fakePlanner) on(goal string, s script) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.scripts[goal] = s
}

func (p *fakePlanner) requests(runID string) []*planexv1.PlanRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*planexv1.PlanRequest(nil), p.calls[runID]...)
}

func (p *fakePlanner) Plan(_ context.Context, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
	p.mu.Lock()
	s := p.scripts[req.GetGoal()]
	if s == nil {
		for prefix, ps := range p.scripts {
			if strings.HasSuffix(prefix, "*") && strings.HasPrefix(req.GetGoal(), strings.TrimSuffix(prefix, "*")) {
				s = ps
			}
		}
	}
	n := len(p.calls[req.GetRunId()])
	p.calls[req.GetRunId()] = append(p.calls[req.GetRunId()], proto.CloneOf(req))
	p.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("no script for goal %q", req.GetGoal())
	}
	return s(n, req)
}

// always answers every call with the same plan.
func always(steps ...*planexv1.Step) script {
	return func(int, *planexv1.PlanRequest) (*planexv1.PlanResponse, error) { return planOf(steps...), nil }
}

// sequence answers call n with plans[n] (the last one repeats).
func sequence(plans ...*planexv1.PlanResponse) script {
	return func(n int, _ *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
		return proto.CloneOf(plans[min(n, len(plans)-1)]), nil
	}
}

func planOf(steps ...*planexv1.Step) *planexv1.PlanResponse {
	return &planexv1.PlanResponse{
		Plan:    &planexv1.Plan{Steps: steps, Confidence: 0.9, Rationale: "scripted"},
		Usage:   &planexv1.TokenUsage{InputTokens: 10, OutputTokens: 5},
		Backend: "fake",
	}
}

func withAnswer(r *planexv1.PlanResponse, answer string) *planexv1.PlanResponse {
	r.Plan.Answer = answer
	return r
}

// noRetry turns off the retry policy of s (one attempt per revision).
func noRetry(s *planexv1.Step) *planexv1.Step {
	s.Retry = &planexv1.RetryPolicy{MaxAttempts: 1}
	return s
}

func step(id, tool string, args map[string]any, deps ...string) *planexv1.Step {
	return &planexv1.Step{Id: id, Tool: tool, Args: mustStruct(args), DependsOn: deps}
}

// --- fake executor pool ------------------------------------------------

// fakePool is the executor pool "test": it consumes planex.steps.test.>
// with the real durable pool consumer, runs fake tools and publishes
// StepStartedNotice and StepResult as the executor runtime does. It counts
// executions per (run, step, attempt).
type fakePool struct {
	t  testing.TB
	js jetstream.JetStream

	gate     chan struct{} // test.gate returns once it is closed
	gateOnce sync.Once

	mu      sync.Mutex
	execs   map[string]int // "<run>/<step>/<attempt>" → executions
	args    map[string]*structpb.Struct
	reports map[string]bool // results published
}

func toolSpecs() []*planexv1.ToolSpec {
	obj := func(props map[string]any, required ...string) *structpb.Struct {
		m := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
		if len(required) > 0 {
			req := make([]any, len(required))
			for i, r := range required {
				req[i] = r
			}
			m["required"] = req
		}
		s, err := structpb.NewStruct(m)
		if err != nil {
			panic(err)
		}
		return s
	}
	integer := map[string]any{"type": "integer", "minimum": 0}
	return []*planexv1.ToolSpec{
		{Name: "test.echo", Pool: "test", Description: "returns {value}", ArgsSchema: obj(map[string]any{"value": map[string]any{}}, "value"), SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ, Idempotent: true},
		{Name: "test.sleep", Pool: "test", Description: "sleeps ms milliseconds", ArgsSchema: obj(map[string]any{"ms": integer}, "ms"), SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ},
		{Name: "test.fail", Pool: "test", Description: "fails", ArgsSchema: obj(map[string]any{"message": map[string]any{"type": "string"}}), SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ},
		{Name: "test.unknown", Pool: "test", Description: "outcome unknown", ArgsSchema: obj(map[string]any{}), SideEffect: planexv1.SideEffect_SIDE_EFFECT_EXTERNAL},
		{Name: "test.big", Pool: "test", Description: "returns {data} of n bytes", ArgsSchema: obj(map[string]any{"bytes": integer}, "bytes"), SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ},
		{Name: "test.approve", Pool: "test", Description: "echo behind an approval", ArgsSchema: obj(map[string]any{"value": map[string]any{}}, "value"), SideEffect: planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, RequiresApproval: true},
		{Name: "test.flaky", Pool: "test", Description: "fails its first `fail` attempts with `code`", ArgsSchema: obj(map[string]any{"fail": integer, "code": map[string]any{"type": "string"}}, "fail"), SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ},
		{Name: "test.flakysend", Pool: "test", Description: "like test.flaky, external and not idempotent", ArgsSchema: obj(map[string]any{"fail": integer, "code": map[string]any{"type": "string"}}, "fail"), SideEffect: planexv1.SideEffect_SIDE_EFFECT_EXTERNAL},
		{Name: "test.flakyput", Pool: "test", Description: "like test.flaky, a write declared idempotent", ArgsSchema: obj(map[string]any{"fail": integer, "code": map[string]any{"type": "string"}}, "fail"), SideEffect: planexv1.SideEffect_SIDE_EFFECT_WRITE, Idempotent: true},
		{Name: "test.gate", Pool: "test", Description: "returns once the test opens the pool's gate", ArgsSchema: obj(map[string]any{}), SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ},
		{Name: "test.beat", Pool: "test", Description: "sleeps ms milliseconds, heartbeating every 100ms", ArgsSchema: obj(map[string]any{"ms": integer}, "ms"), SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ},
		{Name: "test.secret", Pool: "test", Description: "echo of a sensitive value", ArgsSchema: obj(map[string]any{"value": map[string]any{}}, "value"), SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ, SensitiveFields: []string{"value"}},
	}
}

func startPool(t testing.TB, srv *natstest.Server, res *bus.Resources) *fakePool {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	register := func(ctx context.Context) error {
		for _, spec := range toolSpecs() {
			if _, err := res.Tools.Put(ctx, bus.ToolKey(spec.GetName(), "fake-1"), mustMarshal(spec)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := register(ctx); err != nil {
		t.Fatal(err)
	}
	// Registrations expire (planex-tools TTL); renew them like an executor.
	hbCtx, stopHB := context.WithCancel(context.Background())
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-hbCtx.Done():
				return
			case <-tick.C:
				_ = register(hbCtx)
			}
		}
	}()
	t.Cleanup(func() {
		stopHB()
		<-hbDone
	})
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// Like an executor on NATS 2.11+: its steps from PLANEX_EVENTS (the
	// decisions that dispatch one, and requests published apart), and
	// what is still published to PLANEX_STEPS.
	cons, err := js.CreateOrUpdateConsumer(ctx, bus.StreamSteps, bus.PoolConsumerConfig("test", 512, 30*time.Second, 5))
	if err != nil {
		t.Fatal(err)
	}
	logs, err := js.CreateOrUpdateConsumer(ctx, bus.StreamEvents, bus.DispatchConsumerConfig("test", 512, 30*time.Second, 5))
	if err != nil {
		t.Fatal(err)
	}
	p := &fakePool{t: t, js: js, gate: make(chan struct{}), execs: map[string]int{}, args: map[string]*structpb.Struct{}, reports: map[string]bool{}}
	var wg sync.WaitGroup
	var wgMu sync.Mutex // orders wg.Add in callbacks before the final Wait
	stopped := false
	runCtx, cancel := context.WithCancel(context.Background())
	var ccs []jetstream.ConsumeContext
	for _, c := range []jetstream.Consumer{cons, logs} {
		cc, err := c.Consume(func(m jetstream.Msg) {
			wgMu.Lock()
			defer wgMu.Unlock()
			if stopped {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.handle(runCtx, m)
			}()
		}, jetstream.PullMaxMessages(256))
		if err != nil {
			t.Fatal(err)
		}
		ccs = append(ccs, cc)
	}
	t.Cleanup(func() {
		for _, cc := range ccs {
			cc.Stop()
		}
		cancel()
		wgMu.Lock()
		stopped = true
		wgMu.Unlock()
		wg.Wait()
	})
	return p
}

func (p *fakePool) executions(runID string) map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, v := range p.execs {
		if rest, ok := strings.CutPrefix(k, runID+"/"); ok {
			out[rest] = v
		}
	}
	return out
}

func (p *fakePool) argsOf(runID, stepID string, attempt int32) *structpb.Struct {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.args[fmt.Sprintf("%s/%s/%d", runID, stepID, attempt)]
}

func (p *fakePool) handle(ctx context.Context, m jetstream.Msg) {
	req, err := bus.StepRequestOf(bus.NatsMsg(m))
	if err != nil {
		_ = m.Term()
		return
	}
	ctx, span := bus.StartConsumerSpan(ctx, bus.NatsMsg(m))
	defer span.End()
	key := fmt.Sprintf("%s/%s/%d", req.GetRunId(), req.GetStepId(), req.GetAttempt())
	p.mu.Lock()
	p.execs[key]++
	p.args[key] = req.GetArgs()
	p.mu.Unlock()
	attempt := fmt.Sprint(req.GetAttempt())
	started := time.Now()
	_, _ = bus.Publish(ctx, p.js, bus.Publication{
		Subject: bus.EngineSubject(req.GetRunId(), bus.KindStarted),
		Msg:     &planexv1.StepStartedNotice{RunId: req.GetRunId(), StepId: req.GetStepId(), Attempt: req.GetAttempt(), ExecutorId: "fake-1", StartedAt: timestamppb.New(started)},
		MsgID:   bus.MsgID(req.GetRunId(), req.GetStepId(), attempt, "started"),
	})
	res := &planexv1.StepResult{
		RunId: req.GetRunId(), StepId: req.GetStepId(), Attempt: req.GetAttempt(), PlanRevision: req.GetPlanRevision(),
		Tool: req.GetTool(), ExecutorId: "fake-1", StartedAt: timestamppb.New(started),
		Status: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED,
	}
	args := req.GetArgs().AsMap()
	switch req.GetTool() {
	case "test.echo", "test.approve", "test.secret":
		res.Output = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"value": req.GetArgs().GetFields()["value"]}})
	case "test.sleep":
		ms, _ := args["ms"].(float64)
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-ctx.Done():
			return
		}
		res.Output, _ = structpb.NewValue(map[string]any{"slept_ms": ms})
	case "test.fail":
		msg, _ := args["message"].(string)
		res.Status = planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED
		res.Error = &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, Message: "tool failed: " + msg}
	case "test.unknown":
		res.Status = planexv1.StepResultStatus_STEP_RESULT_STATUS_OUTCOME_UNKNOWN
		res.Error = &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN, Message: "crashed while sending"}
	case "test.gate":
		select {
		case <-p.gate:
		case <-ctx.Done():
			return
		}
		res.Output, _ = structpb.NewValue(map[string]any{"opened": true})
	case "test.beat":
		ms, _ := args["ms"].(float64)
		done := time.After(time.Duration(ms) * time.Millisecond)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-done:
			case <-ctx.Done():
				return
			case <-tick.C:
				_, _ = bus.Publish(ctx, p.js, bus.Publication{
					Subject: bus.EngineSubject(req.GetRunId(), bus.KindStarted),
					Msg: &planexv1.StepStartedNotice{RunId: req.GetRunId(), StepId: req.GetStepId(), Attempt: req.GetAttempt(), ExecutorId: "fake-1",
						StartedAt: timestamppb.New(started), Heartbeat: true, HeartbeatAt: timestamppb.Now()},
					MsgID: bus.MsgID(req.GetRunId(), req.GetStepId(), attempt, "hb", fmt.Sprint(n)),
				})
				continue
			}
			break
		}
		res.Output, _ = structpb.NewValue(map[string]any{"slept_ms": ms})
	case "test.flaky", "test.flakysend", "test.flakyput":
		fail, _ := args["fail"].(float64)
		code, _ := args["code"].(string)
		if float64(req.GetAttempt()) <= fail {
			res.Status = planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED
			res.Error = &planexv1.StepError{Code: planexv1.ErrorCode(planexv1.ErrorCode_value["ERROR_CODE_"+code]), Message: fmt.Sprintf("attempt %d: %s", req.GetAttempt(), code)}
		} else {
			res.Output, _ = structpb.NewValue(map[string]any{"attempt": float64(req.GetAttempt())})
		}
	case "test.big":
		n, _ := args["bytes"].(float64)
		res.Output, _ = structpb.NewValue(map[string]any{"data": strings.Repeat("x", int(n))})
	default:
		res.Status = planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED
		res.Error = &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_UNKNOWN_TOOL, Message: "unknown tool " + req.GetTool()}
	}
	res.Duration = durationpb.New(time.Since(started))
	if res.GetOutput() != nil && proto.Size(res.GetOutput()) > 512<<10 {
		// Like the executor runtime: an output too large for a message
		// goes to the object store, the result carries its reference.
		if err := p.storeOutput(ctx, res); err != nil {
			_ = m.NakWithDelay(100 * time.Millisecond)
			return
		}
	}
	if _, err := bus.Publish(ctx, p.js, bus.Publication{
		Subject: bus.EngineSubject(req.GetRunId(), bus.KindResult), Msg: res,
		MsgID: bus.MsgID(req.GetRunId(), req.GetStepId(), attempt, "result"),
	}); err != nil {
		_ = m.NakWithDelay(100 * time.Millisecond)
		return
	}
	p.mu.Lock()
	p.reports[key] = true
	p.mu.Unlock()
	_ = m.Ack()
}

// openGate lets every test.gate step finish.
func (p *fakePool) openGate() { p.gateOnce.Do(func() { close(p.gate) }) }

// storeOutput moves a result's output to planex-outputs.
func (p *fakePool) storeOutput(ctx context.Context, res *planexv1.StepResult) error {
	obj, err := p.js.ObjectStore(ctx, bus.ObjectOutputs)
	if err != nil {
		return err
	}
	data, err := protojson.Marshal(res.GetOutput())
	if err != nil {
		return err
	}
	name := bus.OutputName(res.GetRunId(), res.GetStepId(), res.GetAttempt())
	if _, err := obj.PutBytes(ctx, name, data); err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	res.OutputRef = &planexv1.OutputRef{Bucket: bus.ObjectOutputs, Name: name, Size: int64(len(data)), Sha256: hex.EncodeToString(sum[:])}
	res.Output = nil
	return nil
}

// reported tells whether the pool published the result of an attempt.
func (p *fakePool) reported(runID, stepID string, attempt int32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reports[fmt.Sprintf("%s/%s/%d", runID, stepID, attempt)]
}

// waitEngineIdle waits until the engine consumer has nothing pending or
// unacknowledged (timers excepted: they have their own consumer).
func (h *harness) waitEngineIdle() {
	h.t.Helper()
	waitFor(h.t, 10*time.Second, "the engine to be idle", func() bool {
		c, err := h.res.JS.Consumer(testCtx(h.t, 5*time.Second), bus.StreamEngine, bus.ConsumerEngine)
		if err != nil {
			return false
		}
		ci, err := c.Info(testCtx(h.t, 5*time.Second))
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	})
}

// waitFor polls cond until it holds.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustStruct(m map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic(err)
	}
	return s
}

func mustMarshal(m proto.Message) []byte {
	data, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return data
}

func structInputs(m map[string]any) (*structpb.Struct, error) { return structpb.NewStruct(m) }

func plannerErr(msg string) error { return status.Error(codes.FailedPrecondition, msg) }

func contains(s, sub string) bool { return strings.Contains(s, sub) }
