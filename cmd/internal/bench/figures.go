package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// scriptedPlanner answers the bench's goals without a model:
// "bench chain N" (N no-op steps, each depending on the previous one),
// "bench fan F" (a root step, then F parallel steps depending on it) and
// "bench gate" (one step waiting for approval).
type scriptedPlanner struct{}

func (scriptedPlanner) Plan(_ context.Context, req *planexv1.PlanRequest, _ ...grpc.CallOption) (*planexv1.PlanResponse, error) {
	f := strings.Fields(req.GetGoal())
	if len(f) < 2 || f[0] != "bench" {
		return nil, fmt.Errorf("bench planner: unknown goal %q", req.GetGoal())
	}
	n := 0
	if len(f) == 3 {
		var err error
		if n, err = strconv.Atoi(f[2]); err != nil {
			return nil, fmt.Errorf("bench planner: goal %q: %w", req.GetGoal(), err)
		}
	}
	var steps []*planexv1.Step
	switch f[1] {
	case "chain":
		for i := range n {
			s := &planexv1.Step{Id: "s" + strconv.Itoa(i), Tool: benchTool}
			if i > 0 {
				s.DependsOn = []string{"s" + strconv.Itoa(i-1)}
			}
			steps = append(steps, s)
		}
	case "fan":
		steps = append(steps, &planexv1.Step{Id: "root", Tool: benchTool})
		for i := range n {
			steps = append(steps, &planexv1.Step{Id: "f" + strconv.Itoa(i), Tool: benchTool, DependsOn: []string{"root"}})
		}
	case "gate":
		steps = append(steps, &planexv1.Step{Id: "approve", Tool: benchTool, RequiresApproval: true})
	default:
		return nil, fmt.Errorf("bench planner: unknown goal %q", req.GetGoal())
	}
	return &planexv1.PlanResponse{
		Plan:    &planexv1.Plan{Steps: steps, Confidence: 1, Rationale: "bench"},
		Usage:   &planexv1.TokenUsage{},
		Backend: "bench",
	}, nil
}

// runOnce starts a run of goal and follows it to its end, returning its
// events.
func (s *stack) runOnce(ctx context.Context, goal string, budget *planexv1.Budget) ([]*planexv1.RunEvent, error) {
	resp, err := s.client.StartRun(ctx, &planexv1.StartRunRequest{Goal: goal, Budget: budget})
	if err != nil {
		return nil, fmt.Errorf("StartRun %q: %w", goal, err)
	}
	return s.follow(ctx, resp.GetRun().GetId())
}

// follow reads a run's events to its end with WatchRun, resuming after
// the last event received when the stream breaks (a loaded machine may
// miss a consumer heartbeat).
func (s *stack) follow(ctx context.Context, id string) ([]*planexv1.RunEvent, error) {
	var evs []*planexv1.RunEvent
	var lastErr error
	for range 5 {
		from := uint64(len(evs)) + 1
		err := s.watch(ctx, id, from, func(ev *planexv1.RunEvent) { evs = append(evs, ev) })
		if err == nil {
			break
		}
		lastErr = err
		if ctx.Err() != nil {
			return nil, err
		}
	}
	if len(evs) == 0 || evs[len(evs)-1].GetFinished() == nil {
		return nil, fmt.Errorf("run %s: watch ended before RunFinished: %w", id, lastErr)
	}
	if fin := evs[len(evs)-1].GetFinished(); fin.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		return nil, fmt.Errorf("run %s: %s %s %q", id, fin.GetStatus(), fin.GetStopReason(), fin.GetMessage())
	}
	return evs, nil
}

func (s *stack) watch(ctx context.Context, id string, from uint64, fn func(*planexv1.RunEvent)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: id, FromSequence: from})
	if err != nil {
		return fmt.Errorf("WatchRun %s: %w", id, err)
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("WatchRun %s: %w", id, err)
		}
		if resp.GetEvent().GetSequence() != from {
			return fmt.Errorf("WatchRun %s: event %d, want %d", id, resp.GetEvent().GetSequence(), from)
		}
		from++
		fn(resp.GetEvent())
	}
}

