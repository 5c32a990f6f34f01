// Package runner is the executor runtime shared by every pool: it fetches
// step requests from the pool's durable JetStream consumer with bounded
// concurrency, validates and runs them, and reports each attempt to the
// engine as a StepResult.
//
// # Delivery semantics
//
// Steps arrive at least once. A step is acknowledged only after its result
// was published to planex.engine.<run>.result (deduplicated by Nats-Msg-Id
// "<run>:<step>:<attempt>:result"), so a replica that dies mid-step leaves
// the step to be redelivered to another replica after AckWait. AckWait is
// short (5 s by default) so that the steps of a replica that died return to
// the pool, and free its MaxAckPending capacity, within seconds: while a
// delivery is handled — the tool runs, its result is recorded and
// published — the runner sends InProgress heartbeats every quarter of
// AckWait. A tool failure marked retryable (a backend is unavailable) is
// redelivered with NakWithDelay until the pool's maximum deliveries, after
// which the step fails with the tool's retryable error (UNAVAILABLE), so
// that the engine's retry policy can try again later. A message that does
// not decode is terminated.
//
// # Surviving NATS failures
//
// Every call to JetStream has its own short deadline (Options.KVTimeout)
// and is tried again with backoff while it fails transiently — a stream
// leader change, a NATS node restart — within the attempt's budget: its
// timeout, and for a side effect that happened at least
// Options.RecordGrace. See durable.go.
//
// Side-effecting tools (side_effect other than READ) follow the protocol of
// planex-effects described in effects.go: a record is created before the
// tool acts and completed with the result after, so a redelivered attempt
// replays the recorded result, and an attempt found started but unfinished
// is reported as OUTCOME_UNKNOWN for escalation and never run again.
//
// # Outputs
//
// Outputs are JSON. One larger than Options.MaxOutputBytes is cut when it
// is Truncatable (rows, hits) and the result is marked truncated; otherwise
// the step fails. One larger than Options.InlineOutputBytes is stored in the
// planex-outputs object store and referenced by StepResult.output_ref.
package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/internal/telemetry"
	"github.com/planex-dev/planex/internal/warm"
)

const instrumentation = "github.com/planex-dev/planex/services/executor"

// Defaults of Options fields left zero.
const (
	DefaultConcurrency       = 4
	DefaultAckWait           = 5 * time.Second
	DefaultMaxDeliver        = 5
	DefaultMaxOutputBytes    = 4 << 20
	DefaultInlineOutputBytes = 64 << 10
	DefaultTimeout           = 60 * time.Second
	DefaultMaxArgsBytes      = 256 << 10
	// DefaultStartedNoticeDelay: a step that ends within it reports its
	// start with its result (see Options.StartedNoticeDelay).
	DefaultStartedNoticeDelay = 20 * time.Millisecond
)

// fetchWait bounds one pull request; shutdown cancels it earlier.
const fetchWait = 5 * time.Second

// Hooks inject faults at points of a step's life, for crash tests: a hook
// that closes the replica's NATS connection simulates a replica killed at
// that point. Production code leaves them nil.
type Hooks struct {
	// AfterRun is called after the tool returned and before a side effect's
	// result is recorded in planex-effects.
	AfterRun func(req *planexv1.StepRequest)
	// BeforePublish is called after the result was recorded and before it
	// is published and the step acknowledged.
	BeforePublish func(req *planexv1.StepRequest)
	// OnRetry is called when a JetStream call (named by op) failed
	// transiently and will be tried again.
	OnRetry func(op string, err error)
}

// Options configure a Runner.
type Options struct {
	// Pool is the pool name; every tool must be named "<pool>.<verb>".
	Pool string
	// Tools are the pool's tools.
	Tools []Tool
	// ReplicaID identifies this replica (executor_id); NewReplicaID when
	// empty.
	ReplicaID string
	// Concurrency bounds the steps this replica runs at once.
	Concurrency int
	// AckWait is how long a delivered step may go without an ack or an
	// in-progress heartbeat before it is redelivered.
	AckWait time.Duration
	// MaxDeliver bounds deliveries of one step.
	MaxDeliver int
	// MaxAckPending bounds unacknowledged steps across the whole pool (all
	// replicas). When zero it follows the pool's size: the number of
	// replicas registered in planex-tools times Concurrency, updated as
	// replicas come and go (see scaleAckPending).
	MaxAckPending int
	// MaxOutputBytes caps the JSON size of an output.
	MaxOutputBytes int
	// InlineOutputBytes is the largest output kept inline in the result;
	// larger ones go to the planex-outputs object store.
	InlineOutputBytes int
	// DefaultTimeout applies when neither the step nor the tool sets one.
	DefaultTimeout time.Duration
	// MaxArgsBytes caps the encoded size of a step's arguments.
	MaxArgsBytes int
	// KVTimeout bounds one call to JetStream (a bucket, the object store,
	// a publish); failed calls are tried again within the step's budget.
	KVTimeout time.Duration
	// RecordGrace is the least time spent trying to record and report the
	// result of a side effect that happened, past the step's timeout if
	// need be.
	RecordGrace time.Duration
	// Probe, when set, checks the pool's backend (dial the SMTP relay,
	// ping the database) every ProbeInterval; see Runner.Backend.
	Probe func(ctx context.Context) error
	// ProbeInterval is the period of Probe (DefaultProbeInterval).
	ProbeInterval time.Duration
	// OnBackend, when set, is called when the backend's state changes
	// (from steps or Probe), to report it in the replica's health.
	OnBackend func(up bool, reason string)
	// Logger receives the runner's logs.
	Logger *slog.Logger
	// Hooks inject faults (tests only).
	Hooks Hooks
	// WrapTool, when set, wraps every tool before it is registered: `planex
	// eval` records, replays or injects faults this way (cassette.go).
	WrapTool func(Tool) Tool
	// Verifier, when set, checks every delivered step request's signature
	// (internal/stepsign); a refused request is terminated, never run.
	Verifier *stepsign.Verifier
	// StartedNoticeDelay is how long a step runs before its started notice
	// (and its heartbeats) are published; a step that ends sooner reports
	// its start with its result. Zero means DefaultStartedNoticeDelay,
	// negative publishes the notice as the tool starts.
	StartedNoticeDelay time.Duration
}

