package runner_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor/runner"
)

// fakeTool is a tool whose behaviour the test supplies. The runtime is
// what is under test; the tool only records what it was given.
type fakeTool struct {
	spec  *planexv1.ToolSpec
	run   func(ctx context.Context, c runner.Call) (any, error)
	calls atomic.Int32
}

func (f *fakeTool) Spec() *planexv1.ToolSpec { return f.spec }

func (f *fakeTool) Run(ctx context.Context, c runner.Call) (any, error) {
	f.calls.Add(1)
	return f.run(ctx, c)
}

func newTool(t testing.TB, name string, effect planexv1.SideEffect, run func(context.Context, runner.Call) (any, error)) *fakeTool {
	t.Helper()
	schema, err := structpb.NewStruct(map[string]any{
		"type": "object",
		"properties": map[string]any{
			"n":    map[string]any{"type": "integer", "minimum": 0},
			"text": map[string]any{"type": "string"},
		},
		"required":             []any{"n"},
		"additionalProperties": false,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &fakeTool{
		spec: &planexv1.ToolSpec{Name: name, Pool: bus.PoolOf(name), Description: "test tool", ArgsSchema: schema, SideEffect: effect},
		run:  run,
	}
}

func echo(_ context.Context, c runner.Call) (any, error) {
	return map[string]any{"n": c.Args.GetFields()["n"].GetNumberValue()}, nil
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// startRunner starts a runner of pool "p" on its own NATS connection and
// stops it when the test ends.
func startRunner(t testing.TB, srv *natstest.Server, opts runner.Options) (*runner.Runner, *nats.Conn) {
	t.Helper()
	nc, res := srv.Setup(t)
	if opts.Pool == "" {
		opts.Pool = "p"
	}
	if opts.AckWait == 0 {
		opts.AckWait = 2 * time.Second
	}
	opts.Logger = natstest.Logger(t)
	r, err := runner.New(res, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return r, nc
}

// engine reads what executors publish to PLANEX_ENGINE.
type engine struct {
	t    testing.TB
	cons jetstream.Consumer
}

func newEngine(t testing.TB, res *bus.Resources) *engine {
	t.Helper()
	cons, err := res.JS.CreateOrUpdateConsumer(ctxT(t, 5*time.Second), bus.StreamEngine, jetstream.ConsumerConfig{
		Durable: "test-engine", FilterSubject: bus.SubjectEnginePrefix + "*." + bus.KindResult, AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &engine{t: t, cons: cons}
}

// next waits for the next step result.
func (e *engine) next(ctx context.Context) *planexv1.StepResult {
	e.t.Helper()
	for ctx.Err() == nil {
		batch, err := e.cons.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			e.t.Fatal(err)
		}
		for m := range batch.Messages() {
			var res planexv1.StepResult
			if err := bus.Decode(bus.NatsMsg(m), &res); err != nil {
				e.t.Fatal(err)
			}
			_ = m.Ack()
			return &res
		}
	}
	e.t.Fatalf("no step result before the deadline")
	return nil
}

func args(t testing.TB, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func dispatch(t testing.TB, res *bus.Resources, req *planexv1.StepRequest) {
	t.Helper()
	subj, err := bus.StepSubject(req.GetTool())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Publish(ctxT(t, 5*time.Second), res.JS, bus.Publication{
		Subject: subj, Msg: req, MsgID: bus.MsgID(req.GetRunId(), req.GetStepId(), fmt.Sprint(req.GetAttempt())),
	}); err != nil {
		t.Fatal(err)
	}
}

func step(t testing.TB, run, id, tool string, a map[string]any) *planexv1.StepRequest {
	return &planexv1.StepRequest{RunId: run, StepId: id, Attempt: 1, PlanRevision: 1, Tool: tool, Args: args(t, a)}
}

func TestExecuteValidatesArguments(t *testing.T) {
	srv := natstest.Start(t)
	tool := newTool(t, "p.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo)
	r, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool}, MaxArgsBytes: 512})
	tests := []struct {
		name      string
		args      map[string]any
		wantField string
		wantMsg   string
	}{
		{name: "missing field", args: map[string]any{}, wantField: "args.n", wantMsg: "missing"},
		{name: "wrong type", args: map[string]any{"n": "seven"}, wantField: "args.n", wantMsg: `"seven"`},
		{name: "below minimum", args: map[string]any{"n": -1}, wantField: "args.n", wantMsg: ">= 0"},
		{name: "unknown field", args: map[string]any{"n": 1, "extra": true}, wantField: "args.extra", wantMsg: "not allowed"},
		{name: "oversized", args: map[string]any{"n": 1, "text": strings.Repeat("x", 600)}, wantField: "args", wantMsg: "byte limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := r.Execute(ctxT(t, 5*time.Second), step(t, "run1", "s", "p.echo", tt.args))
			if err != nil {
				t.Fatal(err)
			}
			e := res.GetError()
			if res.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED || e.GetCode() != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT {
				t.Fatalf("result %v, want FAILED INVALID_ARGUMENT", res)
			}
			if e.GetField() != tt.wantField || !strings.Contains(e.GetMessage(), tt.wantMsg) {
				t.Fatalf("error field %q message %q, want field %q and message containing %q", e.GetField(), e.GetMessage(), tt.wantField, tt.wantMsg)
			}
		})
	}
	if n := tool.calls.Load(); n != 0 {
		t.Fatalf("tool ran %d times on invalid arguments", n)
	}
}

func TestStepThroughJetStream(t *testing.T) {
	srv := natstest.Start(t)
	tool := newTool(t, "p.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo)
	r, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool}})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 10*time.Second)

	tests := []struct {
		name     string
		req      *planexv1.StepRequest
		want     planexv1.StepResultStatus
		wantCode planexv1.ErrorCode
		field    string
	}{
		{name: "succeeds", req: step(t, "r1", "a", "p.echo", map[string]any{"n": 7}), want: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED},
		{name: "invalid args", req: step(t, "r1", "b", "p.echo", map[string]any{"n": "x"}), want: planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED,
			wantCode: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, field: "args.n"},
		{name: "unknown tool", req: step(t, "r1", "c", "p.other", map[string]any{"n": 1}), want: planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED,
			wantCode: planexv1.ErrorCode_ERROR_CODE_UNKNOWN_TOOL, field: "tool"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dispatch(t, res, tt.req)
			got := eng.next(ctx)
			if got.GetStepId() != tt.req.GetStepId() || got.GetStatus() != tt.want || got.GetError().GetCode() != tt.wantCode || got.GetError().GetField() != tt.field {
				t.Fatalf("result %v, want step %s status %v code %v field %q", got, tt.req.GetStepId(), tt.want, tt.wantCode, tt.field)
			}
			if got.GetExecutorId() != r.ID() || got.GetStartedAt() == nil || got.GetDuration() == nil {
				t.Fatalf("result lacks executor id, start or duration: %v", got)
			}
			if tt.want == planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
				if n := got.GetOutput().GetStructValue().GetFields()["n"].GetNumberValue(); n != 7 {
					t.Fatalf("output %v, want n=7 inline", got.GetOutput())
				}
			}
		})
	}
}