// chain measures chains of n no-op steps: warmup runs, then reps
// repetitions, each a repetition of the floor (measured by floor) followed
// by runs runs left alone until they end (runQuiet: their per-step cost is
// the engine's, like the floor, which nobody watches), then runs runs
// followed live with WatchRun, as a client following a run does (their
// per-step cost includes what the watch takes from the same machine, and
// their e2e cost StartRun, planning and following). A repetition's figure
// is the mean over its runs' steps, as the floor's is over its round
// trips.
func (s *stack) chain(ctx context.Context, n, reps, warmup, runs int, floor func() (float64, error)) (ChainResult, error) {
	budget := &planexv1.Budget{MaxSteps: int32(n), MaxParallelism: 1, Deadline: durationpb.New(time.Hour)}
	goal := fmt.Sprintf("bench chain %d", n)
	for range warmup {
		if _, err := s.runOnce(ctx, goal, budget); err != nil {
			return ChainResult{}, err
		}
	}
	steps := float64(n * runs)
	var floors, perStep, watched, e2e []float64
	for range reps {
		f, err := floor()
		if err != nil {
			return ChainResult{}, err
		}
		floors = append(floors, f)
		var quiet, followed, elapsed float64
		for range runs {
			_, span, err := s.runQuiet(ctx, goal, budget)
			if err != nil {
				return ChainResult{}, err
			}
			quiet += span
		}
		for range runs {
			start := time.Now()
			evs, err := s.runOnce(ctx, goal, budget)
			if err != nil {
				return ChainResult{}, err
			}
			elapsed += ms(time.Since(start))
			followed += stepSpan(evs)
		}
		perStep = append(perStep, quiet/steps)
		watched = append(watched, followed/steps)
		e2e = append(e2e, elapsed/steps)
	}
	return ChainResult{Steps: n, RunsPerRep: runs, FloorMs: statOf(floors), PerStepMs: statOf(perStep), WatchedPerStepMs: statOf(watched), E2EPerStepMs: statOf(e2e)}, nil
}

// stepSpan is the time in milliseconds from a run's first StepDispatched
// to its last StepSucceeded, on the run log's timestamps.
func stepSpan(evs []*planexv1.RunEvent) float64 {
	var first, last time.Time
	for _, ev := range evs {
		if ev.GetStepDispatched() != nil && first.IsZero() {
			first = ev.GetTime().AsTime()
		}
		if ev.GetStepSucceeded() != nil {
			last = ev.GetTime().AsTime()
		}
	}
	return ms(last.Sub(first))
}

// runQuiet starts a run of goal, waits for its end without watching it,
// and returns its id and the time in milliseconds from its first StepDispatched to
// its last StepSucceeded (and records, in s.firstStep, the time from
// calling StartRun to that first dispatch), from its state (GetRun: the steps' dispatch and
// end are those events' times), which costs less than reading its events
// and leaves less garbage for the next run to collect. The end is seen on
// a plain NATS subscription to the subjects a run's RunFinished can be on
// (a decision that dispatches a step never ends the run, so the step
// dispatches are not delivered to the bench); GetRun every quietPoll
// covers a subscription that missed it (the run ended before the
// subscription was in place, or the bench's credentials may not
// subscribe).
func (s *stack) runQuiet(ctx context.Context, goal string, budget *planexv1.Budget) (id string, span float64, err error) {
	called := time.Now()
	resp, err := s.client.StartRun(ctx, &planexv1.StartRunRequest{Goal: goal, Budget: budget})
	if err != nil {
		return id, 0, fmt.Errorf("StartRun %q: %w", goal, err)
	}
	id = resp.GetRun().GetId()
	run, err := s.awaitQuiet(ctx, id, false)
	if err != nil {
		return id, 0, err
	}
	var first, last time.Time
	for _, st := range run.GetSteps() {
		if at := st.GetDispatchedAt().AsTime(); st.GetDispatchedAt() != nil && (first.IsZero() || at.Before(first)) {
			first = at
		}
		if at := st.GetFinishedAt().AsTime(); st.GetFinishedAt() != nil && at.After(last) {
			last = at
		}
	}
	if first.IsZero() || last.IsZero() {
		return id, 0, fmt.Errorf("run %s: no step dispatched and finished", id)
	}
	s.firstStep = append(s.firstStep, ms(first.Sub(called)))
	return id, ms(last.Sub(first)), nil
}

