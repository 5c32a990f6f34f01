package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// Config selects what to measure.
type Config struct {
	// Chains are the lengths of the chains of sequential no-op activities.
	Chains []int
	// Reps is how many repetitions of each chain figure are measured.
	Reps int
	// StepsPerRep is how many activities one chain repetition runs, in
	// whole workflows (ceil(StepsPerRep/N), at least one).
	StepsPerRep int
	// WarmupSteps is how many activities run before each chain length is
	// measured, in whole workflows (at least one).
	WarmupSteps int
	// Runs is the number of workflows of the throughput figure (0: skip).
	Runs int
	// FanOut is the number of parallel activities after the root activity
	// of each throughput workflow.
	FanOut int
	// InFlight is how many throughput workflows are being started at any
	// time (as planex bench's 64 StartRun calls in flight); a started
	// workflow runs while the others are started.
	InFlight int
	// ThroughputReps is how many repetitions of the throughput figure are
	// measured.
	ThroughputReps int
	// EagerPerTask is the worker's MaxEagerActivityReservationsPerWorkflowTask.
	EagerPerTask int
	// Address is a running Temporal frontend to measure; empty starts a dev
	// server.
	Address string
	// MetricsURL is the Prometheus endpoint of the server at Address, to
	// count eager activities (empty: not counted). Ignored when the anchor
	// starts the server.
	MetricsURL string
	// ServerArgs are appended to the dev server's start-dev arguments.
	ServerArgs []string
	// ModuleDir is where `go tool -n temporal` finds the pinned CLI (this
	// module's directory).
	ModuleDir string
	// StartTimeout bounds the dev server's start, its first build included.
	StartTimeout time.Duration
	// Progress, when set, receives one line per phase.
	Progress func(format string, args ...any)
}

// Validate checks the configuration, naming the flag at fault.
func (c Config) Validate() error {
	var errs []error
	if len(c.Chains) == 0 && c.Runs == 0 {
		errs = append(errs, errors.New("--chains and --runs: nothing to measure"))
	}
	for _, n := range c.Chains {
		if n < 1 || n > 100_000 {
			errs = append(errs, fmt.Errorf("--chains %d: want 1 to 100000", n))
		}
	}
	if c.Reps < 1 {
		errs = append(errs, fmt.Errorf("--reps %d: must be positive", c.Reps))
	}
	if c.StepsPerRep < 1 {
		errs = append(errs, fmt.Errorf("--steps-per-rep %d: must be positive", c.StepsPerRep))
	}
	if c.WarmupSteps < 0 {
		errs = append(errs, fmt.Errorf("--warmup-steps %d: must not be negative", c.WarmupSteps))
	}
	if c.Runs < 0 {
		errs = append(errs, fmt.Errorf("--runs %d: must not be negative", c.Runs))
	}
	if c.FanOut < 1 || c.FanOut > 1000 {
		errs = append(errs, fmt.Errorf("--fan-out %d: want 1 to 1000", c.FanOut))
	}
	if c.InFlight < 1 {
		errs = append(errs, fmt.Errorf("--in-flight %d: must be positive", c.InFlight))
	}
	if c.ThroughputReps < 1 {
		errs = append(errs, fmt.Errorf("--throughput-reps %d: must be positive", c.ThroughputReps))
	}
	if c.EagerPerTask < 1 {
		errs = append(errs, fmt.Errorf("--eager-per-task %d: must be positive", c.EagerPerTask))
	}
	if c.StartTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--start-timeout %s: must be positive", c.StartTimeout))
	}
	return errors.Join(errs...)
}

// Stat is one figure over the repetitions.
type Stat struct {
	// Min, Median and Max are over the repetitions.
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
	// Server is the server measured.
	Server ServerInfo `json:"server"`
	// SDKVersion is the version of go.temporal.io/sdk the worker runs.
	SDKVersion string `json:"sdk_version"`
	// Tuning is how server and worker were set up.
	Tuning TuningInfo `json:"tuning"`
	// Chains are the per-step costs of chains of sequential activities.
	Chains []ChainResult `json:"chains"`
	// Throughput is the concurrent fanned-out workflows figure (nil:
	// skipped).
	Throughput *ThroughputResult `json:"throughput,omitempty"`
}

