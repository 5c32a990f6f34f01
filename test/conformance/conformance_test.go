package conformance

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
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
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/internal/testbin"
)

// EnvExecutor names the variable holding the command of the executor
// under test; unset, the suite runs the Go runner and the TypeScript SDK.
const EnvExecutor = "CONFORMANCE_EXECUTOR"

// typeScriptExecutor is the TypeScript SDK's conformance executor.
const typeScriptExecutor = "examples/typescript-executor/conformance.js"

var replicaRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// TestConformance runs the suite against every executor under test.
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts executor processes; not in -short")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if c := os.Getenv(EnvExecutor); c != "" {
		t.Run("custom", func(t *testing.T) { run(t, root, strings.Fields(c)) })
		return
	}
	t.Run("go", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "goexecutor")
		if err := testbin.Build(root, "./test/conformance/goexecutor", bin); err != nil {
			t.Fatal(err)
		}
		run(t, root, []string{bin})
	})
	t.Run("typescript", func(t *testing.T) {
		if _, err := exec.LookPath("node"); err != nil {
			t.Skip("node is not on the PATH: the TypeScript executor SDK is not checked")
		}
		if _, err := os.Stat(filepath.Join(root, typeScriptExecutor)); err != nil {
			t.Skipf("%s does not exist yet (the TypeScript executor SDK provides it): %v", typeScriptExecutor, err)
		}
		if _, err := os.Stat(filepath.Join(root, filepath.Dir(typeScriptExecutor), "node_modules")); err != nil {
			t.Skipf("the dependencies of %s are not installed (npm ci in %s): %v", typeScriptExecutor, filepath.Dir(typeScriptExecutor), err)
		}
		run(t, root, []string{"node", typeScriptExecutor})
	})
}

// run runs every check against one executor command, in order: the last
// ones kill and stop the executor.
func run(t *testing.T, root string, command []string) {
	s := newSuite(t, root, command)
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"registration", s.registration},
		{"consumer", s.consumer},
		{"result", s.result},
		{"steps_stream", s.stepsStream},
		{"refused", s.refused},
		{"deadline_passed", s.deadlinePassed},
		{"invalid_arguments", s.invalidArguments},
		{"unknown_tool", s.unknownTool},
		{"effects", s.effects},
		{"heartbeats", s.heartbeats},
		{"crash_mid_tool", s.crashMidTool},
		{"shutdown", s.shutdown},
	} {
		t.Run(c.name, c.fn)
	}
}

// registration: one ToolSpec per tool under <pool>.<verb>.<replica>.
func (s *suite) registration(t *testing.T) {
	replica := s.proc.replica
	if !replicaRE.MatchString(replica) {
		t.Errorf("replica id %q does not match %s", replica, replicaRE)
	}
	want, err := Specs()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, w := range want {
		key := bus.ToolKey(w.GetName(), replica)
		e, err := s.res.Tools.Get(ctx, key)
		if err != nil {
			t.Errorf("%s %s: %v", bus.BucketTools, key, err)
			continue
		}
		got := &planexv1.ToolSpec{}
		if err := proto.Unmarshal(e.Value(), got); err != nil {
			t.Errorf("%s %s does not decode as planex.v1.ToolSpec: %v", bus.BucketTools, key, err)
			continue
		}
		if got.GetName() != w.GetName() || got.GetPool() != Pool {
			t.Errorf("%s: name %q pool %q, want %q and %q", key, got.GetName(), got.GetPool(), w.GetName(), Pool)
		}
		if got.GetSideEffect() != w.GetSideEffect() || got.GetIdempotent() != w.GetIdempotent() || got.GetRequiresApproval() != w.GetRequiresApproval() {
			t.Errorf("%s: side_effect %s idempotent %t requires_approval %t, want %s %t %t", key,
				got.GetSideEffect(), got.GetIdempotent(), got.GetRequiresApproval(),
				w.GetSideEffect(), w.GetIdempotent(), w.GetRequiresApproval())
		}
		if !proto.Equal(got.GetArgsSchema(), w.GetArgsSchema()) {
			t.Errorf("%s: args_schema %v, want %v", key, got.GetArgsSchema(), w.GetArgsSchema())
		}
		if !proto.Equal(got.GetOutputSchema(), w.GetOutputSchema()) {
			t.Errorf("%s: output_schema %v, want %v", key, got.GetOutputSchema(), w.GetOutputSchema())
		}
	}
}

