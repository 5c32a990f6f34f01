// Package bench measures planex against the wire it runs on, for `planex
// bench`: on one NATS server (embedded, or a deployed cluster's) it
// measures the raw JetStream two-hop floor (work-queue publish → consume →
// publish a reply → consume), then runs a supervisor replica, a no-op
// executor pool (the real executor runtime) and a scripted planner in this
// process, and measures the engine's cost per step on chains, its
// throughput on concurrent fanned-out runs, and what runs waiting at
// approval gates cost (RSS, CPU, ListRuns' first page).
//
// It lives under cmd/ because it starts services in process (internal/
// never imports services/).
package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/supervisor"
	"github.com/planex-dev/planex/services/supervisor/api"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

// Config selects what to measure.
type Config struct {
	// NATSURL is the NATS server to measure on; empty starts an embedded
	// one (file storage in a temporary directory) for the bench.
	NATSURL string
	// Reps is how many times each figure is measured (min/median/max).
	Reps int
	// FloorTrips is the number of sequential two-hop round trips averaged
	// in one repetition of the floor, and of steps (in whole runs) in one
	// repetition of a chain.
	FloorTrips int
	// Chains are the lengths of the no-op chains whose per-step cost is
	// measured.
	Chains []int
	// WarmupSteps is how many steps of each chain length run before it is
	// measured, in whole runs and at least one (the floor warms up with
	// floorWarmup round trips).
	WarmupSteps int
	// Runs is the number of concurrent runs of the throughput figure.
	Runs int
	// FanOut is the number of parallel steps after the root step of each
	// throughput run.
	FanOut int
	// Waiting is the number of runs parked at an approval gate for the
	// resource figure (0 skips it).
	Waiting int
	// Parked measures the runs an earlier bench left waiting (KeepWaiting)
	// in the NATS server at NATSURL instead of starting Waiting new ones:
	// a restart with a million runs waiting without parking them again.
	Parked bool
	// KeepWaiting leaves the waiting runs waiting when the bench ends,
	// for a later Parked bench (default: they are cancelled).
	KeepWaiting bool
	// Idle is how long CPU is sampled while the runs wait.
	Idle time.Duration
	// Settle is how long the waiting runs are left alone before sampling
	// (default 12s: every run's start guard fires 10 s after StartRun).
	Settle time.Duration
	// MaxBytes is the size budget of the planex streams and buckets, as
	// the services' --jetstream-max-bytes (0: bus.DefaultMaxBytes, 1 GiB,
	// which holds about 140,000 waiting runs' snapshots).
	MaxBytes int64
	// HoldTimers is the supervisor's --hold-timers: on NATS 2.12+ the
	// waiting runs' deadlines are message schedules in PLANEX_TIMERS
	// rather than pending deliveries of the timers consumer.
	HoldTimers bool
	// SweepInterval is the supervisor's sweep for stranded runs (0: the
	// engine's default, a minute, as deployed; negative: none).
	SweepInterval time.Duration
	// EngineWorkers and PoolConcurrency size the supervisor and the pool.
	EngineWorkers, PoolConcurrency int
	// Supervisors is how many supervisor replicas the bench runs (default
	// 1), each on its own NATS connection, sharing the engine's consumers
	// as deployed replicas do; the throughput figure's runs are started
	// through them in turn.
	Supervisors int
	// Replicas is the planex streams' and the floor's replicas (default
	// 1; 3 on a 3-node cluster), as the services' --stream-replicas.
	Replicas int
	// HeapProfile, when set, is the file a heap profile of this process is
	// written to while the waiting runs wait (after a GC).
	HeapProfile string
	// Logger receives the services' logs (nil: discarded).
	Logger *slog.Logger
	// Progress, when set, receives one line per phase.
	Progress func(format string, args ...any)
}

