package schedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
)

// Runs is what the scheduler needs of the supervisor's API (the tenant's
// api.Server, in process).
type Runs interface {
	StartRun(ctx context.Context, req *planexv1.StartRunRequest) (*planexv1.StartRunResponse, error)
	GetRun(ctx context.Context, req *planexv1.GetRunRequest) (*planexv1.GetRunResponse, error)
	CancelRun(ctx context.Context, req *planexv1.CancelRunRequest) (*planexv1.CancelRunResponse, error)
}

// Config configures a Scheduler.
type Config struct {
	// Store holds the tenant's schedules.
	Store *Store
	// KV is the store's bucket, watched for changes.
	KV jetstream.KeyValue
	// Runs starts, reads and cancels runs.
	Runs Runs
	// Logger logs firings.
	Logger *slog.Logger
	// Tenant labels metrics.
	Tenant string
	// Now is the clock (time.Now when nil); tests move it.
	Now func() time.Time
	// Recheck is how often schedules waiting on a running run (buffered
	// firings, sequential backfills) look again (default 1s).
	Recheck time.Duration
	// AfterStart, when set, runs once StartRun answered and before the
	// firing is recorded; an error ends the attempt there, as a crash
	// would (tests).
	AfterStart func(id string, nominal time.Time) error
}

// Scheduler fires a tenant's schedules. Every supervisor replica runs
// one; there is no leader. A firing is decided with a compare-and-set of
// the schedule's state (the winner's decision is the only one), started
// with an idempotency key derived from the nominal time (a retry finds
// the run the first attempt created) and recorded with a second
// compare-and-set, so a replica that dies at any point leaves a state
// another replica completes — no firing skipped, none doubled.
type Scheduler struct {
	cfg     Config
	firings metric.Int64Counter

	wake   chan struct{}
	logger *slog.Logger
}

// New returns a scheduler; Run fires schedules until its context ends.
func New(cfg Config) (*Scheduler, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := otel.Meter("github.com/planex-dev/planex/internal/schedule").Int64Counter("planex.schedule.firings",
		metric.WithDescription("Nominal times of schedules handled, by outcome (started, skipped, buffered, failed)."))
	if err != nil {
		return nil, err
	}
	return &Scheduler{cfg: cfg, firings: c, wake: make(chan struct{}, 1), logger: cfg.Logger}, nil
}

// Wake makes the scheduler look at every schedule now (after a change
// through the API on this replica; the watch tells the others).
func (s *Scheduler) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run fires schedules until ctx ends.
func (s *Scheduler) Run(ctx context.Context) error {
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		s.watch(ctx)
	}()
	defer func() { <-watched }()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.wake:
		}
		next := s.pass(ctx)
		d := time.Until(next)
		d = min(max(d, 5*time.Millisecond), s.cfg.Recheck)
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(d)
	}
}

// watch follows the bucket so that changes made on other replicas are
// looked at at once.
func (s *Scheduler) watch(ctx context.Context) {
	for ctx.Err() == nil {
		w, err := s.cfg.KV.WatchAll(ctx, jetstream.UpdatesOnly())
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
				continue
			}
		}
		for open := true; open; {
			select {
			case <-ctx.Done():
				_ = w.Stop()
				return
			case e, ok := <-w.Updates():
				if open = ok; ok && e != nil {
					s.Wake()
				}
			}
		}
		_ = w.Stop()
	}
}

// pass handles every due schedule and returns when the next one is due.
func (s *Scheduler) pass(ctx context.Context) time.Time {
	now := s.cfg.Now()
	next := now.Add(s.cfg.Recheck)
	entries, err := s.cfg.Store.List(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.WarnContext(ctx, "list schedules", "err", err)
		}
		return next
	}
	for _, e := range entries {
		due, err := s.Advance(ctx, e.Stored.GetSchedule().GetId())
		if err != nil && ctx.Err() == nil {
			s.logger.WarnContext(ctx, "schedule firing not done yet; retrying", "schedule", e.Stored.GetSchedule().GetId(), "err", err)
			continue
		}
		if !due.IsZero() && due.Before(next) {
			next = due
		}
	}
	// Times are the scheduler's clock; the timer runs on the wall clock.
	return time.Now().Add(next.Sub(now))
}

