package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/planex-dev/planex/cmd/internal/bench"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/telemetry"
)

func benchCmd() *cobra.Command {
	cfg := bench.Config{}
	var (
		asJSON     bool
		cpuProfile string
		logLevel   string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the engine against the JetStream floor: per-step cost, throughput, waiting runs",
		Long: `bench measures, on one NATS server (an embedded one by default, or --nats-url),
the JetStream two-hop floor (work-queue publish → consume → publish a reply →
consume), then starts a supervisor replica, a no-op executor pool and a
scripted planner in this process and measures the cost per step of chains of
no-op steps, the throughput of concurrent fanned-out runs, and the RSS, CPU
and ListRuns latency with runs waiting at approval gates. Each figure is
printed with its min/median/max over --reps repetitions. A repetition of the
floor is measured right before each repetition of each chain, and a chain's
planex/floor is over the floor measured alongside it. A chain's per-step
cost is measured on a run nobody watches (like the floor) and on one a
client follows with WatchRun; the time from calling StartRun to each
unwatched run's first step dispatched is reported as p50/p90/p99. See
docs/performance.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return usageError(cmd, "%v", err)
			}
			// As the services log: run_id and step_id from the context,
			// secrets redacted.
			logger, err := telemetry.NewLogger(cmd.ErrOrStderr(), logLevel, "text", nil)
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			cfg.Logger = logger
			if !asJSON {
				cfg.Progress = func(format string, args ...any) {
					fmt.Fprintf(cmd.ErrOrStderr(), "bench: "+format+"\n", args...)
				}
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return fmt.Errorf("--cpu-profile %q: %w", cpuProfile, err)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("--cpu-profile %q: %w", cpuProfile, err)
				}
				defer pprof.StopCPUProfile()
			}
			res, err := bench.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			return res.WriteText(cmd.OutOrStdout())
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&cfg.NATSURL, "nats-url", "", "NATS server to measure on (empty: an embedded server with file storage in a temporary directory)")
	fs.IntVar(&cfg.Reps, "reps", 5, "repetitions of each figure (min/median/max)")
	fs.IntVar(&cfg.FloorTrips, "floor-trips", 200, "sequential two-hop round trips per repetition of the floor, and steps per repetition of a chain (in whole runs)")
	fs.IntSliceVar(&cfg.Chains, "chains", []int{10, 100, 1000}, "lengths of the no-op chains measured")
	fs.IntVar(&cfg.WarmupSteps, "warmup-steps", 50, "steps run (in whole runs, at least one) before each chain length is measured, as the floor warms up with 50 round trips")
	fs.IntVar(&cfg.Runs, "runs", 200, "concurrent runs of the throughput figure (0: skip)")
	fs.IntVar(&cfg.FanOut, "fan-out", 8, "parallel steps after the root step of each throughput run")
	fs.IntVar(&cfg.Waiting, "waiting", 1000, "runs parked at an approval gate for the resource figure (0: skip)")
	fs.BoolVar(&cfg.Parked, "parked", false, "measure the --waiting runs an earlier bench left waiting (--keep-waiting) at --nats-url instead of starting new ones: a restart with a million waiting without parking them again")
	fs.BoolVar(&cfg.KeepWaiting, "keep-waiting", false, "leave the waiting runs waiting at --nats-url when the bench ends (default: cancelled), for a later --parked bench")
	fs.DurationVar(&cfg.Settle, "settle", 12*time.Second, "how long the waiting runs are left alone before they are measured (every run's start guard fires 10 s after its StartRun; the run index's first checkpoint is written a minute after it loaded)")
	fs.DurationVar(&cfg.Idle, "idle", 5*time.Second, "how long CPU is sampled while the runs wait")
	fs.BoolVar(&cfg.HoldTimers, "hold-timers", false, "as the supervisor's flag: on NATS 2.12+ hold the waiting runs' deadlines as message schedules in PLANEX_TIMERS instead of parking them in the timers consumer")
	fs.Var(&bytesFlag{v: &cfg.MaxBytes}, "jetstream-max-bytes", "size budget of the planex streams and buckets, as the services' flag (default 1GiB; a million waiting runs need about 8GiB)")
	fs.DurationVar(&cfg.SweepInterval, "sweep-interval", 0, "the supervisor's sweep for stranded runs (0: the default, a minute; negative: none)")
	fs.IntVar(&cfg.Supervisors, "supervisors", 1, "supervisor replicas the bench runs, sharing the engine's consumers as deployed replicas do (the throughput figure's runs are started through each in turn)")
	fs.IntVar(&cfg.Replicas, "stream-replicas", 1, "replicas of the planex streams and the floor's stream (3 against a 3-node cluster given in --nats-url)")
	fs.IntVar(&cfg.EngineWorkers, "engine-workers", 32, "engine workers of the bench's supervisor")
	fs.IntVar(&cfg.PoolConcurrency, "pool-concurrency", 32, "concurrency of the bench's no-op pool")
	fs.BoolVar(&asJSON, "json", false, "print the result as JSON")
	fs.StringVar(&cfg.HeapProfile, "heap-profile", "", "write a heap profile of this process (NATS included when embedded) while the waiting runs wait, and its goroutines to the same path with .goroutines")
	fs.StringVar(&logLevel, "log-level", "warn", "level of the services' logs on stderr (debug, info, warn, error): debug shows the engine's consumers' missed heartbeats and lost pulls")
	fs.StringVar(&cpuProfile, "cpu-profile", "", "write a CPU profile of the whole bench (NATS included when embedded) to this file")
	return cmd
}

// bytesFlag is a size flag such as 8GiB (bus.ParseBytes).
type bytesFlag struct{ v *int64 }

func (f *bytesFlag) String() string {
	if f.v == nil || *f.v == 0 {
		return ""
	}
	return strconv.FormatInt(*f.v, 10)
}

func (f *bytesFlag) Set(s string) error {
	n, err := bus.ParseBytes(s)
	if err != nil {
		return err
	}
	*f.v = n
	return nil
}

func (f *bytesFlag) Type() string { return "bytes" }
