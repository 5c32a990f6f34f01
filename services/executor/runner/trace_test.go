package runner_test

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor/runner"
)

func TestStepSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	srv := natstest.Start(t)
	startRunner(t, srv, runner.Options{Tools: []runner.Tool{newTool(t, "p.echo", planexv1.SideEffect_SIDE_EFFECT_READ, echo)}})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 10*time.Second)
	dispatch(t, res, step(t, "r1", "ok", "p.echo", map[string]any{"n": 1}))
	eng.next(ctx)
	dispatch(t, res, step(t, "r1", "bad", "p.echo", map[string]any{"n": "x"}))
	eng.next(ctx)

	var process []sdktrace.ReadOnlySpan
	var tool sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && len(process) < 2; time.Sleep(10 * time.Millisecond) {
		process, tool = nil, nil
		for _, s := range rec.Ended() {
			switch s.Name() {
			case "process planex.steps.p.echo":
				process = append(process, s)
			case "tool p.echo":
				tool = s
			}
		}
	}
	if len(process) != 2 || tool == nil {
		t.Fatalf("got %d process spans and tool span %v", len(process), tool)
	}
	for _, s := range process {
		attrs := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			attrs[kv.Key] = kv.Value
		}
		for _, k := range []attribute.Key{"planex.run_id", "planex.step_id", "planex.attempt", "planex.plan_revision", "planex.tool", "planex.pool"} {
			if _, ok := attrs[k]; !ok {
				t.Errorf("process span lacks %s", k)
			}
		}
		failed := attrs["planex.step_id"].AsString() == "bad"
		if failed != (s.Status().Code == codes.Error) {
			t.Errorf("step %s: span status %v", attrs["planex.step_id"].AsString(), s.Status())
		}
		if !failed && tool.Parent().SpanID() != s.SpanContext().SpanID() {
			t.Errorf("tool span is not a child of the process span")
		}
	}
}
