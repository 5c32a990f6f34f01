package plan

import (
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// MaxRetryAttempts bounds RetryPolicy.max_attempts.
const MaxRetryAttempts = 20

// Retry is a resolved retry policy: every field set.
type Retry struct {
	// MaxAttempts counts attempts in a plan revision, the first included.
	MaxAttempts int
	// InitialBackoff is the delay before the first retry.
	InitialBackoff time.Duration
	// MaxBackoff caps the delay.
	MaxBackoff time.Duration
	// Multiplier grows the delay after each retry (>= 1).
	Multiplier float64
	// Codes are the retried error codes.
	Codes []planexv1.ErrorCode
}

// neverRetried are error codes about the arguments, the plan or a policy:
// running the same attempt again cannot change them.
var neverRetried = []planexv1.ErrorCode{
	planexv1.ErrorCode_ERROR_CODE_UNSPECIFIED,
	planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT,
	planexv1.ErrorCode_ERROR_CODE_UNKNOWN_TOOL,
	planexv1.ErrorCode_ERROR_CODE_EXPECTATION_FAILED,
	planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED,
	planexv1.ErrorCode_ERROR_CODE_CANCELLED,
}

// unsafeCodes are failures after which a side effect may have happened:
// a tool that is neither read-only nor idempotent must not repeat them.
var unsafeCodes = []planexv1.ErrorCode{
	planexv1.ErrorCode_ERROR_CODE_TIMEOUT,
	planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN,
	planexv1.ErrorCode_ERROR_CODE_MAX_DELIVERIES,
	planexv1.ErrorCode_ERROR_CODE_INTERNAL,
	planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED,
}

// repeatable reports whether running a tool twice is harmless: it only
// reads, or it declares idempotency.
func repeatable(spec *planexv1.ToolSpec) bool {
	return spec.GetSideEffect() == planexv1.SideEffect_SIDE_EFFECT_READ || spec.GetIdempotent()
}

// DefaultRetry is the policy of a tool's side effect: READ and idempotent
// tools retry transient failures (3 attempts, 1s doubling to 30s); other
// tools are not retried (a failure goes to the planner, an unknown outcome
// is escalated).
func DefaultRetry(spec *planexv1.ToolSpec) Retry {
	r := Retry{MaxAttempts: 1, InitialBackoff: time.Second, MaxBackoff: 30 * time.Second, Multiplier: 2}
	if !repeatable(spec) {
		return r
	}
	r.MaxAttempts = 3
	r.Codes = []planexv1.ErrorCode{
		planexv1.ErrorCode_ERROR_CODE_TIMEOUT,
		planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE,
		planexv1.ErrorCode_ERROR_CODE_MAX_DELIVERIES,
		planexv1.ErrorCode_ERROR_CODE_INTERNAL,
	}
	if spec.GetSideEffect() == planexv1.SideEffect_SIDE_EFFECT_READ {
		// A read has no outcome to lose.
		r.Codes = append(r.Codes, planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN)
	}
	return r
}

// RetryOf resolves the retry policy of step s calling the tool spec (nil
// when unknown): the step's fields, then the tool's, then DefaultRetry.
func RetryOf(s *planexv1.Step, spec *planexv1.ToolSpec) Retry {
	r := DefaultRetry(spec)
	for _, p := range []*planexv1.RetryPolicy{spec.GetRetry(), s.GetRetry()} {
		if p == nil {
			continue
		}
		if n := p.GetMaxAttempts(); n > 0 {
			r.MaxAttempts = min(int(n), MaxRetryAttempts)
		}
		if d := p.GetInitialBackoff(); d != nil && d.AsDuration() > 0 {
			r.InitialBackoff = d.AsDuration()
		}
		if d := p.GetMaxBackoff(); d != nil && d.AsDuration() > 0 {
			r.MaxBackoff = d.AsDuration()
		}
		if m := p.GetBackoffMultiplier(); m >= 1 {
			r.Multiplier = m
		}
		if len(p.GetRetryableCodes()) > 0 {
			r.Codes = slices.Clone(p.GetRetryableCodes())
		}
	}
	// Whatever a policy says, never repeat what cannot change, nor an
	// uncertain side effect of a tool that is not safe to repeat.
	r.Codes = slices.DeleteFunc(r.Codes, func(c planexv1.ErrorCode) bool {
		return slices.Contains(neverRetried, c) || (!repeatable(spec) && slices.Contains(unsafeCodes, c))
	})
	r.MaxBackoff = max(r.MaxBackoff, r.InitialBackoff)
	return r
}

// Retries reports whether a failure with code may be retried after the
// given number of retries already made.
func (r Retry) Retries(code planexv1.ErrorCode, retries int) bool {
	return retries+1 < r.MaxAttempts && slices.Contains(r.Codes, code)
}

// Backoff is the delay before retry number n (1-based).
func (r Retry) Backoff(n int) time.Duration {
	d := float64(r.InitialBackoff)
	for i := 1; i < n && d < float64(r.MaxBackoff); i++ {
		d *= r.Multiplier
	}
	return min(time.Duration(d), r.MaxBackoff)
}

// checkRetry validates a retry policy of a step (or a tool) against the
// tool's side effect; field is where the policy sits ("retry").
func checkRetry(add func(field, format string, args ...any), field string, p *planexv1.RetryPolicy, spec *planexv1.ToolSpec) {
	if p == nil {
		return
	}
	if n := p.GetMaxAttempts(); n < 0 || n > MaxRetryAttempts {
		add(field+".max_attempts", "must be in [0, %d], got %d", MaxRetryAttempts, n)
	}
	dur := func(name string, d *durationpb.Duration) time.Duration {
		if d == nil {
			return 0
		}
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
			add(field+"."+name, "must not be negative, got %v", d.AsDuration())
			return 0
		}
		return d.AsDuration()
	}
	initial, maxB := dur("initial_backoff", p.GetInitialBackoff()), dur("max_backoff", p.GetMaxBackoff())
	if initial > 0 && maxB > 0 && maxB < initial {
		add(field+".max_backoff", "%v is below initial_backoff %v", maxB, initial)
	}
	if m := p.GetBackoffMultiplier(); m != 0 && !(m >= 1 && m <= 100) {
		add(field+".backoff_multiplier", "must be 0 (inherit) or in [1, 100], got %v", m)
	}
	for i, c := range p.GetRetryableCodes() {
		f := fmt.Sprintf("%s.retryable_codes[%d]", field, i)
		switch {
		case planexv1.ErrorCode_name[int32(c)] == "":
			add(f, "unknown error code %d", c)
		case slices.Contains(neverRetried, c):
			add(f, "%s is never retried: the same attempt cannot succeed", c)
		case spec != nil && !repeatable(spec) && slices.Contains(unsafeCodes, c):
			add(f, "%s cannot be retried for tool %s (%s, not idempotent): the side effect may have happened", c, spec.GetName(), spec.GetSideEffect())
		}
	}
}

// CheckToolRetry validates a tool spec's retry policy and heartbeat
// timeout, returning one error per problem (for catalog registration).
func CheckToolRetry(spec *planexv1.ToolSpec) []error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("tool %s: %s: %s", spec.GetName(), field, fmt.Sprintf(format, args...)))
	}
	checkRetry(add, "retry", spec.GetRetry(), spec)
	if d := spec.GetHeartbeatTimeout(); d != nil && (d.CheckValid() != nil || d.AsDuration() < 0) {
		add("heartbeat_timeout", "must not be negative, got %v", d.AsDuration())
	}
	return errs
}