func (o Options) withDefaults() Options {
	if o.ReplicaID == "" {
		o.ReplicaID = NewReplicaID()
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.AckWait <= 0 {
		o.AckWait = DefaultAckWait
	}
	if o.MaxDeliver == 0 {
		o.MaxDeliver = DefaultMaxDeliver
	}
	if o.MaxAckPending <= 0 {
		o.MaxAckPending = o.Concurrency
	}
	if o.MaxOutputBytes <= 0 {
		o.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if o.InlineOutputBytes <= 0 {
		o.InlineOutputBytes = DefaultInlineOutputBytes
	}
	if o.DefaultTimeout <= 0 {
		o.DefaultTimeout = DefaultTimeout
	}
	if o.MaxArgsBytes <= 0 {
		o.MaxArgsBytes = DefaultMaxArgsBytes
	}
	if o.KVTimeout <= 0 {
		o.KVTimeout = DefaultKVTimeout
	}
	if o.RecordGrace <= 0 {
		o.RecordGrace = DefaultRecordGrace
	}
	if o.StartedNoticeDelay == 0 {
		o.StartedNoticeDelay = DefaultStartedNoticeDelay
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = DefaultProbeInterval
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Runner runs one replica of a pool.
type Runner struct {
	// workers run the steps: a warm goroutine's stack has grown already.
	workers *warm.Pool
	opts    Options
	res     *bus.Resources
	logger  *slog.Logger
	tools   atomic.Pointer[toolSet] // replaced whole by SetTools
	tracer  trace.Tracer
	m       metricSet

	sem chan struct{} // one token per running step
	wg  sync.WaitGroup

	runningMu sync.Mutex
	running   map[string]int // effect keys of the attempts running here

	backend backendHealth

	autoAckPending bool         // Options.MaxAckPending was zero: scaleAckPending sizes it
	ackPending     atomic.Int64 // the pool consumer's MaxAckPending as last set here
	fromLogs       atomic.Bool  // this replica takes its steps from its consumer on PLANEX_EVENTS

	regMu      sync.Mutex // serializes writes to planex-tools (renewals, SetTools, deregistration)
	registered bool       // between register and deregister; guarded by regMu

	mu         sync.Mutex
	started    bool
	workCtx    context.Context // parent of every step; survives the start context
	workCancel context.CancelFunc
	loopCancel context.CancelFunc
	loopDone   chan struct{}
	hbCancel   context.CancelFunc
	hbDone     chan struct{}
	attempts   *nats.Subscription
}

// New checks the options and returns a runner; Start begins consuming.
func New(res *bus.Resources, opts Options) (*Runner, error) {
	auto := opts.MaxAckPending <= 0
	opts = opts.withDefaults()
	if !bus.ValidToken(opts.Pool) {
		return nil, fmt.Errorf("pool name %q: want letters, digits, '-' or '_'", opts.Pool)
	}
	if !bus.ValidToken(opts.ReplicaID) {
		return nil, fmt.Errorf("replica id %q: want letters, digits, '-' or '_'", opts.ReplicaID)
	}
	if opts.InlineOutputBytes > opts.MaxOutputBytes {
		opts.InlineOutputBytes = opts.MaxOutputBytes
	}
	r := &Runner{
		workers: warm.New(warm.DefaultIdle, warm.DefaultMaxWaiting),
		opts:    opts,
		res:     res,
		logger:  opts.Logger.With("pool", opts.Pool, "executor_id", opts.ReplicaID),
		tracer:  otel.Tracer(instrumentation),
		sem:     make(chan struct{}, opts.Concurrency),
		running: map[string]int{},

		autoAckPending: auto,
	}
	ts, err := newToolSet(opts.Pool, opts.Tools, opts.WrapTool)
	if err != nil {
		return nil, err
	}
	r.tools.Store(ts)
	m, err := newMetrics(otel.Meter(instrumentation))
	if err != nil {
		return nil, err
	}
	r.m = m
	r.m.poolAttr = metric.WithAttributes(attribute.String("pool", opts.Pool))
	r.workCtx, r.workCancel = context.WithCancel(context.Background())
	r.backend.onChange = func(up bool, reason string) {
		if up {
			r.logger.Info("backend available")
		} else {
			r.logger.Warn("backend unavailable; steps fail with retryable UNAVAILABLE errors until it is back", "reason", reason)
		}
		if r.opts.OnBackend != nil {
			r.opts.OnBackend(up, reason)
		}
	}
	if err := r.m.observeBackend(otel.Meter(instrumentation), opts.Pool, func() bool { up, _, _ := r.backend.state(); return up }); err != nil {
		return nil, err
	}
	return r, nil
}

// NewReplicaID returns "<hostname>-<random>", unique per process start
// (bus.NewReplicaID).
func NewReplicaID() string { return bus.NewReplicaID("executor") }

// ID is the replica id reported as executor_id.
func (r *Runner) ID() string { return r.opts.ReplicaID }

// Pool is the pool name.
func (r *Runner) Pool() string { return r.opts.Pool }

// Specs returns the pool's tool specs, sorted by name.
func (r *Runner) Specs() []*planexv1.ToolSpec {
	specs := r.tools.Load().specs
	out := make([]*planexv1.ToolSpec, len(specs))
	for i, s := range specs {
		out[i] = proto.Clone(s).(*planexv1.ToolSpec)
	}
	return out
}

// Start registers the pool's tools in planex-tools, keeps them registered
// with heartbeats, creates or updates the pool's durable consumer and
// starts consuming. Steps keep running after ctx ends; Stop ends them.
func (r *Runner) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("runner already started")
	}
	r.workCancel()
	r.workCtx, r.workCancel = context.WithCancel(context.WithoutCancel(ctx))
	cfg := bus.PoolConsumerConfig(r.opts.Pool, r.opts.MaxAckPending, r.opts.AckWait, r.opts.MaxDeliver)
	if r.autoAckPending {
		// Not below what the replicas already running need: this one is
		// not registered yet.
		if n, err := r.countReplicas(ctx); err == nil {
			cfg.MaxAckPending = (n + 1) * r.opts.Concurrency
		}
	}
	cons, err := r.res.JS.CreateOrUpdateConsumer(ctx, bus.StreamSteps, cfg)
	if err != nil {
		return fmt.Errorf("create consumer %s: %w", cfg.Durable, err)
	}
	// On NATS 2.11+ the pool takes its steps from PLANEX_EVENTS (see
	// bus.DispatchConsumerConfig); PLANEX_STEPS is then only drained.
	var logs jetstream.Consumer
	if r.logsConsumer() {
		dcfg := bus.DispatchConsumerConfig(r.opts.Pool, cfg.MaxAckPending, r.opts.AckWait, r.opts.MaxDeliver)
		if logs, err = r.res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEvents, dcfg); err != nil {
			// A stream not updated yet by a supervisor of this version
			// (an upgrade that starts with the executors) has no subjects
			// for the filter: this replica takes its steps from
			// PLANEX_STEPS, where supervisors send them while the pool
			// has no consumer on PLANEX_EVENTS.
			r.logger.WarnContext(ctx, "no consumer on the run log stream; taking steps from "+bus.StreamSteps,
				"stream", bus.StreamEvents, "consumer", dcfg.Durable, "err", err)
			logs = nil
		}
	}
	r.fromLogs.Store(logs != nil)
	r.ackPending.Store(int64(cfg.MaxAckPending))
	interval, err := r.register(ctx)
	if err != nil {
		return err
	}
	if err := r.scaleAckPending(ctx); err != nil {
		r.logger.WarnContext(ctx, "scale pool consumer", "err", err)
	}
	if r.attempts, err = r.serveAttempts(); err != nil {
		return err
	}
	hbCtx, hbCancel := context.WithCancel(r.workCtx)
	r.hbCancel, r.hbDone = hbCancel, make(chan struct{})
	go r.registrationLoop(hbCtx, interval)

	if r.opts.Probe != nil {
		go r.probeLoop(hbCtx)
	}

	loopCtx, loopCancel := context.WithCancel(r.workCtx)
	r.loopCancel, r.loopDone = loopCancel, make(chan struct{})
	var loops sync.WaitGroup
	steps := &keptConsumer{stream: bus.StreamSteps, cons: cons, config: func() jetstream.ConsumerConfig {
		return bus.PoolConsumerConfig(r.opts.Pool, int(r.ackPending.Load()), r.opts.AckWait, r.opts.MaxDeliver)
	}}
	if logs != nil {
		dispatched := &keptConsumer{stream: bus.StreamEvents, cons: logs, config: func() jetstream.ConsumerConfig {
			return bus.DispatchConsumerConfig(r.opts.Pool, int(r.ackPending.Load()), r.opts.AckWait, r.opts.MaxDeliver)
		}}
		loops.Go(func() { r.fetchLoop(loopCtx, dispatched) })
		loops.Go(func() { r.drainLoop(loopCtx, steps) })
	} else {
		loops.Go(func() { r.fetchLoop(loopCtx, steps) })
	}
	go func() { loops.Wait(); close(r.loopDone) }()
	r.started = true
	r.logger.InfoContext(ctx, "executor consuming", "consumer", cfg.Durable, "concurrency", r.opts.Concurrency,
		"ack_wait", r.opts.AckWait, "max_deliver", r.opts.MaxDeliver, "tools", len(r.tools.Load().specs))
	return nil
}

// Stop stops fetching steps, lets running steps finish until ctx ends
// (then cancels them), and removes the replica's tool registrations.
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.started {
		r.workCancel()
		return nil
	}
	r.started = false
	r.loopCancel()
	<-r.loopDone

	var errs []error
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		r.logger.Warn("grace period over, cancelling running steps")
		r.workCancel()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			errs = append(errs, errors.New("stop executor: steps still running after cancellation"))
		}
	}
	r.hbCancel()
	<-r.hbDone
	dctx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		dctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
	}
	errs = append(errs, r.deregister(dctx))
	if err := r.attempts.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		errs = append(errs, fmt.Errorf("unsubscribe %s: %w", r.attempts.Subject, err))
	}
	r.workCancel()
	return errors.Join(errs...)
}