// Advance handles everything of schedule id that is due at the
// scheduler's clock and returns when it is next due (zero: not before a
// change or the recheck interval).
func (s *Scheduler) Advance(ctx context.Context, id string) (time.Time, error) {
	for i := 0; ctx.Err() == nil; i++ {
		due, progressed, err := s.step(ctx, id)
		if err != nil || !progressed {
			return due, err
		}
		if i > 10000 {
			return time.Time{}, nil // let other schedules have a turn
		}
	}
	return time.Time{}, ctx.Err()
}

// step takes one decision (or executes one) for schedule id.
func (s *Scheduler) step(ctx context.Context, id string) (due time.Time, progressed bool, err error) {
	e, err := s.cfg.Store.Get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	st := e.Stored
	sc, state := st.GetSchedule(), st.GetState()
	if state.GetPending() != nil {
		return time.Time{}, true, s.execute(ctx, e)
	}
	if sc.GetPaused() {
		return time.Time{}, false, nil
	}
	spec, err := ParseSpec(sc.GetSpec())
	if err != nil {
		return time.Time{}, false, fmt.Errorf("schedule %s: %w", id, err)
	}
	now := s.cfg.Now()
	alive, err := s.alive(ctx, sc.GetRunningRunIds())
	if err != nil {
		return time.Time{}, false, err
	}
	next := proto.Clone(st).(*planexv1.StoredSchedule)
	nsc, nstate := next.Schedule, next.State
	nsc.RunningRunIds = alive

	// A buffered firing starts once nothing runs.
	if b := sc.GetBufferedFiring(); b != nil && len(alive) == 0 {
		nsc.BufferedFiring = nil
		nstate.Pending = s.intent(sc, b.AsTime(), nil, false)
		return time.Time{}, true, s.commit(ctx, next, e.Revision, nil)
	}

	cursor := state.GetCursor()
	if cursor == nil {
		cursor = state.GetCreated()
	}
	if n := spec.Next(cursor.AsTime()); !n.IsZero() {
		fireAt := n.Add(spec.Jitter(id, n))
		if fireAt.After(now) {
			due = fireAt
		} else {
			window := CatchUpWindow(sc)
			if now.Sub(fireAt) > window {
				// Missed beyond the window (the supervisors were down):
				// every such nominal time is recorded in one skip.
				last, count := n, 0
				for t := n; !t.IsZero() && now.Sub(t.Add(spec.Jitter(id, t))) > window && count < 1_000_000; t = spec.Next(t) {
					last, count = t, count+1
				}
				nstate.Cursor = timestamppb.New(last)
				reason := fmt.Sprintf("missed: %d firing(s) from %s to %s were more than the catch-up window (%s) late", count, n.UTC().Format(time.RFC3339), last.UTC().Format(time.RFC3339), window)
				f := &planexv1.ScheduleFiring{NominalTime: timestamppb.New(last), ActualTime: timestamppb.New(now), Outcome: planexv1.ScheduleFiringOutcome_SCHEDULE_FIRING_OUTCOME_SKIPPED, Reason: reason}
				return time.Time{}, true, s.commit(ctx, next, e.Revision, f, int64(count))
			}
			nstate.Cursor = timestamppb.New(n)
			f := s.overlap(sc, next, n, now, alive, sc.GetOverlapPolicy(), false)
			return time.Time{}, true, s.commit(ctx, next, e.Revision, f)
		}
	}

	// Backfills, oldest request first, one nominal time at a time.
	if len(state.GetBackfills()) > 0 {
		b := nstate.Backfills[0]
		from := b.GetStartTime().AsTime().Add(-time.Nanosecond)
		if b.GetCursor() != nil {
			from = b.GetCursor().AsTime()
		}
		t := spec.Next(from)
		if t.IsZero() || !t.Before(b.GetEndTime().AsTime()) {
			nstate.Backfills = nstate.Backfills[1:]
			return time.Time{}, true, s.commit(ctx, next, e.Revision, nil)
		}
		policy := b.GetOverlapPolicy()
		if policy == planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_BUFFER_ONE && len(alive) > 0 {
			return due, false, nil // one after the other: look again later
		}
		b.Cursor = timestamppb.New(t)
		f := s.overlap(sc, next, t, now, alive, policy, true)
		return time.Time{}, true, s.commit(ctx, next, e.Revision, f)
	}
	if len(alive) != len(sc.GetRunningRunIds()) {
		return due, true, s.commit(ctx, next, e.Revision, nil)
	}
	return due, false, nil
}