// ServerInfo names the server measured.
type ServerInfo struct {
	// Version is the server's own (GetSystemInfo).
	Version string `json:"version"`
	// Address is its frontend.
	Address string `json:"address"`
	// Started is whether the anchor started it as a dev server.
	Started bool `json:"started"`
	// CLIVersion is the Temporal CLI module that ran it (when started).
	CLIVersion string `json:"cli_version,omitempty"`
	// Args are the arguments given to the CLI (when started).
	Args []string `json:"args,omitempty"`
}

// TuningInfo is the tuning in effect.
type TuningInfo struct {
	// DynamicConfig are the dev server's --dynamic-config-value settings
	// (when started).
	DynamicConfig []string `json:"dynamic_config,omitempty"`
	// EagerActivities is whether the worker asks for eager activities.
	EagerActivities bool `json:"eager_activities"`
	// MaxEagerPerWorkflowTask is the worker's
	// MaxEagerActivityReservationsPerWorkflowTask.
	MaxEagerPerWorkflowTask int `json:"max_eager_per_workflow_task"`
	// TaskQueue is the one task queue of workflows and activities.
	TaskQueue string `json:"task_queue"`
}

// ChainResult is the cost per activity of workflows running Steps no-op
// activities one after another.
type ChainResult struct {
	// Steps is the chain's length N.
	Steps int `json:"steps"`
	// WorkflowsPerRep is the number of workflows a repetition averages.
	WorkflowsPerRep int `json:"workflows_per_rep"`
	// WarmupWorkflows ran before the repetitions.
	WarmupWorkflows int `json:"warmup_workflows"`
	// PerStepMs is first ActivityTaskScheduled to last
	// ActivityTaskCompleted, on the history's timestamps, over Steps.
	PerStepMs Stat `json:"per_step_ms"`
	// E2EPerStepMs is ExecuteWorkflow to its result, over Steps.
	E2EPerStepMs Stat `json:"e2e_per_step_ms"`
	// Activities is the number of activities completed in the measured
	// workflows' histories.
	Activities int `json:"activities"`
	// EagerActivities is how many activities the server handed out eagerly
	// meanwhile (nil: not counted).
	EagerActivities *int `json:"eager_activities,omitempty"`
}

// ThroughputResult is the rate of no-op activities of Runs workflows, each
// a root activity then FanOut parallel ones, all started (InFlight starts
// at a time) and then awaited, from before the first start to the last
// WorkflowExecutionCompleted.
type ThroughputResult struct {
	// Runs is the number of workflows of a repetition.
	Runs int `json:"runs"`
	// ActivitiesPerRun is 1 + the fan-out.
	ActivitiesPerRun int `json:"activities_per_run"`
	// InFlight is how many workflows were being started at once.
	InFlight int `json:"in_flight"`
	// ActivitiesPerSec is the figure.
	ActivitiesPerSec Stat `json:"activities_per_sec"`
	// WorkflowsPerSec is the same measurement in workflows.
	WorkflowsPerSec Stat `json:"workflows_per_sec"`
	// Activities is the number of activities completed in all
	// repetitions' histories.
	Activities int `json:"activities"`
	// EagerActivities is how many of them the server handed out eagerly
	// (nil: not counted).
	EagerActivities *int `json:"eager_activities,omitempty"`
}

// taskQueue is the one task queue of the anchor's workflows and
// activities: activities on the workflow's own task queue can run eagerly.
const taskQueue = "planex-anchor"

// Noop is the activity: it does nothing and returns at once.
func Noop(context.Context) error { return nil }

// activityOptions are the options of every Noop: on the workflow's task
// queue (eager execution needs the same queue), default retry policy.
var activityOptions = workflow.ActivityOptions{StartToCloseTimeout: time.Minute}

