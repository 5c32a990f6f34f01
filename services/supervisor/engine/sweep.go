package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// sweepLoop runs sweep every SweepInterval (jittered, so replicas do not
// sweep in step) until ctx ends.
func (e *Engine) sweepLoop(ctx context.Context) {
	for {
		d := e.cfg.SweepInterval/2 + rand.N(e.cfg.SweepInterval)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		n, err := e.Sweep(ctx)
		if err != nil && ctx.Err() == nil {
			e.logger.WarnContext(ctx, "sweep stranded runs", "err", err)
		}
		if n > 0 {
			e.logger.InfoContext(ctx, "re-drove stranded runs", "runs", n)
		}
	}
}

// Sweep re-drives stranded runs and returns how many it kicked. A run is
// stranded when it is not terminal, its last event is older than
// StrandedAfter, and nothing is pending for it: no step in flight or
// waiting to be retried, no gate waiting for a human, and no message in
// its engine inbox (kick, result, started notice, decision). Such a run
// lost the message that would have advanced it (a planning kick published
// into the duplicate window of an earlier one, a crash between an append
// and its side effects outside the repair window). The sweeper publishes a
// repair kick (message id <run>:repair:<last sequence>, so replicas that
// sweep together send one): the replica that gets it folds the run from
// its log and advances it, repeating its side effects, and plans when the
// run is planning. Candidates are the runs the run index lists as pending,
// planning or running (runlog.MovingRunIDs: runs waiting at gates cost a
// sweep nothing), each checked against its planex-runs snapshot; the log
// decides.
//
// A planning run is stranded much sooner, after planningStrandedAfter: its
// planning kick stays in the inbox until the planner's answer is applied
// (pending, in a replica's hand with in-progress acks, or waiting for its
// redelivery), so a planning run without one lost it, and the sweeper
// says so at WARN.
func (e *Engine) Sweep(ctx context.Context) (int, error) {
	ids, err := e.log.MovingRunIDs(ctx)
	if err != nil {
		return 0, err
	}
	kicked := 0
	var errs []error
	for _, id := range ids {
		if ctx.Err() != nil {
			return kicked, ctx.Err()
		}
		snap, err := e.log.Snapshot(ctx, id)
		if err != nil || runlog.Terminal(snap.GetStatus()) {
			continue
		}
		if !e.quiet(snap) {
			continue
		}
		ok, err := e.stranded(ctx, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok {
			continue
		}
		st, err := e.log.Load(ctx, id)
		var corrupt *runlog.BrokenEventError
		if errors.As(err, &corrupt) {
			continue // not stranded: it cannot continue (logged once by the run log)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if runlog.Terminal(st.Run.GetStatus()) || !e.quiet(st.Run) {
			continue // Load repaired a stale snapshot, or the run moved
		}
		seq := strconv.FormatUint(st.Run.GetLastSequence(), 10)
		ack, err := bus.Publish(ctx, e.res.JS, bus.Publication{
			Subject: bus.EngineSubject(id, bus.KindKick),
			Msg:     &planexv1.EngineKick{RunId: id, Reason: "stranded: no event since " + st.Run.GetUpdatedAt().AsTime().Format(time.RFC3339), Repair: true},
			MsgID:   bus.MsgID(id, "repair", seq),
			Attrs:   []attribute.KeyValue{attribute.String("planex.run_id", id)},
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("publish repair kick of run %s: %w", id, err))
			continue
		}
		// A replica sweeping with this one may have sent the same kick
		// (same message id): only the kick the stream took is counted.
		if !ack.Duplicate {
			e.metrics.redrove(ctx, planning(st.Run))
		}
		if planning(st.Run) {
			r := roundOf(st.Run)
			e.logger.WarnContext(ctx, "a planning run has no planning kick in flight; re-driving it", "run_id", id, "status", st.Run.GetStatus(),
				"revision", r.revision, "replans", r.replans, "since", st.Run.GetUpdatedAt().AsTime(), "last_sequence", st.Run.GetLastSequence())
		} else {
			e.logger.WarnContext(ctx, "re-driving a stranded run", "run_id", id, "status", st.Run.GetStatus(), "last_sequence", st.Run.GetLastSequence())
		}
		kicked++
	}
	return kicked, errors.Join(errs...)
}

// planningStrandedAfter is how long a planning run may go without an event
// and without a planning kick in its inbox before the sweeper re-drives it
// (StrandedAfter when that is shorter): long enough for the kick published
// right after the append that started the round to be in the inbox.
const planningStrandedAfter = 10 * time.Second

// quiet reports whether a run looks stranded from its state: old enough
// (planning runs sooner, see Sweep), and waiting neither for an executor,
// a retry nor a human.
func (e *Engine) quiet(run *planexv1.Run) bool {
	after := e.cfg.StrandedAfter
	if planning(run) {
		after = min(after, planningStrandedAfter)
	}
	if u := run.GetUpdatedAt(); u == nil || e.cfg.Now().Sub(u.AsTime()) < after {
		return false
	}
	if run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING {
		return false
	}
	for _, s := range run.GetSteps() {
		if runlog.InFlight(s.GetStatus()) || (s.GetStatus() == planexv1.StepStatus_STEP_STATUS_PENDING && s.GetRetryAt() != nil) {
			return false
		}
	}
	return true
}

// stranded reports whether no message waits in the run's engine inbox.
func (e *Engine) stranded(ctx context.Context, runID string) (bool, error) {
	for _, kind := range []string{bus.KindKick, bus.KindResult, bus.KindStarted, bus.KindDecision} {
		_, err := e.inbox.GetLastMsgForSubject(ctx, bus.EngineSubject(runID, kind))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("read engine inbox of run %s: %w", runID, err)
		}
		return false, nil
	}
	return true, nil
}