// overlap decides a due nominal time n under policy: an intent to start
// (pending) or a skipped or buffered firing to record.
func (s *Scheduler) overlap(sc *planexv1.Schedule, next *planexv1.StoredSchedule, n, now time.Time, alive []string, policy planexv1.ScheduleOverlapPolicy, backfill bool) *planexv1.ScheduleFiring {
	rec := func(o planexv1.ScheduleFiringOutcome, reason string) *planexv1.ScheduleFiring {
		return &planexv1.ScheduleFiring{NominalTime: timestamppb.New(n), ActualTime: timestamppb.New(now), Outcome: o, Reason: reason, Backfill: backfill}
	}
	if len(alive) == 0 || policy == planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_ALLOW_ALL {
		next.State.Pending = s.intent(sc, n, nil, backfill)
		return nil
	}
	switch policy {
	case planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_CANCEL_OTHER:
		next.State.Pending = s.intent(sc, n, alive, backfill)
		return nil
	case planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_BUFFER_ONE:
		if next.Schedule.GetBufferedFiring() == nil {
			next.Schedule.BufferedFiring = timestamppb.New(n)
			return rec(planexv1.ScheduleFiringOutcome_SCHEDULE_FIRING_OUTCOME_BUFFERED, "overlap: waits for run "+alive[0])
		}
		return rec(planexv1.ScheduleFiringOutcome_SCHEDULE_FIRING_OUTCOME_SKIPPED, "overlap: a firing is already buffered")
	default: // SKIP
		return rec(planexv1.ScheduleFiringOutcome_SCHEDULE_FIRING_OUTCOME_SKIPPED, "overlap: run "+alive[0]+" has not finished")
	}
}

// intent is the decision to start the run of nominal time n.
func (s *Scheduler) intent(sc *planexv1.Schedule, n time.Time, cancel []string, backfill bool) *planexv1.ScheduleIntent {
	return &planexv1.ScheduleIntent{NominalTime: timestamppb.New(n), Request: StartRequest(sc, n), CancelRunIds: cancel, Backfill: backfill}
}

// StartRequest is the StartRun request of a schedule's firing at nominal
// time n.
func StartRequest(sc *planexv1.Schedule, n time.Time) *planexv1.StartRunRequest {
	a := sc.GetAction()
	labels := map[string]string{}
	for k, v := range a.GetLabels() {
		labels[k] = v
	}
	labels[LabelSchedule] = sc.GetId()
	labels[LabelNominal] = n.UTC().Format(time.RFC3339Nano)
	return &planexv1.StartRunRequest{
		Goal: a.GetGoal(), Inputs: a.GetInputs(), Labels: labels, Budget: a.GetBudget(), Mode: a.GetMode(),
		IdempotencyKey: IdempotencyKey(sc.GetId(), n), PlannerBackend: a.GetPlannerBackend(), ApprovePlans: a.GetApprovePlans(),
	}
}

// execute carries out the pending intent of e: cancel, start (both
// idempotent), record.
func (s *Scheduler) execute(ctx context.Context, e *Entry) error {
	st := e.Stored
	sc, p := st.GetSchedule(), st.GetState().GetPending()
	rctx := authn.WithIdentity(ctx, Identity(sc.GetId()))
	for _, id := range p.GetCancelRunIds() {
		_, err := s.cfg.Runs.CancelRun(rctx, &planexv1.CancelRunRequest{RunId: id,
			Reason: fmt.Sprintf("schedule %s: overlap policy CANCEL_OTHER (firing of %s)", sc.GetId(), p.GetNominalTime().AsTime().UTC().Format(time.RFC3339))})
		if err != nil && !settled(err) {
			return fmt.Errorf("cancel run %s: %w", id, err)
		}
	}
	now := s.cfg.Now()
	f := &planexv1.ScheduleFiring{NominalTime: p.GetNominalTime(), ActualTime: timestamppb.New(now), Backfill: p.GetBackfill()}
	resp, err := s.cfg.Runs.StartRun(rctx, p.GetRequest())
	switch {
	case err == nil:
		f.Outcome, f.RunId = planexv1.ScheduleFiringOutcome_SCHEDULE_FIRING_OUTCOME_STARTED, resp.GetRun().GetId()
	case permanent(err):
		f.Outcome, f.Reason = planexv1.ScheduleFiringOutcome_SCHEDULE_FIRING_OUTCOME_FAILED, "StartRun refused: "+status.Convert(err).Message()
	default:
		return fmt.Errorf("start run of %s: %w", p.GetNominalTime().AsTime().UTC().Format(time.RFC3339), err)
	}
	if s.cfg.AfterStart != nil {
		if err := s.cfg.AfterStart(sc.GetId(), p.GetNominalTime().AsTime()); err != nil {
			return err
		}
	}
	next := proto.Clone(st).(*planexv1.StoredSchedule)
	next.State.Pending = nil
	if f.RunId != "" && !slices.Contains(next.Schedule.RunningRunIds, f.RunId) {
		next.Schedule.RunningRunIds = append(next.Schedule.RunningRunIds, f.RunId)
		if n := len(next.Schedule.RunningRunIds); n > maxRunning {
			next.Schedule.RunningRunIds = next.Schedule.RunningRunIds[n-maxRunning:]
		}
	}
	return s.commit(ctx, next, e.Revision, f)
}

