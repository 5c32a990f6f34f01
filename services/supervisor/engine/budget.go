package engine

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// BudgetLimits is one set of budget values (server defaults or ceilings).
type BudgetLimits struct {
	// MaxSteps bounds step attempts dispatched over a run.
	MaxSteps int32
	// MaxReplans bounds replans, rejected plans included.
	MaxReplans int32
	// MaxParallelism bounds steps in flight at once.
	MaxParallelism int32
	// MaxTokens bounds planner tokens over a run.
	MaxTokens int64
	// Deadline bounds a run's wall-clock time.
	Deadline time.Duration
	// StepTimeout bounds one step attempt.
	StepTimeout time.Duration
}

// Limits are the server-wide budget defaults (for fields a client leaves
// zero) and ceilings (above which StartRun is refused).
type Limits struct {
	// Default applies to zero fields of a requested budget.
	Default BudgetLimits
	// Ceiling is the largest value a client may request.
	Ceiling BudgetLimits
}

// DefaultLimits are the defaults of the supervisor's budget flags.
func DefaultLimits() Limits {
	return Limits{
		Default: BudgetLimits{MaxSteps: 50, MaxReplans: 3, MaxParallelism: 4, MaxTokens: 200_000, Deadline: 30 * time.Minute, StepTimeout: 2 * time.Minute},
		Ceiling: BudgetLimits{MaxSteps: 1000, MaxReplans: 20, MaxParallelism: 64, MaxTokens: 10_000_000, Deadline: 24 * time.Hour, StepTimeout: time.Hour},
	}
}

// Validate checks that defaults are positive and within the ceilings; the
// errors name the flags (--default-max-steps, --ceiling-max-steps, ...).
func (l Limits) Validate() error {
	var errs []error
	d, c := l.Default, l.Ceiling
	checkFlags(&errs, "max-steps", int64(d.MaxSteps), int64(c.MaxSteps))
	checkFlags(&errs, "max-replans", int64(d.MaxReplans), int64(c.MaxReplans))
	checkFlags(&errs, "max-parallelism", int64(d.MaxParallelism), int64(c.MaxParallelism))
	checkFlags(&errs, "max-tokens", d.MaxTokens, c.MaxTokens)
	checkFlags(&errs, "deadline", d.Deadline, c.Deadline)
	checkFlags(&errs, "step-timeout", d.StepTimeout, c.StepTimeout)
	return errors.Join(errs...)
}

func checkFlags[T int64 | time.Duration](errs *[]error, name string, def, ceil T) {
	switch {
	case def <= 0:
		*errs = append(*errs, fmt.Errorf("--default-%s %v: must be positive", name, def))
	case ceil < def:
		*errs = append(*errs, fmt.Errorf("--ceiling-%s %v: below --default-%s %v", name, ceil, name, def))
	}
}

// Resolve returns the effective budget of a run: the requested values, with
// zero fields taking the defaults. A negative value, an invalid duration or
// a value above the ceiling is an error naming the field and the value
// (budget.max_steps 5000 exceeds ...). The step timeout stays unset when
// the client did not ask for one, so that a tool's default timeout applies
// before the server default (see [Engine] dispatch).
func (l Limits) Resolve(b *planexv1.Budget) (*planexv1.Budget, error) {
	var errs []error
	d, c := l.Default, l.Ceiling
	out := &planexv1.Budget{
		MaxSteps:       int32(resolve(&errs, "max_steps", int64(b.GetMaxSteps()), int64(d.MaxSteps), int64(c.MaxSteps))),
		MaxReplans:     int32(resolve(&errs, "max_replans", int64(b.GetMaxReplans()), int64(d.MaxReplans), int64(c.MaxReplans))),
		MaxParallelism: int32(resolve(&errs, "max_parallelism", int64(b.GetMaxParallelism()), int64(d.MaxParallelism), int64(c.MaxParallelism))),
		MaxTokens:      resolve(&errs, "max_tokens", b.GetMaxTokens(), d.MaxTokens, c.MaxTokens),
		Deadline:       durationpb.New(resolve(&errs, "deadline", duration(&errs, "deadline", b.GetDeadline()), d.Deadline, c.Deadline)),
	}
	if st := resolve(&errs, "step_timeout", duration(&errs, "step_timeout", b.GetStepTimeout()), 0, c.StepTimeout); st > 0 {
		out.StepTimeout = durationpb.New(st)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// resolve checks one requested budget value against its ceiling; zero takes
// the default.
func resolve[T int64 | time.Duration](errs *[]error, field string, v, def, ceil T) T {
	switch {
	case v < 0:
		*errs = append(*errs, fmt.Errorf("budget.%s %v: must not be negative", field, v))
	case v > ceil:
		*errs = append(*errs, fmt.Errorf("budget.%s %v: exceeds the server ceiling %v", field, v, ceil))
	case v == 0:
		return def
	}
	return v
}

// duration converts a requested duration; nil or invalid is zero (invalid
// is also an error).
func duration(errs *[]error, field string, v *durationpb.Duration) time.Duration {
	if v == nil {
		return 0
	}
	if err := v.CheckValid(); err != nil {
		*errs = append(*errs, fmt.Errorf("budget.%s %v: %w", field, v, err))
		return 0
	}
	return v.AsDuration()
}

// stepTimeout is the timeout of one attempt: the step's own, else the run's,
// else the tool's default, else the server default; never above the
// ceiling.
func (l Limits) stepTimeout(step *planexv1.Step, budget *planexv1.Budget, spec *planexv1.ToolSpec) time.Duration {
	var t time.Duration
	for _, d := range []*durationpb.Duration{step.GetTimeout(), budget.GetStepTimeout(), spec.GetDefaultTimeout()} {
		if d != nil && d.AsDuration() > 0 {
			t = d.AsDuration()
			break
		}
	}
	if t <= 0 {
		t = l.Default.StepTimeout
	}
	if c := l.Ceiling.StepTimeout; c > 0 && t > c {
		t = c
	}
	return t
}