// consumer: the pool's durable consumer on PLANEX_STEPS.
func (s *suite) consumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	check := func(stream, filter string) {
		c, err := s.res.JS.Consumer(ctx, stream, bus.PoolConsumer(Pool))
		if err != nil {
			t.Errorf("consumer %s on %s: %v", bus.PoolConsumer(Pool), stream, err)
			return
		}
		cfg := c.CachedInfo().Config
		filters := append([]string{cfg.FilterSubject}, cfg.FilterSubjects...)
		found := false
		for _, f := range filters {
			found = found || f == filter
		}
		if !found || cfg.Durable != bus.PoolConsumer(Pool) || cfg.AckPolicy != jetstream.AckExplicitPolicy ||
			cfg.AckWait != ackWait || cfg.MaxDeliver != maxDeliver {
			t.Errorf("consumer %s on %s: durable %q filter %q ack %s ack_wait %s max_deliver %d; want durable, filter %s, explicit acks, ack_wait %s, max_deliver %d",
				bus.PoolConsumer(Pool), stream, cfg.Durable, filters, cfg.AckPolicy, cfg.AckWait, cfg.MaxDeliver, filter, ackWait, maxDeliver)
		}
	}
	check(bus.StreamSteps, bus.PoolFilter(Pool))
	if _, err := s.res.JS.Consumer(ctx, bus.StreamEvents, bus.PoolConsumer(Pool)); err == nil {
		t.Logf("the executor also consumes %s (steps dispatched in run logs)", bus.StreamEvents)
		check(bus.StreamEvents, bus.DispatchFilter(Pool))
	}
}

// checkResult checks a result's identity and headers against its request.
func (s *suite) checkResult(t *testing.T, req *planexv1.StepRequest, res *planexv1.StepResult, m *nats.Msg, status planexv1.StepResultStatus) {
	t.Helper()
	if got, want := m.Subject, bus.EngineSubject(req.GetRunId(), bus.KindResult); got != want {
		t.Errorf("result subject %q, want %q", got, want)
	}
	if got, want := m.Header.Get(nats.MsgIdHdr), bus.MsgID(req.GetRunId(), req.GetStepId(), fmt.Sprint(req.GetAttempt()), bus.KindResult); got != want {
		t.Errorf("result Nats-Msg-Id %q, want %q", got, want)
	}
	if got, want := m.Header.Get(bus.HeaderContentType), "planex.v1.StepResult"; got != want {
		t.Errorf("result %s %q, want %q", bus.HeaderContentType, got, want)
	}
	if res.GetRunId() != req.GetRunId() || res.GetStepId() != req.GetStepId() || res.GetAttempt() != req.GetAttempt() ||
		res.GetPlanRevision() != req.GetPlanRevision() || res.GetTool() != req.GetTool() {
		t.Errorf("result identity run %q step %q attempt %d revision %d tool %q, want %q %q %d %d %q",
			res.GetRunId(), res.GetStepId(), res.GetAttempt(), res.GetPlanRevision(), res.GetTool(),
			req.GetRunId(), req.GetStepId(), req.GetAttempt(), req.GetPlanRevision(), req.GetTool())
	}
	if res.GetStatus() != status {
		t.Fatalf("result status %s (error %v), want %s", res.GetStatus(), res.GetError(), status)
	}
	if res.GetExecutorId() == "" || res.GetStartedAt() == nil {
		t.Errorf("result executor_id %q started_at %v: want both set", res.GetExecutorId(), res.GetStartedAt())
	}
}