// fetchLoop pulls as many steps as there are free slots and hands each to
// its own goroutine. A slot is taken before a step is fetched, so a step is
// never delivered to this replica (and its AckWait never starts) while it
// would have to wait for a slot.
func (r *Runner) fetchLoop(ctx context.Context, k *keptConsumer) {
	backoff := 100 * time.Millisecond
	for {
		_, err := r.fetch(ctx, k.cons, fetchWait, cap(r.sem))
		switch {
		case ctx.Err() != nil:
			return
		case err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoMessages):
			backoff = 100 * time.Millisecond
		default:
			if bus.ConsumerGone(err) || bus.PullUnanswered(err) {
				r.remake(ctx, k, err)
			}
			r.logger.Warn("fetch steps", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}
}

// fetch takes the free slots, at most most (waiting for one), pulls up to as many steps
// within wait and hands each to its own goroutine; the slots left unused
// are given back.
func (r *Runner) fetch(ctx context.Context, cons jetstream.Consumer, wait time.Duration, most int) (int, error) {
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	n := 1
more:
	for n < min(most, cap(r.sem)) {
		select {
		case r.sem <- struct{}{}:
			n++
		default:
			break more
		}
	}
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	batch, err := cons.Fetch(n, jetstream.FetchContext(fctx))
	got := 0
	if err == nil {
		for msg := range batch.Messages() {
			got++
			r.wg.Add(1)
			r.workers.Go(func() { r.handle(msg) })
		}
		err = batch.Error()
	}
	for range n - got {
		<-r.sem
	}
	return got, err
}

// How often a pool that takes its steps from PLANEX_EVENTS looks for steps
// left on PLANEX_STEPS: every drainInterval, and every drainBusyInterval
// for drainBusyFor after it last found one (supervisors of an older version
// still publish there during an upgrade: their steps should not wait
// seconds each).
const (
	drainInterval     = 2 * time.Second
	drainBusyInterval = 100 * time.Millisecond
	drainBusyFor      = 30 * time.Second
)

// drainLoop runs the steps still published to PLANEX_STEPS while the pool
// takes its steps from PLANEX_EVENTS: by supervisors of an older version
// during an upgrade, or before a supervisor found the pool's consumer
// there. It asks for the consumer's pending counts (every drainInterval,
// more often while it finds steps) and fetches only when there are some,
// so the idle queue holds no slot.
func (r *Runner) drainLoop(ctx context.Context, k *keptConsumer) {
	t := time.NewTimer(drainInterval)
	defer t.Stop()
	var found time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if r.drain(ctx, k) {
			found = time.Now()
		}
		if time.Since(found) < drainBusyFor {
			t.Reset(drainBusyInterval)
		} else {
			t.Reset(drainInterval)
		}
	}
}