// Validate checks the configuration, naming the flag at fault.
func (c Config) Validate() error {
	var errs []error
	if c.Reps < 1 {
		errs = append(errs, fmt.Errorf("--reps %d: must be positive", c.Reps))
	}
	if c.FloorTrips < 1 {
		errs = append(errs, fmt.Errorf("--floor-trips %d: must be positive", c.FloorTrips))
	}
	for _, n := range c.Chains {
		if n < 1 || n > 100_000 {
			errs = append(errs, fmt.Errorf("--chains %d: want 1 to 100000", n))
		}
	}
	if c.WarmupSteps < 0 {
		errs = append(errs, fmt.Errorf("--warmup-steps %d: must not be negative", c.WarmupSteps))
	}
	if c.Runs < 0 {
		errs = append(errs, fmt.Errorf("--runs %d: must not be negative", c.Runs))
	}
	if c.FanOut < 1 || c.FanOut > 64 {
		errs = append(errs, fmt.Errorf("--fan-out %d: want 1 to 64", c.FanOut))
	}
	if c.Waiting < 0 {
		errs = append(errs, fmt.Errorf("--waiting %d: must not be negative", c.Waiting))
	}
	if (c.Parked || c.KeepWaiting) && c.NATSURL == "" {
		errs = append(errs, errors.New("--parked and --keep-waiting need --nats-url: the embedded server's store is deleted when the bench ends"))
	}
	if c.Parked && c.Waiting == 0 {
		errs = append(errs, errors.New("--parked: set --waiting to how many runs an earlier bench left waiting"))
	}
	if c.Supervisors < 0 || c.Supervisors > 8 {
		errs = append(errs, fmt.Errorf("--supervisors %d: want 1 to 8", c.Supervisors))
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("--stream-replicas %d: want 1 to 5", c.Replicas))
	}
	if c.EngineWorkers < 1 || c.PoolConcurrency < 1 {
		errs = append(errs, fmt.Errorf("--engine-workers %d, --pool-concurrency %d: must be positive", c.EngineWorkers, c.PoolConcurrency))
	}
	return errors.Join(errs...)
}