// maxRunning bounds the run ids a schedule tracks (ALLOW_ALL may have
// many running).
const maxRunning = 64

// maxRecent is how many firings a schedule keeps.
const maxRecent = 20

// commit writes next at rev with firing f (if any) recorded; a lost
// compare-and-set is not an error: another replica moved the schedule
// on, and the next step reads what it wrote.
func (s *Scheduler) commit(ctx context.Context, next *planexv1.StoredSchedule, rev uint64, f *planexv1.ScheduleFiring, count ...int64) error {
	if f != nil {
		next.Schedule.RecentFirings = append([]*planexv1.ScheduleFiring{f}, next.Schedule.RecentFirings...)
		if len(next.Schedule.RecentFirings) > maxRecent {
			next.Schedule.RecentFirings = next.Schedule.RecentFirings[:maxRecent]
		}
	}
	_, err := s.cfg.Store.Update(ctx, next, rev)
	if errors.Is(err, ErrConflict) {
		return nil
	}
	if err != nil {
		return err
	}
	if f != nil {
		n := int64(1)
		if len(count) > 0 {
			n = count[0]
		}
		outcome := strings.ToLower(strings.TrimPrefix(f.GetOutcome().String(), "SCHEDULE_FIRING_OUTCOME_"))
		s.firings.Add(ctx, n, metric.WithAttributes(attribute.String("outcome", outcome), attribute.String("tenant", s.cfg.Tenant)))
		s.logger.InfoContext(ctx, "schedule firing", "schedule", next.Schedule.GetId(), "nominal", f.GetNominalTime().AsTime().UTC().Format(time.RFC3339Nano),
			"outcome", outcome, "run_id", f.GetRunId(), "reason", f.GetReason())
	}
	return nil
}

// alive is the subset of ids whose runs have not finished.
func (s *Scheduler) alive(ctx context.Context, ids []string) ([]string, error) {
	var out []string
	for _, id := range ids {
		resp, err := s.cfg.Runs.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
		if status.Code(err) == codes.NotFound {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read run %s: %w", id, err)
		}
		if !Terminal(resp.GetRun().GetStatus()) {
			out = append(out, id)
		}
	}
	return out, nil
}

// Terminal reports a finished run's status.
func Terminal(st planexv1.RunStatus) bool {
	switch st {
	case planexv1.RunStatus_RUN_STATUS_SUCCEEDED, planexv1.RunStatus_RUN_STATUS_FAILED,
		planexv1.RunStatus_RUN_STATUS_ESCALATED, planexv1.RunStatus_RUN_STATUS_CANCELLED:
		return true
	}
	return false
}

// permanent reports a StartRun refusal that a retry would meet again.
func permanent(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.ResourceExhausted, codes.OutOfRange:
		return true
	}
	return false
}

// settled reports a CancelRun error meaning there is nothing to cancel.
func settled(err error) bool {
	switch status.Code(err) {
	case codes.NotFound, codes.FailedPrecondition:
		return true
	}
	return false
}

// Identity is who a schedule's runs are started by: subject
// "schedule:<id>" (Run.started_by), with the runner role.
func Identity(id string) authn.Identity {
	return authn.Identity{Subject: "schedule:" + id, Roles: []authn.Role{authn.RoleRunner}}
}
