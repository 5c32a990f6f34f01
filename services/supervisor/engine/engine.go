// Package engine is the supervisor's run engine. Every replica consumes the
// engine inbox (stream PLANEX_ENGINE, subjects planex.engine.<run>.<kind>)
// through durable consumers shared by all replicas; handling one message is
//
//	load the run (runlog) → decide → append events → perform side effects → ack
//
// Decisions are derived from the run's state, and so are side effects
// (step requests, timers, planning kicks): they are published after the
// events that call for them, with message ids built from run, step and
// attempt, so a crash between append and publish is repaired by the next
// load (which publishes again; the server drops the duplicate) and never
// runs a step twice. Timers are messages too: they are redelivered with
// NakWithDelay until they fire, and so survive restarts. See docs/engine.md.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/internal/warm"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

const instrumentation = "github.com/planex-dev/planex/services/supervisor/engine"

// ConsumerTimers is the durable consumer of timer messages
// (planex.timers.<run>). Timers wait as delayed redeliveries, which count
// against a consumer's MaxAckPending; a consumer of their own, without that
// limit, keeps parked timers from starving step results.
const ConsumerTimers = bus.ConsumerEngine + "-timers"

// inHandPerWorker bounds the engine messages a replica holds in hand
// (handling or waiting for a worker or a run lock) per worker; messages
// waiting for the planner hold one too. A run's messages beyond runInHand
// wait in its queue instead (locks.go).
const inHandPerWorker = 8

// timersPerWorker bounds the timer messages a replica handles at once
// (handling, or waiting for a worker or their run's lock) per worker. A
// timer not due goes back at once, without loading its run; one that is
// due loads it. When many fall due together — the start guards of a burst
// of StartRuns, the deadlines of a million waiting runs — the timers
// consumer's delivery waits for a place, and the rest wait on the server,
// not as goroutines holding their messages here.
const timersPerWorker = 4

// Config tunes an Engine.
type Config struct {
	// Workers bounds the messages handled at once by this replica (a
	// planner call does not hold a worker while it waits).
	Workers int
	// AckWait is how long a message may be handled before it is
	// redelivered to another replica; long handling sends in-progress acks.
	AckWait time.Duration
	// MaxAckPending bounds the unacknowledged engine messages across all
	// replicas (the consumer's setting; keep it equal on every replica).
	// 0 scales it with the replicas: each registers in planex-supervisors
	// with what it may hold (Workers × 16: in hand and queued behind its
	// runs), and the bound is the sum over the live replicas, set at start
	// and re-checked at every renewal of the registration.
	MaxAckPending int
	// ReplicaID names this replica in planex-supervisors (default
	// "<hostname>-<random>").
	ReplicaID string
	// InlineOutputBytes is the largest step output kept inline in the run
	// log; larger outputs go to the planex-outputs object store.
	InlineOutputBytes int
	// PlannerTimeout bounds one planner call.
	PlannerTimeout time.Duration
	// Limits are the budget defaults and ceilings.
	Limits Limits
	// PlanLimits bound the size of a plan.
	PlanLimits plan.Limits
	// Now is the clock (default time.Now).
	Now func() time.Time
	// AutoApprove lists tools whose ToolSpec-level approval is waived.
	AutoApprove []string
	// ScheduleToStartTimeout is how long an attempt may wait in its pool's
	// queue when its step sets no schedule_to_start_timeout; 0 waits for
	// capacity (until the run's deadline).
	ScheduleToStartTimeout time.Duration
	// SweepInterval is how often this replica looks for stranded runs
	// (default 1m; negative disables the sweeper).
	SweepInterval time.Duration
	// StrandedAfter is how long a run may stay without a new event and with
	// no pending work before the sweeper re-drives it (default 5m).
	StrandedAfter time.Duration
	// Signer signs step requests (internal/stepsign); nil publishes them
	// unsigned.
	Signer *stepsign.Signer
	// NoDirectDispatch publishes every step request to PLANEX_STEPS after
	// the decision's append, rather than appending a decision that
	// dispatches one step as that step's request for its pool's consumer
	// on PLANEX_EVENTS (see direct.go).
	NoDirectDispatch bool
	// Guardrails: policies, stall detection and the critic (policy.go,
	// stall.go, critic.go).
	Guardrails
	// Hooks inject faults (tests only).
	Hooks Hooks
	// Tenant is the tenant whose NATS account this engine serves (empty:
	// the default tenant), for logs and metrics.
	Tenant string
	// Admit, when set, is called before each engine message is handled,
	// after the replica's own worker slot is taken; release is called when
	// the handling ends. The supervisor shares one fair scheduler among
	// its tenants' engines through it (services/supervisor/quota), so
	// that one tenant's backlog cannot take every slot.
	Admit func(ctx context.Context) (release func(), err error)
	// PoolLimit, when set, returns how many steps of pool may be
	// dispatched and not finished at once for this tenant (0: no limit);
	// ready steps beyond it wait, in order, and are dispatched as others
	// finish.
	PoolLimit func(pool string) int
	// OnEvents, when set, is called after events of a run are appended
	// (with the run's state after them), for usage accounting; it must
	// not block.
	OnEvents func(ctx context.Context, run *planexv1.Run, events []*planexv1.RunEvent)
	// MeterProvider records the engine's metrics (default: the global
	// provider, which telemetry.Setup sets).
	MeterProvider metric.MeterProvider
}

