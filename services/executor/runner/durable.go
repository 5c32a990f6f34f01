package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
)

// Calls to JetStream (planex-effects, planex-outputs, the result publish)
// survive a NATS leader change or a node restart: each call has its own
// deadline, Options.KVTimeout, far shorter than a step's, and a call that
// fails transiently is tried again with backoff until the attempt's budget
// (see budget) is spent. Only then does the runner give up, and only for
// the effect record does giving up mean that a redelivery will report
// OUTCOME_UNKNOWN.

// Defaults of the durability options.
const (
	// DefaultKVTimeout bounds one call to a bucket, the object store or
	// a publish acknowledgement.
	DefaultKVTimeout = 2 * time.Second
	// DefaultRecordGrace is the least time the runner keeps trying to
	// record and report a side effect's result after the tool returned,
	// even when the step's timeout has (nearly) passed: the effect
	// happened, and losing its record costs an escalation.
	DefaultRecordGrace = 15 * time.Second
)

// retryBackoffMin and retryBackoffMax are the first and the longest pause
// between two tries of a JetStream call.
const (
	retryBackoffMin = 50 * time.Millisecond
	retryBackoffMax = time.Second
)

// permanent reports errors that trying again cannot change: the server
// answered (the key exists, is missing, the revision moved on) or this
// connection is closed for good.
func permanent(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyNotFound),
		errors.Is(err, jetstream.ErrKeyDeleted), errors.Is(err, jetstream.ErrObjectNotFound),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, errCorruptRecord):
		return true
	case errors.As(err, &apiErr):
		// The server decided; any other API error (no leader, not
		// available) is transient.
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant,
			jetstream.JSErrCodeBadRequest, jetstream.JSErrCodeStreamMessageExceedsMaximum, jetstream.JSErrCodeMessageNotFound:
			return true
		}
	}
	return false
}

// retry calls op, each call bounded by Options.KVTimeout, until it
// succeeds, fails permanently, ctx ends or until passes. The error of the
// last call is returned, wrapped with what and the number of tries.
func (r *Runner) retry(ctx context.Context, until time.Time, what string, op func(ctx context.Context) error) error {
	backoff := retryBackoffMin
	for tries := 1; ; tries++ {
		callTimeout := min(r.opts.KVTimeout, max(time.Until(until), 100*time.Millisecond))
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		err := op(cctx)
		cancel()
		if err == nil || permanent(err) {
			return err
		}
		if h := r.opts.Hooks.OnRetry; h != nil {
			h(what, err)
		}
		if ctx.Err() != nil || time.Now().Add(backoff).After(until) {
			return fmt.Errorf("%s: gave up after %d tries: %w", what, tries, err)
		}
		r.logger.DebugContext(ctx, "JetStream call failed; trying again", "op", what, "tries", tries, "retry_in", backoff, "err", err)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
		backoff = min(2*backoff, retryBackoffMax)
	}
}

// budget is the time an attempt may spend: the step's timeout from start,
// capped by the run's deadline. Recording a result that happened gets at
// least Options.RecordGrace more (see recordBy).
func (r *Runner) budget(spec *planexv1.ToolSpec, req *planexv1.StepRequest, start time.Time) (timeout time.Duration, until time.Time) {
	timeout = r.opts.DefaultTimeout
	if d := spec.GetDefaultTimeout(); d != nil && d.AsDuration() > 0 {
		timeout = d.AsDuration()
	}
	if d := req.GetTimeout(); d != nil && d.AsDuration() > 0 {
		timeout = d.AsDuration()
	}
	until = start.Add(timeout)
	if dl := req.GetDeadline(); dl != nil && dl.AsTime().Before(until) {
		until = dl.AsTime()
	}
	return timeout, until
}