func TestTimeouts(t *testing.T) {
	srv := natstest.Start(t)
	slow := newTool(t, "p.slow", planexv1.SideEffect_SIDE_EFFECT_READ, func(ctx context.Context, _ runner.Call) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	r, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{slow}})
	ctx := ctxT(t, 10*time.Second)

	t.Run("step timeout", func(t *testing.T) {
		req := step(t, "r1", "a", "p.slow", map[string]any{"n": 1})
		req.Timeout = durationpb.New(100 * time.Millisecond)
		res, err := r.Execute(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if res.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_TIMEOUT || res.GetDuration().AsDuration() < 100*time.Millisecond {
			t.Fatalf("result %v, want TIMEOUT after >= 100ms", res)
		}
	})
	t.Run("deadline passed", func(t *testing.T) {
		before := slow.calls.Load()
		req := step(t, "r1", "b", "p.slow", map[string]any{"n": 1})
		req.Deadline = timestamppb.New(time.Now().Add(-time.Second))
		res, err := r.Execute(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if res.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_TIMEOUT || !strings.Contains(res.GetError().GetMessage(), "passed before") {
			t.Fatalf("result %v, want TIMEOUT before start", res)
		}
		if slow.calls.Load() != before {
			t.Fatal("tool ran although the deadline had passed")
		}
	})
}

// rows is a Truncatable output.
type rows struct {
	Rows      []string `json:"rows"`
	Truncated bool     `json:"truncated"`
}

func (r rows) Len() int { return len(r.Rows) }
func (r rows) Cut(n int) any {
	return rows{Rows: r.Rows[:n], Truncated: n < len(r.Rows)}
}

func TestOutputCapAndObjectStore(t *testing.T) {
	srv := natstest.Start(t)
	many := make([]string, 100)
	for i := range many {
		many[i] = fmt.Sprintf("row-%03d-%s", i, strings.Repeat("x", 20))
	}
	tools := []runner.Tool{
		newTool(t, "p.rows", planexv1.SideEffect_SIDE_EFFECT_READ, func(context.Context, runner.Call) (any, error) {
			return rows{Rows: many}, nil
		}),
		newTool(t, "p.blob", planexv1.SideEffect_SIDE_EFFECT_READ, func(context.Context, runner.Call) (any, error) {
			return map[string]any{"blob": strings.Repeat("y", 5000)}, nil
		}),
		newTool(t, "p.medium", planexv1.SideEffect_SIDE_EFFECT_READ, func(context.Context, runner.Call) (any, error) {
			return map[string]any{"text": strings.Repeat("z", 1500)}, nil
		}),
	}
	r, _ := startRunner(t, srv, runner.Options{Tools: tools, MaxOutputBytes: 2000, InlineOutputBytes: 1000})
	_, res := srv.Setup(t)
	ctx := ctxT(t, 10*time.Second)

	t.Run("rows cut to the cap", func(t *testing.T) {
		got, err := r.Execute(ctx, step(t, "r1", "rows", "p.rows", map[string]any{"n": 1}))
		if err != nil {
			t.Fatal(err)
		}
		if !got.GetTruncated() || got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
			t.Fatalf("result %v, want succeeded and truncated", got)
		}
		out := outputOf(t, res, got).GetStructValue().GetFields()
		kept := out["rows"].GetListValue().GetValues()
		if len(kept) == 0 || len(kept) >= len(many) || !out["truncated"].GetBoolValue() {
			t.Fatalf("kept %d of %d rows, truncated=%v", len(kept), len(many), out["truncated"].GetBoolValue())
		}
		if kept[0].GetStringValue() != many[0] {
			t.Fatalf("first row %q, want %q (a prefix is kept)", kept[0].GetStringValue(), many[0])
		}
		if size := got.GetOutputRef().GetSize(); size > 2000 || size == 0 {
			t.Fatalf("stored output is %d bytes, want at most the 2000 byte cap (and above the inline limit)", size)
		}
	})
	t.Run("untruncatable output fails", func(t *testing.T) {
		got, err := r.Execute(ctx, step(t, "r1", "blob", "p.blob", map[string]any{"n": 1}))
		if err != nil {
			t.Fatal(err)
		}
		if got.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED || !strings.Contains(got.GetError().GetMessage(), "exceeds") {
			t.Fatalf("result %v, want TOOL_FAILED naming the cap", got)
		}
	})
	t.Run("large output goes to the object store", func(t *testing.T) {
		got, err := r.Execute(ctx, step(t, "r1", "medium", "p.medium", map[string]any{"n": 1}))
		if err != nil {
			t.Fatal(err)
		}
		ref := got.GetOutputRef()
		if got.GetOutput() != nil || ref.GetBucket() != bus.ObjectOutputs || ref.GetName() != bus.OutputName("r1", "medium", 1) {
			t.Fatalf("result %v, want an output_ref to %s", got, bus.OutputName("r1", "medium", 1))
		}
		data, err := res.Outputs.GetBytes(ctx, ref.GetName())
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if int64(len(data)) != ref.GetSize() || hex.EncodeToString(sum[:]) != ref.GetSha256() || !strings.Contains(string(data), strings.Repeat("z", 1500)) {
			t.Fatalf("stored object (%d bytes) does not match the ref %v", len(data), ref)
		}
	})
}