// Hooks inject faults at points of a message's handling, for crash tests:
// a hook that closes the replica's NATS connection simulates a replica
// killed at that point. Production code leaves them nil.
type Hooks struct {
	// AfterAppend is called after a decision's events were appended to
	// the run log and before its side effects are published.
	AfterAppend func(runID string, events []*planexv1.RunEvent)
	// AfterChildCreate is called after a child run's RunCreated was
	// appended by the side effects of its parent's dispatch, before the
	// child is kicked and the parent's message acknowledged.
	AfterChildCreate func(parentID, childID string)
}

func (c Config) withDefaults() Config {
	if c.Workers <= 0 {
		c.Workers = 32
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxAckPending < 0 {
		c.MaxAckPending = 0
	}
	if c.ReplicaID == "" {
		c.ReplicaID = bus.NewReplicaID("supervisor")
	}
	if c.InlineOutputBytes <= 0 {
		c.InlineOutputBytes = 64 << 10
	}
	if c.PlannerTimeout <= 0 {
		c.PlannerTimeout = 2 * time.Minute
	}
	if c.Limits == (Limits{}) {
		c.Limits = DefaultLimits()
	}
	if c.PlanLimits == (plan.Limits{}) {
		c.PlanLimits = plan.DefaultLimits()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Minute
	}
	if c.StrandedAfter <= 0 {
		c.StrandedAfter = 5 * time.Minute
	}
	return c
}

// Engine advances runs. Create it with New, then Start; Stop drains it.
type Engine struct {
	// workers handle the engine's messages: a warm goroutine's stack has
	// grown already.
	workers   *warm.Pool
	cfg       Config
	res       *bus.Resources
	log       *runlog.Log
	tools     *catalog.Cache
	planner   planexv1.PlannerServiceClient
	logger    *slog.Logger
	tracer    trace.Tracer
	metrics   *metrics
	dupWindow time.Duration
	inbox     jetstream.Stream // PLANEX_ENGINE, read to find pending messages

	locks runLocks
	sem   chan struct{}
	hand  *hand // admits the main consumer's messages (locks.go)
	// timers are the places of timer messages in hand (timersPerWorker).
	timers chan struct{}
	// timersBusy, timersPeak and timersDone count the timer messages
	// being handled, the most at once and those handled (a test reads
	// them).
	timersBusy, timersPeak, timersDone atomic.Int64
	// direct remembers which pools consume their steps from the run logs.
	direct directPools
	// pools holds the tenant's places per pool (Config.PoolLimit).
	pools *poolLimiter
	wg    sync.WaitGroup

	// replicas is this replica's registration when MaxAckPending scales
	// (nil otherwise, or when planex-supervisors could not be opened).
	replicas *replicaSet

	mu        sync.Mutex
	consumes  []*bus.Consumption
	cancel    context.CancelFunc // ends handling (and the lag monitor)
	stopSweep func()             // ends the stranded-run sweeper and waits for it
	stopRenew func()             // ends the registration renewals and waits for them
}

// New returns an engine over the JetStream resources, appending to log and
// calling planner.
func New(ctx context.Context, cfg Config, res *bus.Resources, log *runlog.Log, tools *catalog.Cache, planner planexv1.PlannerServiceClient, logger *slog.Logger) (*Engine, error) {
	cfg = cfg.withDefaults()
	st, err := res.JS.Stream(ctx, bus.StreamSteps)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", bus.StreamSteps, err)
	}
	inbox, err := res.JS.Stream(ctx, bus.StreamEngine)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", bus.StreamEngine, err)
	}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m, err := newMetrics(mp.Meter(instrumentation))
	if err != nil {
		return nil, err
	}
	window := st.CachedInfo().Config.Duplicates
	if window <= 0 {
		window = 2 * time.Minute // the server's default
	}
	e := &Engine{
		workers: warm.New(warm.DefaultIdle, warm.DefaultMaxWaiting),
		cfg:     cfg, res: res, log: log, tools: tools, planner: planner, logger: logger,
		tracer: otel.Tracer(instrumentation), metrics: m, dupWindow: window, inbox: inbox,
		locks: runLocks{m: map[string]*runLock{}}, sem: make(chan struct{}, cfg.Workers),
		hand:   newHand(inHandPerWorker*cfg.Workers, runInHand),
		timers: make(chan struct{}, timersPerWorker*cfg.Workers),
	}
	e.pools = &poolLimiter{e: e}
	return e, nil
}

