package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// ErrInvalid marks a request refused for its content; the message names
// the field.
var ErrInvalid = errors.New("invalid schedule request")

func invalid(err error) error { return fmt.Errorf("%w: %w", ErrInvalid, err) }

// Ops are the ScheduleService operations over a Store, with the caller's
// subject passed in; the supervisor translates their errors to gRPC
// status codes (ErrInvalid, ErrNotFound, ErrExists, ErrConflict).
type Ops struct {
	// Store holds the schedules.
	Store *Store
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// MaxCatchUp bounds catch_up_window (the idempotency keys' retention;
	// 0: no bound).
	MaxCatchUp time.Duration
}

func (o *Ops) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// View fills a stored schedule's output-only fields for an answer.
func View(e *Entry, now time.Time) *planexv1.Schedule {
	sc := proto.Clone(e.Stored.GetSchedule()).(*planexv1.Schedule)
	sc.Revision = e.Revision
	sc.NextFirings = nil
	var remaining int64
	spec, err := ParseSpec(sc.GetSpec())
	if err == nil {
		for _, b := range e.Stored.GetState().GetBackfills() {
			from := b.GetStartTime().AsTime().Add(-time.Nanosecond)
			if b.GetCursor() != nil {
				from = b.GetCursor().AsTime()
			}
			remaining += int64(len(spec.Between(from, b.GetEndTime().AsTime(), MaxBackfill+1)))
		}
		if !sc.GetPaused() {
			after := now
			if c := e.Stored.GetState().GetCursor(); c != nil && c.AsTime().Before(now) {
				after = c.AsTime() // due ones not handled yet come first
			}
			for _, t := range spec.Upcoming(after, 5) {
				sc.NextFirings = append(sc.NextFirings, timestamppb.New(t))
			}
		}
	}
	sc.BackfillRemaining = remaining
	return sc
}

// Between lists the nominal times t with after < t < end (at most max).
func (s *Spec) Between(after, end time.Time, max int) []time.Time {
	var out []time.Time
	for t := s.Next(after); !t.IsZero() && t.Before(end) && len(out) < max; t = s.Next(t) {
		out = append(out, t)
	}
	return out
}

// Create stores a new schedule for subject.
func (o *Ops) Create(ctx context.Context, sc *planexv1.Schedule, subject string) (*planexv1.Schedule, error) {
	if _, err := Validate(sc, o.MaxCatchUp); err != nil {
		return nil, invalid(err)
	}
	now := o.now()
	c := definition(sc)
	c.Id, c.Paused, c.Note = sc.GetId(), sc.GetPaused(), sc.GetNote()
	c.CreatedBy, c.UpdatedBy = subject, subject
	c.CreateTime, c.UpdateTime = timestamppb.New(now), timestamppb.New(now)
	st := &planexv1.StoredSchedule{Schedule: c, State: &planexv1.ScheduleState{Created: timestamppb.New(now)}}
	rev, err := o.Store.Create(ctx, st)
	if err != nil {
		return nil, err
	}
	return View(&Entry{Stored: st, Revision: rev}, now), nil
}

// definition is the client-settable part of a schedule.
func definition(sc *planexv1.Schedule) *planexv1.Schedule {
	return &planexv1.Schedule{Id: sc.GetId(), Description: sc.GetDescription(), Spec: sc.GetSpec(), Action: sc.GetAction(),
		OverlapPolicy: sc.GetOverlapPolicy(), CatchUpWindow: sc.GetCatchUpWindow()}
}

// Get reads one schedule.
func (o *Ops) Get(ctx context.Context, id string) (*planexv1.Schedule, error) {
	e, err := o.Store.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return View(e, o.now()), nil
}

// List reads every schedule.
func (o *Ops) List(ctx context.Context) ([]*planexv1.Schedule, error) {
	es, err := o.Store.List(ctx)
	if err != nil {
		return nil, err
	}
	now := o.now()
	out := make([]*planexv1.Schedule, 0, len(es))
	for _, e := range es {
		out = append(out, View(e, now))
	}
	return out, nil
}

