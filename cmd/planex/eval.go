package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/planex-dev/planex/cmd/internal/devstack"
	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/cassette"
	"github.com/planex-dev/planex/internal/eval"
	"github.com/planex-dev/planex/internal/telemetry"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/planner"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// evalFlags configure `planex eval`.
type evalFlags struct {
	cf          clientFlags
	dev         devFlags
	useDev      bool
	parallel    int
	record      string
	replay      string
	replayMiss  string
	jsonOut     string
	junitOut    string
	baseline    string
	tolerances  []string
	saveLogs    string
	taskTimeout time.Duration
	gateLatency bool
}

func evalCmd() *cobra.Command {
	var f evalFlags
	cmd := &cobra.Command{
		Use:   "eval SUITE",
		Short: "Run a suite of golden tasks as real runs and score them",
		Long: `Run every task of a suite (YAML or JSON: goal, inputs, expected status,
result matchers, expected tool trajectory, limits, faults) as a real run and
score it; print a table, and optionally write JSON (--report, or --json on
stdout) and JUnit XML (--junit). With --baseline, compare the suite's
metrics with a previous JSON report and fail when one regressed beyond its
tolerance band; the regressions are in the table, the JSON report and the
JUnit XML too (one test case per compared metric). In a replay, wall-clock
latency measures the machine, not the agent: it is not compared unless
--gate-latency is given.

A task's approval gates are decided by the harness through the API, as a
user would, following the task's gates: rules ({step: close, decision:
approve}; step "*" decides every gate). A gate no rule decides fails the
task at once and cancels its run.

With --dev or --replay the harness exports traces like planex dev: set
OTEL_EXPORTER_OTLP_ENDPOINT (and the other OTEL_ variables).

Where the runs go:
  --addr HOST:PORT   a running supervisor (no faults, no cassettes)
  --dev              a dev stack started in this process (demo data)
  --replay DIR       offline: NATS, supervisor, a planner answering from the
                     cassette and tools answering from it, no model and no
                     tool backend; with --dev, the dev stack's tools and
                     planner answer from the cassette instead
With --dev, --record DIR stores every planner answer and tool result in a
cassette, keyed by a hash of its canonical request. Faults (fail a tool on an
attempt, add latency, lose a result, an invalid plan) need --dev or --replay.

Exit codes: 0 every task passed and no metric regressed; 3 otherwise; 1 bad
usage or the stack could not start. See docs/evaluation.md.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			suite, err := eval.LoadSuite(args[0])
			if err != nil {
				return &exitError{code: exitUsage, msg: err.Error()}
			}
			return runEval(cmd.Context(), cmd, f, suite)
		},
	}
	f.cf.register(cmd.Flags())
	f.dev.register(cmd.Flags(), "eval-dev")
	fs := cmd.Flags()
	fs.BoolVar(&f.useDev, "dev", false, "run the suite on a dev stack started in this process")
	fs.IntVar(&f.parallel, "parallel", 1, "tasks run at once")
	fs.StringVar(&f.record, "record", "", "with --dev: record planner answers and tool results into this cassette directory")
	fs.StringVar(&f.replay, "replay", "", "answer planner requests and tool calls from this cassette directory")
	fs.StringVar(&f.replayMiss, "replay-miss", "error", "a request the cassette lacks: error (fail naming it) or live (ask the real planner or tool; needs --dev)")
	fs.StringVar(&f.jsonOut, "report", "", "write the report as JSON to this file (--json prints it on stdout instead of the table)")
	fs.StringVar(&f.junitOut, "junit", "", "write the report as JUnit XML to this file")
	fs.StringVar(&f.baseline, "baseline", "", "JSON report of a previous run: fail when a metric regressed beyond its tolerance")
	fs.StringArrayVar(&f.tolerances, "tolerance", nil, "tolerance band of a metric, metric=0.05 (absolute) or metric=10% (relative) (repeatable)")
	fs.StringVar(&f.saveLogs, "save-logs", "", "with --dev or --replay: write each task's run log (as stored, unredacted) to DIR/<task>.jsonl, for planex replay")
	fs.DurationVar(&f.taskTimeout, "task-timeout", 2*time.Minute, "longest a task's run may take before it is cancelled and fails")
	fs.BoolVar(&f.gateLatency, "gate-latency", false, "with --baseline and --replay: compare the latency metrics too (a replay's latency measures the machine, so they are not compared by default)")
	return cmd
}

func (f evalFlags) validate(suite *eval.Suite) error {
	var errs []error
	if f.parallel < 1 || f.parallel > 64 {
		errs = append(errs, fmt.Errorf("--parallel %d: want 1 to 64", f.parallel))
	}
	if f.record != "" && f.replay != "" {
		errs = append(errs, errors.New("--record and --replay: choose one"))
	}
	if f.record != "" && !f.useDev {
		errs = append(errs, errors.New("--record: needs --dev (the planner and tools to record run in this process)"))
	}
	if f.replayMiss != "error" && f.replayMiss != "live" {
		errs = append(errs, fmt.Errorf("--replay-miss %q: want error or live", f.replayMiss))
	} else if f.replayMiss == "live" && !f.useDev {
		errs = append(errs, errors.New("--replay-miss live: needs --dev (something live to ask)"))
	}
	local := f.useDev || f.replay != ""
	if !local && hasFaults(suite) {
		errs = append(errs, errors.New("the suite injects faults: run it with --dev or --replay (faults are injected in this process)"))
	}
	if f.saveLogs != "" && !local {
		errs = append(errs, errors.New("--save-logs: needs --dev or --replay (it reads the run logs from the stack's NATS)"))
	}
	if f.taskTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--task-timeout %s: must be positive", f.taskTimeout))
	}
	tol := eval.DefaultTolerances()
	for _, t := range f.tolerances {
		if err := eval.ParseTolerance(tol, t); err != nil {
			errs = append(errs, fmt.Errorf("--tolerance: %w", err))
		}
	}
	if f.gateLatency && f.baseline == "" {
		errs = append(errs, errors.New("--gate-latency: needs --baseline"))
	}
	if f.useDev {
		if err := f.dev.services.Validate(); err != nil {
			errs = append(errs, err)
		}
	} else if err := f.dev.services.Critic.ValidateName(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func hasFaults(s *eval.Suite) bool {
	if len(s.Faults) > 0 {
		return true
	}
	for _, t := range s.Tasks {
		if len(t.Faults) > 0 {
			return true
		}
	}
	return false
}

// evalTarget is where a suite's runs go.
type evalTarget struct {
	addr string
	js   jetstream.JetStream // the stack's JetStream (local stacks only)
	mode string
}

func runEval(ctx context.Context, cmd *cobra.Command, f evalFlags, suite *eval.Suite) (err error) {
	if err := f.validate(suite); err != nil {
		return usageError(cmd, "%v", err)
	}
	var baseline *eval.Report
	if f.baseline != "" {
		b, err := eval.ReadReport(f.baseline)
		if err != nil {
			return usageError(cmd, "--baseline: %v", err)
		}
		baseline = &b
	}
	faults := newFaultRegistry(suite)
	target := evalTarget{addr: f.cf.addr, mode: "live"}
	if f.useDev || f.replay != "" {
		// The stack runs in this process: export its traces as planex dev
		// does (OTEL_EXPORTER_OTLP_ENDPOINT and the other OTEL_ variables).
		r, err := f.dev.redactor()
		if err != nil {
			return usageError(cmd, "%v", err)
		}
		t, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "planex-dev", Version: version, Redactor: r})
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			err = errors.Join(err, t.Shutdown(sctx))
		}()
		f.dev.services.Metrics = t.Metrics
	}
	switch {
	case f.useDev:
		var cas *cassette.Cassette
		if dir := cmp(f.record, f.replay); dir != "" {
			if cas, err = cassette.Open(dir, nil); err != nil {
				return err
			}
		}
		stack, js, closeJS, err := startEvalDev(ctx, f, cas, faults, cmd.ErrOrStderr())
		if err != nil {
			return err
		}
		defer func() {
			closeJS()
			err = errors.Join(err, stopDevStack(ctx, stack))
		}()
		target = evalTarget{addr: stack.Addr, js: js, mode: "live"}
		if f.replay != "" {
			target.mode = "replay"
		}
		if f.record != "" {
			if err := writeCatalog(ctx, js, cas); err != nil {
				return err
			}
		}
	case f.replay != "":
		cas, err := cassette.Open(f.replay, nil)
		if err != nil {
			return err
		}
		off, err := startOffline(ctx, cas, faults, f.dev.services.Critic)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, off.stop()) }()
		// The offline stack serves plaintext gRPC on loopback only.
		prev := connection.plaintext
		connection.plaintext = true
		defer func() { connection.plaintext = prev }()
		target = evalTarget{addr: off.addr, js: off.js, mode: "replay"}
	}
	results, err := runSuite(ctx, target, suite, f, faults)
	if err != nil {
		return err
	}
	report := eval.Summarize(suite.Name, results)
	report.Mode = target.mode
	if baseline != nil {
		tol := eval.DefaultTolerances()
		for _, t := range f.tolerances {
			_ = eval.ParseTolerance(tol, t) // validated above
		}
		skip := map[string]string{}
		if !f.gateLatency && (report.Mode == "replay" || baseline.Mode == "replay") {
			for _, m := range eval.LatencyMetrics {
				skip[m] = "not compared in a replay (--gate-latency compares it)"
			}
		}
		report.CheckBaseline(f.baseline, *baseline, tol, skip)
	}
	out := cmd.OutOrStdout()
	if f.cf.json {
		if err := report.WriteJSON(out); err != nil {
			return err
		}
	} else if err := report.WriteTable(out); err != nil {
		return err
	}
	if f.jsonOut != "" {
		if err := writeFileWith(f.jsonOut, report.WriteJSON); err != nil {
			return fmt.Errorf("--report: %w", err)
		}
	}
	if f.junitOut != "" {
		if err := writeFileWith(f.junitOut, report.WriteJUnit); err != nil {
			return fmt.Errorf("--junit: %w", err)
		}
	}
	var problems []string
	if report.Failed() {
		problems = append(problems, fmt.Sprintf("%d of %d tasks failed", report.Metrics.Tasks-report.Metrics.Passed, report.Metrics.Tasks))
	}
	if report.Regressed() {
		for _, r := range report.Baseline.Regressions {
			problems = append(problems, r.String())
		}
	}
	if len(problems) > 0 {
		return &exitError{code: exitFailed, msg: "eval: " + strings.Join(problems, "\n")}
	}
	return nil
}

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func writeFileWith(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// runSuite runs the tasks, f.parallel at a time, and scores them in suite
// order.
func runSuite(ctx context.Context, target evalTarget, suite *eval.Suite, f evalFlags, faults *faultRegistry) ([]eval.TaskResult, error) {
	client, closeConn, err := dial(target.addr)
	if err != nil {
		return nil, err
	}
	defer closeConn()
	if f.saveLogs != "" {
		if err := os.MkdirAll(f.saveLogs, 0o755); err != nil {
			return nil, fmt.Errorf("--save-logs: %w", err)
		}
	}
	results := make([]eval.TaskResult, len(suite.Tasks))
	sem := make(chan struct{}, f.parallel)
	var wg sync.WaitGroup
	var saveErr error
	var mu sync.Mutex
	for i, task := range suite.Tasks {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			obs := runTask(ctx, client, suite, task, f.taskTimeout, faults)
			results[i] = eval.Score(suite, task, obs)
			if f.saveLogs != "" && obs.Run != nil {
				if err := saveLog(ctx, target.js, obs.Run.GetId(), filepath.Join(f.saveLogs, task.Name+".jsonl")); err != nil {
					mu.Lock()
					saveErr = errors.Join(saveErr, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return results, saveErr
}

// runTask starts a task's run, follows it to its end and collects what
// scoring needs.
func runTask(ctx context.Context, client planexv1.SupervisorServiceClient, suite *eval.Suite, task eval.Task, timeout time.Duration, faults *faultRegistry) eval.Observation {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req := &planexv1.StartRunRequest{Goal: task.Goal, Labels: map[string]string{"eval.suite": labelValue(suite.Name), "eval.task": labelValue(task.Name)}}
	for k, v := range task.Labels {
		req.Labels[k] = v
	}
	if len(task.Inputs) > 0 {
		in, err := structpb.NewStruct(task.Inputs)
		if err != nil {
			return eval.Observation{Err: fmt.Errorf("inputs: %w", err)}
		}
		req.Inputs = in
	}
	if d := task.StepTimeout.Duration; d > 0 {
		req.Budget = &planexv1.Budget{StepTimeout: durationpb.New(d)}
	}
	if task.Mode == "next-step" {
		req.Mode = planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP
	}
	start := time.Now()
	runID, err := faults.start(task, func() (string, error) {
		resp, err := client.StartRun(ctx, req)
		return resp.GetRun().GetId(), err
	})
	if err != nil {
		return eval.Observation{Err: fmt.Errorf("start run: %w", err)}
	}
	stream, err := client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: runID})
	if err != nil {
		return eval.Observation{Err: fmt.Errorf("watch run %s: %w", runID, err)}
	}
	var (
		events    []*planexv1.RunEvent
		failures  []string
		decisions []string
	)
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				_, _ = client.CancelRun(context.WithoutCancel(ctx), &planexv1.CancelRunRequest{RunId: runID, Reason: "eval: task timeout"})
				return eval.Observation{Err: fmt.Errorf("run %s did not finish within --task-timeout %s", runID, timeout)}
			}
			return eval.Observation{Err: fmt.Errorf("watch run %s: %w", runID, err)}
		}
		events = append(events, resp.GetEvent())
		if resp.GetEvent().GetFinished() != nil {
			break
		}
		if g := resp.GetEvent().GetGateOpened().GetGate(); g != nil {
			decided, err := decideGate(ctx, client, runID, task, g)
			if err != nil {
				failures = append(failures, err.Error())
				if _, cerr := client.CancelRun(ctx, &planexv1.CancelRunRequest{RunId: runID, Reason: "eval: " + err.Error()}); cerr != nil {
					failures = append(failures, fmt.Sprintf("cancel run %s: %v", runID, cerr))
					break
				}
				continue
			}
			decisions = append(decisions, decided)
		}
	}
	latency := time.Since(start)
	got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: runID})
	if err != nil {
		return eval.Observation{Err: fmt.Errorf("get run %s: %w", runID, err)}
	}
	return eval.Observation{Run: got.GetRun(), Events: events, Latency: latency, Failures: failures, Decisions: decisions}
}

// evalActor is who the harness's gate decisions are recorded from.
const evalActor = "planex eval"

// decideGate decides an open gate through the API as the task's gates:
// rules say, and describes the decision; a gate no rule decides is an
// error naming it and the rule that would.
func decideGate(ctx context.Context, client planexv1.SupervisorServiceClient, runID string, task eval.Task, g *planexv1.Gate) (string, error) {
	step, what := g.GetStepId(), fmt.Sprintf("gate %s (step %s)", g.GetId(), g.GetStepId())
	if g.GetKind() == planexv1.GateKind_GATE_KIND_PLAN {
		step, what = eval.GatePlan, fmt.Sprintf("gate %s (plan revision %d)", g.GetId(), g.GetPlanRevision())
	}
	rule, ok := task.GateRule(step)
	if !ok {
		return "", fmt.Errorf("%s opened (%s) and the task has no gates: rule deciding it (add gates: [{step: %s, decision: approve}])", what, g.GetReason(), step)
	}
	req := &planexv1.DecideRequest{RunId: runID, GateId: g.GetId(), Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE,
		Actor: evalActor, Comment: rule.Comment}
	if rule.Decision == eval.GateReject {
		req.Decision, req.StopRun = planexv1.DecisionKind_DECISION_KIND_REJECT, rule.StopRun
		if req.Comment == "" {
			req.Comment = "rejected by the golden task " + task.Name
		}
	}
	if _, err := client.Decide(ctx, req); err != nil {
		return "", fmt.Errorf("%s: %s: %w", what, rule.Decision, err)
	}
	return rule.Decision + " " + what, nil
}

// labelValue fits a name into a label value.
func labelValue(s string) string {
	if len(s) > 63 {
		return s[:63]
	}
	return s
}

// saveLog writes a run's stored log, unredacted, for planex replay.
func saveLog(ctx context.Context, js jetstream.JetStream, runID, path string) error {
	events, err := runlog.ReadStored(ctx, js, runID)
	if err != nil {
		return fmt.Errorf("--save-logs: %w", err)
	}
	exported := make([]runlog.ExportedEvent, len(events))
	for i, ev := range events {
		exported[i] = runlog.ExportedEvent{Event: ev}
	}
	return writeFileWith(path, func(w io.Writer) error { return runlog.WriteExport(w, exported) })
}

// faultRegistry maps runs to the faults of their task. Starting a run
// holds the write lock until the run is registered, so a tool call or a
// planner request of that run (which can only come after StartRun) always
// finds its faults.
type faultRegistry struct {
	suite []eval.Fault
	mu    sync.RWMutex
	byRun map[string][]eval.Fault
	calls map[string]int // planner calls per run
}

func newFaultRegistry(s *eval.Suite) *faultRegistry {
	return &faultRegistry{suite: s.Faults, byRun: map[string][]eval.Fault{}, calls: map[string]int{}}
}

func (r *faultRegistry) start(task eval.Task, startRun func() (string, error)) (string, error) {
	faults := append(slices.Clone(r.suite), task.Faults...)
	if len(faults) == 0 {
		return startRun()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	id, err := startRun()
	if err == nil {
		r.byRun[id] = faults
	}
	return id, err
}

// tool returns the fault of one tool call.
func (r *faultRegistry) tool(c runner.Call, tool string) runner.Fault {
	r.mu.RLock()
	faults := r.byRun[c.RunID]
	r.mu.RUnlock()
	var out runner.Fault
	for _, f := range faults {
		if f.Tool != tool {
			continue
		}
		attempt := int32(f.Attempt)
		if attempt == 0 && f.Kind != "latency" {
			attempt = 1
		}
		if attempt != 0 && attempt != c.Attempt {
			continue
		}
		switch f.Kind {
		case "fail":
			code := planexv1.ErrorCode(planexv1.ErrorCode_value["ERROR_CODE_"+strings.ToUpper(cmp(f.Code, "UNAVAILABLE"))])
			msg := cmp(f.Message, fmt.Sprintf("injected failure of %s attempt %d", tool, c.Attempt))
			out.Err = &runner.Error{Code: code, Message: msg}
		case "latency":
			out.Delay += f.Latency.Duration
		case "drop":
			out.Drop = true
		}
	}
	return out
}

// planInvalid counts a run's planner calls and reports whether this one
// must be answered with an invalid plan.
func (r *faultRegistry) planInvalid(req *planexv1.PlanRequest) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	faults := r.byRun[req.GetRunId()]
	if len(faults) == 0 {
		return false
	}
	r.calls[req.GetRunId()]++
	n := r.calls[req.GetRunId()]
	for _, f := range faults {
		if f.Kind == "planner_invalid" && max(f.Attempt, 1) == n {
			return true
		}
	}
	return false
}

// wrapTool layers cassette recording or replay and faults on a tool.
func (r *faultRegistry) wrapTool(t runner.Tool, cas *cassette.Cassette, record, liveMiss bool) runner.Tool {
	t = cassetteTool(t, cas, record, liveMiss)
	name := t.Spec().GetName()
	return runner.FaultTool(t, func(c runner.Call) runner.Fault { return r.tool(c, name) })
}

// wrapPlanner layers cassette recording or replay and faults on a planner
// backend.
func (r *faultRegistry) wrapPlanner(b planner.Backend, cas *cassette.Cassette, record, liveMiss bool) planner.Backend {
	return planner.InvalidPlanFault(cassettePlanner(b, cas, record, liveMiss), r.planInvalid)
}

// cassetteTool records a tool's results into cas, or answers from cas
// (misses going to the tool itself when liveMiss); nil cas: t.
func cassetteTool(t runner.Tool, cas *cassette.Cassette, record, liveMiss bool) runner.Tool {
	switch {
	case cas != nil && record:
		return runner.RecordTool(t, cas)
	case cas != nil:
		var live runner.Tool
		if liveMiss {
			live = t
		}
		return runner.ReplayTool(t.Spec(), cas, live)
	}
	return t
}

// cassettePlanner records a planner backend's answers into cas, or
// answers from cas (misses going to b when liveMiss); nil cas: b.
func cassettePlanner(b planner.Backend, cas *cassette.Cassette, record, liveMiss bool) planner.Backend {
	switch {
	case cas != nil && record:
		return planner.RecordBackend(b, cas)
	case cas != nil:
		var live planner.Backend
		if liveMiss {
			live = b
		}
		return planner.ReplayBackend(cas, live)
	}
	return b
}

// startEvalDev starts the dev stack with the suite's faults and the
// cassette wired into the planner and every tool, and returns it with a
// JetStream connection to its NATS (as the supervisor) for --save-logs.
func startEvalDev(ctx context.Context, f evalFlags, cas *cassette.Cassette, faults *faultRegistry, logw io.Writer) (*devstack.Stack, jetstream.JetStream, func(), error) {
	record, liveMiss := f.record != "", f.replayMiss == "live"
	f.dev.services.WrapTool = func(t runner.Tool) runner.Tool { return faults.wrapTool(t, cas, record, liveMiss) }
	f.dev.services.Planner.Wrap = func(b planner.Backend) planner.Backend { return faults.wrapPlanner(b, cas, record, liveMiss) }
	stack, err := startDevStack(ctx, f.dev, "eval", "127.0.0.1:0", logw, levelError)
	if err != nil {
		return nil, nil, nil, err
	}
	sf := storeFlags{url: stack.NATSURL}
	sf.auth.NKeySeedFile = stack.Credentials.NATSSeedFiles["supervisor"]
	js, closeJS, err := sf.connect(ctx)
	if err != nil {
		return nil, nil, nil, errors.Join(err, stopDevStack(ctx, stack))
	}
	return stack, js, closeJS, nil
}