// outputOf returns a result's output, reading it from the object store
// when it was not inlined.
func outputOf(t testing.TB, res *bus.Resources, r *planexv1.StepResult) *structpb.Value {
	t.Helper()
	if r.GetOutputRef() == nil {
		return r.GetOutput()
	}
	data, err := res.Outputs.GetBytes(ctxT(t, 5*time.Second), r.GetOutputRef().GetName())
	if err != nil {
		t.Fatal(err)
	}
	v := &structpb.Value{}
	if err := v.UnmarshalJSON(data); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestSideEffectIdempotency(t *testing.T) {
	srv := natstest.Start(t)
	sent := newTool(t, "p.send", planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, func(_ context.Context, c runner.Call) (any, error) {
		return map[string]any{"id": c.RunID + "/" + c.StepID}, nil
	})
	r, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{sent}})
	_, res := srv.Setup(t)
	ctx := ctxT(t, 10*time.Second)

	first, err := r.Execute(ctx, step(t, "r1", "a", "p.send", map[string]any{"n": 1}))
	if err != nil {
		t.Fatal(err)
	}
	second, err := r.Execute(ctx, step(t, "r1", "a", "p.send", map[string]any{"n": 1}))
	if err != nil {
		t.Fatal(err)
	}
	if sent.calls.Load() != 1 {
		t.Fatalf("tool ran %d times for one attempt", sent.calls.Load())
	}
	if first.GetReplayed() || !second.GetReplayed() || !proto.Equal(first.GetOutput(), second.GetOutput()) {
		t.Fatalf("second delivery %v is not a replay of %v", second, first)
	}

	// An attempt another replica started and never finished.
	started, _ := proto.Marshal(&planexv1.StepResult{RunId: "r1", StepId: "b", Attempt: 1, ExecutorId: "dead-replica", StartedAt: timestamppb.Now()})
	if _, err := res.Effects.Create(ctx, bus.EffectKey("r1", "b", 1), started); err != nil {
		t.Fatal(err)
	}
	unknown, err := r.Execute(ctx, step(t, "r1", "b", "p.send", map[string]any{"n": 1}))
	if err != nil {
		t.Fatal(err)
	}
	if unknown.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_OUTCOME_UNKNOWN ||
		unknown.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN || !strings.Contains(unknown.GetError().GetMessage(), "dead-replica") {
		t.Fatalf("result %v, want OUTCOME_UNKNOWN naming the replica", unknown)
	}
	if sent.calls.Load() != 1 {
		t.Fatal("tool ran for an attempt whose outcome is unknown")
	}
}

