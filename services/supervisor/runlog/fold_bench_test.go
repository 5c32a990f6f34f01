package runlog_test

import (
	"strconv"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// BenchmarkChainDecision measures the fold's share of a chain step — a
// decision appending one step's success and the next one's dispatch to a
// clone of the state — in plans of 10 and 1000 steps, halfway through the
// chain. The two figures should be about equal (flat cost with plan
// length; docs/performance.md).
func BenchmarkChainDecision(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			var l runlog.Log
			steps := make([]*planexv1.Step, n)
			for i := range steps {
				steps[i] = st("s" + strconv.Itoa(i))
				if i > 0 {
					steps[i].DependsOn = []string{"s" + strconv.Itoa(i-1)}
				}
			}
			emit := func(state *runlog.State, evs ...*planexv1.RunEvent) *runlog.State {
				tx := l.Begin(state)
				for _, ev := range evs {
					if err := tx.Emit(ev); err != nil {
						b.Fatal(err)
					}
				}
				return tx.State()
			}
			state := emit(&runlog.State{},
				&planexv1.RunEvent{RunId: "R", Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "g", Budget: &planexv1.Budget{MaxSteps: int32(n)}}}},
				planEv(1, nil, steps...), dispatched("s0", 1))
			half := n / 2
			for i := 1; i <= half; i++ {
				state = emit(state, succeeded("s"+strconv.Itoa(i-1), 1), dispatched("s"+strconv.Itoa(i), 1))
			}
			next := "s" + strconv.Itoa(half+1)
			cur := "s" + strconv.Itoa(half)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				_ = emit(state, succeeded(cur, 1), dispatched(next, 1))
			}
		})
	}
}