// ConsumerConfigs are the engine's two durable consumers on PLANEX_ENGINE:
// everything but timers, and timers. Their filters do not overlap, as a
// work-queue stream requires.
func ConsumerConfigs(maxAckPending int, ackWait time.Duration) []jetstream.ConsumerConfig {
	// One filter subject each, so the consumers work on NATS 2.9 servers
	// too (multiple filter subjects need 2.10).
	main := bus.EngineConsumerConfig(maxAckPending, ackWait)
	timers := bus.EngineConsumerConfig(-1, ackWait)
	timers.Durable = ConsumerTimers
	timers.Description = "planex supervisors: run deadlines and step timeouts"
	timers.FilterSubject = bus.EngineSubject("*", bus.KindTimer)
	// Timers first: a stack created by an older layout had its timers
	// consumer filtered inside planex.engine.>, which must move out before
	// the main consumer takes all of planex.engine.> (work-queue filters
	// may not overlap).
	return []jetstream.ConsumerConfig{timers, main}
}

// DueConsumerConfig is the supervisors' durable consumer of the timers
// PLANEX_TIMERS fires (planex.due.<run>), handled like the parked timers
// of ConsumerTimers.
func DueConsumerConfig(ackWait time.Duration) jetstream.ConsumerConfig {
	cfg := bus.EngineConsumerConfig(-1, ackWait)
	cfg.Durable = bus.ConsumerDue
	cfg.Description = "planex supervisors: run deadlines and gate SLAs held by NATS until due"
	cfg.FilterSubject = bus.DueSubject("*")
	return cfg
}

// Start creates (or updates) the engine consumers and starts consuming
// until Stop. Handling does not end with ctx (only its values are kept), so
// that Stop can let in-flight messages finish. With MaxAckPending 0 it
// registers the replica in planex-supervisors and keeps the main
// consumer's bound at the live replicas' shares.
func (e *Engine) Start(ctx context.Context) error {
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.mu.Lock()
	e.cancel = cancel
	e.mu.Unlock()
	maxAckPending := e.cfg.MaxAckPending
	if maxAckPending == 0 {
		maxAckPending = e.startReplica(ctx)
	}
	type streamConsumer struct {
		stream string
		cfg    jetstream.ConsumerConfig
	}
	var consumers []streamConsumer
	for _, cc := range ConsumerConfigs(maxAckPending, e.cfg.AckWait) {
		consumers = append(consumers, streamConsumer{bus.StreamEngine, cc})
	}
	if e.res.HoldsTimers() {
		consumers = append(consumers, streamConsumer{bus.StreamTimers, DueConsumerConfig(e.cfg.AckWait)})
	}
	for _, sc := range consumers {
		cc := sc.cfg
		// Prefetch no more than the workers can take: whatever a replica
		// holds when it dies waits for the ack wait before another replica
		// gets it.
		batch := e.cfg.Workers
		timers := cc.Durable == ConsumerTimers || cc.Durable == bus.ConsumerDue
		if timers {
			batch = 256
		}
		name := cc.Durable
		// The main consumer's messages are admitted by e.hand: the
		// callback blocks when the replica's hand is full, so a replica's
		// death strands no more runs than that until the ack wait, and a
		// run's messages beyond its places wait in its queue (locks.go).
		// Timers take one of e.timers' places: the callback blocks
		// while they are all taken (a timer not due is parked with
		// NakWithDelay at once and frees its place).
		handler := e.admitTimer(hctx)
		if !timers {
			handler = e.admit(hctx)
		}
		// Kept consumed when the server deletes the consumer (a stream
		// restored, `nats consumer rm`): the engine's consumers deliver
		// all of a work queue, so one made again loses nothing.
		c, err := bus.Consume(ctx, e.res.JS, sc.stream, cc, handler, e.logger, func(err error) {
			if hctx.Err() == nil {
				e.logger.Debug("engine consumer", "consumer", name, "err", err)
			}
		}, bus.PullOptions{Batch: batch})
		if err != nil {
			e.stopConsuming()
			cancel()
			return err
		}
		e.mu.Lock()
		e.consumes = append(e.consumes, c)
		e.mu.Unlock()
	}
	go e.metrics.monitorLag(hctx, e.res.JS, e.logger)
	go e.beatQueued(hctx)
	if e.cfg.SweepInterval > 0 {
		e.background(hctx, &e.stopSweep, e.sweepLoop)
	}
	if e.replicas != nil {
		e.background(hctx, &e.stopRenew, e.renewLoop)
	}
	return nil
}

