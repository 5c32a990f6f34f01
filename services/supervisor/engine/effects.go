package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// perform publishes the side effects the committed state calls for:
// requests and timeout timers of the attempts this transaction dispatched
// and, when the state was not produced by this process (a crash may have
// cut them off), again for recent attempts still in flight, the deadline
// timer and the planning kick. Every publish carries a deterministic
// message id, so repeats inside the duplicate window are dropped by the
// server; repeats are limited to that window so they can never run an
// attempt twice.
func (e *Engine) perform(ctx context.Context, base, next *runlog.State, events []*planexv1.RunEvent) error {
	run := next.Run
	children := e.childEffects(ctx, base, next, events) // children.go
	if runlog.Terminal(run.GetStatus()) {
		return concurrently(children)
	}
	now := e.cfg.Now()
	recent := func(t *timestamppb.Timestamp) bool {
		return t != nil && now.Sub(t.AsTime()) < e.dupWindow/2
	}
	dispatched := map[string]bool{}
	for _, ev := range events {
		if d := ev.GetStepDispatched(); d != nil {
			dispatched[d.GetStepId()] = true
		}
	}
	started, retrying := map[string]bool{}, map[string]bool{}
	for _, ev := range events {
		if d := ev.GetStepStarted(); d != nil {
			started[d.GetStepId()] = true
		}
		if d := ev.GetStepRetrying(); d != nil {
			retrying[d.GetStepId()] = true
		}
	}
	// Step requests, timers and the kick are published asynchronously, in
	// the order found, and their acknowledgements awaited together (one
	// round trip for all); the rest (gate timers, the deadline) run
	// concurrently meanwhile.
	var waits, jobs []func() error
	for _, st := range stepsToPerform(base, next, events) {
		switch st.GetStatus() {
		case planexv1.StepStatus_STEP_STATUS_DISPATCHED:
			if st.GetChildRunId() != "" {
				// A run.child attempt: its child run, created at most once
				// (children.go), whenever it may be missing.
				if dispatched[st.GetStepId()] || !base.Verified {
					waits = append(waits, e.startChild(ctx, next, st))
				}
				continue
			}
			// The request only inside the duplicate window (so it can never
			// run an attempt twice); its timer whenever it may be missing
			// (a repeated timer is harmless: it fires once it is relevant).
			// An attempt appended as its own request (direct.go) is in
			// its pool's consumer already.
			if (dispatched[st.GetStepId()] || (!base.Verified && recent(st.GetDispatchedAt()))) &&
				!next.DirectAttempt(st.GetStepId(), st.GetAttempt()) {
				waits = append(waits, e.startStep(ctx, next, st))
			}
			if dispatched[st.GetStepId()] || !base.Verified {
				if t := e.queueTimer(next, st); t != nil {
					waits = append(waits, e.startTimer(ctx, next, t, "queue"))
				}
			}
		case planexv1.StepStatus_STEP_STATUS_RUNNING:
			if started[st.GetStepId()] || !base.Verified {
				for _, t := range e.runTimers(next, st) {
					waits = append(waits, e.startTimer(ctx, next, t, timerSuffix(t)))
				}
			}
		case planexv1.StepStatus_STEP_STATUS_PENDING:
			if at := st.GetRetryAt(); at != nil && (retrying[st.GetStepId()] || !base.Verified) {
				t := &planexv1.EngineTimer{RunId: run.GetId(), FireAt: at, Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_RETRY, StepId: st.GetStepId(), Attempt: st.GetAttempt()}
				waits = append(waits, e.startTimer(ctx, next, t, "retry"))
			}
		}
	}
	jobs = append(jobs, children...)
	jobs = append(jobs, e.gateTimers(ctx, base, next, events)...)
	jobs = append(jobs, e.critiqueKicks(ctx, base, next, events)...)
	if !base.Verified && (recent(run.GetCreatedAt()) || recent(run.GetResetAt())) {
		jobs = append(jobs, func() error { return PublishDeadline(ctx, e.res, run) })
	}
	newRound := !planning(base.Run) || roundOf(base.Run) != roundOf(run)
	// A kick being handled drives its own round; repeating its kick would
	// only make a second planner call for the same round.
	if planning(run) && (newRound || (!base.Verified && !handlingKick(ctx))) {
		r := roundOf(run)
		kick := &planexv1.EngineKick{RunId: run.GetId(), Reason: fmt.Sprintf("plan revision %d", r.revision)}
		p := bus.PublishAsync(e.runContext(ctx, next), e.res.JS, bus.Publication{
			Subject: bus.EngineSubject(run.GetId(), bus.KindKick), Msg: kick,
			MsgID: PlanKickID(run.GetId(), r.revision, r.replans),
			Attrs: []attribute.KeyValue{attribute.String("planex.run_id", run.GetId())},
		})
		waits = append(waits, func() error {
			if _, err := p.Wait(ctx); err != nil {
				return fmt.Errorf("publish planning kick: %w", err)
			}
			return nil
		})
	}
	var done chan error
	if len(jobs) > 0 {
		done = make(chan error, 1)
		go func() { done <- concurrently(jobs) }()
	}
	errs := make([]error, 0, len(waits)+1)
	for _, wait := range waits {
		errs = append(errs, wait())
	}
	if done != nil {
		errs = append(errs, <-done)
	}
	return errors.Join(errs...)
}