// ChainWorkflow runs n Noop activities one after another.
func ChainWorkflow(ctx workflow.Context, n int) error {
	ctx = workflow.WithActivityOptions(ctx, activityOptions)
	for i := range n {
		if err := workflow.ExecuteActivity(ctx, Noop).Get(ctx, nil); err != nil {
			return fmt.Errorf("activity %d: %w", i, err)
		}
	}
	return nil
}

// FanWorkflow runs one Noop activity, then fan Noop activities in
// parallel, and waits for all of them.
func FanWorkflow(ctx workflow.Context, fan int) error {
	ctx = workflow.WithActivityOptions(ctx, activityOptions)
	if err := workflow.ExecuteActivity(ctx, Noop).Get(ctx, nil); err != nil {
		return fmt.Errorf("root activity: %w", err)
	}
	futures := make([]workflow.Future, fan)
	for i := range futures {
		futures[i] = workflow.ExecuteActivity(ctx, Noop)
	}
	for i, f := range futures {
		if err := f.Get(ctx, nil); err != nil {
			return fmt.Errorf("fan-out activity %d: %w", i, err)
		}
	}
	return nil
}

// Run measures everything cfg asks for.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, ...any) {}
	}
	res := &Result{
		SDKVersion: moduleVersion("go.temporal.io/sdk"),
		Tuning:     TuningInfo{EagerActivities: true, MaxEagerPerWorkflowTask: cfg.EagerPerTask, TaskQueue: taskQueue},
		Server:     ServerInfo{Address: cfg.Address},
	}
	metricsURL := cfg.MetricsURL
	if cfg.Address == "" {
		cfg.Progress("starting the Temporal dev server (`temporal server start-dev`, the CLI pinned in this module; the first start builds it)")
		srv, err := StartDevServer(ctx, cfg.ModuleDir, cfg.ServerArgs, cfg.StartTimeout)
		if err != nil {
			return nil, err
		}
		defer srv.Stop()
		res.Server = ServerInfo{Address: srv.Address, Started: true, Args: srv.Args}
		res.Tuning.DynamicConfig = append(slices.Clone(Tuning), dynamicConfigArgs(cfg.ServerArgs)...)
		metricsURL = srv.MetricsURL
		if v, err := cliVersion(ctx, cfg.ModuleDir); err == nil {
			res.Server.CLIVersion = v
		}
	}

	c, err := dial(ctx, res.Server.Address)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	info, err := c.WorkflowService().GetSystemInfo(ctx, &workflowservice.GetSystemInfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetSystemInfo: %w", err)
	}
	res.Server.Version = info.GetServerVersion()

	eager := cfg.EagerPerTask
	w := worker.New(c, taskQueue, worker.Options{
		DisableEagerActivities:                      false,
		MaxEagerActivityReservationsPerWorkflowTask: &eager,
	})
	w.RegisterWorkflow(ChainWorkflow)
	w.RegisterWorkflow(FanWorkflow)
	w.RegisterActivity(Noop)
	if err := w.Start(); err != nil {
		return nil, fmt.Errorf("start worker on %s: %w", taskQueue, err)
	}
	defer w.Stop()

	m := &meter{c: c, metricsURL: metricsURL, prefix: fmt.Sprintf("anchor-%d-%d", os.Getpid(), time.Now().UnixNano())}
	for _, n := range cfg.Chains {
		cr, err := m.chain(ctx, cfg, n)
		if err != nil {
			return nil, err
		}
		res.Chains = append(res.Chains, cr)
	}
	if cfg.Runs > 0 {
		cfg.Progress("throughput: %d workflows of 1+%d activities, %d in flight, × %d", cfg.Runs, cfg.FanOut, cfg.InFlight, cfg.ThroughputReps)
		tr, err := m.throughput(ctx, cfg)
		if err != nil {
			return nil, err
		}
		res.Throughput = tr
	}
	return res, nil
}

