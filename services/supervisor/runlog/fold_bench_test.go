package runlog_test

import (
	"strconv"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// BenchmarkChainDecision measures the fold's share of a chain step — a
// decision appending one step's success and the next one's dispatch to a
// clone of the state, and the engine's questions about the plan (ready
// steps, steps in flight, plan complete) — in plans of 10 and 1000 steps,
// halfway through the chain. The two figures should be about equal (flat
// cost with plan length; docs/performance.md); what remains plan-sized is
// the copy of Run.steps (one pointer per step) by the decision's first
// write, which the run's state cannot share with the cached one it was
// cloned from.
func BenchmarkChainDecision(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			steps := make([]*planexv1.Step, n)
			for i := range steps {
				steps[i] = st("s" + strconv.Itoa(i))
				if i > 0 {
					steps[i].DependsOn = []string{"s" + strconv.Itoa(i-1)}
				}
			}
			var prefix []*planexv1.RunEvent
			for i := 1; i <= n/2; i++ {
				prefix = append(prefix, succeeded("s"+strconv.Itoa(i-1), 1), dispatched("s"+strconv.Itoa(i), 1))
			}
			benchDecision(b, n, steps, prefix, succeeded("s"+strconv.Itoa(n/2), 1), dispatched("s"+strconv.Itoa(n/2+1), 1))
		})
	}
}

// BenchmarkFanDecision is BenchmarkChainDecision for a fanned-out plan: a
// root and n-1 steps depending on it, run four at a time, halfway through:
// a decision appends one step's success and the next one's dispatch.
func BenchmarkFanDecision(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			steps := []*planexv1.Step{st("root")}
			for i := 1; i < n; i++ {
				steps = append(steps, st("f"+strconv.Itoa(i), "root"))
			}
			prefix := []*planexv1.RunEvent{succeeded("root", 1)}
			for i := 1; i <= 4; i++ {
				prefix = append(prefix, dispatched("f"+strconv.Itoa(i), 1))
			}
			half := n / 2
			for i := 1; i < half; i++ {
				prefix = append(prefix, succeeded("f"+strconv.Itoa(i), 1), dispatched("f"+strconv.Itoa(i+4), 1))
			}
			benchDecision(b, n, steps, prefix, succeeded("f"+strconv.Itoa(half), 1), dispatched("f"+strconv.Itoa(half+4), 1))
		})
	}
}

// benchDecision folds a run of plan steps (the first one dispatched) and
// prefix, then measures a transaction emitting decision on it and asking
// what the engine asks of a state after each event.
func benchDecision(b *testing.B, n int, steps []*planexv1.Step, prefix []*planexv1.RunEvent, decision ...*planexv1.RunEvent) {
	var l runlog.Log
	emit := func(state *runlog.State, evs ...*planexv1.RunEvent) *runlog.State {
		tx := l.Begin(state)
		for _, ev := range evs {
			if err := tx.Emit(ev); err != nil {
				b.Fatal(err)
			}
			s := tx.State()
			for range s.Ready() {
				break // the engine stops at the run's parallelism
			}
			_, _ = s.InFlight(), s.PlanComplete()
		}
		return tx.State()
	}
	state := emit(&runlog.State{},
		&planexv1.RunEvent{RunId: "R", Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "g", Budget: &planexv1.Budget{MaxSteps: int32(n)}}}},
		planEv(1, nil, steps...), dispatched(steps[0].GetId(), 1))
	state = emit(state, prefix...)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		_ = emit(state, decision...)
	}
}
