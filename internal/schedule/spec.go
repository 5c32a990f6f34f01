// Package schedule keeps planex's schedules (planex.v1.ScheduleService):
// their validation, the nominal times of a cron expression or an interval,
// the planex-schedules KV bucket they live in, and the Scheduler that
// fires them exactly once across supervisor replicas without a leader.
// It knows the supervisor only through the small Runs interface
// (StartRun, GetRun, CancelRun); see docs/schedules.md.
package schedule

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Limits of a schedule.
const (
	// MinInterval is the shortest interval (and cron has seconds).
	MinInterval = time.Second
	// MaxJitter bounds ScheduleSpec.jitter.
	MaxJitter = time.Hour
	// DefaultCatchUpWindow is Schedule.catch_up_window when unset.
	DefaultCatchUpWindow = time.Minute
	// MaxBackfill bounds the nominal times of one backfill.
	MaxBackfill = 1000
	// maxText bounds description and note.
	maxText = 1024
)

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidID checks a schedule id, naming the field.
func ValidID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("id %q: want 1 to 63 of [a-z0-9_-], starting with a letter or digit", id)
	}
	return nil
}

// Spec is a compiled ScheduleSpec: the nominal times and their jitter.
type Spec struct {
	cron     *Cron
	interval time.Duration
	offset   time.Duration
	jitter   time.Duration
}

// ParseSpec compiles a ScheduleSpec, naming the field at fault
// ("spec.cron: ...").
func ParseSpec(s *planexv1.ScheduleSpec) (*Spec, error) {
	if s == nil {
		return nil, errors.New("spec: required (cron or interval)")
	}
	var errs []error
	sp := &Spec{interval: s.GetInterval().AsDuration(), offset: s.GetOffset().AsDuration(), jitter: s.GetJitter().AsDuration()}
	hasCron, hasInterval := s.GetCron() != "", s.GetInterval() != nil
	switch {
	case hasCron && hasInterval:
		errs = append(errs, errors.New("spec: set cron or interval, not both"))
	case !hasCron && !hasInterval:
		errs = append(errs, errors.New("spec: set cron or interval"))
	case hasCron:
		loc := time.UTC
		if tz := s.GetTimeZone(); tz != "" {
			l, err := time.LoadLocation(tz)
			if err != nil {
				errs = append(errs, fmt.Errorf("spec.time_zone %q: not an IANA time zone (e.g. Europe/Paris)", tz))
			} else {
				loc = l
			}
		}
		c, err := ParseCron(s.GetCron(), loc)
		if err != nil {
			errs = append(errs, fmt.Errorf("spec.cron: %w", err))
		} else if c.Next(time.Now()).IsZero() {
			errs = append(errs, fmt.Errorf("spec.cron %q: never fires", s.GetCron()))
		} else {
			sp.cron = c
		}
		if s.GetOffset() != nil {
			errs = append(errs, errors.New("spec.offset: only with interval"))
		}
	case hasInterval:
		if s.GetTimeZone() != "" {
			errs = append(errs, errors.New("spec.time_zone: only with cron (an interval counts from the Unix epoch)"))
		}
		if sp.interval < MinInterval || sp.interval%time.Second != 0 {
			errs = append(errs, fmt.Errorf("spec.interval %s: want whole seconds, at least %s", sp.interval, MinInterval))
		}
		if sp.offset < 0 || (sp.interval > 0 && sp.offset >= sp.interval) {
			errs = append(errs, fmt.Errorf("spec.offset %s: want 0 <= offset < interval (%s)", sp.offset, sp.interval))
		}
	}
	if sp.jitter < 0 || sp.jitter > MaxJitter || (hasInterval && sp.interval > 0 && sp.jitter > sp.interval) {
		errs = append(errs, fmt.Errorf("spec.jitter %s: want 0 to %s, and at most the interval", sp.jitter, MaxJitter))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return sp, nil
}

// Next is the first nominal time strictly after t (zero when none).
func (s *Spec) Next(t time.Time) time.Time {
	if s.cron != nil {
		return s.cron.Next(t)
	}
	// Nominal times are epoch + offset + k·interval.
	base := t.UnixNano() - int64(s.offset)
	k := floorDiv(base, int64(s.interval)) + 1
	return time.Unix(0, k*int64(s.interval)+int64(s.offset)).UTC()
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// Upcoming is the next n nominal times after t.
func (s *Spec) Upcoming(t time.Time, n int) []time.Time {
	var out []time.Time
	for len(out) < n {
		t = s.Next(t)
		if t.IsZero() {
			break
		}
		out = append(out, t)
	}
	return out
}

// Jitter is the delay of the firing of nominal time t of schedule id: a
// hash of both, so every replica computes the same.
func (s *Spec) Jitter(id string, t time.Time) time.Duration {
	if s.jitter <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(t.UnixNano()))
	h.Write(b[:])
	return time.Duration(h.Sum64() % uint64(s.jitter))
}

// Validate checks a schedule as CreateSchedule and UpdateSchedule accept
// it (maxCatchUp: the longest catch-up window, 0 for no bound), naming
// the field at fault, and returns its compiled spec.
func Validate(sc *planexv1.Schedule, maxCatchUp time.Duration) (*Spec, error) {
	var errs []error
	if err := ValidID(sc.GetId()); err != nil {
		errs = append(errs, err)
	}
	sp, err := ParseSpec(sc.GetSpec())
	if err != nil {
		errs = append(errs, err)
	}
	if sc.GetAction().GetGoal() == "" {
		errs = append(errs, errors.New("action.goal: required"))
	}
	for k := range sc.GetAction().GetLabels() {
		if k == LabelSchedule || k == LabelNominal {
			errs = append(errs, fmt.Errorf("action.labels[%q]: set by the schedule itself", k))
		}
	}
	if p := sc.GetOverlapPolicy(); planexv1.ScheduleOverlapPolicy_name[int32(p)] == "" {
		errs = append(errs, fmt.Errorf("overlap_policy %d: unknown", p))
	}
	if w := sc.GetCatchUpWindow().AsDuration(); w < 0 || (sc.GetCatchUpWindow() != nil && w < time.Second && w != 0) || (maxCatchUp > 0 && w > maxCatchUp) {
		errs = append(errs, fmt.Errorf("catch_up_window %s: want 1s to %s (idempotency keys are kept that long)", w, maxCatchUp))
	}
	if len(sc.GetDescription()) > maxText {
		errs = append(errs, fmt.Errorf("description: at most %d bytes", maxText))
	}
	if len(sc.GetNote()) > maxText {
		errs = append(errs, fmt.Errorf("note: at most %d bytes", maxText))
	}
	return sp, errors.Join(errs...)
}

// CatchUpWindow is a schedule's catch-up window (its default when unset).
func CatchUpWindow(sc *planexv1.Schedule) time.Duration {
	if w := sc.GetCatchUpWindow().AsDuration(); w > 0 {
		return w
	}
	return DefaultCatchUpWindow
}

// Labels every run a schedule starts carries.
const (
	// LabelSchedule is the schedule's id.
	LabelSchedule = "planex.schedule"
	// LabelNominal is the firing's nominal time (RFC 3339).
	LabelNominal = "planex.schedule.nominal"
)

// IdempotencyKey is the StartRun idempotency key of a firing.
func IdempotencyKey(id string, nominal time.Time) string {
	return "schedule:" + id + ":" + nominal.UTC().Format(time.RFC3339Nano)
}