// dynamicConfigArgs are the KEY=VALUE pairs of the --dynamic-config-value
// flags among start-dev arguments.
func dynamicConfigArgs(args []string) []string {
	var kvs []string
	for i, a := range args {
		if kv, ok := strings.CutPrefix(a, "--dynamic-config-value="); ok {
			kvs = append(kvs, kv)
		} else if a == "--dynamic-config-value" && i+1 < len(args) {
			kvs = append(kvs, args[i+1])
		}
	}
	return kvs
}

// meter runs the anchor's workflows on one client.
type meter struct {
	c          client.Client
	metricsURL string
	prefix     string // of workflow IDs
	seq        atomic.Int64
}

// chain measures workflows of n sequential activities: warm-up workflows,
// then cfg.Reps repetitions of ceil(cfg.StepsPerRep/n) workflows run one
// after another.
func (m *meter) chain(ctx context.Context, cfg Config, n int) (ChainResult, error) {
	warmup := max(1, (cfg.WarmupSteps+n-1)/n)
	runs := max(1, (cfg.StepsPerRep+n-1)/n)
	cfg.Progress("chain of %d activities: %d warm-up workflows, then %d repetitions of %d workflows", n, warmup, cfg.Reps, runs)
	for range warmup {
		if _, _, err := m.runChain(ctx, n); err != nil {
			return ChainResult{}, err
		}
	}
	eager0, counted := m.eager(ctx)
	var perStep, e2e []float64
	for range cfg.Reps {
		var span, elapsed float64
		for range runs {
			s, e, err := m.runChain(ctx, n)
			if err != nil {
				return ChainResult{}, err
			}
			span += s
			elapsed += e
		}
		steps := float64(n * runs)
		perStep = append(perStep, span/steps)
		e2e = append(e2e, elapsed/steps)
	}
	cr := ChainResult{
		Steps: n, WorkflowsPerRep: runs, WarmupWorkflows: warmup,
		PerStepMs: statOf(perStep), E2EPerStepMs: statOf(e2e),
		Activities: n * runs * cfg.Reps,
	}
	if eager1, ok := m.eager(ctx); counted && ok {
		cr.EagerActivities = new(eager1 - eager0)
	}
	return cr, nil
}

// runChain runs one chain workflow of n activities and returns its span
// (first ActivityTaskScheduled to last ActivityTaskCompleted) and its
// end-to-end time, in milliseconds.
func (m *meter) runChain(ctx context.Context, n int) (span, e2e float64, err error) {
	start := time.Now()
	run, err := m.c.ExecuteWorkflow(ctx, m.options("chain"), ChainWorkflow, n)
	if err != nil {
		return 0, 0, fmt.Errorf("start chain workflow of %d: %w", n, err)
	}
	if err := run.Get(ctx, nil); err != nil {
		return 0, 0, fmt.Errorf("chain workflow %s: %w", run.GetID(), err)
	}
	e2e = ms(time.Since(start))
	h, err := m.history(ctx, run.GetID(), run.GetRunID())
	if err != nil {
		return 0, 0, err
	}
	if h.scheduled != n || h.completed != n {
		return 0, 0, fmt.Errorf("chain workflow %s: %d activities scheduled and %d completed, want %d", run.GetID(), h.scheduled, h.completed, n)
	}
	return ms(h.lastCompleted.Sub(h.firstScheduled)), e2e, nil
}