// drain fetches the steps k holds and reports whether there were any.
func (r *Runner) drain(ctx context.Context, k *keptConsumer) bool {
	cons := k.cons
	info, err := cons.Info(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.logger.Debug("pool consumer info", "stream", k.stream, "err", err)
			if bus.ConsumerGone(err) {
				r.remake(ctx, k, err)
			}
		}
		return false
	}
	// Steps waiting for a first delivery, and those delivered and not
	// acknowledged yet (a redelivery after the ack wait is not counted as
	// pending).
	pending := info.NumPending + uint64(max(info.NumAckPending, 0))
	found := false
	for pending > 0 && ctx.Err() == nil {
		got, err := r.fetch(ctx, cons, 200*time.Millisecond, int(min(pending, uint64(cap(r.sem)))))
		if got == 0 || (err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, jetstream.ErrNoMessages)) {
			break
		}
		found = true
		pending -= min(pending, uint64(got))
	}
	return found
}

// keptConsumer is one of the pool's durable consumers, used by one loop's
// goroutine, and how to make it again when the server deleted it.
type keptConsumer struct {
	stream string
	cons   jetstream.Consumer
	// config is the consumer's configuration with the MaxAckPending last
	// set by this replica.
	config func() jetstream.ConsumerConfig
}

// remake looks k's consumer up after an error that says or may mean that
// it is gone (`nats consumer rm`, a stream made again by a restore) and
// makes it again when it is: otherwise the replica would fetch from a
// consumer that no longer exists until it restarted, its steps waiting.
// The consumer on PLANEX_EVENTS is made again with DeliverNew: the steps
// dispatched while it was gone wait for their schedule-to-start timeout
// (docs/queues.md); the one on PLANEX_STEPS loses nothing (a work queue).
func (r *Runner) remake(ctx context.Context, k *keptConsumer, cause error) {
	cfg := k.config()
	cons, made, err := bus.EnsureConsumer(ctx, r.res.JS, k.stream, cfg)
	if err != nil {
		if ctx.Err() == nil {
			r.logger.Warn("make pool consumer again", "stream", k.stream, "consumer", cfg.Durable, "cause", cause, "err", err)
		}
		return
	}
	k.cons = cons
	if made {
		r.logger.Warn("pool consumer was gone; made it again", "stream", k.stream, "consumer", cfg.Durable, "cause", cause)
	}
}

// logsConsumer reports whether the pool takes its steps from PLANEX_EVENTS:
// the server supports the routed run logs (NATS 2.11+).
func (r *Runner) logsConsumer() bool { return bus.RoutedLogs(r.res.JS.Conn()) }

// handle processes one delivery of a step.
func (r *Runner) handle(msg jetstream.Msg) {
	defer r.wg.Done()
	defer func() { <-r.sem }()
	r.m.inflight.Add(r.workCtx, 1, r.m.poolAttr)
	defer r.m.inflight.Add(r.workCtx, -1, r.m.poolAttr)

	nm := bus.NatsMsg(msg)
	req, err := bus.StepRequestOf(nm)
	if err == nil {
		err = checkRequest(req)
	}
	if err != nil {
		r.logger.Error("terminating undecodable step request", "subject", msg.Subject(), "err", err)
		r.m.count(r.workCtx, "", "poison")
		if terr := msg.Term(); terr != nil {
			r.logger.Warn("terminate step request", "subject", msg.Subject(), "err", terr)
		}
		return
	}
	delivered, seq := 1, uint64(0)
	if meta, err := msg.Metadata(); err == nil {
		delivered, seq = int(meta.NumDelivered), meta.Sequence.Stream
	}
	if v := r.opts.Verifier; v != nil {
		tool := r.tools.Load().byName[req.GetTool()]
		if err := v.Verify(r.workCtx, stepsign.Request{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data(), StreamSeq: seq,
			Tool: req.GetTool(), RequiresApproval: tool == nil || tool.Spec().GetRequiresApproval()}); err != nil {
			if errors.Is(err, stepsign.ErrReplayCacheUnavailable) {
				// Fail closed, not for good: not executed now, tried again
				// once the shared replay cache answers.
				_ = msg.NakWithDelay(nakDelay(delivered))
				return
			}
			_ = msg.Term() // refused: counted and logged by the verifier
			return
		}
	}
	ctx := telemetry.WithLogAttrs(r.workCtx, slog.String("run_id", req.GetRunId()), slog.String("step_id", req.GetStepId()))
	ctx, dropped := withDropSlot(ctx) // evaluation faults: see FaultTool
	ctx, span := bus.StartConsumerSpan(ctx, nm)
	if span.IsRecording() { // the attributes cost allocations; built only when kept
		span.SetAttributes(append(r.stepAttrs(req), attribute.Int("messaging.nats.delivered", delivered))...)
	}
	defer span.End()

	// Heartbeats run until the delivery is acknowledged or rejected, so
	// that recording and reporting across a NATS hiccup do not let the
	// step go back to the pool.
	stopHB := r.keepInProgress(msg)
	defer stopHB()
	// The start is reported lazily (see deferStart): a step that ends
	// within the started-notice delay reports its start with its result.
	notice := r.deferStart(req, delivered)
	defer notice.await(ctx)
	res, retry, err := r.execute(ctx, req, notice.start)
	notice.cancel()
	if r.dropResult(ctx, dropped, msg, req, stopHB, notice) {
		return
	}
	if err != nil {
		r.logger.ErrorContext(ctx, "run step", "tool", req.GetTool(), "attempt", req.GetAttempt(), "delivered", delivered, "err", err)
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		retry = Unavailable(err, "executor could not reach JetStream")
		res = r.failure(req, time.Now(), retry)
	}
	if retry != nil {
		if r.opts.MaxDeliver < 0 || delivered < r.opts.MaxDeliver {
			delay := nakDelay(delivered)
			r.logger.WarnContext(ctx, "step will be retried", "tool", req.GetTool(), "delivered", delivered, "retry_in", delay, "err", retry.Error())
			r.m.count(ctx, req.GetTool(), "retried")
			stopHB()
			if nerr := msg.NakWithDelay(delay); nerr != nil {
				r.logger.WarnContext(ctx, "nak step", "err", nerr)
			}
			return
		}
		// Still retryable: the backend may come back, and the engine's
		// retry policy decides whether to try again with a new attempt.
		res.Status = planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED
		res.Error = &planexv1.StepError{
			Code:      retry.Code,
			Message:   fmt.Sprintf("gave up after %d deliveries: %s", delivered, retry.Error()),
			Field:     retry.Field,
			Retryable: true,
		}
		r.maskStepError(req.GetTool(), res.Error)
	}
	if h := r.opts.Hooks.BeforePublish; h != nil {
		h(req)
	}
	err = r.publishResult(ctx, req, res)
	notice.stopBeats()
	if err != nil {
		r.logger.ErrorContext(ctx, "publish step result; the step will be redelivered", "err", err)
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		stopHB()
		if nerr := msg.NakWithDelay(nakDelay(delivered)); nerr != nil {
			r.logger.WarnContext(ctx, "nak step", "err", nerr)
		}
		return
	}
	stopHB()
	if err := msg.Ack(); err != nil {
		r.logger.WarnContext(ctx, "ack step", "err", err)
	}
	if res.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		span.SetStatus(codes.Error, res.GetError().GetMessage())
	}
	r.observe(ctx, res)
}