// admitTimer returns the timers consumer's callback: a timer message
// waits for a place among e.timers, then is handled on a worker goroutine.
// A message whose wait ends with ctx is left unacknowledged (redelivered
// after the ack wait).
func (e *Engine) admitTimer(ctx context.Context) func(jetstream.Msg) {
	return func(msg jetstream.Msg) {
		select {
		case e.timers <- struct{}{}:
		case <-ctx.Done():
			return
		}
		e.wg.Add(1)
		e.workers.Go(func() {
			defer e.wg.Done()
			defer func() { <-e.timers }()
			n := e.timersBusy.Add(1)
			for {
				p := e.timersPeak.Load()
				if n <= p || e.timersPeak.CompareAndSwap(p, n) {
					break
				}
			}
			e.process(ctx, msg)
			e.timersBusy.Add(-1)
			e.timersDone.Add(1)
		})
	}
}

// admit returns the main consumer's callback: a message that gets a place
// in hand is handled on a goroutine of its own, which then handles the
// messages of the same run that queued behind it.
func (e *Engine) admit(hctx context.Context) func(jetstream.Msg) {
	return func(msg jetstream.Msg) {
		runID, _, _ := bus.ParseEngineSubject(msg.Subject()) // a bad subject is terminated by process
		if !e.hand.admit(hctx, runID, msg) {
			return
		}
		e.wg.Add(1)
		e.workers.Go(func() {
			defer e.wg.Done()
			defer e.hand.leave()
			for m := msg; m != nil; m = e.hand.next(runID) {
				if hctx.Err() == nil { // else left for redelivery after the ack wait
					e.process(hctx, m)
				}
			}
		})
	}
}

// beatQueued sends in-progress acks for the messages queued behind their
// runs' messages in hand until ctx ends, as heartbeat does for a message
// being handled.
func (e *Engine) beatQueued(ctx context.Context) {
	t := time.NewTicker(e.cfg.AckWait / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, msg := range e.hand.queuedMsgs() {
				if err := msg.InProgress(); err != nil && ctx.Err() == nil {
					e.logger.DebugContext(ctx, "in-progress ack of a queued message", "err", err)
				}
			}
		}
	}
}

// background runs loop until Stop, which calls *stop to end it and wait.
func (e *Engine) background(hctx context.Context, stop *func(), loop func(context.Context)) {
	ctx, cancel := context.WithCancel(hctx)
	done := make(chan struct{})
	e.mu.Lock()
	*stop = func() { cancel(); <-done }
	e.mu.Unlock()
	go func() {
		defer close(done)
		loop(ctx)
	}()
}

// Stop stops fetching and lets buffered and in-flight messages finish
// until ctx ends; then it cancels what remains (unacknowledged messages are
// redelivered to another replica) and returns ctx's error.
func (e *Engine) Stop(ctx context.Context) error {
	e.mu.Lock()
	cs := e.consumes
	e.consumes = nil
	cancel := e.cancel
	stopSweep, stopRenew := e.stopSweep, e.stopRenew
	e.stopSweep, e.stopRenew = nil, nil
	e.mu.Unlock()
	if stopSweep != nil {
		stopSweep()
	}
	if cancel == nil {
		return nil
	}
	defer cancel()
	for _, c := range cs {
		c.Drain()
	}
	for _, c := range cs {
		select {
		case <-c.Closed():
		case <-ctx.Done():
		}
	}
	done := make(chan struct{})
	go func() {
		e.wg.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		cancel()
		<-done
		err = fmt.Errorf("stop engine: %w", ctx.Err())
	}
	if stopRenew != nil {
		stopRenew()
		err = errors.Join(err, e.leave(ctx))
	}
	return err
}

func (e *Engine) stopConsuming() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.consumes {
		c.Stop()
	}
	e.consumes = nil
}

// acquire takes a worker slot, or fails when ctx ends.
func (e *Engine) acquire(ctx context.Context) error {
	select {
	case e.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *Engine) release() { <-e.sem }

// Errors a decision returns to steer the message's acknowledgement.
var (
	// errIgnore acks a message that no longer matters (stale attempt,
	// decided gate).
	errIgnore = errors.New("ignored")
	// errStale means the message refers to something this replica's view of
	// the run does not show yet (a lagging read): retry shortly.
	errStale = errors.New("run state older than the message")
)

// notYet asks for redelivery after a delay (a timer that has not fired).
type notYet struct{ delay time.Duration }

func (n notYet) Error() string { return fmt.Sprintf("not due for %s", n.delay) }