// concurrently runs independent publishes at once (their order does not
// matter: each is deduplicated and consumed independently) and joins their
// errors.
func concurrently(jobs []func() error) error {
	if len(jobs) == 1 {
		return jobs[0]()
	}
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, job := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = job()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// stepsToPerform are the steps whose side effects perform may owe: on a
// verified base (this process performed everything before), only the steps
// the decision's events name — so a decision costs the same at any plan
// length —; on an unverified one, every step, to repeat what a crash may
// have cut off.
func stepsToPerform(base, next *runlog.State, events []*planexv1.RunEvent) []*planexv1.StepState {
	if !base.Verified {
		return next.Run.GetSteps()
	}
	var out []*planexv1.StepState
	seen := map[string]bool{}
	for _, ev := range events {
		var id string
		switch p := ev.GetPayload().(type) {
		case *planexv1.RunEvent_StepDispatched:
			id = p.StepDispatched.GetStepId()
		case *planexv1.RunEvent_StepStarted:
			id = p.StepStarted.GetStepId()
		case *planexv1.RunEvent_StepRetrying:
			id = p.StepRetrying.GetStepId()
		case *planexv1.RunEvent_CritiquePending:
			id = p.CritiquePending.GetStepId()
		default:
			continue
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		if st := next.Step(id); st != nil {
			out = append(out, st)
		}
	}
	return out
}

// startStep starts publishing an attempt's StepRequest to its pool, inside
// a "dispatch step" span parented on the run's root span (so the
// executor's spans join the run's trace), and returns the wait for its
// acknowledgement.
func (e *Engine) startStep(ctx context.Context, st *runlog.State, s *planexv1.StepState) (wait func() error) {
	run := st.Run
	attempt := strconv.Itoa(int(s.GetAttempt()))
	attrs := []attribute.KeyValue{
		attribute.String("planex.run_id", run.GetId()),
		attribute.String("planex.step_id", s.GetStepId()),
		attribute.Int("planex.attempt", int(s.GetAttempt())),
		attribute.Int("planex.plan_revision", int(s.GetPlanRevision())),
		attribute.String("planex.tool", s.GetTool()),
		attribute.String("planex.pool", bus.PoolOf(s.GetTool())),
	}
	sctx, span := e.tracer.Start(e.runContext(ctx, st), "dispatch step",
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(trace.LinkFromContext(ctx)), trace.WithAttributes(attrs...))
	defer span.End()
	subj, err := bus.StepSubject(s.GetTool())
	if err != nil {
		return func() error { return err }
	}
	if !e.cfg.NoDirectDispatch && e.poolConsumesLogs(ctx, bus.PoolOf(s.GetTool())) {
		// Its pool consumes its steps from PLANEX_EVENTS (direct.go): the
		// request goes there, on no run's log subject.
		subj = bus.RequestSubject(bus.PoolOf(s.GetTool()))
	}
	req := &planexv1.StepRequest{
		RunId: run.GetId(), StepId: s.GetStepId(), Attempt: s.GetAttempt(), PlanRevision: s.GetPlanRevision(),
		Tool: s.GetTool(), Args: s.GetResolvedArgs(), Timeout: durationpb.New(startToClose(st, s, e.cfg.Limits.Default.StepTimeout)),
	}
	if dl, ok := st.Deadlines[s.GetStepId()]; ok && !dl.IsZero() && dl.Unix() > 0 {
		req.Deadline = timestamppb.New(dl)
	}
	if hb := s.GetHeartbeatTimeout(); hb != nil && hb.AsDuration() > 0 {
		req.HeartbeatTimeout = hb
	}
	if t := e.queueTimer(st, s); t != nil {
		req.StartBy = t.GetFireAt()
	}
	span.SetAttributes(attribute.Bool("planex.retry", s.GetRetries() > 0))
	p := bus.PublishAsync(sctx, e.res.JS, bus.Publication{
		Subject: subj, Msg: req, MsgID: bus.MsgID(run.GetId(), s.GetStepId(), attempt), Attrs: attrs,
		Sign: e.cfg.Signer.SignFunc(signatureExpiry(run, time.Now()),
			stepsign.Approval(run, s, slices.Contains(e.cfg.AutoApprove, s.GetTool()))),
	})
	return func() error {
		if _, err := p.Wait(ctx); err != nil {
			return fmt.Errorf("publish step %s attempt %s: %w", s.GetStepId(), attempt, err)
		}
		return nil
	}
}

// publishTimer publishes a timer of a step attempt with message id
// <run>:timer:<step>:<attempt>:<suffix>.
func (e *Engine) publishTimer(ctx context.Context, st *runlog.State, t *planexv1.EngineTimer, suffix string) error {
	return e.startTimer(ctx, st, t, suffix)()
}

// startTimer starts publishing a timer of a step attempt (message id
// <run>:timer:<step>:<attempt>:<suffix>) and returns the wait for its
// acknowledgement.
func (e *Engine) startTimer(ctx context.Context, st *runlog.State, t *planexv1.EngineTimer, suffix string) (wait func() error) {
	attempt := strconv.Itoa(int(t.GetAttempt()))
	p := bus.PublishAsync(e.runContext(ctx, st), e.res.JS, bus.Publication{
		Subject: bus.EngineSubject(t.GetRunId(), bus.KindTimer), Msg: t,
		MsgID: bus.MsgID(t.GetRunId(), "timer", t.GetStepId(), attempt, suffix),
		Attrs: []attribute.KeyValue{
			attribute.String("planex.run_id", t.GetRunId()), attribute.String("planex.step_id", t.GetStepId()),
			attribute.Int("planex.attempt", int(t.GetAttempt())), attribute.String("planex.timer", t.GetKind().String()),
		},
	})
	return func() error {
		if _, err := p.Wait(ctx); err != nil {
			return fmt.Errorf("publish %s timer of step %s attempt %s: %w", t.GetKind(), t.GetStepId(), attempt, err)
		}
		return nil
	}
}

// PublishDeadline publishes the run's deadline timer (message id
// "<run>:timer:deadline"); StartRun calls it after RunCreated, the engine
// repeats it when repairing a young run.
func PublishDeadline(ctx context.Context, res *bus.Resources, run *planexv1.Run) error {
	dl := runDeadline(run)
	if dl.IsZero() {
		return nil
	}
	t := &planexv1.EngineTimer{RunId: run.GetId(), FireAt: timestamppb.New(dl), Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_DEADLINE}
	if _, err := bus.Publish(ctx, res.JS, heldTimer(ctx, res, t, deadlineID(run),
		attribute.String("planex.run_id", run.GetId()))); err != nil {
		return fmt.Errorf("publish deadline timer of run %s: %w", run.GetId(), err)
	}
	return nil
}

// heldTimer is the publication of a run-level timer nothing supersedes (a
// run deadline, a gate SLA): a message schedule in PLANEX_TIMERS when
// bus.Resources.HoldTimer takes it (--hold-timers, NATS 2.12+, due later
// than bus.Options.TimersAfter, room in the stream), else parked on
// planex.timers.<run> like every other timer. A run
// waiting at a gate for days then costs NATS no pending delivery.
func heldTimer(ctx context.Context, res *bus.Resources, t *planexv1.EngineTimer, msgID string, attrs ...attribute.KeyValue) bus.Publication {
	p := bus.Publication{Subject: bus.EngineSubject(t.GetRunId(), bus.KindTimer), Msg: t, MsgID: msgID, Attrs: attrs}
	if res.HoldTimer(ctx, &p, t.GetRunId(), t.GetFireAt().AsTime()) {
		p.Attrs = append(p.Attrs, attribute.Bool("planex.timer.held", true))
	}
	return p
}

// deadlineID is the message id of the run's deadline timer:
// "<run>:timer:deadline", and "<run>:timer:deadline:<n>" after its nth
// reset (whose deadline counts from the reset).
func deadlineID(run *planexv1.Run) string {
	if n := run.GetResets(); n > 0 {
		return bus.MsgID(run.GetId(), "timer", "deadline", strconv.Itoa(int(n)))
	}
	return bus.MsgID(run.GetId(), "timer", "deadline")
}

// PublishStartGuard publishes the START_GUARD timer of a run about to be
// created, due after delay (10s when zero).
func PublishStartGuard(ctx context.Context, js jetstream.JetStream, runID string, delay time.Duration) error {
	if delay <= 0 {
		delay = 10 * time.Second
	}
	t := &planexv1.EngineTimer{RunId: runID, FireAt: timestamppb.New(time.Now().Add(delay)), Kind: planexv1.EngineTimerKind_ENGINE_TIMER_KIND_START_GUARD}
	if _, err := bus.Publish(ctx, js, bus.Publication{
		Subject: bus.EngineSubject(runID, bus.KindTimer), Msg: t,
		MsgID: bus.MsgID(runID, "timer", "start"),
		Attrs: []attribute.KeyValue{attribute.String("planex.run_id", runID)},
	}); err != nil {
		return fmt.Errorf("publish start guard of run %s: %w", runID, err)
	}
	return nil
}

// runContext returns ctx carrying the run's root span context (stored in
// RunCreated.trace_context) as the remote parent of new spans, so every
// replica's spans for a run join one trace.
func (e *Engine) runContext(ctx context.Context, st *runlog.State) context.Context {
	return RunContext(ctx, st.TraceContext)
}

// RunContext returns ctx whose span parent is the run's root span, decoded
// from a W3C trace context map; without one, ctx is returned unchanged.
func RunContext(ctx context.Context, tc map[string]string) context.Context {
	if len(tc) == 0 {
		return ctx
	}
	rctx := propagation.TraceContext{}.Extract(context.WithoutCancel(ctx), propagation.MapCarrier(tc))
	sc := trace.SpanContextFromContext(rctx)
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// errOutputs marks a failure to read a stored output (retry the message).
var errOutputs = errors.New("step output unavailable")

// outputOf returns a step output as a JSON-like Go value, reading it from
// the object store when it was stored by reference: from the bucket the
// reference names (a pool's bus.OutputBucket, or bus.ObjectOutputs for
// outputs stored by the supervisor or by executors of earlier versions;
// bus.CheckOutputBucket refuses any other).
func (e *Engine) outputOf(ctx context.Context, v *structpb.Value, ref *planexv1.OutputRef) (any, error) {
	if ref == nil {
		return v.AsInterface(), nil
	}
	data, err := e.res.ReadOutput(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errOutputs, err)
	}
	var out any
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("%w: decode %s/%s: %w", errOutputs, ref.GetBucket(), ref.GetName(), err)
	}
	return out, nil
}

// keepSmall moves an output above the inline threshold to the object store
// (under the attempt's name, so storing again is harmless) and returns the
// reference to keep in the run log instead.
func (e *Engine) keepSmall(ctx context.Context, runID string, st *planexv1.StepState, v *structpb.Value) (*structpb.Value, *planexv1.OutputRef, error) {
	if proto.Size(v) <= e.cfg.InlineOutputBytes {
		return v, nil, nil
	}
	data, err := protojson.Marshal(v)
	if err != nil {
		return nil, nil, fmt.Errorf("encode output of step %s: %w", st.GetStepId(), err)
	}
	name := bus.OutputName(runID, st.GetStepId(), st.GetAttempt())
	if _, err := e.res.Outputs.PutBytes(ctx, name, data); err != nil {
		return nil, nil, fmt.Errorf("%w: store output of step %s: %w", errOutputs, st.GetStepId(), err)
	}
	sum := sha256.Sum256(data)
	return nil, &planexv1.OutputRef{Bucket: bus.ObjectOutputs, Name: name, Size: int64(len(data)), Sha256: hex.EncodeToString(sum[:])}, nil
}

type kickKey struct{}

// withKick marks ctx as the handling of a planning kick.
func withKick(ctx context.Context) context.Context { return context.WithValue(ctx, kickKey{}, true) }

func handlingKick(ctx context.Context) bool { v, _ := ctx.Value(kickKey{}).(bool); return v }

// signatureExpiry is how long a step request's signature stays valid: until
// the run's deadline, since an attempt may wait in its pool's queue for
// capacity that long, and never beyond stepsign.MaxValidity from now.
func signatureExpiry(run *planexv1.Run, now time.Time) time.Time {
	limit := now.Add(stepsign.MaxValidity - time.Minute)
	if dl := runDeadline(run); !dl.IsZero() && dl.Before(limit) {
		return dl
	}
	return limit
}
