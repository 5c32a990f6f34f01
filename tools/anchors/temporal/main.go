package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run parses args, measures and prints; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, asJSON, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "temporal anchor: %v\n", err)
		return 2
	}
	if !asJSON {
		cfg.Progress = func(format string, args ...any) {
			fmt.Fprintf(stderr, "anchor: "+format+"\n", args...)
		}
	}
	res, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "temporal anchor: %v\n", err)
		return 1
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(res)
	} else {
		err = res.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "temporal anchor: %v\n", err)
		return 1
	}
	return 0
}

// parseFlags reads the command line into a validated Config.
func parseFlags(args []string, stderr io.Writer) (cfg Config, asJSON bool, err error) {
	fs := flag.NewFlagSet("temporal-anchor", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // a parse error is returned, and printed once by run
	chains := intList{10, 100}
	var serverArgs stringList
	fs.Var(&chains, "chains", "comma-separated lengths of the chains of sequential no-op activities (empty: none)")
	fs.IntVar(&cfg.Reps, "reps", 5, "repetitions of each chain figure (min/median/max)")
	fs.IntVar(&cfg.StepsPerRep, "steps-per-rep", 200, "activities per chain repetition, in whole workflows run one after another")
	fs.IntVar(&cfg.WarmupSteps, "warmup-steps", 50, "activities run (in whole workflows, at least one) before each chain length is measured")
	fs.IntVar(&cfg.Runs, "runs", 200, "workflows of the throughput figure (0: skip it)")
	fs.IntVar(&cfg.FanOut, "fan-out", 8, "parallel activities after the root activity of each throughput workflow")
	fs.IntVar(&cfg.InFlight, "in-flight", 64, "throughput workflows being started at any time (all then run at once)")
	fs.IntVar(&cfg.ThroughputReps, "throughput-reps", 3, "repetitions of the throughput figure (min/median/max)")
	fs.IntVar(&cfg.EagerPerTask, "eager-per-task", 3, "the worker's MaxEagerActivityReservationsPerWorkflowTask (the SDK's default is 3)")
	fs.BoolVar(&asJSON, "json", false, "print the result as JSON")
	fs.Var(&serverArgs, "server-arg", "extra argument to the dev server's start-dev command (repeatable)")
	fs.StringVar(&cfg.Address, "address", "", "host:port of a running Temporal frontend to measure instead of starting a dev server")
	fs.StringVar(&cfg.MetricsURL, "metrics-url", "", "Prometheus endpoint of the server at --address, to count eager activities")
	fs.DurationVar(&cfg.StartTimeout, "start-timeout", 10*time.Minute, "how long the dev server may take to start (the first start builds the CLI)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "usage: go run . [flags]  (in tools/anchors/temporal; see doc.go)")
			fs.SetOutput(stderr)
			fs.PrintDefaults()
		}
		return cfg, false, err
	}
	if fs.NArg() > 0 {
		return cfg, false, fmt.Errorf("unexpected argument %q (all options are flags)", fs.Arg(0))
	}
	if cfg.Address != "" && len(serverArgs) > 0 {
		return cfg, false, errors.New("--server-arg: only applies when the anchor starts the server (no --address)")
	}
	cfg.Chains, cfg.ServerArgs = chains, serverArgs
	if cfg.ModuleDir, err = os.Getwd(); err != nil {
		return cfg, false, fmt.Errorf("working directory: %w", err)
	}
	return cfg, asJSON, cfg.Validate()
}

// intList is a comma-separated list of integers flag.
type intList []int

func (l *intList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, n := range *l {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func (l *intList) Set(v string) error {
	*l = nil
	for f := range strings.SplitSeq(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return fmt.Errorf("%q is not an integer", f)
		}
		*l = append(*l, n)
	}
	return nil
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, " ")
}

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// WriteText prints the result as a table for people, after a header naming
// the server and the tuning.
func (r *Result) WriteText(w io.Writer) error {
	how := "at " + r.Server.Address
	if r.Server.Started {
		how = fmt.Sprintf("dev server started by the anchor at %s, Temporal CLI %s", r.Server.Address, r.Server.CLIVersion)
	}
	fmt.Fprintf(w, "Temporal server %s (%s), Go SDK %s\n", r.Server.Version, how, r.SDKVersion)
	if r.Server.Started {
		fmt.Fprintf(w, "server: temporal %s\n", strings.Join(r.Server.Args, " "))
	}
	fmt.Fprintf(w, "tuning: one task queue (%s) for workflows and activities; worker eager activities on, up to %d per workflow task",
		r.Tuning.TaskQueue, r.Tuning.MaxEagerPerWorkflowTask)
	if len(r.Tuning.DynamicConfig) > 0 {
		fmt.Fprintf(w, "; dynamic config %s", strings.Join(r.Tuning.DynamicConfig, " "))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, s Stat, unit, extra string) {
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\t%s\t%s\t\n", name, s.Min, s.Median, s.Max, unit, extra)
	}
	fmt.Fprintf(tw, "figure\tmin\tmedian\tmax\tunit\t\t\n")
	for _, c := range r.Chains {
		note := fmt.Sprintf("%d reps of %d workflows; %s", len(c.PerStepMs.Samples), c.WorkflowsPerRep, eagerNote(c.EagerActivities, c.Activities))
		row(fmt.Sprintf("temporal chain %d: per step", c.Steps), c.PerStepMs, "ms", note)
		row(fmt.Sprintf("temporal chain %d: per step e2e", c.Steps), c.E2EPerStepMs, "ms", "")
	}
	if t := r.Throughput; t != nil {
		name := fmt.Sprintf("temporal throughput: %d workflows × %d activities, %d in flight", t.Runs, t.ActivitiesPerRun, t.InFlight)
		row(name, t.ActivitiesPerSec, "activities/s", fmt.Sprintf("%d reps; %s", len(t.ActivitiesPerSec.Samples), eagerNote(t.EagerActivities, t.Activities)))
		row("temporal throughput: workflows", t.WorkflowsPerSec, "workflows/s", "")
	}
	return tw.Flush()
}

func eagerNote(eager *int, total int) string {
	if eager == nil {
		return fmt.Sprintf("%d activities, eager not counted", total)
	}
	return fmt.Sprintf("%d of %d activities eager", *eager, total)
}