// recordBy is how long the runner keeps trying to record or report an
// attempt whose budget ends at until.
func (r *Runner) recordBy(until time.Time) time.Time {
	return maxTime(until, time.Now().Add(r.opts.RecordGrace))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// peekEffectRetry reads the record of key, trying again until until.
func (r *Runner) peekEffectRetry(ctx context.Context, key string, until time.Time) (state effectState, rec *planexv1.StepResult, rev uint64, err error) {
	err = r.retry(ctx, until, "read effect record "+key, func(ctx context.Context) error {
		var perr error
		state, rec, rev, perr = r.peekEffect(ctx, key)
		return perr
	})
	return state, rec, rev, err
}

// startEffectRetry creates the "started" record of key. A create whose
// answer was lost may have been stored: when the key exists, the record
// is read back and is this attempt's own when it names this executor and
// this start time.
func (r *Runner) startEffectRetry(ctx context.Context, key string, started *planexv1.StepResult, until time.Time) (rev uint64, ok bool, err error) {
	tries := 0
	err = r.retry(ctx, until, "create effect record "+key, func(ctx context.Context) error {
		tries++
		var serr error
		rev, ok, serr = r.startEffect(ctx, key, started)
		return serr
	})
	if err != nil || ok || tries == 1 {
		return rev, ok, err
	}
	state, rec, recRev, err := r.peekEffectRetry(ctx, key, until)
	if err != nil {
		return 0, false, err
	}
	if state == effectStarted && sameAttemptRun(rec, started) {
		return recRev, true, nil
	}
	return 0, false, nil
}

// finishEffectRetry records res as the final result of key. An update
// whose answer was lost may have been stored: on a revision conflict the
// record is read back and counts when it holds this run's result.
func (r *Runner) finishEffectRetry(ctx context.Context, key string, rev uint64, res *planexv1.StepResult, until time.Time) error {
	err := r.retry(ctx, until, "record result in "+key, func(ctx context.Context) error {
		return r.finishEffect(ctx, key, rev, res)
	})
	if err == nil || !permanent(err) {
		return err
	}
	state, rec, _, perr := r.peekEffectRetry(ctx, key, until)
	if perr != nil {
		return errors.Join(err, perr)
	}
	if state == effectFinished && sameAttemptRun(rec, res) {
		return nil
	}
	return err
}

// abandonEffectRetry removes the "started" record of key; a record that
// is already gone counts as removed.
func (r *Runner) abandonEffectRetry(ctx context.Context, key string, rev uint64, until time.Time) error {
	err := r.retry(ctx, until, "remove effect record "+key, func(ctx context.Context) error {
		return r.abandonEffect(ctx, key, rev)
	})
	if err == nil || !permanent(err) {
		return err
	}
	state, _, _, perr := r.peekEffectRetry(ctx, key, until)
	if perr == nil && state == effectNone {
		return nil
	}
	return errors.Join(err, perr)
}

// sameAttemptRun reports whether two records were written by the same run
// of an attempt: same executor, same start time.
func sameAttemptRun(a, b *planexv1.StepResult) bool {
	return a.GetExecutorId() == b.GetExecutorId() && a.GetStartedAt().AsTime().Equal(b.GetStartedAt().AsTime())
}

// takeoverPoll is how often a delivery that found another delivery's
// "started" record looks again.
const takeoverPoll = 250 * time.Millisecond

// ownerGoneAfter is how long an owner must stay unreachable before it
// counts as dead: a replica whose NATS node restarts is away for a moment
// while its client reconnects.
const ownerGoneAfter = 3 * time.Second

// awaitOwner is called when a delivery finds the attempt started and not
// finished. The attempt may still be running: on this replica (the step
// was redelivered to it while the first delivery runs, its heartbeats lost
// in a NATS leader change) or on another replica that is alive. Reporting
// OUTCOME_UNKNOWN then would escalate a step that is about to succeed, so
// the delivery waits while the owner runs the attempt, until the record is
// finished (and is replayed), the owner is gone or no longer runs it, or
// until passes.
func (r *Runner) awaitOwner(ctx context.Context, req *planexv1.StepRequest, key string, rec *planexv1.StepResult, until time.Time) (effectState, *planexv1.StepResult, error) {
	var unreachableSince time.Time
	for {
		alive, why := r.ownerRuns(ctx, key, rec.GetExecutorId())
		switch {
		case alive == ownerRunning:
			unreachableSince = time.Time{}
		case alive == ownerUnreachable && unreachableSince.IsZero():
			unreachableSince = time.Now()
		case alive == ownerUnreachable && time.Since(unreachableSince) < ownerGoneAfter:
		default:
			r.logger.InfoContext(ctx, "the started attempt has no running owner", "started_by", rec.GetExecutorId(), "why", why)
			return effectStarted, rec, nil
		}
		if time.Now().Add(takeoverPoll).After(until) {
			r.logger.WarnContext(ctx, "owner of the started attempt still running at the end of the step's budget", "started_by", rec.GetExecutorId())
			return effectStarted, rec, nil
		}
		select {
		case <-time.After(takeoverPoll):
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
		state, next, _, err := r.peekEffectRetry(ctx, key, until)
		if err != nil {
			return 0, nil, err
		}
		if state != effectStarted || !sameAttemptRun(next, rec) {
			return state, next, nil
		}
	}
}

// ownerState is what the owner of a started attempt says about it.
type ownerState int

const (
	ownerRunning     ownerState = iota // it runs the attempt now
	ownerIdle                          // it is alive and does not run it
	ownerUnreachable                   // nobody answers for it
)

// ownerRuns asks the executor that started an attempt whether it still
// runs it, over core NATS request/reply on its attempts subject. A replica
// that died has no subscriber: the request fails with no responders. An
// answer that does not come in time (a NATS hiccup) counts as running, the
// safe side; awaitOwner bounds the wait.
func (r *Runner) ownerRuns(ctx context.Context, key, owner string) (ownerState, string) {
	if owner == r.opts.ReplicaID {
		if r.active(key) {
			return ownerRunning, "running on this replica"
		}
		return ownerIdle, "this replica started it and no longer runs it"
	}
	if !bus.ValidToken(owner) {
		return ownerIdle, fmt.Sprintf("owner %q is not a replica id", owner)
	}
	cctx, cancel := context.WithTimeout(ctx, r.opts.KVTimeout)
	defer cancel()
	reply, err := r.res.JS.Conn().RequestWithContext(cctx, AttemptsSubject(r.opts.Pool, owner), []byte(key))
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return ownerUnreachable, "no responders"
	case err != nil:
		return ownerRunning, "no answer: " + err.Error()
	case string(reply.Data) == attemptRunning:
		return ownerRunning, "owner runs it"
	}
	return ownerIdle, "owner does not run it"
}

// AttemptsSubject is the core NATS subject on which replica id of pool
// answers whether it runs an attempt (request: its planex-effects key;
// reply: "running" or "idle"). The pool in the subject lets NATS
// permissions confine a pool's replicas to each other.
func AttemptsSubject(pool, id string) string {
	return "planex.executor." + pool + "." + id + ".attempts"
}

const (
	attemptRunning = "running"
	attemptIdle    = "idle"
)

// serveAttempts answers AttemptsSubject requests until the returned
// subscription is unsubscribed.
func (r *Runner) serveAttempts() (*nats.Subscription, error) {
	sub, err := r.res.JS.Conn().Subscribe(AttemptsSubject(r.opts.Pool, r.opts.ReplicaID), func(m *nats.Msg) {
		ans := attemptIdle
		if r.active(string(m.Data)) {
			ans = attemptRunning
		}
		_ = m.Respond([]byte(ans))
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", AttemptsSubject(r.opts.Pool, r.opts.ReplicaID), err)
	}
	return sub, nil
}

// enter marks the attempt with effect key as running on this replica;
// leave unmarks it.
func (r *Runner) enter(key string) {
	r.runningMu.Lock()
	r.running[key]++
	r.runningMu.Unlock()
}

func (r *Runner) leave(key string) {
	r.runningMu.Lock()
	if r.running[key]--; r.running[key] <= 0 {
		delete(r.running, key)
	}
	r.runningMu.Unlock()
}

func (r *Runner) active(key string) bool {
	r.runningMu.Lock()
	defer r.runningMu.Unlock()
	return r.running[key] > 0
}