// result: a valid signed step is executed once, reported and acked.
func (s *suite) result(t *testing.T) {
	req := step(ToolEcho, map[string]any{"text": "hello"})
	req.PlanRevision = 3
	s.echo(t, req, send{})
}

// stepsStream: the same through PLANEX_STEPS, which every executor reads.
func (s *suite) stepsStream(t *testing.T) {
	s.echo(t, step(ToolEcho, map[string]any{"text": "from " + bus.StreamSteps}), send{subject: bus.SubjectStepsPrefix + ToolEcho})
}

func (s *suite) echo(t *testing.T, req *planexv1.StepRequest, o send) {
	t.Helper()
	w := s.watch(t, req.GetRunId())
	_, ack := s.publish(t, req, o)
	res, m := w.nthResult(t, 1)
	s.checkResult(t, req, res, m, planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED)
	want := structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"text": req.GetArgs().GetFields()["text"]}})
	if !proto.Equal(res.GetOutput(), want) {
		t.Errorf("output %v, want %v", res.GetOutput(), want)
	}
	if res.GetExecutorId() != s.proc.replica {
		t.Errorf("executor_id %q, want the registered replica id %q", res.GetExecutorId(), s.proc.replica)
	}
	if res.GetDuration() == nil || res.GetReplayed() || res.GetError() != nil {
		t.Errorf("duration %v replayed %t error %v: want a duration, not replayed, no error", res.GetDuration(), res.GetReplayed(), res.GetError())
	}
	s.waitAcked(t, ack)
	s.executions(t, req.GetRunId(), 1)
}

// refused: requests the executor must terminate without running them.
func (s *suite) refused(t *testing.T) {
	write := func() *planexv1.StepRequest {
		return step(ToolWrite, map[string]any{"key": "k", "value": "v"})
	}
	echo := func() *planexv1.StepRequest { return step(ToolEcho, map[string]any{"text": "refuse me"}) }
	for _, c := range []struct {
		name string
		req  func() *planexv1.StepRequest
		o    send
	}{
		{"unsigned", echo, send{tamper: func(m *nats.Msg) {
			for _, h := range []string{stepsign.HeaderSignature, stepsign.HeaderKeyID, stepsign.HeaderExpires, stepsign.HeaderApproval} {
				m.Header.Del(h)
			}
		}}},
		{"unknown_key", echo, send{signer: s.stranger}},
		{"forged_signature", echo, send{signer: s.stranger, tamper: func(m *nats.Msg) {
			m.Header.Set(stepsign.HeaderKeyID, s.signer.KeyID()) // a trusted key id over another key's signature
		}}},
		{"tampered_payload", echo, send{tamper: func(m *nats.Msg) {
			req := &planexv1.StepRequest{}
			if err := proto.Unmarshal(m.Data, req); err != nil {
				panic(err)
			}
			req.Args.Fields["text"] = structpb.NewStringValue("changed after signing")
			m.Data, _ = proto.Marshal(req)
		}}},
		{"expired_signature", echo, send{expires: time.Now().Add(-time.Second)}},
		{"no_approval", write, send{noApproval: true}},
		{"forged_approval", write, send{noApproval: true, tamper: func(m *nats.Msg) {
			m.Header.Set(stepsign.HeaderApproval, "gate=g-s1;decision=approve;by=mallory")
		}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := c.req()
			w := s.watch(t, req.GetRunId())
			_, ack := s.publish(t, req, c.o)
			s.checkRefused(t, w, req, ack)
		})
	}
	t.Run("replayed_signature", func(t *testing.T) {
		req := echo()
		w := s.watch(t, req.GetRunId())
		m, ack := s.publish(t, req, send{})
		w.nthResult(t, 1)
		s.waitAcked(t, ack)
		again := s.republish(t, m, bus.MsgID(req.GetRunId(), req.GetStepId(), "1", "replay"))
		s.waitTerminated(t, again)
		if rs, _ := w.results(t); len(rs) != 1 {
			t.Errorf("%d results after the replay, want the first one only", len(rs))
		}
		s.executions(t, req.GetRunId(), 1)
	})
}

