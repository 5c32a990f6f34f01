package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/telemetry"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// The spans that tell a run's story across engine messages — the run
// itself, each gate's wait, each step attempt — are written once they are
// over, from the times the run log recorded, by the replica that appended
// the event that ends them, right after the append (docs/tracing.md). The
// conditional append lets one replica only append an event, so each is
// written once; a replica that dies between the append and the write
// loses it (no duplicate is ever written: replays and repairs do not pass
// here).

// runSpanContext is the run's root span context recorded in RunCreated
// (invalid when the run has none).
func runSpanContext(tc map[string]string) trace.SpanContext {
	if len(tc) == 0 {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(tc))
	return trace.SpanContextFromContext(ctx)
}

// rootSlot collects the root spans a handling must write after its own
// consumer span ended, so that no span of the run ends after its root.
type rootSlot struct {
	mu    sync.Mutex
	roots []rootSpan
}

type rootSlotKey struct{}

// withRootSlot returns ctx whose finished runs' root spans wait in the
// returned slot until flushRoots.
func withRootSlot(ctx context.Context) (context.Context, *rootSlot) {
	s := &rootSlot{}
	return context.WithValue(ctx, rootSlotKey{}, s), s
}

// rootSpan is a finished run's root span, to be written.
type rootSpan struct {
	sc         trace.SpanContext
	start, end time.Time
	attrs      []attribute.KeyValue
	failed     string // status description when the run did not succeed
	// resets > 0: the run finished again after its nth reset; its root
	// was written when it first finished, so this writes a "run reset"
	// span under it, from the reset to the new end.
	resets int32
	// parent, for a child run, is its parent step's span (children.go).
	parent trace.SpanContext
}

// traceCommitted writes the spans the committed events end: gate waits,
// step attempts and, for a finished run, the root (deferred to the end of
// the handling when ctx has a root slot). base is the state the events
// were decided on, next the state after them.
func (e *Engine) traceCommitted(ctx context.Context, base, next *runlog.State, events []*planexv1.RunEvent) {
	if !slices.ContainsFunc(events, endsSpan) {
		return // most decisions (a dispatch, a start) end none
	}
	root := runSpanContext(next.TraceContext)
	if !root.IsValid() || !root.IsSampled() {
		return
	}
	run := next.Run
	rctx := trace.ContextWithRemoteSpanContext(context.WithoutCancel(ctx), root)
	handling := trace.LinkFromContext(ctx)
	for i, ev := range events {
		at := ev.GetTime().AsTime()
		switch p := ev.GetPayload().(type) {
		case *planexv1.RunEvent_GateDecided:
			if g := gateOf(run, p.GateDecided.GetGateId()); g != nil {
				e.writeGate(rctx, run, g, at, handling)
			}
		case *planexv1.RunEvent_StepSucceeded:
			e.writeAttempt(rctx, base, next, events, i, p.StepSucceeded.GetStepId(), p.StepSucceeded.GetAttempt(), "succeeded", nil)
		case *planexv1.RunEvent_StepFailed:
			outcome := "failed"
			if p.StepFailed.GetError().GetCode() == planexv1.ErrorCode_ERROR_CODE_TIMEOUT {
				outcome = "timed_out"
			}
			e.writeAttempt(rctx, base, next, events, i, p.StepFailed.GetStepId(), p.StepFailed.GetAttempt(), outcome, p.StepFailed.GetError())
		case *planexv1.RunEvent_ExpectationFailed:
			x := p.ExpectationFailed
			e.writeAttempt(rctx, base, next, events, i, x.GetStepId(), x.GetAttempt(), "expectation_failed",
				&planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_EXPECTATION_FAILED, Message: x.GetMessage()})
		case *planexv1.RunEvent_Finished:
			// What the run leaves open ends with it: undecided gates,
			// attempts still in flight (their results will be ignored).
			for _, g := range run.GetGates() {
				if g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
					e.writeGate(rctx, run, g, at, handling)
				}
			}
			for _, s := range run.GetSteps() {
				if runlog.InFlight(s.GetStatus()) {
					e.writeAttempt(rctx, base, next, events, i, s.GetStepId(), s.GetAttempt(), "abandoned", nil)
				}
			}
			r := rootSpan{sc: root, start: run.GetCreatedAt().AsTime(), end: at, attrs: runAttrs(run), resets: run.GetResets(), parent: childParentSpan(run, root)}
			if r.resets > 0 {
				r.start = run.GetResetAt().AsTime()
			}
			if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
				r.failed = strings.TrimPrefix(run.GetStopReason().String(), "STOP_REASON_")
			}
			if slot, ok := ctx.Value(rootSlotKey{}).(*rootSlot); ok {
				slot.mu.Lock()
				slot.roots = append(slot.roots, r)
				slot.mu.Unlock()
			} else {
				e.writeRoot(ctx, r)
			}
		}
	}
}