// Percentiles summarizes many samples of one latency, in milliseconds.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// percentilesOf summarizes samples (nil when there are none): the
// nearest-rank percentiles.
func percentilesOf(samples []float64) *Percentiles {
	if len(samples) == 0 {
		return nil
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return &Percentiles{N: len(s), P50: rank(0.5), P90: rank(0.9), P99: rank(0.99), Max: s[len(s)-1]}
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

// Result is everything one bench measured.
type Result struct {
	// NATS names the server measured on ("embedded" or its URL).
	NATS string `json:"nats"`
	// FloorMs is the JetStream two-hop round trip, in milliseconds, over
	// every repetition measured (one before each repetition of a chain).
	FloorMs Stat `json:"floor_two_hop_ms"`
	// Chains are the per-step costs of no-op chains.
	Chains []ChainResult `json:"chains"`
	// FirstStep is the time from calling StartRun to the run's first step
	// dispatched (the scripted planner answering in process, as a
	// playbook does), over every unwatched chain run (nil: no chain).
	FirstStep *Percentiles `json:"first_step,omitempty"`
	// Throughput is the concurrent fanned-out runs figure (nil: skipped).
	Throughput *ThroughputResult `json:"throughput,omitempty"`
	// Waiting is the resource figure of runs waiting at gates (nil:
	// skipped).
	Waiting *WaitingResult `json:"waiting,omitempty"`
}

// ChainResult is the cost per step of a chain of no-op steps, measured on
// the run log's timestamps from the first StepDispatched to the last
// StepSucceeded, divided by the chain's length.
type ChainResult struct {
	Steps int `json:"steps"`
	// RunsPerRep is the number of runs of each kind in a repetition: as
	// many steps as a repetition of the floor has round trips, in whole
	// runs (at least one).
	RunsPerRep int `json:"runs_per_rep"`
	// PerStepMs is measured on runs nobody watches while they run, like
	// the floor; a repetition is the mean over its runs' steps.
	PerStepMs Stat `json:"per_step_ms"`
	// WatchedPerStepMs is measured on runs a client follows live with
	// WatchRun (in this process, on the same cores).
	WatchedPerStepMs Stat `json:"watched_per_step_ms"`
	// E2EPerStepMs includes StartRun, planning and following the run.
	E2EPerStepMs Stat `json:"e2e_per_step_ms"`
	// FloorMs is the floor measured right before each repetition of this
	// chain.
	FloorMs Stat `json:"floor_two_hop_ms"`
	// FloorRatio is the median per-step cost over the median of FloorMs.
	FloorRatio float64 `json:"floor_ratio"`
	// WatchedFloorRatio is the median watched per-step cost over the
	// median of FloorMs.
	WatchedFloorRatio float64 `json:"watched_floor_ratio"`
}

// ThroughputResult is the rate of no-op steps of Runs concurrent runs,
// each a root step then FanOut parallel steps, from the first StartRun to
// the last run finished.
type ThroughputResult struct {
	Runs        int  `json:"runs"`
	StepsPerRun int  `json:"steps_per_run"`
	StepsPerSec Stat `json:"steps_per_sec"`
}

// WaitingResult is what runs parked at an approval gate cost the process
// (NATS included when embedded).
type WaitingResult struct {
	Runs int `json:"runs"`
	// RSSMiB is the resident set of this process after a GC that returns
	// freed memory to the OS.
	RSSMiB float64 `json:"rss_mib"`
	// HeapMiB is the Go heap in use at the same time (services and, when
	// embedded, NATS): the rest of RSS is the runtime, stacks and the
	// memory-mapped store.
	HeapMiB float64 `json:"heap_mib"`
	// BaselineRSSMiB is the resident set before the runs were started.
	BaselineRSSMiB float64 `json:"baseline_rss_mib"`
	// CPUPercent is the CPU used while the runs waited (100 = one core).
	CPUPercent float64 `json:"cpu_percent"`
	// Goroutines is the number of goroutines while the runs wait.
	Goroutines int `json:"goroutines"`
	// ListRunsMs is the latency of ListRuns' first page (50 runs).
	ListRunsMs Stat `json:"list_runs_first_page_ms"`
	// StartSeconds is how long starting all runs and seeing them wait
	// took.
	StartSeconds float64 `json:"start_seconds"`
	// RestartSeconds is how long a new supervisor replica, started after
	// this one stopped, took to return from Start (consumers created, API
	// registered), and IndexedSeconds until its run index had loaded
	// every waiting run (what ListRuns and the sweeper read).
	RestartSeconds float64 `json:"restart_seconds"`
	IndexedSeconds float64 `json:"restart_indexed_seconds"`
	// RestartListRunsMs is ListRuns' first page right after the index
	// of the restarted replica loaded.
	RestartListRunsMs float64 `json:"restart_list_runs_ms"`
	// StopSeconds is how long stopping the replica took (the engine
	// drained, and the run index's checkpoint written).
	StopSeconds float64 `json:"stop_seconds"`
	// IndexedRuns is how many runs the restarted replica's index held,
	// FromCheckpoint how many of them it read from the run index's
	// checkpoint and CheckpointSeconds how long that took (the rest of
	// IndexedSeconds replayed planex-runs after it; 0: every snapshot
	// was read).
	IndexedRuns       int     `json:"restart_indexed_runs"`
	FromCheckpoint    int     `json:"restart_from_checkpoint"`
	CheckpointSeconds float64 `json:"restart_checkpoint_seconds"`
	// FirstIndexedSeconds, with Parked, is how long the first replica's
	// index took to load (from Start), and FirstFromCheckpoint how many
	// runs it read from a checkpoint.
	FirstIndexedSeconds float64 `json:"first_indexed_seconds,omitempty"`
	FirstFromCheckpoint int     `json:"first_from_checkpoint,omitempty"`
}

// Run measures everything cfg asks for.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, ...any) {}
	}
	res := &Result{NATS: cfg.NATSURL}
	url := cfg.NATSURL
	if url == "" {
		res.NATS = "embedded"
		ns, stop, err := embeddedNATS()
		if err != nil {
			return nil, err
		}
		defer stop()
		url = ns.ClientURL()
	}
	debug.FreeOSMemory()
	baseRSS := rssMiB()

	floor, err := openFloor(ctx, url, cfg.Replicas)
	if err != nil {
		return nil, err
	}
	defer floor.close()

	st, err := startStack(ctx, url, cfg)
	if err != nil {
		return nil, err
	}
	defer st.close()

	var floorSamples []float64
	for _, n := range cfg.Chains {
		// A repetition takes as many steps as the floor's takes round
		// trips, in whole runs.
		runs := max(1, (cfg.FloorTrips+n-1)/n)
		cfg.Progress("chain of %d steps: %d repetitions of %d two-hop round trips of the floor, %d runs alone, %d runs watched", n, cfg.Reps, cfg.FloorTrips, runs, runs)
		cr, err := st.chain(ctx, n, cfg.Reps, max(1, (cfg.WarmupSteps+n-1)/n), runs, func() (float64, error) {
			return floor.measure(ctx, cfg.FloorTrips)
		})
		if err != nil {
			return nil, err
		}
		if cr.FloorMs.Median > 0 {
			cr.FloorRatio = cr.PerStepMs.Median / cr.FloorMs.Median
			cr.WatchedFloorRatio = cr.WatchedPerStepMs.Median / cr.FloorMs.Median
		}
		floorSamples = append(floorSamples, cr.FloorMs.Samples...)
		res.Chains = append(res.Chains, cr)
	}
	if len(floorSamples) == 0 {
		cfg.Progress("floor: %d repetitions of %d two-hop round trips", cfg.Reps, cfg.FloorTrips)
		for range cfg.Reps {
			v, err := floor.measure(ctx, cfg.FloorTrips)
			if err != nil {
				return nil, err
			}
			floorSamples = append(floorSamples, v)
		}
	}
	res.FloorMs = statOf(floorSamples)
	res.FirstStep = percentilesOf(st.firstStep)
	floor.close() // before the throughput and waiting figures

	if cfg.Runs > 0 {
		cfg.Progress("throughput: %d concurrent runs of 1+%d steps × %d", cfg.Runs, cfg.FanOut, cfg.Reps)
		tr, err := st.throughput(ctx, cfg.Runs, cfg.FanOut, cfg.Reps)
		if err != nil {
			return nil, err
		}
		res.Throughput = tr
	}
	if cfg.Waiting > 0 {
		cfg.Progress("waiting: %d runs at an approval gate", cfg.Waiting)
		settle := cfg.Settle
		if settle <= 0 {
			settle = 12 * time.Second
		}
		wr, err := st.waiting(ctx, cfg, settle)
		if err != nil {
			return nil, err
		}
		wr.BaselineRSSMiB = baseRSS
		res.Waiting = wr
		if cfg.NATSURL != "" && !cfg.KeepWaiting && !cfg.Parked {
			cfg.Progress("waiting: cancelling the %d runs", cfg.Waiting)
			if err := st.cancelAll(ctx); err != nil {
				return nil, err
			}
		}
	}
	return res, nil
}