// nakDelay backs off redeliveries: 0.5 s, 1 s, 2 s ... up to 30 s.
func nakDelay(delivered int) time.Duration {
	d := 500 * time.Millisecond
	for i := 1; i < delivered && d < 30*time.Second; i++ {
		d *= 2
	}
	return min(d, 30*time.Second)
}

// keepInProgress sends InProgress heartbeats every quarter of AckWait
// until the returned function is called; calling it again is a no-op.
func (r *Runner) keepInProgress(msg jetstream.Msg) (stop func()) {
	return bus.KeepInProgress(msg, max(r.opts.AckWait/4, 10*time.Millisecond), func(err error) {
		r.logger.Debug("in-progress ack", "err", err)
	})
}

// checkRequest rejects requests no result can be reported for.
func checkRequest(req *planexv1.StepRequest) error {
	switch {
	case !bus.ValidToken(req.GetRunId()):
		return fmt.Errorf("run_id %q: want a subject token", req.GetRunId())
	case req.GetStepId() == "":
		return errors.New("step_id is empty")
	case req.GetAttempt() < 1:
		return fmt.Errorf("attempt %d: want >= 1", req.GetAttempt())
	case req.GetTool() == "":
		return errors.New("tool is empty")
	}
	return nil
}

// Execute runs one step directly, without JetStream (ExecutorService.Execute):
// the same validation, idempotency, timeout and output handling as a step
// from the queue, but a retryable failure is returned as a failed result
// instead of being redelivered. The error is set only when the executor
// could not run the step at all (the request is malformed, planex-effects is
// unreachable).
func (r *Runner) Execute(ctx context.Context, req *planexv1.StepRequest) (*planexv1.StepResult, error) {
	if err := checkRequest(req); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	ctx = telemetry.WithLogAttrs(ctx, slog.String("run_id", req.GetRunId()), slog.String("step_id", req.GetStepId()))
	ctx, span := r.tracer.Start(ctx, "execute "+req.GetTool(), trace.WithAttributes(r.stepAttrs(req)...))
	defer span.End()
	res, _, err := r.execute(ctx, req, nil)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}
	if res.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
		span.SetStatus(codes.Error, res.GetError().GetMessage())
	}
	r.observe(ctx, res)
	return res, nil
}

// ErrBadRequest is matched by errors.Is for Execute errors caused by a
// malformed request.
var ErrBadRequest = errors.New("bad step request")

// execute runs one attempt. retry is set when the attempt should be
// redelivered (its result then says FAILED with a retryable error); err when
// the executor could not use JetStream.
func (r *Runner) execute(ctx context.Context, req *planexv1.StepRequest, onStart func(context.Context)) (res *planexv1.StepResult, retry *Error, err error) {
	start := time.Now()
	tool, ok := r.tools.Load().byName[req.GetTool()]
	if !ok {
		return r.failure(req, start, &Error{
			Code:    planexv1.ErrorCode_ERROR_CODE_UNKNOWN_TOOL,
			Field:   "tool",
			Message: fmt.Sprintf("pool %q has no tool %q; it runs %s", r.opts.Pool, req.GetTool(), strings.Join(r.toolNames(), ", ")),
		}), nil, nil
	}
	spec := tool.Spec()
	if e := r.validate(spec, req); e != nil {
		return r.failure(req, start, e), nil, nil
	}

	effectful := spec.GetSideEffect() != planexv1.SideEffect_SIDE_EFFECT_READ
	key := bus.EffectKey(req.GetRunId(), req.GetStepId(), req.GetAttempt())
	_, until := r.budget(spec, req, start)
	if effectful {
		if res, err := r.earlier(ctx, req, start, key, until); res != nil || err != nil {
			return res, nil, err
		}
	}
	if dl := req.GetDeadline(); dl != nil && !dl.AsTime().After(start) {
		return r.failure(req, start, &Error{
			Code:    planexv1.ErrorCode_ERROR_CODE_TIMEOUT,
			Message: fmt.Sprintf("deadline %s passed before the step started", dl.AsTime().UTC().Format(time.RFC3339)),
		}), nil, nil
	}
	var rev uint64
	if effectful {
		// Marked before the record exists, so that another delivery of
		// this attempt to this replica never finds it started and unowned.
		r.enter(key)
		entered := true
		defer func() {
			if entered {
				r.leave(key)
			}
		}()
		var created bool
		rev, created, err = r.startEffectRetry(ctx, key, r.base(req, start), until)
		if err != nil {
			return nil, nil, err
		}
		if !created { // another delivery of this attempt got there first
			r.leave(key)
			entered = false
			if res, err := r.earlier(ctx, req, start, key, until); res != nil || err != nil {
				return res, nil, err
			}
			return nil, nil, fmt.Errorf("effect record %s vanished while starting", key)
		}
	}
	if onStart != nil {
		onStart(ctx)
	}

	out, terr := r.runTool(ctx, tool, req)
	r.backend.observe(terr, r.opts.Probe != nil)
	if terr == nil {
		// Secrets masked before the output is encoded, stored, hashed or
		// recorded (mask.go).
		res, terr = r.output(ctx, req, start, r.maskOutput(ctx, req.GetTool(), out), effectful)
	}
	if terr != nil {
		r.logger.WarnContext(ctx, "step failed", "tool", req.GetTool(), "code", terr.Code.String(), "err", terr.Error(), "cause", terr.Err)
		res = r.failure(req, start, terr)
		if terr.Retryable {
			if effectful {
				if err := r.abandonEffectRetry(ctx, key, rev, r.recordBy(until)); err != nil {
					// The record stays "started": a redelivery reports
					// OUTCOME_UNKNOWN instead of retrying, which is safe.
					r.logger.WarnContext(ctx, "release effect record", "err", err)
				}
			}
			return res, terr, nil
		}
	}
	if h := r.opts.Hooks.AfterRun; h != nil {
		h(req)
	}
	if effectful {
		if err := r.finishEffectRetry(ctx, key, rev, res, r.recordBy(until)); err != nil {
			// The effect happened; report it. Should this delivery fail to
			// publish too, the redelivery finds the record started and
			// escalates.
			r.logger.ErrorContext(ctx, "record side effect result", "err", err)
		}
	}
	return res, nil, nil
}

