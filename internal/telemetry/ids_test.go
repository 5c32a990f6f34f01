package telemetry_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/planex-dev/planex/internal/telemetry"
)

// A run's root span is opened by StartRun and written again when the run
// finished, with the same ids: the opened one is exported as "start run"
// under the written one, and a span started from the context of the
// written one gets an id of its own.
func TestRootWrittenLaterKeepsItsIDs(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithIDGenerator(telemetry.IDGenerator()), sdktrace.WithSpanProcessor(telemetry.SpanProcessor(rec)))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := tp.Tracer("test")

	caller, callerSpan := tr.Start(context.Background(), "StartRun")
	_, placeholder := tr.Start(caller, "run", trace.WithNewRoot(), trace.WithLinks(trace.LinkFromContext(caller)),
		trace.WithAttributes(attribute.String("planex.run_id", "r1")))
	rootSC := placeholder.SpanContext()
	placeholder.End()
	callerSpan.End()
	_, child := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), rootSC), "step a")
	child.End()

	start := time.Now().Add(-time.Second)
	ctx := telemetry.WithSpanIDs(context.Background(), rootSC)
	rctx, root := tr.Start(ctx, "run", trace.WithNewRoot(), trace.WithTimestamp(start),
		trace.WithAttributes(attribute.String("planex.run_id", "r1"), telemetry.RunStatusKey.String("SUCCEEDED")))
	_, after := tr.Start(rctx, "after")
	after.End()
	_, again := tr.Start(ctx, "again", trace.WithNewRoot())
	again.End()
	root.End()

	if root.SpanContext().TraceID() != rootSC.TraceID() || root.SpanContext().SpanID() != rootSC.SpanID() {
		t.Fatalf("written root %v, want the ids %v", root.SpanContext(), rootSC)
	}
	if after.SpanContext().SpanID() == rootSC.SpanID() || again.SpanContext().SpanID() == rootSC.SpanID() {
		t.Fatal("the recorded ids were given to a second span")
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
	}
	sr, ok := byName["start run"]
	if !ok {
		t.Fatalf("StartRun's span was not exported as \"start run\": %v", byName)
	}
	if sr.Parent().SpanID() != rootSC.SpanID() || sr.SpanContext().SpanID() == rootSC.SpanID() || sr.SpanContext().TraceID() != rootSC.TraceID() {
		t.Errorf("start run: parent %v, ids %v; want a child of %v", sr.Parent(), sr.SpanContext(), rootSC)
	}
	if len(sr.Links()) != 1 || sr.Links()[0].SpanContext.SpanID() != callerSpan.SpanContext().SpanID() {
		t.Errorf("start run lost its link to the caller: %v", sr.Links())
	}
	if r := byName["run"]; r == nil || r.Parent().IsValid() || !r.StartTime().Equal(start) {
		t.Errorf("written root %v", r)
	}
}