// embeddedNATS starts a JetStream server on a loopback port with its
// store in a temporary directory, removed by stop.
func embeddedNATS() (*server.Server, func(), error) {
	dir, err := os.MkdirTemp("", "planex-bench-")
	if err != nil {
		return nil, nil, fmt.Errorf("bench store: %w", err)
	}
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("embedded NATS: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		_ = os.RemoveAll(dir)
		return nil, nil, errors.New("embedded NATS: not ready within 10s")
	}
	return ns, func() {
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}, nil
}

// benchPool is the executor pool of the bench's no-op tool.
const (
	benchPool = "bench"
	benchTool = "bench.noop"
)

// stack is a supervisor replica, a no-op pool and a scripted planner in
// this process, each on its own NATS connection.
type stack struct {
	client planexv1.SupervisorServiceClient
	// clients are every replica's (Config.Supervisors), client the last.
	clients []planexv1.SupervisorServiceClient
	// observer is the bench's own NATS connection, on which it sees runs
	// end without watching them.
	observer *nats.Conn
	closers  []func()
	// firstStep are the times in milliseconds from calling StartRun to the
	// first step's dispatch of every run runQuiet measured.
	firstStep []float64
	// connect opens a NATS connection and its resources, closed with the
	// stack.
	connect func(name string) (*bus.Resources, error)
	// stopSupervisor stops the supervisor replica (restart).
	stopSupervisor func()
	// indexed receives the replica's run index once loaded.
	indexed chan supervisor.IndexLoaded
	// waitingIDs are the runs the waiting figure parked.
	waitingIDs []string
}