// earlier looks for an earlier run of a side-effecting attempt in
// planex-effects and returns its result (recorded, or OUTCOME_UNKNOWN when
// it started and its owner is gone), or nil when there is none.
func (r *Runner) earlier(ctx context.Context, req *planexv1.StepRequest, start time.Time, key string, until time.Time) (*planexv1.StepResult, error) {
	state, rec, _, err := r.peekEffectRetry(ctx, key, until)
	if err != nil {
		return nil, err
	}
	if state == effectStarted {
		if state, rec, err = r.awaitOwner(ctx, req, key, rec, until); err != nil {
			return nil, err
		}
	}
	return r.recorded(ctx, req, start, state, rec), nil
}

// recorded turns an effect record into the result of a redelivery: the
// recorded result replayed, or OUTCOME_UNKNOWN for an attempt that started
// and never finished. It returns nil when there is no record.
func (r *Runner) recorded(ctx context.Context, req *planexv1.StepRequest, start time.Time, state effectState, rec *planexv1.StepResult) *planexv1.StepResult {
	switch state {
	case effectFinished:
		rec.Replayed = true
		r.logger.InfoContext(ctx, "replaying recorded result", "tool", req.GetTool(), "status", rec.GetStatus().String())
		return rec
	case effectStarted:
		r.logger.WarnContext(ctx, "attempt started earlier and never finished; escalating", "tool", req.GetTool(), "started_by", rec.GetExecutorId())
		res := r.failure(req, start, &Error{
			Code: planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN,
			Message: fmt.Sprintf("attempt %d of %s was started by executor %s at %s and its outcome was never recorded; not repeating it",
				req.GetAttempt(), req.GetTool(), rec.GetExecutorId(), rec.GetStartedAt().AsTime().UTC().Format(time.RFC3339)),
		})
		return res
	}
	return nil
}

// validate checks the size and the schema of the arguments.
func (r *Runner) validate(spec *planexv1.ToolSpec, req *planexv1.StepRequest) *Error {
	if n := proto.Size(req.GetArgs()); n > r.opts.MaxArgsBytes {
		return InvalidArgument("args", "arguments of %d bytes exceed the %d byte limit", n, r.opts.MaxArgsBytes)
	}
	return CheckArgs(spec, req.GetArgs())
}

// CheckArgs validates args against the tool's JSON Schema (with the
// schema cache of internal/plan) and returns an INVALID_ARGUMENT error
// naming the first offending field, or nil.
func CheckArgs(spec *planexv1.ToolSpec, args *structpb.Struct) *Error {
	err := plan.ValidateArgs(spec, args)
	if err == nil {
		return nil
	}
	var verr *plan.ValidationError
	if errors.As(err, &verr) && len(verr.Problems) > 0 {
		msg := strings.TrimPrefix(err.Error(), plan.ErrInvalidArgs.Error()+": ")
		return &Error{Code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Field: verr.Problems[0].Field, Message: msg}
	}
	return &Error{Code: planexv1.ErrorCode_ERROR_CODE_INTERNAL, Message: "tool schema is invalid", Err: err}
}

