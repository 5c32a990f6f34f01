package telemetry

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Spans that last across engine messages (a run, a gate wait, a step
// attempt) cannot be held open in memory: the replica that starts one may
// not be the one that ends it, and it may crash in between. planex writes
// them once they are over, from the timestamps recorded in the run log,
// with trace.WithTimestamp. A run's root span has a further constraint:
// its children are exported while the run goes on, naming it as their
// parent, so the span written at the end must carry the span id recorded
// at the start. The SDK has no option for that; IDGenerator reads it from
// the context (the replay-safe approach of Temporal's OpenTelemetry plugin,
// which derives span ids from the workflow instead of drawing them).

// RunSpanName is the name of a run's root span.
const RunSpanName = "run"

// StartRunSpanName is what the span StartRun opens as the run's root is
// exported as (see SpanProcessor).
const StartRunSpanName = "start run"

// RunStatusKey is set on the root span written when the run finished
// (planex.run.status); a root "run" span without it is StartRun's
// placeholder.
const RunStatusKey = attribute.Key("planex.run.status")

type forcedIDsKey struct{}

// forcedIDs are the ids of the next span started from a context; used
// once, so a child started from the returned context gets its own.
type forcedIDs struct {
	sc   trace.SpanContext
	used atomic.Bool
}

// WithSpanIDs returns ctx from which the next span started by a tracer
// provider using IDGenerator gets sc's trace and span ids: a root span
// (trace.WithNewRoot) takes both, a child of a span of sc's trace takes
// the span id. Only that one span: spans started later from the context
// it returns get ids of their own.
func WithSpanIDs(ctx context.Context, sc trace.SpanContext) context.Context {
	return context.WithValue(ctx, forcedIDsKey{}, &forcedIDs{sc: sc})
}

func takeIDs(ctx context.Context) (trace.SpanContext, bool) {
	f, ok := ctx.Value(forcedIDsKey{}).(*forcedIDs)
	if !ok || !f.sc.IsValid() || !f.used.CompareAndSwap(false, true) {
		return trace.SpanContext{}, false
	}
	return f.sc, true
}

// IDGenerator returns the span id generator of planex processes: random
// ids like the SDK's default, except for a span started from a context
// prepared with WithSpanIDs.
func IDGenerator() sdktrace.IDGenerator { return idGenerator{} }

type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if sc, ok := takeIDs(ctx); ok {
		return sc.TraceID(), sc.SpanID()
	}
	var tid trace.TraceID
	for !tid.IsValid() {
		binary.NativeEndian.PutUint64(tid[:8], rand.Uint64())
		binary.NativeEndian.PutUint64(tid[8:], rand.Uint64())
	}
	return tid, randomSpanID()
}

func (idGenerator) NewSpanID(ctx context.Context, traceID trace.TraceID) trace.SpanID {
	if sc, ok := takeIDs(ctx); ok && sc.TraceID() == traceID {
		return sc.SpanID()
	}
	return randomSpanID()
}

func randomSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		binary.NativeEndian.PutUint64(sid[:], rand.Uint64())
	}
	return sid
}

// SpanProcessor wraps next (an exporting processor) for planex's run
// traces. StartRun opens the run's root span, whose context every later
// span of the run names as its parent, and ends it when the call returns;
// the engine writes the real root, with the same ids, when the run
// finishes. The span StartRun ended is therefore passed on as a child of
// the root named StartRunSpanName, with an id of its own, keeping its
// attributes and its link to the caller's span. Every other span passes
// unchanged.
func SpanProcessor(next sdktrace.SpanProcessor) sdktrace.SpanProcessor {
	return rootProcessor{SpanProcessor: next}
}

type rootProcessor struct {
	sdktrace.SpanProcessor
}

func (p rootProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if isPlaceholderRoot(s) {
		sc := s.SpanContext()
		s = startRunSpan{ReadOnlySpan: s, sc: sc.WithSpanID(randomSpanID()), parent: sc}
	}
	p.SpanProcessor.OnEnd(s)
}

// isPlaceholderRoot reports whether s is the root span StartRun opened:
// named "run", without a parent, naming its run, and without the status
// only the root written at the end carries.
func isPlaceholderRoot(s sdktrace.ReadOnlySpan) bool {
	if s.Name() != RunSpanName || s.Parent().IsValid() {
		return false
	}
	attrs := s.Attributes()
	return slices.ContainsFunc(attrs, func(kv attribute.KeyValue) bool { return kv.Key == "planex.run_id" }) &&
		!slices.ContainsFunc(attrs, func(kv attribute.KeyValue) bool { return kv.Key == RunStatusKey })
}

type startRunSpan struct {
	sdktrace.ReadOnlySpan
	sc, parent trace.SpanContext
}

func (s startRunSpan) Name() string                   { return StartRunSpanName }
func (s startRunSpan) SpanContext() trace.SpanContext { return s.sc }
func (s startRunSpan) Parent() trace.SpanContext      { return s.parent }
