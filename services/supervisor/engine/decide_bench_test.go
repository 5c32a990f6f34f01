package engine

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// BenchmarkEngineDecision measures the engine's CPU for one step of a run,
// without NATS: a transaction on the run's state that handles a step's
// result (the start recorded with it, the success) and advances the run
// (the next dispatch), halfway through a chain or a fan-out (a root and
// n-1 steps depending on it, four at a time) of n no-op steps. The figures
// for 10 and 1000 steps should be about equal: the decision's work does
// not grow with the plan (docs/performance.md).
func BenchmarkEngineDecision(b *testing.B) {
	for _, shape := range []string{"chain", "fan"} {
		for _, n := range []int{10, 1000} {
			b.Run(shape+"/"+strconv.Itoa(n), func(b *testing.B) {
				ctx := context.Background()
				now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
				e := &Engine{
					cfg:    Config{Now: func() time.Time { return now }}.withDefaults(),
					res:    &bus.Resources{JS: offlineJS{}, Outputs: noOutputs{}},
					tools:  catalog.StaticCache(catalog.Static([]*planexv1.ToolSpec{{Name: "bench.noop"}})),
					logger: slog.New(slog.DiscardHandler),
				}
				var steps []*planexv1.Step
				parallel := int32(1)
				if shape == "chain" {
					for i := range n {
						s := &planexv1.Step{Id: "s" + strconv.Itoa(i), Tool: "bench.noop"}
						if i > 0 {
							s.DependsOn = []string{steps[i-1].GetId()}
						}
						steps = append(steps, s)
					}
				} else {
					parallel = 4
					steps = append(steps, &planexv1.Step{Id: "s0", Tool: "bench.noop"})
					for i := 1; i < n; i++ {
						steps = append(steps, &planexv1.Step{Id: "s" + strconv.Itoa(i), Tool: "bench.noop", DependsOn: []string{"s0"}})
					}
				}
				var l runlog.Log
				tx := l.Begin(&runlog.State{})
				for _, ev := range []*planexv1.RunEvent{
					{RunId: "R", Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "bench", Budget: &planexv1.Budget{
						MaxSteps: int32(n), MaxParallelism: parallel, MaxReplans: 1}}}},
					Event(&planexv1.PlanRevised{Plan: &planexv1.Plan{Revision: 1, Steps: steps}}),
				} {
					if err := tx.Emit(ev); err != nil {
						b.Fatal(err)
					}
				}
				if err := e.advance(ctx, tx); err != nil {
					b.Fatal(err)
				}
				state := tx.State()
				// inFlight are the steps dispatched and not finished, oldest
				// first.
				var inFlight []string
				dispatched := func(evs []*planexv1.RunEvent) {
					for _, ev := range evs {
						if d := ev.GetStepDispatched(); d != nil {
							inFlight = append(inFlight, d.GetStepId())
						}
					}
				}
				dispatched(tx.Events())
				// decide handles the result of the oldest step in flight and
				// advances the run.
				decide := func(state *runlog.State, id string) (*runlog.State, []*planexv1.RunEvent) {
					tx := l.Begin(state)
					res := &planexv1.StepResult{RunId: "R", StepId: id, Attempt: 1, Status: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED, ExecutorId: "x"}
					if err := e.onResult(ctx, tx, res); err != nil {
						b.Fatal(err)
					}
					if err := e.advance(ctx, tx); err != nil {
						b.Fatal(err)
					}
					if len(tx.Events()) < 3 {
						b.Fatalf("decision emitted %d events, want started, succeeded, dispatched", len(tx.Events()))
					}
					return tx.State(), tx.Events()
				}
				for range n / 2 {
					var evs []*planexv1.RunEvent
					state, evs = decide(state, inFlight[0])
					inFlight = inFlight[1:]
					dispatched(evs)
				}
				id := inFlight[0]
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					_, _ = decide(state, id)
				}
			})
		}
	}
}
