package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/planex-dev/planex/cmd/internal/bench"
)

// A small bench on an embedded server measures every figure and reports
// it as text and JSON.
func TestBenchMeasuresEveryFigure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := bench.Run(ctx, bench.Config{
		Reps: 2, FloorTrips: 20, Chains: []int{3, 6}, Runs: 3, FanOut: 2, Waiting: 3,
		Idle: 100 * time.Millisecond, Settle: 100 * time.Millisecond, EngineWorkers: 4, PoolConcurrency: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	// The floor is measured before each repetition of each chain.
	if res.FloorMs.Median <= 0 || len(res.FloorMs.Samples) != 4 {
		t.Errorf("floor %+v", res.FloorMs)
	}
	if len(res.Chains) != 2 || res.Chains[1].Steps != 6 || res.Chains[1].PerStepMs.Median <= 0 || res.Chains[1].FloorRatio <= 0 ||
		res.Chains[1].WatchedPerStepMs.Median <= 0 || res.Chains[1].WatchedFloorRatio <= 0 || len(res.Chains[1].PerStepMs.Samples) != 2 || res.Chains[1].RunsPerRep != 4 ||
		len(res.Chains[1].FloorMs.Samples) != 2 || res.Chains[1].FloorRatio != res.Chains[1].PerStepMs.Median/res.Chains[1].FloorMs.Median {
		t.Errorf("chains %+v", res.Chains)
	}
	// Every unwatched chain run's StartRun → first step: 2 repetitions of
	// 7 runs of 3 steps and 4 of 6 (20 steps each, in whole runs).
	if f := res.FirstStep; f == nil || f.N != 22 || f.P50 <= 0 || f.P50 > f.P99 || f.P99 > f.Max {
		t.Errorf("first step %+v, want 22 runs' percentiles", f)
	}
	if res.Throughput == nil || res.Throughput.StepsPerRun != 3 || res.Throughput.StepsPerSec.Min <= 0 {
		t.Errorf("throughput %+v", res.Throughput)
	}
	if w := res.Waiting; w == nil || w.Runs != 3 || w.ListRunsMs.Median <= 0 || w.Goroutines <= 0 {
		t.Errorf("waiting %+v", res.Waiting)
	}
	var text bytes.Buffer
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"two-hop floor", "chain 6: floor alongside", "chain 6: per step", "chain 6: per step, watched", "planex/floor", "throughput", "ListRuns"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	if _, err := json.Marshal(res); err != nil {
		t.Fatal(err)
	}
}

func TestConfigErrorsNameTheFlag(t *testing.T) {
	err := bench.Config{Reps: 0, FloorTrips: 1, FanOut: 100, EngineWorkers: 1, PoolConcurrency: 1, Chains: []int{0}, WarmupSteps: -1}.Validate()
	for _, want := range []string{"--reps 0", "--fan-out 100", "--chains 0", "--warmup-steps -1"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want it to name %s", err, want)
		}
	}
}