// endsSpan reports whether ev ends a span traceCommitted writes.
func endsSpan(ev *planexv1.RunEvent) bool {
	switch ev.GetPayload().(type) {
	case *planexv1.RunEvent_GateDecided, *planexv1.RunEvent_StepSucceeded, *planexv1.RunEvent_StepFailed,
		*planexv1.RunEvent_ExpectationFailed, *planexv1.RunEvent_Finished:
		return true
	}
	return false
}

// flushRoots writes the root spans collected in slot; they end now if the
// handling outlasted the run's last event, so that they cover it.
func (e *Engine) flushRoots(ctx context.Context, slot *rootSlot) {
	slot.mu.Lock()
	roots := slot.roots
	slot.roots = nil
	slot.mu.Unlock()
	for _, r := range roots {
		if now := time.Now(); now.After(r.end) {
			r.end = now
		}
		e.writeRoot(ctx, r)
	}
}

// writeRoot writes a run's root span with the ids recorded when the run
// started (telemetry.WithSpanIDs). A tracer provider without planex's id
// generator cannot give it those ids: the span is then left unended, so
// it is never exported rather than exported as a second root.
func (e *Engine) writeRoot(ctx context.Context, r rootSpan) {
	if r.resets > 0 {
		rctx := trace.ContextWithRemoteSpanContext(context.WithoutCancel(ctx), r.sc)
		_, span := e.tracer.Start(rctx, fmt.Sprintf("run reset %d", r.resets), trace.WithTimestamp(r.start),
			trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(r.attrs...))
		if r.failed != "" {
			span.SetStatus(codes.Error, r.failed)
		}
		span.End(trace.WithTimestamp(r.end))
		return
	}
	ctx = telemetry.WithSpanIDs(context.WithoutCancel(ctx), r.sc)
	opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithTimestamp(r.start), trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(r.attrs...)}
	if r.parent.IsValid() {
		// A child run's root is a span of its parent's trace.
		ctx = trace.ContextWithRemoteSpanContext(ctx, r.parent)
		opts = opts[1:]
	}
	_, span := e.tracer.Start(ctx, telemetry.RunSpanName, opts...)
	if span.SpanContext().SpanID() != r.sc.SpanID() || span.SpanContext().TraceID() != r.sc.TraceID() {
		return
	}
	if r.failed != "" {
		span.SetStatus(codes.Error, r.failed)
	}
	span.End(trace.WithTimestamp(r.end))
}

func runAttrs(run *planexv1.Run) []attribute.KeyValue {
	u := run.GetUsage()
	return []attribute.KeyValue{
		attribute.String("planex.run_id", run.GetId()),
		telemetry.RunStatusKey.String(strings.TrimPrefix(run.GetStatus().String(), "RUN_STATUS_")),
		attribute.String("planex.run.stop_reason", strings.TrimPrefix(run.GetStopReason().String(), "STOP_REASON_")),
		attribute.String("planex.planning_mode", run.GetMode().String()),
		attribute.Int("planex.plan_revision", int(runlog.CurrentPlan(run).GetRevision())),
		attribute.Int("planex.run.steps", int(u.GetSteps())),
		attribute.Int("planex.run.replans", int(u.GetReplans())),
		attribute.Int64("planex.run.tokens", u.GetTokens()),
	}
}

func gateOf(run *planexv1.Run, id string) *planexv1.Gate {
	for _, g := range run.GetGates() {
		if g.GetId() == id {
			return g
		}
	}
	return nil
}

// gateWait is a gate's wait as the run log recorded it.
type gateWait struct {
	start, end time.Time
	kind       string // "plan" or "step"
}