// throughput measures cfg.ThroughputReps repetitions of cfg.Runs fan
// workflows, cfg.InFlight of them being started at any time.
func (m *meter) throughput(ctx context.Context, cfg Config) (*ThroughputResult, error) {
	per := 1 + cfg.FanOut
	tr := &ThroughputResult{Runs: cfg.Runs, ActivitiesPerRun: per, InFlight: min(cfg.InFlight, cfg.Runs)}
	eager0, counted := m.eager(ctx)
	var acts, wfs []float64
	for range cfg.ThroughputReps {
		start := time.Now()
		runs, err := m.fanRuns(ctx, cfg)
		if err != nil {
			return nil, err
		}
		var end time.Time
		for _, r := range runs {
			h, err := m.history(ctx, r.GetID(), r.GetRunID())
			if err != nil {
				return nil, err
			}
			if h.scheduled != per || h.completed != per {
				return nil, fmt.Errorf("fan workflow %s: %d activities scheduled and %d completed, want %d", r.GetID(), h.scheduled, h.completed, per)
			}
			if h.closed.After(end) {
				end = h.closed
			}
		}
		secs := end.Sub(start).Seconds()
		acts = append(acts, float64(cfg.Runs*per)/secs)
		wfs = append(wfs, float64(cfg.Runs)/secs)
		tr.Activities += cfg.Runs * per
	}
	tr.ActivitiesPerSec, tr.WorkflowsPerSec = statOf(acts), statOf(wfs)
	if eager1, ok := m.eager(ctx); counted && ok {
		tr.EagerActivities = new(eager1 - eager0)
	}
	return tr, nil
}

// fanRuns starts cfg.Runs fan workflows from cfg.InFlight goroutines, as
// planex bench starts its runs, and then waits for the result of each.
func (m *meter) fanRuns(ctx context.Context, cfg Config) ([]client.WorkflowRun, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runs := make([]client.WorkflowRun, cfg.Runs)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, min(cfg.InFlight, cfg.Runs))
	for g := range errs {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= cfg.Runs || ctx.Err() != nil {
					return
				}
				run, err := m.c.ExecuteWorkflow(ctx, m.options("fan"), FanWorkflow, cfg.FanOut)
				if err != nil {
					errs[g] = fmt.Errorf("fan workflow %d: %w", i, err)
					cancel()
					return
				}
				runs[i] = run
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i, run := range runs {
		if err := run.Get(ctx, nil); err != nil {
			return nil, fmt.Errorf("fan workflow %d: %w", i, err)
		}
	}
	return runs, nil
}

func (m *meter) options(kind string) client.StartWorkflowOptions {
	return client.StartWorkflowOptions{
		ID:        fmt.Sprintf("%s-%s-%d", m.prefix, kind, m.seq.Add(1)),
		TaskQueue: taskQueue,
	}
}

// metricsFlush is how long the anchor lets the server's metrics settle
// before reading them: the dev server's tally scope reports every second.
const metricsFlush = 2 * time.Second

// eager reads the server's eager activity counter, after letting the
// server report what it counted; ok is false when it cannot be read (no
// metrics endpoint known).
func (m *meter) eager(ctx context.Context) (int, bool) {
	if m.metricsURL == "" {
		return 0, false
	}
	select {
	case <-ctx.Done():
		return 0, false
	case <-time.After(metricsFlush):
	}
	n, err := eagerCount(ctx, m.metricsURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "anchor: eager activities not counted: %v\n", err)
		return 0, false
	}
	return n, true
}

// historySummary is what the anchor reads from a closed workflow's history.
type historySummary struct {
	scheduled, completed          int
	firstScheduled, lastCompleted time.Time
	// closed is the time of its WorkflowExecutionCompleted event.
	closed time.Time
}

func (m *meter) history(ctx context.Context, id, runID string) (historySummary, error) {
	var h historySummary
	it := m.c.GetWorkflowHistory(ctx, id, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return h, fmt.Errorf("history of %s: %w", id, err)
		}
		at := ev.GetEventTime().AsTime()
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			if h.scheduled == 0 {
				h.firstScheduled = at
			}
			h.scheduled++
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
			h.completed++
			if at.After(h.lastCompleted) {
				h.lastCompleted = at
			}
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
			h.closed = at
		}
	}
	if h.closed.IsZero() {
		return h, fmt.Errorf("history of %s: no WorkflowExecutionCompleted", id)
	}
	return h, nil
}

// moduleVersion is the version of module path in this binary's build.
func moduleVersion(path string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			if d.Replace != nil {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return "unknown"
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
