package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
	"text/tabwriter"
)

const (
	// einoModule is the module measured.
	einoModule = "github.com/cloudwego/eino"
	// agentPackage is the prebuilt agent measured.
	agentPackage = einoModule + "/adk/prebuilt/planexecute"
)

// Config is what to measure.
type Config struct {
	// Chains are the plan lengths, in steps.
	Chains []int
	// Reps is the number of repetitions per plan length.
	Reps int
	// StepsPerRep is the steps a repetition runs at least: it is the mean
	// of ceil(StepsPerRep / N) runs.
	StepsPerRep int
	// WarmupSteps is the steps the warm-up runs before each plan length
	// make at least.
	WarmupSteps int
}

// runsFor is how many runs of n steps make at least steps steps.
func runsFor(steps, n int) int {
	return (steps + n - 1) / n
}

// Stat is one figure over the repetitions.
type Stat struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	// Samples are the values of every repetition, in order.
	Samples []float64 `json:"samples"`
}

func statOf(samples []float64) Stat {
	s := slices.Clone(samples)
	slices.Sort(s)
	if len(s) == 0 {
		return Stat{}
	}
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stat{Min: s[0], Median: med, Max: s[len(s)-1], Samples: samples}
}

// Result is everything one measurement found.
type Result struct {
	// Eino is the version of github.com/cloudwego/eino measured.
	Eino string `json:"eino"`
	// Package is the prebuilt agent's import path.
	Package string `json:"package"`
	// Go is the Go version the harness was built with.
	Go string `json:"go"`
	// GOMAXPROCS is the number of CPUs the Go runtime used.
	GOMAXPROCS int `json:"gomaxprocs"`
	// Chains are the per-step costs of plans of no-op steps.
	Chains []ChainResult `json:"chains"`
}

// ChainResult is the cost per step of plans of Steps no-op steps.
type ChainResult struct {
	Steps int `json:"steps"`
	// Reps is the number of repetitions.
	Reps int `json:"reps"`
	// RunsPerRep is the runs a repetition is the mean of.
	RunsPerRep int `json:"runs_per_rep"`
	// WarmupRuns is the runs made before the repetitions.
	WarmupRuns int `json:"warmup_runs"`
	// PerStepMs is from the first tool call's start to the last one's
	// end, divided by Steps, in milliseconds.
	PerStepMs Stat `json:"per_step_ms"`
	// E2EPerStepMs is from before the run starts to the end of its events,
	// divided by Steps, in milliseconds.
	E2EPerStepMs Stat `json:"e2e_per_step_ms"`
}

// einoVersion is the version of Eino linked into this binary.
func einoVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, dep := range info.Deps {
		if dep.Path != einoModule {
			continue
		}
		if dep.Replace != nil {
			return dep.Replace.Version
		}
		return dep.Version
	}
	return "unknown"
}

// measure runs every plan length of cfg, reporting progress on log.
func measure(ctx context.Context, cfg Config, log io.Writer) (*Result, error) {
	res := &Result{
		Eino:       einoVersion(),
		Package:    agentPackage,
		Go:         runtime.Version(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
	}
	for _, n := range cfg.Chains {
		cr, err := measureChain(ctx, cfg, n, log)
		if err != nil {
			return nil, err
		}
		res.Chains = append(res.Chains, cr)
	}
	return res, nil
}

func measureChain(ctx context.Context, cfg Config, n int, log io.Writer) (ChainResult, error) {
	c, err := newChain(ctx, n)
	if err != nil {
		return ChainResult{}, fmt.Errorf("chain %d: %w", n, err)
	}
	cr := ChainResult{
		Steps:      n,
		Reps:       cfg.Reps,
		RunsPerRep: runsFor(cfg.StepsPerRep, n),
		WarmupRuns: runsFor(cfg.WarmupSteps, n),
	}
	fmt.Fprintf(log, "eino chain %d: %d warm-up runs, %d reps × %d runs\n", n, cr.WarmupRuns, cr.Reps, cr.RunsPerRep)
	for range cr.WarmupRuns {
		if _, err := c.run(ctx); err != nil {
			return ChainResult{}, fmt.Errorf("chain %d, warm-up: %w", n, err)
		}
	}
	perStep := make([]float64, 0, cr.Reps)
	e2e := make([]float64, 0, cr.Reps)
	for rep := range cr.Reps {
		var sumPerStep, sumE2E float64
		for range cr.RunsPerRep {
			if err := ctx.Err(); err != nil {
				return ChainResult{}, fmt.Errorf("chain %d, rep %d: %w", n, rep+1, err)
			}
			r, err := c.run(ctx)
			if err != nil {
				return ChainResult{}, fmt.Errorf("chain %d, rep %d: %w", n, rep+1, err)
			}
			sumPerStep += r.perStepMs
			sumE2E += r.e2ePerStepMs
		}
		perStep = append(perStep, sumPerStep/float64(cr.RunsPerRep))
		e2e = append(e2e, sumE2E/float64(cr.RunsPerRep))
	}
	cr.PerStepMs = statOf(perStep)
	cr.E2EPerStepMs = statOf(e2e)
	return cr, nil
}

// WriteText prints the result as a table for people.
func (r *Result) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "Eino %s (%s), scripted model, %s, GOMAXPROCS %d\n", r.Eino, r.Package, r.Go, r.GOMAXPROCS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, s Stat, extra string) {
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\tms\t%s\t\n", name, s.Min, s.Median, s.Max, extra)
	}
	fmt.Fprintf(tw, "figure\tmin\tmedian\tmax\tunit\t\t\n")
	for _, c := range r.Chains {
		reps := fmt.Sprintf("%d reps × %d runs", c.Reps, c.RunsPerRep)
		row(fmt.Sprintf("eino chain %d: per step", c.Steps), c.PerStepMs, reps)
		row(fmt.Sprintf("eino chain %d: per step e2e", c.Steps), c.E2EPerStepMs, reps)
	}
	if len(r.Chains) > 1 && r.Chains[0].PerStepMs.Median > 0 {
		first, last := r.Chains[0], r.Chains[len(r.Chains)-1]
		fmt.Fprintf(tw, "eino chain %d / chain %d per step\t\t%.2f\t\t×\t\t\n", last.Steps, first.Steps, last.PerStepMs.Median/first.PerStepMs.Median)
	}
	return tw.Flush()
}
