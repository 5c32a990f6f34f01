package supervisor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// BenchmarkEngineStepOverhead measures what the engine adds per step: runs
// of a chain of no-op steps (test.echo, each depending on the previous one)
// go through the whole path (StepDispatched append, StepRequest publish on
// PLANEX_STEPS, the fake executor's StepStartedNotice and StepResult on
// PLANEX_ENGINE, StepStarted and StepSucceeded appends, the next dispatch).
// ns/step is measured on the run log, from the first dispatch to the last
// step's success, so planning and client polling are left out.
func BenchmarkEngineStepOverhead(b *testing.B) {
	h := newHarness(b)
	benchChain(b, h, h.startReplica())
}

// BenchmarkTracingOverhead runs the same chain with tracing off (the no-op
// provider) and on (the SDK with always-on sampling and a batch processor
// exporting to a discarding exporter, i.e. everything but the network).
func BenchmarkTracingOverhead(b *testing.B) {
	for _, tc := range []struct {
		name string
		tp   trace.TracerProvider
	}{
		{name: "off", tp: noop.NewTracerProvider()},
		{name: "always-sample", tp: sdktrace.NewTracerProvider(
			sdktrace.WithSampler(sdktrace.AlwaysSample()),
			sdktrace.WithBatcher(discardExporter{}))},
	} {
		b.Run(tc.name, func(b *testing.B) {
			prev := otel.GetTracerProvider()
			otel.SetTracerProvider(tc.tp)
			b.Cleanup(func() { otel.SetTracerProvider(prev) })
			h := newHarness(b)
			benchChain(b, h, h.startReplica())
		})
	}
}

type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// benchChain runs 20-step chains on r until b.N steps ran.
func benchChain(b *testing.B, h *harness, r *replica) {
	const chainLen = 20
	var chain []*planexv1.Step
	for i := range chainLen {
		s := step(fmt.Sprintf("s%d", i), "test.echo", map[string]any{"value": i})
		if i > 0 {
			s.DependsOn = []string{fmt.Sprintf("s%d", i-1)}
		}
		chain = append(chain, s)
	}
	h.planner.on("bench", always(chain...))
	var steps int
	var onLog time.Duration
	b.ResetTimer()
	for steps < b.N {
		id := start(b, r.client, &planexv1.StartRunRequest{Goal: "bench"})
		evs := watchAll(b, r.client, id, 1)
		var first, last time.Time
		for _, ev := range evs {
			if ev.GetStepDispatched() != nil && first.IsZero() {
				first = ev.GetTime().AsTime()
			}
			if ev.GetStepSucceeded() != nil {
				last = ev.GetTime().AsTime()
			}
		}
		if evs[len(evs)-1].GetFinished().GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
			b.Fatalf("run %s: %v", id, evs[len(evs)-1].GetFinished())
		}
		onLog += last.Sub(first)
		steps += chainLen
	}
	b.StopTimer()
	b.ReportMetric(float64(onLog.Nanoseconds())/float64(steps), "ns/step")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(steps), "ns/step-e2e")
	b.ReportMetric(0, "ns/op")
}