// gateWaitOf is gate g's wait: from its opening to its decision, or to end
// (its run's end) when nobody decided it. The gate's span and the
// planex.gate.wait.duration histogram both measure it.
func gateWaitOf(g *planexv1.Gate, end time.Time) gateWait {
	start := end
	if g.GetOpenedAt() != nil {
		start = g.GetOpenedAt().AsTime()
	}
	if g.GetDecidedAt() != nil {
		end = g.GetDecidedAt().AsTime()
	}
	return gateWait{start: start, end: end, kind: strings.ToLower(strings.TrimPrefix(g.GetKind().String(), "GATE_KIND_"))}
}

// writeGate writes a gate's wait: from its opening to its decision (or to
// end, the run's end, for a gate nobody decided), with who decided what
// under which rule. handling links the handling of the decision.
func (e *Engine) writeGate(rctx context.Context, run *planexv1.Run, g *planexv1.Gate, end time.Time, handling trace.Link) {
	w := gateWaitOf(g, end)
	start, end, kind := w.start, w.end, w.kind
	name := "gate " + kind
	if g.GetKind() != planexv1.GateKind_GATE_KIND_PLAN {
		name = "gate " + g.GetStepId()
	}
	decision := strings.ToLower(strings.TrimPrefix(g.GetDecision().String(), "DECISION_KIND_"))
	if g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
		decision = "none"
	}
	decider := g.GetDecidedBy()
	if decider == "" {
		decider = g.GetActor()
	}
	attrs := []attribute.KeyValue{
		attribute.String("planex.run_id", run.GetId()),
		attribute.String("planex.gate_id", g.GetId()),
		attribute.String("planex.gate.kind", kind),
		attribute.Int("planex.plan_revision", int(g.GetPlanRevision())),
		attribute.String("planex.gate.reason", g.GetReason()),
		attribute.String("planex.gate.decision", decision),
		attribute.Int64("planex.gate.wait_ms", end.Sub(start).Milliseconds()),
	}
	if g.GetStepId() != "" {
		attrs = append(attrs, attribute.String("planex.step_id", g.GetStepId()))
	}
	if g.GetPolicy() != "" {
		attrs = append(attrs, attribute.String("planex.gate.policy", g.GetPolicy()), attribute.String("planex.gate.rule", g.GetRule()))
	}
	if len(g.GetApprovers()) > 0 {
		attrs = append(attrs, attribute.StringSlice("planex.gate.approvers", g.GetApprovers()))
	}
	if sla := g.GetSlaAt(); sla != nil {
		attrs = append(attrs, attribute.String("planex.gate.sla_at", sla.AsTime().UTC().Format(time.RFC3339Nano)),
			attribute.Int64("planex.gate.sla_ms", sla.AsTime().Sub(start).Milliseconds()),
			attribute.String("planex.gate.on_timeout", strings.ToLower(strings.TrimPrefix(g.GetOnTimeout().String(), "GATE_TIMEOUT_ACTION_"))))
	}
	if decider != "" {
		attrs = append(attrs, attribute.String("planex.gate.decider", decider))
	}
	if g.GetActor() != "" {
		attrs = append(attrs, attribute.String("planex.gate.actor", g.GetActor()))
	}
	if g.GetDecidedBy() != "" {
		attrs = append(attrs, attribute.String("planex.gate.decided_by", g.GetDecidedBy()))
	}
	if g.GetDecidedVia() != "" {
		attrs = append(attrs, attribute.String("planex.gate.via", g.GetDecidedVia()))
	}
	if g.GetStopRun() {
		attrs = append(attrs, attribute.Bool("planex.gate.stop_run", true))
	}
	opts := []trace.SpanStartOption{trace.WithTimestamp(start), trace.WithAttributes(attrs...)}
	if handling.SpanContext.IsValid() {
		opts = append(opts, trace.WithLinks(handling))
	}
	_, span := e.tracer.Start(rctx, name, opts...)
	span.AddEvent("gate opened", trace.WithTimestamp(start))
	if g.GetDecidedAt() != nil {
		span.AddEvent("gate decided", trace.WithTimestamp(end), trace.WithAttributes(attribute.String("planex.gate.decision", decision)))
	}
	span.End(trace.WithTimestamp(end))
}

