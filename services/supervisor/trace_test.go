package supervisor_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/planex-dev/planex/internal/telemetry"
)

// One trace covers a run: the root span (recorded by StartRun, written
// when the run finished), the planner call, each step dispatch, and the
// executor's consumer span under the dispatch's producer span. Not
// parallel: it swaps the global providers.
func TestOneTracePerRun(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithIDGenerator(telemetry.IDGenerator()), sdktrace.WithSpanProcessor(telemetry.SpanProcessor(rec)))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
		_ = tp.Shutdown(testCtx(t, 5*time.Second))
	})

	h := newHarness(t)
	r := h.startReplica()
	id := h.runGoal(t, r, "traced", always(
		step("a", "test.echo", map[string]any{"value": 1}),
		step("b", "test.echo", map[string]any{"value": 2}, "a"),
	))
	run := waitTerminal(t, r.client, id, 10*time.Second)
	if len(run.GetTraceId()) != 32 {
		t.Fatalf("trace id %q", run.GetTraceId())
	}
	// A step's request is consumed from PLANEX_STEPS, or (NATS 2.11+) from
	// the run log: a decision on its pool's dispatch subject, or a request
	// published apart (b is the chain's next step: the decision that
	// dispatches it is its request).
	stepSpan := func(name string) (subject string, ok bool) {
		subject, ok = strings.CutPrefix(name, "process ")
		return subject, ok && slices.Contains([]string{"planex.steps.test.echo", "planex.events.requests.step.test", "planex.events.{run}.step.test"}, subject)
	}
	waitFor(t, 5*time.Second, "the executor spans to end", func() bool {
		n := 0
		for _, s := range rec.Ended() {
			if _, ok := stepSpan(s.Name()); ok {
				n++
			}
		}
		return n == 2
	})
	waitFor(t, 5*time.Second, "the run's root span", func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == "run" && s.SpanContext().TraceID().String() == run.GetTraceId() {
				return true
			}
		}
		return false
	})
	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byID[s.SpanContext().SpanID().String()] = s
	}
	inRun := func(name string) []sdktrace.ReadOnlySpan {
		var out []sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			if s.Name() == name && s.SpanContext().TraceID().String() == run.GetTraceId() {
				out = append(out, s)
			}
		}
		return out
	}
	if roots := inRun("run"); len(roots) != 1 || roots[0].Parent().IsValid() {
		t.Fatalf("want one root span \"run\" in the run's trace, got %d", len(roots))
	}
	if n := len(inRun("plan revision")); n != 1 {
		t.Fatalf("plan revision spans in the run's trace: %d", n)
	}
	if n := len(inRun("dispatch step")); n != 2 {
		t.Fatalf("dispatch spans in the run's trace: %d", n)
	}
	var procs []sdktrace.ReadOnlySpan
	direct := 0
	for _, s := range rec.Ended() {
		if subject, ok := stepSpan(s.Name()); ok && s.SpanContext().TraceID().String() == run.GetTraceId() {
			procs = append(procs, s)
			if subject == "planex.events.{run}.step.test" {
				direct++
			}
		}
	}
	if len(procs) != 2 || direct != 1 {
		t.Fatalf("executor spans in the run's trace: %d, %d of them from a dispatching decision; want 2 and 1", len(procs), direct)
	}
	for _, proc := range procs {
		subject, _ := stepSpan(proc.Name())
		pub, ok := byID[proc.Parent().SpanID().String()]
		if !ok || pub.Name() != "publish "+subject {
			t.Fatalf("executor span %q's parent is not the step publish", proc.Name())
		}
		disp, ok := byID[pub.Parent().SpanID().String()]
		if !ok || disp.Name() != "dispatch step" {
			t.Fatalf("step publish's parent is not the dispatch span")
		}
		attrs := map[string]bool{}
		for _, kv := range disp.Attributes() {
			attrs[string(kv.Key)] = true
		}
		for _, k := range []string{"planex.run_id", "planex.step_id", "planex.attempt", "planex.plan_revision", "planex.tool", "planex.pool"} {
			if !attrs[k] {
				t.Fatalf("dispatch span lacks %s", k)
			}
		}
	}
}
