package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/telemetry"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

const (
	// maxConflicts bounds how often one message reloads its run after
	// losing an append race before it is retried later.
	maxConflicts = 16
	// unknownRunDeliveries is how often a message for an unknown run is
	// retried (the run log may lag a little on a replica) before it is
	// dropped.
	unknownRunDeliveries = 3
	// staleDeliveries bounds retries of a message about an attempt this
	// replica does not see yet.
	staleDeliveries = 20
)

// process handles one engine message and settles it: ack when handled or
// irrelevant, delayed nak when it must come back (timer not due, transient
// failure), term when it cannot be decoded or its run's log is corrupt
// (the run cannot continue, and waiting does not repair the log).
func (e *Engine) process(ctx context.Context, msg jetstream.Msg) {
	start := time.Now()
	runID, kind, err := bus.ParseEngineSubject(msg.Subject())
	if err != nil {
		e.logger.Warn("terminating engine message with a bad subject", "subject", msg.Subject(), "err", err)
		_ = msg.TermWithReason("bad subject")
		e.metrics.droppedMsg(ctx, "", dropBadSubject)
		return
	}
	// A run finished by this message gets its root span once the
	// message's own span ended (deferred first, so it runs last).
	ctx, roots := withRootSlot(ctx)
	defer e.flushRoots(ctx, roots)
	startSpan := bus.StartConsumerSpan
	if kind == bus.KindTimer || kind == bus.KindStarted {
		// A timer fires long after it was set, a started notice may
		// arrive after its run finished: their handling is linked to the
		// run's trace, not part of it (their story is told by the step
		// span's events).
		startSpan = bus.StartLinkedConsumerSpan
	}
	ctx, span := startSpan(ctx, bus.NatsMsg(msg), attribute.String("planex.run_id", runID))
	defer span.End()
	ctx = telemetry.WithLogAttrs(ctx, slog.String("run_id", runID))
	stopBeat := e.heartbeat(ctx, msg)
	err = e.handle(ctx, runID, kind, msg)
	stopBeat()

	delivered := uint64(1)
	if md, merr := msg.Metadata(); merr == nil {
		delivered = md.NumDelivered
	}
	outcome := "ack"
	var (
		ny      notYet
		corrupt *runlog.BrokenEventError
	)
	switch {
	case err == nil || errors.Is(err, errIgnore):
		err = msg.Ack()
	case errors.As(err, &ny):
		outcome = "delay"
		err = msg.NakWithDelay(ny.delay)
	case errors.As(err, &corrupt) && corrupt.StreamSeq > 0:
		// The run's log holds an entry that is not an event or breaks its
		// chain: final, and nothing may be appended past it (fail closed).
		// Redelivering would spin; the run log logged it once at ERROR.
		outcome = "corrupt"
		span.RecordError(err)
		span.SetStatus(codes.Error, "run log corrupt")
		err = msg.TermWithReason(fmt.Sprintf("run log corrupt at stream sequence %d", corrupt.StreamSeq))
		e.metrics.droppedMsg(ctx, kind, dropCorruptLog)
	case errors.Is(err, errDecode):
		outcome = "term"
		e.logger.WarnContext(ctx, "terminating undecodable engine message", "subject", msg.Subject(), "err", err)
		err = msg.TermWithReason(err.Error())
		e.metrics.droppedMsg(ctx, kind, dropUndecodable)
	case errors.Is(err, runlog.ErrRunNotFound) && delivered >= unknownRunDeliveries:
		e.logger.DebugContext(ctx, "dropping engine message for an unknown run", "kind", kind)
		err = msg.Ack()
		e.metrics.droppedMsg(ctx, kind, dropUnknownRun)
	case errors.Is(err, runlog.ErrRunNotFound):
		outcome = "retry"
		err = msg.NakWithDelay(time.Second)
	case errors.Is(err, errStale) && delivered >= staleDeliveries:
		e.logger.WarnContext(ctx, "dropping engine message about an attempt or round the run log never showed", "kind", kind, "delivered", delivered, "err", err)
		err = msg.Ack()
		e.metrics.droppedMsg(ctx, kind, dropStale)
	case errors.Is(err, errStale):
		outcome = "retry"
		e.logger.DebugContext(ctx, "engine message ahead of the run log read, will retry", "kind", kind, "delivered", delivered, "err", err)
		err = msg.NakWithDelay(100 * time.Millisecond)
	default:
		outcome = "retry"
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		level := slog.LevelWarn
		if ctx.Err() != nil {
			level = slog.LevelDebug
		}
		e.logger.Log(ctx, level, "engine message failed, will retry", "kind", kind, "delivered", delivered, "err", err)
		err = msg.NakWithDelay(backoff(delivered))
	}
	if err != nil && ctx.Err() == nil {
		e.logger.DebugContext(ctx, "settle engine message", "kind", kind, "outcome", outcome, "err", err)
	}
	e.metrics.handled(ctx, kind, outcome, time.Since(start))
}