// writeAttempt writes a step attempt ended by events[i] (its outcome):
// from its dispatch to that event, with what happened to it in between as
// span events (the timers armed for it, its start, a retry it leads to).
// The attempt's dispatch span (and the executor's spans under it) stay
// children of the run's root: they are exported as they happen, this
// span only once the attempt is over.
func (e *Engine) writeAttempt(rctx context.Context, base, next *runlog.State, events []*planexv1.RunEvent, i int, stepID string, attempt int32, outcome string, serr *planexv1.StepError) {
	end := events[i].GetTime().AsTime()
	s := next.Step(stepID)
	if s.GetAttempt() != attempt {
		s = base.Step(stepID)
	}
	if s.GetAttempt() != attempt {
		s = nil
	}
	var dispatched, started time.Time
	if s != nil {
		dispatched, started = s.GetDispatchedAt().AsTime(), s.GetStartedAt().AsTime()
		if s.GetDispatchedAt() == nil {
			dispatched = time.Time{}
		}
		if s.GetStartedAt() == nil {
			started = time.Time{}
		}
	}
	if dispatched.IsZero() || dispatched.After(end) {
		dispatched = end // failed before it was dispatched (invalid arguments, a policy)
	}
	if started.Before(dispatched) || started.After(end) {
		started = time.Time{}
	}
	tool := runlog.Step(next.Run, stepID).GetTool()
	if s != nil {
		tool = s.GetTool()
	}
	attrs := []attribute.KeyValue{
		attribute.String("planex.run_id", next.Run.GetId()),
		attribute.String("planex.step_id", stepID),
		attribute.Int("planex.attempt", int(attempt)),
		attribute.String("planex.tool", tool),
		attribute.String("planex.pool", bus.PoolOf(tool)),
		attribute.String("planex.step.outcome", outcome),
	}
	if s != nil {
		attrs = append(attrs, attribute.Int("planex.plan_revision", int(s.GetPlanRevision())))
		if s.GetExecutorId() != "" {
			attrs = append(attrs, attribute.String("planex.executor_id", s.GetExecutorId()))
		}
	}
	if s.GetChildRunId() != "" {
		// A run.child attempt: its span has the id its child's root
		// names as parent (children.go).
		root := trace.SpanContextFromContext(rctx)
		attrs = append(attrs, attribute.String("planex.child_run_id", s.GetChildRunId()))
		rctx = telemetry.WithSpanIDs(rctx, childParentSpanOf(next.Run.GetId(), stepID, attempt, root))
	}
	_, span := e.tracer.Start(rctx, "step "+stepID, trace.WithTimestamp(dispatched), trace.WithAttributes(attrs...))
	span.AddEvent("dispatched", trace.WithTimestamp(dispatched))
	if s != nil {
		if t := e.queueTimer(next, s); t != nil {
			span.AddEvent("timer set", trace.WithTimestamp(dispatched), trace.WithAttributes(timerAttrs(t)...))
		}
	}
	if !started.IsZero() {
		span.AddEvent("started", trace.WithTimestamp(started))
		for _, t := range e.runTimers(next, s) {
			span.AddEvent("timer set", trace.WithTimestamp(started), trace.WithAttributes(timerAttrs(t)...))
		}
	}
	if serr != nil {
		code := strings.TrimPrefix(serr.GetCode().String(), "ERROR_CODE_")
		span.AddEvent(outcome, trace.WithTimestamp(end), trace.WithAttributes(attribute.String("planex.error_code", code)))
		span.SetStatus(codes.Error, code)
	} else {
		span.AddEvent(outcome, trace.WithTimestamp(end))
	}
	for _, ev := range events[i+1:] {
		if r := ev.GetStepRetrying(); r != nil && r.GetStepId() == stepID && r.GetAttempt() == attempt {
			span.AddEvent("retry scheduled", trace.WithTimestamp(ev.GetTime().AsTime()), trace.WithAttributes(
				attribute.Int("planex.retry", int(r.GetRetry())),
				attribute.String("planex.retry_at", r.GetRetryAt().AsTime().UTC().Format(time.RFC3339Nano)),
				attribute.Int64("planex.retry.backoff_ms", r.GetRetryAt().AsTime().Sub(ev.GetTime().AsTime()).Milliseconds()),
			))
		}
	}
	span.End(trace.WithTimestamp(end))
}

func timerAttrs(t *planexv1.EngineTimer) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("planex.timer", strings.ToLower(strings.TrimPrefix(t.GetKind().String(), "ENGINE_TIMER_KIND_"))),
		attribute.String("planex.timer.fire_at", ts(t.GetFireAt())),
	}
}

func ts(t *timestamppb.Timestamp) string { return t.AsTime().UTC().Format(time.RFC3339Nano) }