// runTool calls the tool under the step's timeout in its own span.
func (r *Runner) runTool(ctx context.Context, tool Tool, req *planexv1.StepRequest) (out any, terr *Error) {
	spec := tool.Spec()
	timeout := r.opts.DefaultTimeout
	if d := spec.GetDefaultTimeout(); d != nil && d.AsDuration() > 0 {
		timeout = d.AsDuration()
	}
	if d := req.GetTimeout(); d != nil && d.AsDuration() > 0 {
		timeout = d.AsDuration()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if dl := req.GetDeadline(); dl != nil {
		var cancelDL context.CancelFunc
		ctx, cancelDL = context.WithDeadline(ctx, dl.AsTime())
		defer cancelDL()
	}
	ctx, span := r.tracer.Start(ctx, "tool "+req.GetTool())
	if span.IsRecording() {
		span.SetAttributes(append(r.stepAttrs(req), attribute.String("planex.side_effect", spec.GetSideEffect().String()))...)
	}
	defer span.End()
	defer func() {
		if p := recover(); p != nil {
			r.logger.ErrorContext(ctx, "panic in tool", "tool", req.GetTool(), "panic", p, "stack", string(debug.Stack()))
			out, terr = nil, toError(ctx, req.GetTool(), fmt.Errorf("panic: %v", p))
		}
		if terr != nil {
			span.SetStatus(codes.Error, terr.Error())
		}
	}()
	out, err := tool.Run(ctx, Call{RunID: req.GetRunId(), StepID: req.GetStepId(), Attempt: req.GetAttempt(), Args: req.GetArgs()})
	if err != nil {
		span.RecordError(err)
		return nil, toError(ctx, req.GetTool(), err)
	}
	return out, nil
}

// output builds the succeeded result: capped, inline or in the object
// store.
func (r *Runner) output(ctx context.Context, req *planexv1.StepRequest, start time.Time, out any, effectful bool) (*planexv1.StepResult, *Error) {
	res := r.base(req, start)
	res.Duration = durationpb.New(time.Since(start))
	data, truncated, err := fitOutput(out, r.opts.MaxOutputBytes)
	if err != nil {
		return nil, Failed(err, "%s: %v (--max-output-bytes)", req.GetTool(), err)
	}
	res.Truncated = truncated
	if len(data) > r.opts.InlineOutputBytes {
		ref, err := r.storeOutput(ctx, req, data)
		switch {
		case err == nil:
			res.OutputRef = ref
		case !effectful:
			return nil, Unavailable(err, "could not store the output of %s", req.GetTool())
		default:
			// The effect happened; keep the output inline rather than lose
			// the result.
			r.logger.WarnContext(ctx, "store large output; keeping it inline", "err", err)
		}
	}
	if res.OutputRef == nil {
		v, err := jsonValue(data)
		if err != nil {
			return nil, toError(ctx, req.GetTool(), err)
		}
		res.Output = v
	}
	res.Status = planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED
	return res, nil
}

// base is a result with the attempt's identity.
func (r *Runner) base(req *planexv1.StepRequest, start time.Time) *planexv1.StepResult {
	return &planexv1.StepResult{
		RunId:        req.GetRunId(),
		StepId:       req.GetStepId(),
		Attempt:      req.GetAttempt(),
		PlanRevision: req.GetPlanRevision(),
		Tool:         req.GetTool(),
		ExecutorId:   r.opts.ReplicaID,
		StartedAt:    timestamppb.New(start),
	}
}

// failure is a failed (or outcome unknown) result carrying e.
func (r *Runner) failure(req *planexv1.StepRequest, start time.Time, e *Error) *planexv1.StepResult {
	res := r.base(req, start)
	res.Status = planexv1.StepResultStatus_STEP_RESULT_STATUS_FAILED
	if e.Code == planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN {
		res.Status = planexv1.StepResultStatus_STEP_RESULT_STATUS_OUTCOME_UNKNOWN
	}
	res.Error = e.StepError()
	r.maskStepError(req.GetTool(), res.Error)
	res.Duration = durationpb.New(time.Since(start))
	return res
}

func (r *Runner) toolNames() []string {
	specs := r.tools.Load().specs
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.GetName()
	}
	return names
}

// stepAttrs are the planex.* span attributes of a step.
func (r *Runner) stepAttrs(req *planexv1.StepRequest) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("planex.run_id", req.GetRunId()),
		attribute.String("planex.step_id", req.GetStepId()),
		attribute.Int("planex.attempt", int(req.GetAttempt())),
		attribute.Int("planex.plan_revision", int(req.GetPlanRevision())),
		attribute.String("planex.tool", req.GetTool()),
		attribute.String("planex.pool", r.opts.Pool),
	}
}

// publishStarted starts telling the engine the attempt began, without
// waiting for the acknowledgement (awaitStarted); best effort. A
// redelivery that starts the attempt again (its first executor died before
// acting) sends its own notice, with its executor id and start time, so
// that the engine can count the attempt's time from the new start.
func (r *Runner) publishStarted(ctx context.Context, req *planexv1.StepRequest, delivered int) *bus.Pending {
	msgID := bus.MsgID(req.GetRunId(), req.GetStepId(), strconv.Itoa(int(req.GetAttempt())), bus.KindStarted)
	if delivered > 1 {
		msgID = bus.MsgID(msgID, strconv.Itoa(delivered))
	}
	notice := &planexv1.StepStartedNotice{
		RunId: req.GetRunId(), StepId: req.GetStepId(), Attempt: req.GetAttempt(),
		ExecutorId: r.opts.ReplicaID, StartedAt: timestamppb.Now(),
	}
	return bus.PublishAsync(ctx, r.res.JS, bus.Publication{
		Subject: bus.EngineSubject(req.GetRunId(), bus.KindStarted),
		Msg:     notice,
		MsgID:   msgID,
		Attrs:   r.stepAttrs(req),
	})
}

// startNotice is the lazily published started notice of one attempt and
// the heartbeats that follow it.
type startNotice struct {
	r         *Runner
	req       *planexv1.StepRequest
	delivered int

	mu      sync.Mutex
	timer   *time.Timer
	over    bool         // the tool returned: nothing more is published
	pending *bus.Pending // the notice's publish, once sent and until awaited
	stopHB  func()       // stops the heartbeats, once started
}

// deferStart returns the started notice of an attempt, not yet published.
//
// Like Temporal's lazily recorded activity start, a step that ends quickly
// does not report its start separately: the engine records the start with
// the result (a result that finds its attempt still DISPATCHED). The
// notice, and the heartbeats after it, are published only once the tool
// has run for Options.StartedNoticeDelay, or at once when the attempt has
// a heartbeat timeout or its schedule-to-start limit (StepRequest.start_by)
// is near, so that the engine's timers see the start in time. A fast step thus costs one
// message less on the run's critical path (no notice to store, deliver,
// handle and acknowledge). A notice that is never sent or lost is handled
// as before: the result records the start.
func (r *Runner) deferStart(req *planexv1.StepRequest, delivered int) *startNotice {
	return &startNotice{r: r, req: req, delivered: delivered}
}