// checkRefused: the delivery was terminated, nothing ran, nothing was
// reported.
func (s *suite) checkRefused(t *testing.T, w *watcher, req *planexv1.StepRequest, ack *jetstream.PubAck) {
	t.Helper()
	// Done when the delivery was terminated, or (a failure, reported at
	// once) when the executor ran the tool or reported the step.
	waitFor(t, "termination (Term) of the step request at "+ack.Stream+":"+strconv.FormatUint(ack.Sequence, 10), func() bool {
		return s.isTerminated(ack) || len(w.snapshot()) > 0 || len(s.records(t, req.GetRunId())) > 0
	})
	if !s.isTerminated(ack) {
		t.Errorf("refused step was not terminated (Term): the executor ran or reported it")
	}
	// A result is published before the delivery is settled, on the
	// connection the advisory comes from: it would be here by now.
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := w.snapshot(); len(got) != 0 {
		t.Errorf("refused step: executor published %d messages about the run (first on %s)", len(got), got[0].Subject)
	}
	if n := s.stored(t, req.GetRunId()); n != 0 {
		t.Errorf("refused step: %s holds %d messages about the run", bus.StreamEngine, n)
	}
	s.executions(t, req.GetRunId(), 0)
}

// runFailed publishes req and checks it fails with code without running.
func (s *suite) runFailed(t *testing.T, req *planexv1.StepRequest, code planexv1.ErrorCode) *planexv1.StepError {
	t.Helper()
	w := s.watch(t, req.GetRunId())
	_, ack := s.publish(t, req, send{})
	res, m := w.nthResult(t, 1)
	s.checkResult(t, req, res, m, planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED)
	if res.GetError().GetCode() != code {
		t.Errorf("error %v, want code %s", res.GetError(), code)
	}
	if res.GetError().GetMessage() == "" {
		t.Errorf("error %v: want a message", res.GetError())
	}
	s.waitAcked(t, ack)
	s.executions(t, req.GetRunId(), 0)
	return res.GetError()
}

// deadlinePassed: a validly signed step past its deadline fails TIMEOUT.
func (s *suite) deadlinePassed(t *testing.T) {
	req := step(ToolEcho, map[string]any{"text": "too late"})
	req.Deadline = timestamppb.New(time.Now().Add(-time.Second))
	s.runFailed(t, req, planexv1.ErrorCode_ERROR_CODE_TIMEOUT)
}