// change applies fn to the stored schedule id at rev (0: as read) with a
// compare-and-set, retrying lost races only when rev is 0.
func (o *Ops) change(ctx context.Context, id string, rev uint64, subject string, fn func(*planexv1.StoredSchedule, time.Time) error) (*planexv1.Schedule, error) {
	for {
		e, err := o.Store.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if rev != 0 && e.Revision != rev {
			return nil, ErrConflict
		}
		now := o.now()
		next := proto.Clone(e.Stored).(*planexv1.StoredSchedule)
		if err := fn(next, now); err != nil {
			return nil, err
		}
		next.Schedule.UpdatedBy, next.Schedule.UpdateTime = subject, timestamppb.New(now)
		n, err := o.Store.Update(ctx, next, e.Revision)
		if errors.Is(err, ErrConflict) && rev == 0 {
			continue // a firing was recorded meanwhile
		}
		if err != nil {
			return nil, err
		}
		return View(&Entry{Stored: next, Revision: n}, now), nil
	}
}

// Update replaces the definition of a schedule.
func (o *Ops) Update(ctx context.Context, sc *planexv1.Schedule, rev uint64, subject string) (*planexv1.Schedule, error) {
	if _, err := Validate(sc, o.MaxCatchUp); err != nil {
		return nil, invalid(err)
	}
	return o.change(ctx, sc.GetId(), rev, subject, func(st *planexv1.StoredSchedule, _ time.Time) error {
		d := definition(sc)
		s := st.Schedule
		s.Description, s.Spec, s.Action, s.OverlapPolicy, s.CatchUpWindow = d.Description, d.Spec, d.Action, d.OverlapPolicy, d.CatchUpWindow
		return nil
	})
}

// Pause pauses a schedule.
func (o *Ops) Pause(ctx context.Context, id, note, subject string) (*planexv1.Schedule, error) {
	if len(note) > maxText {
		return nil, invalid(fmt.Errorf("note: at most %d bytes", maxText))
	}
	return o.change(ctx, id, 0, subject, func(st *planexv1.StoredSchedule, _ time.Time) error {
		st.Schedule.Paused, st.Schedule.Note = true, note
		return nil
	})
}

// Resume resumes a schedule: nominal times of the pause never fire.
func (o *Ops) Resume(ctx context.Context, id, note, subject string) (*planexv1.Schedule, error) {
	if len(note) > maxText {
		return nil, invalid(fmt.Errorf("note: at most %d bytes", maxText))
	}
	return o.change(ctx, id, 0, subject, func(st *planexv1.StoredSchedule, now time.Time) error {
		if st.Schedule.GetPaused() {
			if c := st.State.GetCursor(); c == nil || c.AsTime().Before(now) {
				st.State.Cursor = timestamppb.New(now)
			}
			st.Schedule.BufferedFiring = nil
		}
		st.Schedule.Paused, st.Schedule.Note = false, note
		return nil
	})
}

// Delete removes a schedule.
func (o *Ops) Delete(ctx context.Context, id string, rev uint64) error {
	return o.Store.Delete(ctx, id, rev)
}

// Backfill queues the nominal times of [start, end) and returns how many
// there are.
func (o *Ops) Backfill(ctx context.Context, id string, start, end time.Time, policy planexv1.ScheduleOverlapPolicy, subject string) (*planexv1.Schedule, int64, error) {
	switch {
	case start.IsZero() || end.IsZero():
		return nil, 0, invalid(errors.New("start_time and end_time: required"))
	case !end.After(start):
		return nil, 0, invalid(fmt.Errorf("end_time %s: must be after start_time %s", end.UTC().Format(time.RFC3339), start.UTC().Format(time.RFC3339)))
	case planexv1.ScheduleOverlapPolicy_name[int32(policy)] == "":
		return nil, 0, invalid(fmt.Errorf("overlap_policy %d: unknown", policy))
	}
	var count int64
	sc, err := o.change(ctx, id, 0, subject, func(st *planexv1.StoredSchedule, _ time.Time) error {
		spec, err := ParseSpec(st.Schedule.GetSpec())
		if err != nil {
			return invalid(err)
		}
		n := len(spec.Between(start.Add(-time.Nanosecond), end, MaxBackfill+1))
		if n > MaxBackfill {
			return invalid(fmt.Errorf("end_time: the range holds more than %d nominal times; backfill it in parts", MaxBackfill))
		}
		count = int64(n)
		p := policy
		if p == planexv1.ScheduleOverlapPolicy_SCHEDULE_OVERLAP_POLICY_UNSPECIFIED {
			p = st.Schedule.GetOverlapPolicy()
		}
		st.State.Backfills = append(st.State.Backfills, &planexv1.ScheduleBackfill{StartTime: timestamppb.New(start), EndTime: timestamppb.New(end), OverlapPolicy: p})
		return nil
	})
	return sc, count, err
}