// startSupervisor starts a supervisor replica on a NATS connection of its
// own, serving gRPC on a loopback port that s.client calls.
func (s *stack) startSupervisor(ctx context.Context, cfg Config) error {
	var closers []func()
	stopAll := func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}
	supRes, err := s.connect("supervisor")
	if err != nil {
		return err
	}
	limits := engine.DefaultLimits()
	limits.Ceiling.MaxSteps = 1_000_000
	pl := plan.DefaultLimits()
	pl.MaxSteps = 100_000
	pl.MaxPlanBytes = 64 << 20
	gs := grpc.NewServer()
	indexed := make(chan supervisor.IndexLoaded, 1)
	s.indexed = indexed
	stop, err := supervisor.Start(ctx, supervisor.Components{
		Bus: supRes, Logger: cfg.Logger, Planner: scriptedPlanner{}, GRPC: gs,
		Engine: engine.Config{
			Workers: cfg.EngineWorkers, Limits: limits, PlanLimits: pl, SweepInterval: cfg.SweepInterval,
		},
		API:              api.Config{Limits: limits},
		OnIndexed:        func(il supervisor.IndexLoaded) { indexed <- il },
		IndexCheckpoints: true, // as --index-checkpoints (the embedded server grants everything)
	})
	if err != nil {
		return err
	}
	closers = append(closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = stop(sctx)
		supRes.JS.Conn().Close()
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		stopAll()
		return fmt.Errorf("bench supervisor listener: %w", err)
	}
	go func() { _ = gs.Serve(lis) }()
	closers = append(closers, gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stopAll()
		return fmt.Errorf("bench supervisor client: %w", err)
	}
	closers = append(closers, func() { _ = conn.Close() })
	s.client = planexv1.NewSupervisorServiceClient(conn)
	var once sync.Once
	s.stopSupervisor = func() { once.Do(stopAll) }
	s.closers = append(s.closers, s.stopSupervisor)
	return nil
}

func (s *stack) close() {
	for _, c := range slices.Backward(s.closers) {
		c()
	}
}

func startStack(ctx context.Context, url string, cfg Config) (_ *stack, err error) {
	s := &stack{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	connect := func(name string) (*bus.Resources, error) {
		nc, err := nats.Connect(url, nats.Name("planex-bench-"+name), nats.MaxReconnects(-1))
		if err != nil {
			return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
		}
		s.closers = append(s.closers, nc.Close)
		return bus.Setup(ctx, nc, bus.Options{MaxBytes: cfg.MaxBytes, HoldTimers: cfg.HoldTimers, Replicas: cfg.Replicas})
	}

	s.observer, err = nats.Connect(url, nats.Name("planex-bench-observer"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	s.closers = append(s.closers, s.observer.Close)

	poolRes, err := connect("pool")
	if err != nil {
		return nil, err
	}
	noop := runner.NewTool(&planexv1.ToolSpec{
		Name: benchTool, Pool: benchPool, Description: "does nothing and returns {}",
		SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ, Idempotent: true,
	}, func(context.Context, runner.Call) (any, error) { return map[string]any{}, nil })
	r, err := runner.New(poolRes, runner.Options{
		Pool: benchPool, Tools: []runner.Tool{noop}, Concurrency: cfg.PoolConcurrency, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	pctx, cancelPool := context.WithCancel(context.WithoutCancel(ctx))
	if err := r.Start(pctx); err != nil {
		cancelPool()
		return nil, fmt.Errorf("start bench pool: %w", err)
	}
	s.closers = append(s.closers, func() {
		cancelPool()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
	})

	s.connect = connect
	for range max(cfg.Supervisors, 1) {
		if err := s.startSupervisor(ctx, cfg); err != nil {
			return nil, err
		}
		s.clients = append(s.clients, s.client)
	}

	// The supervisor's catalog must list the pool's tool before a plan
	// using it validates.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := s.client.ListTools(ctx, &planexv1.ListToolsRequest{})
		if err == nil && slices.ContainsFunc(resp.GetTools(), func(t *planexv1.RegisteredTool) bool { return t.GetSpec().GetName() == benchTool }) {
			return s, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("tool %s not in the supervisor's catalog within 30s (last error: %v)", benchTool, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