// backoff is the redelivery delay after n failed deliveries.
func backoff(n uint64) time.Duration {
	d := 250 * time.Millisecond
	for i := uint64(1); i < n && d < 15*time.Second; i++ {
		d *= 2
	}
	return min(d, 15*time.Second)
}

// heartbeat sends in-progress acks while a message is handled, so a long
// handling (a planner call) is not redelivered to another replica.
func (e *Engine) heartbeat(ctx context.Context, msg jetstream.Msg) (stop func()) {
	return bus.KeepInProgress(msg, e.cfg.AckWait/3, func(err error) {
		e.logger.DebugContext(ctx, "in-progress ack", "err", err)
	})
}

// errDecode marks a poison message.
var errDecode = errors.New("undecodable message")

func decode(msg jetstream.Msg, into proto.Message) error {
	if err := bus.Decode(bus.NatsMsg(msg), into); err != nil {
		return fmt.Errorf("%w: %w", errDecode, err)
	}
	return nil
}

// handle decodes a message and runs the decision for its kind.
func (e *Engine) handle(ctx context.Context, runID, kind string, msg jetstream.Msg) error {
	var payload proto.Message
	switch kind {
	case bus.KindResult:
		payload = &planexv1.StepResult{}
	case bus.KindStarted:
		payload = &planexv1.StepStartedNotice{}
	case bus.KindTimer:
		payload = &planexv1.EngineTimer{}
	case bus.KindDecision:
		payload = &planexv1.GateDecided{}
	case bus.KindKick:
		payload = &planexv1.EngineKick{}
	default:
		return fmt.Errorf("%w: unknown engine message kind %q", errDecode, kind)
	}
	if err := decode(msg, payload); err != nil {
		return err
	}
	var d decision
	switch p := payload.(type) {
	case *planexv1.StepResult:
		ctx = telemetry.WithLogAttrs(ctx, slog.String("step_id", p.GetStepId()))
		d = func(ctx context.Context, tx *runlog.Tx) error { return e.onResult(ctx, tx, p) }
	case *planexv1.StepStartedNotice:
		ctx = telemetry.WithLogAttrs(ctx, slog.String("step_id", p.GetStepId()))
		if !p.GetHeartbeat() {
			// Off the result's critical path: a fast step's result is
			// usually handled first (and records the start with it).
			select {
			case <-time.After(startedDelay):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if attemptOver(e.log.Cached(runID), p.GetStepId(), p.GetAttempt()) {
			return errIgnore // nothing to record, and nothing to load for
		}
		if p.GetHeartbeat() {
			handled, err := e.onHeartbeat(ctx, runID, p)
			if handled || err != nil {
				return err
			}
		}
		handled, err := e.onRestart(ctx, runID, p)
		switch {
		case err != nil && !errors.Is(err, errIgnore):
			return err
		case handled:
			// The restart's timers are out; the log records the new start.
			d = func(_ context.Context, tx *runlog.Tx) error { return e.onRestarted(tx, p) }
		default:
			d = func(_ context.Context, tx *runlog.Tx) error { return e.onStarted(tx, p) }
		}
	case *planexv1.EngineTimer:
		// A timer that is not due goes back without loading its run; one
		// whose step finished long ago is dropped when it fires.
		if wait := p.GetFireAt().AsTime().Sub(e.cfg.Now()); wait > 0 {
			return notYet{wait}
		}
		d = func(ctx context.Context, tx *runlog.Tx) error { return e.onTimer(ctx, tx, p) }
	case *planexv1.GateDecided:
		d = func(_ context.Context, tx *runlog.Tx) error { return e.onDecision(tx, p) }
	case *planexv1.EngineKick:
		if p.GetRepair() {
			// Fold the run from its log (an unverified state), so advancing
			// it repeats the side effects its state calls for.
			e.log.Forget(runID)
		}
		if p.GetCritique() {
			return e.onCritiques(ctx, runID)
		}
		if !p.GetCancel() {
			var kicked *round
			if r, ok := kickRound(runID, msg.Headers().Get(jetstream.MsgIDHeader)); ok {
				kicked = &r
			}
			return e.onPlanKick(withKick(ctx), runID, kicked)
		}
		d = func(_ context.Context, tx *runlog.Tx) error { return e.onCancel(tx, p) }
	}
	if kind == bus.KindResult {
		return e.transactJoined(ctx, runID, d)
	}
	return e.transact(ctx, runID, d)
}

// startedDelay is how long a started notice waits before it is handled,
// so that it does not hold the run's lock (and a worker) when the step's
// result follows it closely: a result of a step still DISPATCHED records
// its start itself, and the notice is then dropped without loading the run.
// It only delays the start-to-close timer of longer steps by as much.
const startedDelay = 10 * time.Millisecond

// attemptOver reports whether a (possibly stale) state shows that a step's
// attempt is over — a later attempt exists, or the attempt left
// DISPATCHED/RUNNING. These facts only move forward (a reset starts a step
// over with a new attempt number), so a stale state cannot be wrong about
// them. A finished run is not enough: a reset may have re-opened it.
func attemptOver(st *runlog.State, stepID string, attempt int32) bool {
	if st == nil || st.Run == nil {
		return false
	}
	s := runlog.Step(st.Run, stepID)
	return s != nil && (s.GetAttempt() > attempt || (s.GetAttempt() == attempt && !runlog.InFlight(s.GetStatus())))
}

// decision is the message-specific part of handling; it emits events on tx
// and may return errIgnore, errStale or notYet.
type decision func(ctx context.Context, tx *runlog.Tx) error

// transact runs one decision on the run under this replica's run lock:
// load, decide, advance the run as far as its state allows, append, perform
// the side effects; it repeats on append conflicts. A decision that returns
// errIgnore still advances the run (to repair side effects after a crash).
func (e *Engine) transact(ctx context.Context, runID string, decide decision) error {
	j := &joined{ctx: ctx, decide: decide}
	e.decideRun(ctx, runID, e.locks.lock(runID), []*joined{j}, false)
	j.settle()
	return j.err
}

// transactJoined is transact for a decision that the run lock's holder may
// take over (a step's result, see joined): the results of a fan-out that
// arrive together are decided in one transaction by whichever of their
// handlers gets the lock first.
func (e *Engine) transactJoined(ctx context.Context, runID string, decide decision) error {
	j := &joined{ctx: ctx, decide: decide}
	unlock, taken := e.locks.lockJoined(runID, j)
	if taken {
		unlock()
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.SetAttributes(attribute.Bool("planex.joined", true))
			span.AddLink(trace.LinkFromContext(j.by, attribute.String("planex.link", "decided by")))
		}
	} else {
		e.decideRun(ctx, runID, unlock, []*joined{j}, true)
	}
	j.settle()
	return j.err
}

// decideRun decides batch (with take, every decision waiting for the run's
// lock instead) on the run in one transaction, with the run's lock held
// (unlocked before it returns), and finishes each decision with its
// outcome. Each decision is followed by the run's advance, as when they
// are handled one after another, so the log reads the same (and replays
// the same); the side effects are performed once, after the one append.
// A decision that fails on its own is finished with its error and left
// out, and the others are decided again without it.
func (e *Engine) decideRun(ctx context.Context, runID string, unlock func(), batch []*joined, take bool) {
	var err error
	locked := true
	defer func() {
		if locked {
			for _, j := range batch {
				j.finish(ctx, err, nil)
			}
			unlock()
		}
	}()
	if err = e.acquire(ctx); err != nil {
		return
	}
	defer e.release()
	if e.cfg.Admit != nil {
		// The tenants' shared slot (services/supervisor/quota.Fair),
		// after this replica's own worker slot.
		release, aerr := e.cfg.Admit(ctx)
		if err = aerr; err != nil {
			return
		}
		defer release()
	}
	if take {
		// Taken once a worker is ours: what joined while we waited for
		// it is decided with us.
		batch = e.locks.take(runID)
		if len(batch) > 1 {
			trace.SpanFromContext(ctx).SetAttributes(attribute.Int("planex.decisions", len(batch)))
		}
	}
	// The first try decides on this replica's own state without reading
	// the log (one round trip less); the conditional append refuses it
	// when another replica advanced the run, and the next try reads the
	// log.
	trust := true
attempts:
	for range maxConflicts {
		load := e.log.Load
		if trust {
			load = e.log.LoadTrusted
		}
		var st *runlog.State
		if st, err = load(ctx, runID); err != nil {
			return
		}
		trusted := trust && st.Verified
		trust = false
		if runlog.Terminal(st.Run.GetStatus()) {
			if trusted {
				// A finished run may have been reset (ResetRun appends
				// without this replica): read the log before ignoring.
				continue
			}
			e.logger.DebugContext(ctx, "ignoring engine message for a finished run", "status", st.Run.GetStatus())
			err = errIgnore
			return
		}
		var tx *runlog.Tx
	decide:
		for {
			tx = e.log.Begin(st)
			for i, j := range batch {
				if i > 0 {
					// As if the previous decision had been handled on
					// its own.
					if err = e.advance(ctx, tx); err != nil {
						return
					}
				}
				j.decided = j.decide(j.ctx, tx)
				if trusted && (errors.Is(j.decided, errStale) || errors.Is(j.decided, errIgnore)) {
					// The message may be ahead of a stale state: read the
					// log. An ignored message is checked too: with nothing
					// to append, no conditional append would catch the
					// staleness, and a replica whose cached run is behind
					// would drop (ack) a message that matters, e.g. the
					// planning kick of a replan another replica requested.
					continue attempts
				}
				if j.decided != nil && !errors.Is(j.decided, errIgnore) {
					if len(batch) == 1 {
						err = j.decided
						return
					}
					j.finish(ctx, j.decided, nil)
					batch = slices.Delete(batch, i, i+1)
					continue decide
				}
			}
			break
		}
		if err = e.advance(ctx, tx); err != nil {
			return
		}
		// A decision that dispatches one step may be that step's request.
		d, endDispatch := e.directDispatch(ctx, tx)
		if d != nil {
			tx.SetDispatch(d)
		}
		// The snapshot is written while the side effects are published.
		next, settle, cerr := e.log.CommitDeferred(ctx, tx)
		if endDispatch != nil {
			endDispatch()
		}
		if errors.Is(cerr, runlog.ErrConflict) {
			e.logger.DebugContext(ctx, "run advanced concurrently, deciding again")
			continue
		}
		if err = cerr; err != nil {
			return
		}
		e.metrics.committed(ctx, next.Run, tx.Events())
		e.traceCommitted(ctx, st, next, tx.Events())
		if e.cfg.OnEvents != nil && len(tx.Events()) > 0 {
			e.cfg.OnEvents(ctx, next.Run, tx.Events())
		}
		e.releasePlaces(ctx, st, next, tx.Events())
		if h := e.cfg.Hooks.AfterAppend; h != nil && len(tx.Events()) > 0 {
			h(runID, tx.Events())
		}
		if err = e.perform(ctx, st, next, tx.Events()); err != nil {
			settle()
			e.log.Forget(runID)
			return
		}
		e.log.MarkVerified(next)
		// The run's next decision need not wait for a status change's
		// snapshot; the messages are settled (acked) only after it.
		for _, j := range batch {
			j.finish(ctx, j.decided, settle)
		}
		if len(batch) > 1 {
			e.metrics.joinedResults(ctx, len(batch)-1)
		}
		locked = false
		unlock()
		return
	}
	err = fmt.Errorf("run %s: gave up after %d append conflicts", runID, maxConflicts)
}