// start is called when the tool is about to run.
func (n *startNotice) start(ctx context.Context) {
	delay := n.r.opts.StartedNoticeDelay
	if hb := n.req.GetHeartbeatTimeout(); hb != nil && hb.AsDuration() > 0 {
		// The step asked for liveness tracking: the engine arms its
		// heartbeat timer from the start, which it must learn at once.
		delay = 0
	}
	if sb := n.req.GetStartBy(); sb != nil {
		// Half the time left before the schedule-to-start limit at most.
		delay = min(delay, time.Until(sb.AsTime())/2)
	}
	if delay <= 0 {
		n.publish(ctx)
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.timer = time.AfterFunc(delay, func() { n.publish(ctx) })
}

// publish sends the notice and starts the heartbeats, unless the tool has
// already returned.
func (n *startNotice) publish(ctx context.Context) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.over || n.pending != nil {
		return
	}
	n.pending = n.r.publishStarted(ctx, n.req, n.delivered)
	n.stopHB = n.r.sendHeartbeats(ctx, n.req)
}

// report sends the notice after the tool returned, when no result will
// carry the start (an injected lost result), and waits for it; it is
// called before await.
func (n *startNotice) report(ctx context.Context) {
	n.mu.Lock()
	if n.pending == nil {
		n.pending = n.r.publishStarted(ctx, n.req, n.delivered)
	}
	n.mu.Unlock()
	n.await(ctx)
}

// cancel is called when the tool returned: a notice not yet sent never is.
func (n *startNotice) cancel() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.over = true
	if n.timer != nil {
		n.timer.Stop()
	}
}

// stopBeats stops the heartbeats (idempotent).
func (n *startNotice) stopBeats() {
	n.mu.Lock()
	stop := n.stopHB
	n.stopHB = nil
	n.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// await stops the heartbeats and waits, within one call timeout, for the
// acknowledgement of a notice that was sent (after the result's publish:
// same connection, so the notice is stored first when both land); a
// failure is only logged, as the notice is best effort.
func (n *startNotice) await(ctx context.Context) {
	n.cancel()
	n.stopBeats()
	n.mu.Lock()
	p := n.pending
	n.pending = nil // a second await returns at once
	n.mu.Unlock()
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, n.r.opts.KVTimeout)
	defer cancel()
	if _, err := p.Wait(ctx); err != nil {
		n.r.logger.WarnContext(ctx, "publish step started notice", "err", err)
	}
}

// minHeartbeatInterval bounds how often an attempt's heartbeats are sent,
// whatever its heartbeat timeout.
const minHeartbeatInterval = 100 * time.Millisecond

// sendHeartbeats publishes a heartbeat notice for a started attempt every
// third of its heartbeat timeout until the returned function is called
// (calling it again is a no-op); nothing when the request has no heartbeat
// timeout. Heartbeats are cheap: one small publish each, sent one at a time
// (a slow acknowledgement delays the next rather than piling them up), each
// bounded by the call timeout, and failures are only logged — the next one
// may get through. Message ids are <run>:<step>:<attempt>:hb:<n>, n the
// heartbeat's time in Unix milliseconds, so the heartbeats of a redelivered
// attempt never collide with those of its first owner.
func (r *Runner) sendHeartbeats(ctx context.Context, req *planexv1.StepRequest) (stop func()) {
	hb := req.GetHeartbeatTimeout()
	if hb == nil || hb.AsDuration() <= 0 {
		return func() {}
	}
	every := max(hb.AsDuration()/3, minHeartbeatInterval)
	ctx, cancel := context.WithCancel(ctx)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(every)
		defer t.Stop()
		var last int64
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := time.Now()
			n := max(now.UnixMilli(), last+1)
			last = n
			r.publishHeartbeat(ctx, req, now, n, min(every, r.opts.KVTimeout))
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-exited }) }
}

// publishHeartbeat sends one heartbeat notice within timeout; best effort.
func (r *Runner) publishHeartbeat(ctx context.Context, req *planexv1.StepRequest, at time.Time, n int64, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := bus.Publish(ctx, r.res.JS, bus.Publication{
		Subject: bus.EngineSubject(req.GetRunId(), bus.KindStarted),
		Msg: &planexv1.StepStartedNotice{
			RunId: req.GetRunId(), StepId: req.GetStepId(), Attempt: req.GetAttempt(),
			ExecutorId: r.opts.ReplicaID, Heartbeat: true, HeartbeatAt: timestamppb.New(at),
		},
		MsgID: bus.MsgID(req.GetRunId(), req.GetStepId(), strconv.Itoa(int(req.GetAttempt())), "hb", strconv.FormatInt(n, 10)),
		Attrs: r.stepAttrs(req),
	})
	if err != nil {
		r.logger.DebugContext(ctx, "publish heartbeat", "err", err)
	}
}

// publishResult sends the result to the engine, trying again for
// Options.RecordGrace while the publish fails transiently; the message id
// makes a publish whose acknowledgement was lost harmless to repeat.
func (r *Runner) publishResult(ctx context.Context, req *planexv1.StepRequest, res *planexv1.StepResult) error {
	return r.retry(ctx, r.recordBy(time.Time{}), "publish step result", func(ctx context.Context) error {
		_, err := bus.Publish(ctx, r.res.JS, bus.Publication{
			Subject: bus.EngineSubject(req.GetRunId(), bus.KindResult),
			Msg:     res,
			MsgID:   bus.MsgID(req.GetRunId(), req.GetStepId(), strconv.Itoa(int(req.GetAttempt())), bus.KindResult),
			Attrs:   r.stepAttrs(req),
		})
		return err
	})
}

// observe logs and counts a finished attempt.
func (r *Runner) observe(ctx context.Context, res *planexv1.StepResult) {
	outcome := strings.ToLower(strings.TrimPrefix(res.GetStatus().String(), "STEP_RESULT_STATUS_"))
	if res.GetReplayed() {
		outcome = "replayed"
	}
	r.m.count(ctx, res.GetTool(), outcome)
	r.m.latency.Record(ctx, res.GetDuration().AsDuration().Seconds(), metric.WithAttributes(
		attribute.String("tool", res.GetTool()), attribute.String("outcome", outcome)))
	attrs := []any{"tool", res.GetTool(), "attempt", res.GetAttempt(), "status", outcome, "duration", res.GetDuration().AsDuration()}
	if e := res.GetError(); e != nil {
		attrs = append(attrs, "error_code", e.GetCode().String(), "error", e.GetMessage())
	}
	r.logger.InfoContext(ctx, "step finished", attrs...)
}
