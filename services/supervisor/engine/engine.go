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
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

const instrumentation = "github.com/planex-dev/planex/services/supervisor/engine"

// ConsumerTimers is the durable consumer of timer messages
// (planex.timers.<run>). Timers wait as delayed redeliveries, which count
// against a consumer's MaxAckPending; a consumer of their own, without that
// limit, keeps parked timers from starving step results.
const ConsumerTimers = bus.ConsumerEngine + "-timers"

// inHandPerWorker bounds the engine messages a replica holds (handling or
// waiting for a worker or a run lock) per worker; messages waiting for the
// planner hold one too.
const inHandPerWorker = 8

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
	MaxAckPending int
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
	// Guardrails: policies, stall detection and the critic (policy.go,
	// stall.go, critic.go).
	Guardrails
	// Hooks inject faults (tests only).
	Hooks Hooks
}

// Hooks inject faults at points of a message's handling, for crash tests:
// a hook that closes the replica's NATS connection simulates a replica
// killed at that point. Production code leaves them nil.
type Hooks struct {
	// AfterAppend is called after a decision's events were appended to
	// the run log and before its side effects are published.
	AfterAppend func(runID string, events []*planexv1.RunEvent)
}

func (c Config) withDefaults() Config {
	if c.Workers <= 0 {
		c.Workers = 32
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxAckPending <= 0 {
		c.MaxAckPending = 1024
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
	wg    sync.WaitGroup

	mu        sync.Mutex
	consumes  []jetstream.ConsumeContext
	cancel    context.CancelFunc // ends handling (and the lag monitor)
	stopSweep func()             // ends the stranded-run sweeper and waits for it
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
	m, err := newMetrics(otel.Meter(instrumentation))
	if err != nil {
		return nil, err
	}
	window := st.CachedInfo().Config.Duplicates
	if window <= 0 {
		window = 2 * time.Minute // the server's default
	}
	return &Engine{
		cfg: cfg, res: res, log: log, tools: tools, planner: planner, logger: logger,
		tracer: otel.Tracer(instrumentation), metrics: m, dupWindow: window, inbox: inbox,
		locks: runLocks{m: map[string]*runLock{}}, sem: make(chan struct{}, cfg.Workers),
	}, nil
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

// Start creates (or updates) the engine consumers and starts consuming
// until Stop. Handling does not end with ctx (only its values are kept), so
// that Stop can let in-flight messages finish.
func (e *Engine) Start(ctx context.Context) error {
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.mu.Lock()
	e.cancel = cancel
	e.mu.Unlock()
	for _, cc := range ConsumerConfigs(e.cfg.MaxAckPending, e.cfg.AckWait) {
		cons, err := e.res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEngine, cc)
		if err != nil {
			return fmt.Errorf("create consumer %s on %s: %w", cc.Durable, bus.StreamEngine, err)
		}
		// Prefetch no more than the workers can take: whatever a replica
		// holds when it dies waits for the ack wait before another replica
		// gets it.
		batch := e.cfg.Workers
		if cc.Durable == ConsumerTimers {
			batch = 256
		}
		name := cc.Durable
		// A replica holds at most inHand messages of the main consumer
		// (plus the pull buffer): the consume callback blocks when they
		// are all in hand, so a replica's death strands no more than that
		// until the ack wait. Timers are not bounded: they are parked
		// with NakWithDelay at once.
		var hand chan struct{}
		if cc.Durable != ConsumerTimers {
			hand = make(chan struct{}, inHandPerWorker*e.cfg.Workers)
		}
		c, err := cons.Consume(func(msg jetstream.Msg) {
			if hand != nil {
				select {
				case hand <- struct{}{}:
				case <-hctx.Done():
					return // not handled: redelivered after the ack wait
				}
			}
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				if hand != nil {
					defer func() { <-hand }()
				}
				e.process(hctx, msg)
			}()
		}, jetstream.PullMaxMessages(batch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if hctx.Err() == nil {
				e.logger.Debug("engine consumer", "consumer", name, "err", err)
			}
		}))
		if err != nil {
			e.stopConsuming()
			cancel()
			return fmt.Errorf("consume %s: %w", name, err)
		}
		e.mu.Lock()
		e.consumes = append(e.consumes, c)
		e.mu.Unlock()
	}
	go e.metrics.monitorLag(hctx, e.res.JS, e.logger)
	if e.cfg.SweepInterval > 0 {
		sctx, stop := context.WithCancel(hctx)
		done := make(chan struct{})
		e.mu.Lock()
		e.stopSweep = func() { stop(); <-done }
		e.mu.Unlock()
		go func() {
			defer close(done)
			e.sweepLoop(sctx)
		}()
	}
	return nil
}

// Stop stops fetching and lets buffered and in-flight messages finish
// until ctx ends; then it cancels what remains (unacknowledged messages are
// redelivered to another replica) and returns ctx's error.
func (e *Engine) Stop(ctx context.Context) error {
	e.mu.Lock()
	cs := e.consumes
	e.consumes = nil
	cancel := e.cancel
	stopSweep := e.stopSweep
	e.stopSweep = nil
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
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		cancel()
		<-done
		return fmt.Errorf("stop engine: %w", ctx.Err())
	}
}

func (e *Engine) stopConsuming() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.consumes {
		c.Stop()
	}
	e.consumes = nil
}

// runLocks serialises the handling of one run inside this replica; runs
// proceed concurrently.
type runLocks struct {
	mu sync.Mutex
	m  map[string]*runLock
}

type runLock struct {
	mu   sync.Mutex
	refs int
}

func (l *runLocks) lock(id string) (unlock func()) {
	l.mu.Lock()
	rl := l.m[id]
	if rl == nil {
		rl = &runLock{}
		l.m[id] = rl
	}
	rl.refs++
	l.mu.Unlock()
	rl.mu.Lock()
	return func() {
		rl.mu.Unlock()
		l.mu.Lock()
		if rl.refs--; rl.refs == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}
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
