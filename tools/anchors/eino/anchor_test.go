package main

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
)

// TestRunCallsEachStepOnceInOrder runs a plan of 3 through Eino's
// plan-execute agent and checks the tool calls the run made.
func TestRunCallsEachStepOnceInOrder(t *testing.T) {
	ctx := context.Background()
	c, err := newChain(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	for run := range 2 { // the agent is reused across runs
		r, err := c.run(ctx)
		if err != nil {
			t.Fatalf("run %d: %v", run+1, err)
		}
		if want := []int{1, 2, 3}; !slices.Equal(r.steps, want) {
			t.Errorf("run %d: tool calls for steps %v, want %v", run+1, r.steps, want)
		}
		if r.perStepMs <= 0 || r.e2ePerStepMs < r.perStepMs {
			t.Errorf("run %d: per step %v ms, e2e %v ms: want 0 < per step ≤ e2e", run+1, r.perStepMs, r.e2ePerStepMs)
		}
	}
}

// TestMeasure measures a plan of 3 with one repetition.
func TestMeasure(t *testing.T) {
	cfg := Config{Chains: []int{3}, Reps: 1, StepsPerRep: 6, WarmupSteps: 3}
	res, err := measure(context.Background(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if res.Eino == "" || res.Eino == "unknown" {
		t.Errorf("Eino version %q", res.Eino)
	}
	if len(res.Chains) != 1 {
		t.Fatalf("%d chains, want 1", len(res.Chains))
	}
	c := res.Chains[0]
	if c.Steps != 3 || c.Reps != 1 || c.RunsPerRep != 2 || c.WarmupRuns != 1 {
		t.Errorf("chain %+v: want 3 steps, 1 rep × 2 runs, 1 warm-up run", c)
	}
	for name, s := range map[string]Stat{"per step": c.PerStepMs, "e2e": c.E2EPerStepMs} {
		if s.Min <= 0 || s.Median < s.Min || s.Max < s.Median || len(s.Samples) != 1 {
			t.Errorf("%s: %+v: want positive figures from 1 sample", name, s)
		}
	}
	var text strings.Builder
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "eino chain 3: per step") {
		t.Errorf("table lacks the chain row:\n%s", text.String())
	}
}

// TestRunFailsOnWrongStep checks that a run calling the wrong steps fails.
func TestRunFailsOnWrongStep(t *testing.T) {
	ctx := context.Background()
	c, err := newChain(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	// A plan that skips step 2: the replanner continues with step 3 only.
	c.script.plans[1] = `{"steps":["step 3"]}`
	if _, err := c.run(ctx); !errors.Is(err, errRun) {
		t.Fatalf("run: %v, want an %v error", err, errRun)
	}
}

func TestParseFlags(t *testing.T) {
	cfg, asJSON, err := parseFlags([]string{"--chains", "10, 100", "--reps", "2", "--json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Chains, []int{10, 100}) || cfg.Reps != 2 || cfg.StepsPerRep != 200 || cfg.WarmupSteps != 50 || !asJSON {
		t.Errorf("got %+v json=%v", cfg, asJSON)
	}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--chains", "10,x"}, "--chains"},
		{[]string{"--chains", "0"}, "--chains"},
		{[]string{"--reps", "0"}, "--reps"},
		{[]string{"--steps-per-rep", "-1"}, "--steps-per-rep"},
		{[]string{"--warmup-steps", "-1"}, "--warmup-steps"},
		{[]string{"--reps", "many"}, "reps"},
	} {
		_, _, err := parseFlags(tc.args, io.Discard)
		var fe *flagError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%v: error %v, want a flag error naming %s", tc.args, err, tc.flag)
		}
	}
}