// invalidArguments: schema violations name the field.
func (s *suite) invalidArguments(t *testing.T) {
	t.Run("wrong_type", func(t *testing.T) {
		e := s.runFailed(t, step(ToolEcho, map[string]any{"text": 5}), planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
		if e.GetField() != "args.text" {
			t.Errorf("field %q, want %q", e.GetField(), "args.text")
		}
	})
	t.Run("missing", func(t *testing.T) {
		e := s.runFailed(t, step(ToolEcho, map[string]any{}), planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
		if !strings.HasPrefix(e.GetField(), "args") {
			t.Errorf("field %q, want args or args.<name>", e.GetField())
		}
	})
}

// unknownTool: a tool the pool does not have.
func (s *suite) unknownTool(t *testing.T) {
	e := s.runFailed(t, step(Pool+".nope", map[string]any{}), planexv1.ErrorCode_ERROR_CODE_UNKNOWN_TOOL)
	if e.GetField() != "tool" {
		t.Errorf("field %q, want %q", e.GetField(), "tool")
	}
}

// effects: the idempotency records of a non-idempotent tool.
func (s *suite) effects(t *testing.T) {
	t.Run("replayed_attempt", func(t *testing.T) {
		req := step(ToolWrite, map[string]any{"key": "k1", "value": "v1"})
		w := s.watch(t, req.GetRunId())
		_, ack := s.publish(t, req, send{})
		first, m := w.nthResult(t, 1)
		s.checkResult(t, req, first, m, planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED)
		s.waitAcked(t, ack)
		recs := s.executions(t, req.GetRunId(), 1)
		rec := s.effect(t, req)
		if rec == nil || rec.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
			t.Fatalf("effect record %s: %v, want a StepResult with status SUCCEEDED",
				bus.PoolEffectKey(Pool, bus.EffectKey(req.GetRunId(), req.GetStepId(), req.GetAttempt())), rec)
		}
		if len(recs) == 1 {
			if id := first.GetOutput().GetStructValue().GetFields()["execution_id"].GetStringValue(); id != recs[0].ExecutionID {
				t.Errorf("output execution_id %q, want the recorded %q", id, recs[0].ExecutionID)
			}
		}

		// The same attempt again, signed anew (another signature: a
		// later expiry), as a redelivery of a lost acknowledgement is.
		_, ack2 := s.publish(t, req, send{expires: time.Now().Add(6 * time.Minute), msgID: bus.MsgID(req.GetRunId(), req.GetStepId(), "1", "again")})
		second, m2 := w.nthResult(t, 2)
		s.checkResult(t, req, second, m2, planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED)
		if !second.GetReplayed() {
			t.Errorf("second result of the attempt: replayed false, want true")
		}
		if !proto.Equal(second.GetOutput(), first.GetOutput()) {
			t.Errorf("replayed output %v, want the recorded %v", second.GetOutput(), first.GetOutput())
		}
		s.waitAcked(t, ack2)
		s.executions(t, req.GetRunId(), 1)
	})
	t.Run("started_unfinished", func(t *testing.T) {
		req := step(ToolWrite, map[string]any{"key": "k2", "value": "v2"})
		started := &planexv1.StepResult{
			RunId: req.GetRunId(), StepId: req.GetStepId(), Attempt: req.GetAttempt(), PlanRevision: req.GetPlanRevision(),
			Tool: req.GetTool(), ExecutorId: "gone-0000", StartedAt: timestamppb.New(time.Now().Add(-time.Minute)),
		}
		data, err := proto.Marshal(started)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := s.res.Effects.Create(ctx, bus.PoolEffectKey(Pool, bus.EffectKey(req.GetRunId(), req.GetStepId(), req.GetAttempt())), data); err != nil {
			t.Fatal(err)
		}
		w := s.watch(t, req.GetRunId())
		_, ack := s.publish(t, req, send{})
		res, m := w.nthResult(t, 1)
		s.checkResult(t, req, res, m, planexv1.StepResultStatus_STEP_RESULT_STATUS_OUTCOME_UNKNOWN)
		if res.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN {
			t.Errorf("error %v, want ERROR_CODE_OUTCOME_UNKNOWN", res.GetError())
		}
		s.waitAcked(t, ack)
		s.executions(t, req.GetRunId(), 0)
	})
}

// heartbeats: a slow step with a heartbeat timeout.
func (s *suite) heartbeats(t *testing.T) {
	req := step(ToolSlow, map[string]any{"ms": 2500})
	req.HeartbeatTimeout = durationpb.New(600 * time.Millisecond)
	w := s.watch(t, req.GetRunId())
	_, ack := s.publish(t, req, send{})
	res, m := w.nthResult(t, 1)
	s.checkResult(t, req, res, m, planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED)
	s.waitAcked(t, ack)

	var notice, beats int
	prefix := bus.MsgID(req.GetRunId(), req.GetStepId(), "1", "hb") + ":"
	for _, msg := range w.snapshot() {
		if strings.HasSuffix(msg.Subject, "."+bus.KindResult) {
			break // only what came before the result counts
		}
		n := &planexv1.StepStartedNotice{}
		if err := proto.Unmarshal(msg.Data, n); err != nil {
			t.Fatalf("notice on %s: %v", msg.Subject, err)
		}
		if n.GetRunId() != req.GetRunId() || n.GetStepId() != req.GetStepId() || n.GetAttempt() != req.GetAttempt() || n.GetExecutorId() != s.proc.replica {
			t.Errorf("notice run %q step %q attempt %d executor %q, want %q %q %d %q", n.GetRunId(), n.GetStepId(), n.GetAttempt(), n.GetExecutorId(),
				req.GetRunId(), req.GetStepId(), req.GetAttempt(), s.proc.replica)
		}
		if !n.GetHeartbeat() {
			notice++
			if n.GetStartedAt() == nil {
				t.Errorf("started notice without started_at")
			}
			continue
		}
		beats++
		if id := msg.Header.Get(nats.MsgIdHdr); !strings.HasPrefix(id, prefix) {
			t.Errorf("heartbeat Nats-Msg-Id %q, want %s<n>", id, prefix)
		}
		if n.GetHeartbeatAt() == nil {
			t.Errorf("heartbeat without heartbeat_at")
		}
	}
	if notice < 1 || beats < 2 {
		t.Errorf("before the result: %d started notices and %d heartbeats, want at least 1 and 2", notice, beats)
	}
	// 2.5 s is longer than the ack wait: only in-progress acks kept the
	// step from being redelivered and run again.
	s.executions(t, req.GetRunId(), 1)
}

// crashMidTool: a non-idempotent step is not run again after its executor
// died while running it.
func (s *suite) crashMidTool(t *testing.T) {
	req := step(ToolWrite, map[string]any{"key": "crash", "value": "v", "sleep_ms": 30000})
	w := s.watch(t, req.GetRunId())
	_, ack := s.publish(t, req, send{})
	waitFor(t, "started notice and execution record of the step", func() bool {
		ns, _ := w.notices(t)
		return len(ns) > 0 && len(s.records(t, req.GetRunId())) > 0
	})
	if rs, _ := w.results(t); len(rs) != 0 {
		t.Fatalf("result before the kill: %v", rs[0])
	}
	s.kill(t) // checks the process was running until the kill
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if rs, _ := w.results(t); len(rs) != 0 {
		t.Fatalf("result published by the killed executor: %v", rs[0])
	}
	if rec := s.effect(t, req); rec == nil || rec.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_UNSPECIFIED {
		t.Errorf("effect record of the killed attempt: %v, want one with status UNSPECIFIED (started)", rec)
	}

	s.start(t)
	res, m := w.nthResult(t, 1)
	s.checkResult(t, req, res, m, planexv1.StepResultStatus_STEP_RESULT_STATUS_OUTCOME_UNKNOWN)
	if res.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN {
		t.Errorf("error %v, want ERROR_CODE_OUTCOME_UNKNOWN", res.GetError())
	}
	s.waitAcked(t, ack)
	s.executions(t, req.GetRunId(), 1)
}

// shutdown: SIGTERM while a step runs.
func (s *suite) shutdown(t *testing.T) {
	req := step(ToolSlow, map[string]any{"ms": 1500})
	w := s.watch(t, req.GetRunId())
	_, ack := s.publish(t, req, send{})
	waitFor(t, "execution record of the step", func() bool { return len(s.records(t, req.GetRunId())) > 0 })
	replica := s.proc.replica
	if err := s.terminate(t); err != nil {
		t.Errorf("executor exit after SIGTERM: %v, want status 0", err)
	}
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	rs, _ := w.results(t)
	switch {
	case len(rs) > 0:
		if rs[0].GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
			t.Errorf("in-flight step ended %s (%v), want SUCCEEDED or given back", rs[0].GetStatus(), rs[0].GetError())
		}
		s.waitAcked(t, ack)
	default:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := s.res.JS.Consumer(ctx, ack.Stream, bus.PoolConsumer(Pool))
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.AckFloor.Stream >= ack.Sequence {
			t.Errorf("in-flight step neither reported nor given back: acked without a result")
		}
		t.Logf("in-flight step given back for redelivery (pending %d, ack pending %d)", info.NumPending, info.NumAckPending)
	}
	for _, key := range s.keys(t) {
		if strings.HasSuffix(key, "."+replica) {
			t.Errorf("registration %s left after shutdown", key)
		}
	}
}