func TestRetryableErrorsStayRetryableAfterMaxDeliveries(t *testing.T) {
	srv := natstest.Start(t)
	var mu sync.Mutex
	var attempts []int32
	down := newTool(t, "p.down", planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, func(_ context.Context, c runner.Call) (any, error) {
		mu.Lock()
		attempts = append(attempts, c.Attempt)
		mu.Unlock()
		return nil, runner.Unavailable(errors.New("connection refused"), "backend unavailable")
	})
	startRunner(t, srv, runner.Options{Tools: []runner.Tool{down}, MaxDeliver: 2})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)

	dispatch(t, res, step(t, "r1", "a", "p.down", map[string]any{"n": 1}))
	got := eng.next(ctxT(t, 10*time.Second))
	// Still UNAVAILABLE and retryable: the engine's retry policy may try
	// again with a new attempt once the backend is back.
	if got.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE || !got.GetError().GetRetryable() ||
		!strings.Contains(got.GetError().GetMessage(), "gave up after 2 deliveries: backend unavailable") {
		t.Fatalf("result %v, want a retryable UNAVAILABLE naming the deliveries and the last error", got)
	}
	if n := down.calls.Load(); n != 2 {
		t.Fatalf("tool ran %d times, want once per delivery (2): a retryable failure releases the effect record", n)
	}
}

