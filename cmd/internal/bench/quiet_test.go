package bench

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// The figure of a run nobody watched, read from its state, is the one its
// events give.
func TestQuietRunSpanIsTheEvents(t *testing.T) {
	ns, stop, err := embeddedNATS()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	st, err := startStack(t.Context(), ns.ClientURL(), Config{EngineWorkers: 4, PoolConcurrency: 4, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	for _, n := range []int{1, 7} {
		budget := &planexv1.Budget{MaxSteps: int32(n), MaxParallelism: 1, Deadline: durationpb.New(time.Hour)}
		id, span, err := st.runQuiet(t.Context(), fmt.Sprintf("bench chain %d", n), budget)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := st.follow(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if want := stepSpan(evs); span != want || span <= 0 {
			t.Errorf("chain of %d: %v ms from the state, %v ms from the events", n, span, want)
		}
	}
}

func TestPercentilesOf(t *testing.T) {
	if got := percentilesOf(nil); got != nil {
		t.Fatalf("no samples: %+v, want nil", got)
	}
	var samples []float64
	for i := 100; i >= 1; i-- { // out of order: 100 down to 1
		samples = append(samples, float64(i))
	}
	got := percentilesOf(samples)
	want := Percentiles{N: 100, P50: 50, P90: 90, P99: 99, Max: 100}
	if *got != want {
		t.Fatalf("1..100: %+v, want %+v", *got, want)
	}
	if samples[0] != 100 {
		t.Fatal("percentilesOf sorted its argument")
	}
	if got := percentilesOf([]float64{7}); *got != (Percentiles{N: 1, P50: 7, P90: 7, P99: 7, Max: 7}) {
		t.Fatalf("one sample: %+v", *got)
	}
}