// awaitQuiet waits for run id to end without watching it (see runQuiet)
// and returns it as GetRun does, or an error if it did not succeed. With
// ended, a run that may have ended already, it asks GetRun once as soon
// as it has subscribed.
func (s *stack) awaitQuiet(ctx context.Context, id string, ended bool) (*planexv1.Run, error) {
	msgs := make(chan *nats.Msg, 64)
	for _, subject := range []string{bus.RunLogSubject(id), bus.EventSubject(id)} {
		sub, err := s.observer.ChanSubscribe(subject, msgs)
		if err != nil {
			return nil, fmt.Errorf("subscribe to %s: %w", subject, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	if err := s.observer.Flush(); err != nil {
		return nil, fmt.Errorf("subscribe to run %s: %w", id, err)
	}
	poll := time.NewTicker(quietPoll)
	defer poll.Stop()
	var run *planexv1.Run
	for run == nil {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-whenTrue(ended):
			ended = false
		case m := <-msgs:
			evs, err := runlog.DecodeEvents(m)
			if err != nil {
				return nil, fmt.Errorf("run %s: %w", id, err)
			}
			if !slices.ContainsFunc(evs, func(ev *planexv1.RunEvent) bool { return ev.GetFinished() != nil }) {
				continue
			}
		case <-poll.C:
		}
		resp, err := s.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
		if err != nil {
			return nil, fmt.Errorf("GetRun %s: %w", id, err)
		}
		if runlog.Terminal(resp.GetRun().GetStatus()) {
			run = resp.GetRun()
		}
	}
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		return nil, fmt.Errorf("run %s: %s %s %q", id, run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
	return run, nil
}

// whenTrue is a closed channel when b, else nil (a select case taken at
// once, or never).
func whenTrue(b bool) <-chan struct{} {
	if !b {
		return nil
	}
	c := make(chan struct{})
	close(c)
	return c
}

// quietPoll is how often runQuiet asks for the state of a run it has not
// seen end.
const quietPoll = time.Second

// throughput starts runs runs of 1+fan steps at once and measures the
// steps finished per second, from before the first StartRun to the last
// run's end (Run.finished_at, the time of its RunFinished). The bench
// sees the runs end without watching them (awaitQuiet): a WatchRun each,
// as before, put an ordered consumer on PLANEX_EVENTS per run beside the
// runs measured, whose scans of the stream were 17 % of the NATS
// server's CPU in a profile of this figure (docs/performance.md).
func (s *stack) throughput(ctx context.Context, runs, fan, reps int) (*ThroughputResult, error) {
	budget := &planexv1.Budget{MaxSteps: int32(fan + 1), MaxParallelism: int32(fan), Deadline: durationpb.New(time.Hour)}
	goal := fmt.Sprintf("bench fan %d", fan)
	var samples []float64
	for range reps {
		start := time.Now()
		ids := make([]string, runs)
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(64)
		for i := range runs {
			g.Go(func() error {
				client := s.client
				if len(s.clients) > 0 {
					client = s.clients[i%len(s.clients)]
				}
				resp, err := client.StartRun(gctx, &planexv1.StartRunRequest{Goal: goal, Budget: budget})
				if err != nil {
					return fmt.Errorf("StartRun %q: %w", goal, err)
				}
				ids[i] = resp.GetRun().GetId()
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return nil, err
		}
		// One run at a time, as the runs finish about together: the
		// bench decodes the log of one run still going, not of all.
		var end time.Time
		for _, id := range ids {
			run, err := s.awaitQuiet(ctx, id, true)
			if err != nil {
				return nil, err
			}
			if run.GetFinishedAt() == nil {
				return nil, fmt.Errorf("run %s: succeeded without finished_at", id)
			}
			if t := run.GetFinishedAt().AsTime(); t.After(end) {
				end = t
			}
		}
		samples = append(samples, float64(runs*(fan+1))/end.Sub(start).Seconds())
	}
	return &ThroughputResult{Runs: runs, StepsPerRun: fan + 1, StepsPerSec: statOf(samples)}, nil
}

// waiting parks cfg.Waiting runs at an approval gate, then measures this
// process's RSS and CPU while they wait, the latency of ListRuns' first
// page, and a restart of the supervisor replica with them waiting. On a
// deployed cluster the runs are cancelled afterwards (cancelAll).
func (s *stack) waiting(ctx context.Context, cfg Config, settle time.Duration) (*WaitingResult, error) {
	k := cfg.Waiting
	if cfg.Parked {
		return s.parked(ctx, cfg, settle)
	}
	budget := &planexv1.Budget{MaxSteps: 1, Deadline: durationpb.New(24 * time.Hour)}
	start := time.Now()
	ids := make([]string, k)
	var next sync.Mutex
	i := 0
	g, gctx := errgroup.WithContext(ctx)
	for range min(k, 64) {
		g.Go(func() error {
			for {
				next.Lock()
				n := i
				i++
				next.Unlock()
				if n >= k {
					return nil
				}
				if n > 0 && n%100_000 == 0 {
					cfg.Progress("waiting: %d runs started (%.0f s)", n, time.Since(start).Seconds())
				}
				resp, err := s.client.StartRun(gctx, &planexv1.StartRunRequest{Goal: "bench gate", Budget: budget})
				if err != nil {
					return fmt.Errorf("StartRun: %w", err)
				}
				ids[n] = resp.GetRun().GetId()
				if err := s.waitStatus(gctx, ids[n], planexv1.RunStatus_RUN_STATUS_WAITING); err != nil {
					return err
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	s.waitingIDs = ids
	wr := &WaitingResult{Runs: k, StartSeconds: time.Since(start).Seconds()}
	// Let the start-up settle — every run's start guard timer fires 10 s
	// after its StartRun — then sample.
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(settle):
	}
	return s.sampleWaiting(ctx, cfg, wr)
}

// parked measures runs an earlier bench left waiting (Config.Parked):
// once this replica's run index has loaded them.
func (s *stack) parked(ctx context.Context, cfg Config, settle time.Duration) (*WaitingResult, error) {
	var il supervisor.IndexLoaded
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case il = <-s.indexed:
	}
	if il.Runs < cfg.Waiting {
		return nil, fmt.Errorf("--parked: the run index holds %d runs, fewer than --waiting %d: park them first (--keep-waiting)", il.Runs, cfg.Waiting)
	}
	cfg.Progress("waiting: %d runs indexed in %.2f s (%d from the checkpoint)", il.Runs, il.Took.Seconds(), il.FromCheckpoint)
	wr := &WaitingResult{Runs: cfg.Waiting, FirstIndexedSeconds: il.Took.Seconds(), FirstFromCheckpoint: il.FromCheckpoint}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(settle):
	}
	return s.sampleWaiting(ctx, cfg, wr)
}

// sampleWaiting measures the waiting runs: this process's RSS and CPU,
// ListRuns' first page, and a restart of the supervisor replica.
func (s *stack) sampleWaiting(ctx context.Context, cfg Config, wr *WaitingResult) (*WaitingResult, error) {
	k := wr.Runs
	// The heap profile is of the state at the last GC but one or two:
	// collect thrice so it shows what stays, not the parking's garbage.
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory() // RSS of live memory, not of garbage not yet returned
	wr.RSSMiB = rssMiB()
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	wr.HeapMiB = float64(mem.HeapInuse) / (1 << 20)
	wr.Goroutines = runtime.NumGoroutine()
	if cfg.HeapProfile != "" {
		if err := writeHeapProfile(cfg.HeapProfile); err != nil {
			return nil, err
		}
	}
	cpu0 := cpuTime()
	t0 := time.Now()
	time.Sleep(cfg.Idle)
	wr.CPUPercent = 100 * (cpuTime() - cpu0).Seconds() / time.Since(t0).Seconds()
	var lat []float64
	for range cfg.Reps {
		t := time.Now()
		resp, err := s.client.ListRuns(ctx, &planexv1.ListRunsRequest{PageSize: 50})
		if err != nil {
			return nil, fmt.Errorf("ListRuns: %w", err)
		}
		lat = append(lat, ms(time.Since(t)))
		if len(resp.GetRuns()) == 0 {
			return nil, errors.New("ListRuns: empty first page")
		}
	}
	wr.ListRunsMs = statOf(lat)
	cfg.Progress("waiting: %d runs started and parked in %.0f s, %.1f MiB RSS (Go heap %.1f MiB, %d goroutines), %.2f %% CPU over %s, ListRuns first page %.1f ms; restarting the supervisor",
		k, wr.StartSeconds, wr.RSSMiB, wr.HeapMiB, wr.Goroutines, wr.CPUPercent, cfg.Idle, wr.ListRunsMs.Median)

	t := time.Now()
	s.stopSupervisor()
	wr.StopSeconds = time.Since(t).Seconds()
	t = time.Now()
	if err := s.startSupervisor(ctx, cfg); err != nil {
		return nil, fmt.Errorf("restart the supervisor: %w", err)
	}
	wr.RestartSeconds = time.Since(t).Seconds()
	var il supervisor.IndexLoaded
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case il = <-s.indexed:
	}
	wr.IndexedSeconds = time.Since(t).Seconds()
	wr.IndexedRuns, wr.FromCheckpoint, wr.CheckpointSeconds = il.Runs, il.FromCheckpoint, il.CheckpointTook.Seconds()
	t = time.Now()
	resp, err := s.client.ListRuns(ctx, &planexv1.ListRunsRequest{PageSize: 50})
	if err != nil {
		return nil, fmt.Errorf("ListRuns after the restart: %w", err)
	}
	wr.RestartListRunsMs = ms(time.Since(t))
	if len(resp.GetRuns()) == 0 {
		return nil, errors.New("ListRuns after the restart: empty first page")
	}
	cfg.Progress("waiting: stopped in %.2f s, restarted in %.2f s, run index of %d runs loaded %.2f s after (%d from the checkpoint in %.2f s), ListRuns first page %.1f ms",
		wr.StopSeconds, wr.RestartSeconds, wr.IndexedRuns, wr.IndexedSeconds, wr.FromCheckpoint, wr.CheckpointSeconds, wr.RestartListRunsMs)
	return wr, nil
}

// cancelAll cancels the runs waiting parked, 64 at a time.
func (s *stack) cancelAll(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for _, id := range s.waitingIDs {
		g.Go(func() error {
			if _, err := s.client.CancelRun(gctx, &planexv1.CancelRunRequest{RunId: id, Reason: "planex bench"}); err != nil {
				return fmt.Errorf("CancelRun %s: %w", id, err)
			}
			return nil
		})
	}
	return g.Wait()
}

func (s *stack) waitStatus(ctx context.Context, id string, want planexv1.RunStatus) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		resp, err := s.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
		if err == nil && resp.GetRun().GetStatus() == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("run %s: not %s within 5 minutes (status %s, err %v)", id, want, resp.GetRun().GetStatus(), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// writeHeapProfile writes this process's heap profile to path, and its
// goroutines (pprof's debug=1 text) to path.goroutines.
func writeHeapProfile(path string) error {
	for _, p := range []struct {
		name, path string
		debug      int
	}{{"heap", path, 0}, {"goroutine", path + ".goroutines", 1}} {
		f, err := os.Create(p.path)
		if err != nil {
			return fmt.Errorf("%s profile %q: %w", p.name, p.path, err)
		}
		if err := pprof.Lookup(p.name).WriteTo(f, p.debug); err != nil {
			_ = f.Close()
			return fmt.Errorf("%s profile %q: %w", p.name, p.path, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("%s profile %q: %w", p.name, p.path, err)
		}
	}
	return nil
}