func TestPoisonMessageTerminated(t *testing.T) {
	srv := natstest.Start(t)
	startRunner(t, srv, runner.Options{Tools: []runner.Tool{newTool(t, "p.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo)}})
	nc, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 10*time.Second)

	terminated := make(chan *nats.Msg, 2)
	sub, err := nc.ChanSubscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED."+bus.StreamSteps+"."+bus.PoolConsumer("p"), terminated)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	for i, data := range [][]byte{{0xff, 0xff, 0xff}, mustMarshal(t, &planexv1.StepRequest{StepId: "no-run", Attempt: 1, Tool: "p.echo"})} {
		if _, err := res.JS.PublishMsg(ctx, &nats.Msg{Subject: "planex.steps.p.echo", Data: data}, jetstream.WithMsgID(fmt.Sprint("poison-", i))); err != nil {
			t.Fatal(err)
		}
		select {
		case <-terminated:
		case <-ctx.Done():
			t.Fatalf("poison message %d was not terminated", i)
		}
	}
	// The pool goes on working.
	dispatch(t, res, step(t, "r1", "a", "p.echo", map[string]any{"n": 1}))
	if got := eng.next(ctx); got.GetStepId() != "a" {
		t.Fatalf("result %v, want step a", got)
	}
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConcurrencyBound(t *testing.T) {
	srv := natstest.Start(t)
	release := make(chan struct{})
	var running, peak atomic.Int32
	block := newTool(t, "p.block", planexv1.SideEffect_SIDE_EFFECT_READ, func(ctx context.Context, _ runner.Call) (any, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		select {
		case <-release:
			return map[string]any{}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	startRunner(t, srv, runner.Options{Tools: []runner.Tool{block}, Concurrency: 2})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 20*time.Second)
	const steps = 6
	for i := range steps {
		dispatch(t, res, step(t, "r1", fmt.Sprint("s", i), "p.block", map[string]any{"n": i}))
	}
	cons, err := res.JS.Consumer(ctx, bus.StreamSteps, bus.PoolConsumer("p"))
	if err != nil {
		t.Fatal(err)
	}
	// Wait until two steps run, then check the server delivered no more.
	for running.Load() < 2 {
		if ctx.Err() != nil {
			t.Fatal("two steps never ran at once")
		}
		time.Sleep(10 * time.Millisecond)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 2 || info.NumPending != steps-2 {
		t.Fatalf("ack pending %d, pending %d; want 2 delivered and %d waiting", info.NumAckPending, info.NumPending, steps-2)
	}
	close(release)
	for range steps {
		if got := eng.next(ctx); got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
			t.Fatalf("result %v", got)
		}
	}
	if p := peak.Load(); p != 2 {
		t.Fatalf("peak concurrency %d, want 2", p)
	}
}

func TestKilledReplicaStepIsRedelivered(t *testing.T) {
	srv := natstest.Start(t)
	started := make(chan struct{}, 1)
	hang := make(chan struct{})
	defer close(hang)
	var calls atomic.Int32
	tool := func() *fakeTool {
		return newTool(t, "p.work", planexv1.SideEffect_SIDE_EFFECT_READ, func(ctx context.Context, _ runner.Call) (any, error) {
			if calls.Add(1) == 1 {
				started <- struct{}{}
				<-hang // the first replica dies while it runs
				return nil, errors.New("replica is dead")
			}
			return map[string]any{"done": true}, nil
		})
	}
	// Replica A reports its start as the tool starts (it is killed while
	// the tool runs, before any started-notice delay would pass).
	_, ncA := startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool()}, AckWait: time.Second, StartedNoticeDelay: -1})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 20*time.Second)

	dispatch(t, res, step(t, "r1", "a", "p.work", map[string]any{"n": 1}))
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("first replica never started the step")
	}
	ncA.Close() // kill: no ack, no nak, no heartbeats any more
	killedAt := time.Now()

	b, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool()}, AckWait: time.Second})
	got := eng.next(ctx)
	if got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED || got.GetExecutorId() != b.ID() {
		t.Fatalf("result %v, want success from replica %s", got, b.ID())
	}
	if waited := time.Since(killedAt); waited < 500*time.Millisecond {
		t.Fatalf("redelivered after %v, before AckWait", waited)
	}
	// The killed replica's start told the engine (its tool ran past the
	// started-notice delay); the redelivery ended at once and reports its
	// start with its result, under its own executor id (checked above).
	notices, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEngine, jetstream.ConsumerConfig{
		Durable: "test-started", FilterSubject: bus.EngineSubject("r1", bus.KindStarted), AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := notices.Fetch(2, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var by []string
	for m := range batch.Messages() {
		var n planexv1.StepStartedNotice
		if err := bus.Decode(bus.NatsMsg(m), &n); err != nil {
			t.Fatal(err)
		}
		by = append(by, n.GetExecutorId())
	}
	if len(by) != 1 || by[0] == b.ID() {
		t.Fatalf("started notices from %v, want one from the killed replica only (%s reports with its result)", by, b.ID())
	}
}

func TestInProgressKeepsLongStepsFromRedelivery(t *testing.T) {
	srv := natstest.Start(t)
	long := newTool(t, "p.long", planexv1.SideEffect_SIDE_EFFECT_READ, func(ctx context.Context, _ runner.Call) (any, error) {
		select {
		case <-time.After(2500 * time.Millisecond): // 2.5 × AckWait
			return map[string]any{}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	startRunner(t, srv, runner.Options{Tools: []runner.Tool{long}, AckWait: time.Second, Concurrency: 2})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	dispatch(t, res, step(t, "r1", "a", "p.long", map[string]any{"n": 1}))
	got := eng.next(ctxT(t, 10*time.Second))
	if got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("result %v", got)
	}
	if n := long.calls.Load(); n != 1 {
		t.Fatalf("long step ran %d times; in-progress acks should prevent redelivery", n)
	}
}

func TestToolRegistration(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	ctx := ctxT(t, 10*time.Second)
	tools := []runner.Tool{
		newTool(t, "p.one", planexv1.SideEffect_SIDE_EFFECT_READ, echo),
		newTool(t, "p.two", planexv1.SideEffect_SIDE_EFFECT_WRITE, echo),
	}
	r, err := runner.New(res, runner.Options{Pool: "p", Tools: tools, Logger: natstest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools {
		e, err := res.Tools.Get(ctx, bus.ToolKey(tool.Spec().GetName(), r.ID()))
		if err != nil {
			t.Fatalf("tool %s not registered: %v", tool.Spec().GetName(), err)
		}
		var spec planexv1.ToolSpec
		if err := proto.Unmarshal(e.Value(), &spec); err != nil || !proto.Equal(&spec, tool.Spec()) {
			t.Fatalf("registered spec %v, want %v", &spec, tool.Spec())
		}
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools {
		if _, err := res.Tools.Get(ctx, bus.ToolKey(tool.Spec().GetName(), r.ID())); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("tool %s still registered after Stop: %v", tool.Spec().GetName(), err)
		}
	}
}

func TestNewRejectsForeignTools(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	tests := []struct {
		name  string
		tools []runner.Tool
	}{
		{name: "other pool", tools: []runner.Tool{newTool(t, "q.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo)}},
		{name: "duplicate", tools: []runner.Tool{newTool(t, "p.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo), newTool(t, "p.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo)}},
		{name: "bad name", tools: []runner.Tool{newTool(t, "p.Echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := runner.New(res, runner.Options{Pool: "p", Tools: tt.tools}); err == nil {
				t.Fatal("New accepted the tools")
			}
		})
	}
}

// A running attempt with a heartbeat timeout heartbeats to the engine at
// least every third of it, on the started subject with message ids
// <run>:<step>:<attempt>:hb:<n>, until its result is published; a killed
// replica falls silent (the engine's heartbeat timeout then fires, see
// services/supervisor TestHeartbeatTimeout), and an attempt without a
// heartbeat timeout sends none.
func TestHeartbeatsToTheEngine(t *testing.T) {
	srv := natstest.Start(t)
	release, quietRelease := make(chan struct{}), make(chan struct{})
	tool := newTool(t, "p.long", planexv1.SideEffect_SIDE_EFFECT_READ, func(ctx context.Context, c runner.Call) (any, error) {
		wait := release
		if c.RunID == "quiet" {
			wait = quietRelease
		}
		select {
		case <-wait:
			return map[string]any{}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	r, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool}, AckWait: time.Second})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 30*time.Second)
	notices, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEngine, jetstream.ConsumerConfig{
		Durable: "test-started", FilterSubject: bus.SubjectEnginePrefix + "*." + bus.KindStarted, AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	const hbTimeout = 600 * time.Millisecond
	req := step(t, "r1", "a", "p.long", map[string]any{"n": 1})
	req.HeartbeatTimeout = durationpb.New(hbTimeout)
	dispatch(t, res, req)

	var beats []*planexv1.StepStartedNotice
	for len(beats) < 5 && ctx.Err() == nil {
		batch, err := notices.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			var n planexv1.StepStartedNotice
			if err := bus.Decode(bus.NatsMsg(m), &n); err != nil {
				t.Fatal(err)
			}
			_ = m.Ack()
			if !n.GetHeartbeat() {
				continue // the started notice
			}
			id := m.Headers().Get(jetstream.MsgIDHeader)
			if !strings.HasPrefix(id, "r1:a:1:hb:") || n.GetExecutorId() != r.ID() || n.GetHeartbeatAt() == nil || n.GetRunId() != "r1" || n.GetAttempt() != 1 {
				t.Fatalf("heartbeat %v with message id %q", &n, id)
			}
			beats = append(beats, &n)
		}
	}
	if len(beats) < 5 {
		t.Fatalf("%d heartbeats before the test deadline, want 5", len(beats))
	}
	for i := 1; i < len(beats); i++ {
		if gap := beats[i].GetHeartbeatAt().AsTime().Sub(beats[i-1].GetHeartbeatAt().AsTime()); gap <= 0 || gap >= hbTimeout {
			t.Fatalf("heartbeats %d and %d are %v apart, want within the %v heartbeat timeout", i-1, i, gap, hbTimeout)
		}
	}
	close(release)
	if got := eng.next(ctx); got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("result %v", got)
	}

	// No heartbeat timeout: the started notice only (the tool runs until
	// the notice is seen, past the started-notice delay).
	dispatch(t, res, step(t, "quiet", "a", "p.long", map[string]any{"n": 1}))
	for seen := false; !seen; {
		m, err := notices.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("started notice of the quiet attempt: %v", err)
		}
		var n planexv1.StepStartedNotice
		if err := bus.Decode(bus.NatsMsg(m), &n); err != nil {
			t.Fatal(err)
		}
		_ = m.Ack()
		if n.GetRunId() == "quiet" && n.GetHeartbeat() {
			t.Fatalf("attempt without a heartbeat timeout sent heartbeat %v", &n)
		}
		seen = n.GetRunId() == "quiet"
	}
	close(quietRelease)
	if got := eng.next(ctx); got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("result %v", got)
	}
	msgs, err := notices.Fetch(10, jetstream.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for m := range msgs.Messages() {
		var n planexv1.StepStartedNotice
		if err := bus.Decode(bus.NatsMsg(m), &n); err != nil {
			t.Fatal(err)
		}
		if n.GetRunId() == "quiet" && n.GetHeartbeat() {
			t.Fatalf("attempt without a heartbeat timeout sent heartbeat %v", &n)
		}
	}
}

// A step reports its start lazily: one that ends within the started-notice
// delay publishes no notice (its result carries the start), one that runs
// longer publishes it, and one whose schedule-to-start limit (start_by) is
// near publishes it as it starts, whatever the delay.
func TestStartedNoticeIsLazy(t *testing.T) {
	srv := natstest.Start(t)
	slow := make(chan struct{})
	tool := newTool(t, "p.lazy", planexv1.SideEffect_SIDE_EFFECT_READ, func(ctx context.Context, c runner.Call) (any, error) {
		if c.RunID == "slow" {
			select {
			case <-slow:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return map[string]any{}, nil
	})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 30*time.Second)
	noticeOf := func(run string) (*planexv1.StepStartedNotice, error) {
		stream, err := res.JS.Stream(ctx, bus.StreamEngine)
		if err != nil {
			t.Fatal(err)
		}
		m, err := stream.GetLastMsgForSubject(ctx, bus.EngineSubject(run, bus.KindStarted))
		if err != nil {
			return nil, err
		}
		var n planexv1.StepStartedNotice
		if err := bus.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}, &n); err != nil {
			t.Fatal(err)
		}
		return &n, nil
	}

	// A delay no fast step reaches, even on a loaded machine.
	r, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool}, StartedNoticeDelay: time.Minute})
	dispatch(t, res, step(t, "fast", "a", "p.lazy", map[string]any{"n": 1}))
	got := eng.next(ctx)
	if got.GetExecutorId() != r.ID() || got.GetStartedAt() == nil {
		t.Fatalf("result %v: want the start (executor, started_at) carried by the result", got)
	}
	if n, err := noticeOf("fast"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("fast step published started notice %v (%v), want none", n, err)
	}

	// start_by already reached: the notice goes out as the tool starts.
	near := step(t, "near", "a", "p.lazy", map[string]any{"n": 1})
	near.StartBy = timestamppb.Now()
	dispatch(t, res, near)
	eng.next(ctx)
	if n, err := noticeOf("near"); err != nil || n.GetExecutorId() != r.ID() {
		t.Fatalf("started notice of the step whose start_by passed: %v, %v", n, err)
	}

	// A step running past the delay publishes its notice while it runs.
	r2, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{tool}, StartedNoticeDelay: 10 * time.Millisecond})
	_ = r.Stop(ctx)
	dispatch(t, res, step(t, "slow", "a", "p.lazy", map[string]any{"n": 1}))
	notices, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEngine, jetstream.ConsumerConfig{
		Durable: "test-slow", FilterSubject: bus.EngineSubject("slow", bus.KindStarted), AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	m, err := notices.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("started notice of the running step: %v", err)
	}
	var n planexv1.StepStartedNotice
	if err := bus.Decode(bus.NatsMsg(m), &n); err != nil || n.GetExecutorId() != r2.ID() || n.GetStartedAt() == nil {
		t.Fatalf("started notice %v, %v: want one from %s with its start time", &n, err, r2.ID())
	}
	close(slow)
	if got := eng.next(ctx); got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		t.Fatalf("result %v", got)
	}
}
