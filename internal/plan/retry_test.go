package plan

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

func TestRetryOf(t *testing.T) {
	read := &planexv1.ToolSpec{Name: "sql.query", SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ}
	send := &planexv1.ToolSpec{Name: "email.send", SideEffect: planexv1.SideEffect_SIDE_EFFECT_EXTERNAL}
	put := &planexv1.ToolSpec{Name: "search.index", SideEffect: planexv1.SideEffect_SIDE_EFFECT_WRITE, Idempotent: true}
	code := func(c planexv1.ErrorCode) []planexv1.ErrorCode { return []planexv1.ErrorCode{c} }
	tests := []struct {
		name    string
		step    *planexv1.Step
		spec    *planexv1.ToolSpec
		code    planexv1.ErrorCode
		retries int
		want    bool
	}{
		{"read retries a timeout", &planexv1.Step{}, read, planexv1.ErrorCode_ERROR_CODE_TIMEOUT, 0, true},
		{"read retries an unknown outcome", &planexv1.Step{}, read, planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN, 1, true},
		{"read stops after 3 attempts", &planexv1.Step{}, read, planexv1.ErrorCode_ERROR_CODE_TIMEOUT, 2, false},
		{"read does not retry a tool error", &planexv1.Step{}, read, planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, 0, false},
		{"external does not retry by default", &planexv1.Step{}, send, planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, false},
		{"external may retry UNAVAILABLE when asked", &planexv1.Step{Retry: &planexv1.RetryPolicy{MaxAttempts: 2, RetryableCodes: code(planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE)}}, send, planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, true},
		{"external never retries a timeout, whatever the policy", &planexv1.Step{Retry: &planexv1.RetryPolicy{MaxAttempts: 5, RetryableCodes: code(planexv1.ErrorCode_ERROR_CODE_TIMEOUT)}}, send, planexv1.ErrorCode_ERROR_CODE_TIMEOUT, 0, false},
		{"idempotent write retries a timeout", &planexv1.Step{}, put, planexv1.ErrorCode_ERROR_CODE_TIMEOUT, 0, true},
		{"idempotent write does not retry an unknown outcome by default", &planexv1.Step{}, put, planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN, 0, false},
		{"invalid arguments are never retried", &planexv1.Step{Retry: &planexv1.RetryPolicy{RetryableCodes: code(planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)}}, read, planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, 0, false},
		{"step overrides tool", &planexv1.Step{Retry: &planexv1.RetryPolicy{MaxAttempts: 1}}, &planexv1.ToolSpec{SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ, Retry: &planexv1.RetryPolicy{MaxAttempts: 9}}, planexv1.ErrorCode_ERROR_CODE_TIMEOUT, 0, false},
		{"unknown tool is treated as external", &planexv1.Step{}, nil, planexv1.ErrorCode_ERROR_CODE_TIMEOUT, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RetryOf(tt.step, tt.spec).Retries(tt.code, tt.retries); got != tt.want {
				t.Fatalf("Retries(%s, %d) = %v, want %v", tt.code, tt.retries, got, tt.want)
			}
		})
	}
}

func TestRetryBackoff(t *testing.T) {
	r := RetryOf(&planexv1.Step{Retry: &planexv1.RetryPolicy{
		InitialBackoff: durationpb.New(time.Second), MaxBackoff: durationpb.New(5 * time.Second), BackoffMultiplier: 3,
	}}, &planexv1.ToolSpec{SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ})
	for n, want := range map[int]time.Duration{1: time.Second, 2: 3 * time.Second, 3: 5 * time.Second, 10: 5 * time.Second} {
		if got := r.Backoff(n); got != want {
			t.Errorf("Backoff(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestValidateRetryPolicy(t *testing.T) {
	cat := MapCatalog{
		"sql.query":  {Name: "sql.query", SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ},
		"email.send": {Name: "email.send", SideEffect: planexv1.SideEffect_SIDE_EFFECT_EXTERNAL},
	}
	s := func(tool string, p *planexv1.RetryPolicy) *planexv1.Plan {
		return &planexv1.Plan{Confidence: 1, Steps: []*planexv1.Step{{Id: "a", Tool: tool, Retry: p}}}
	}
	tests := []struct {
		name string
		plan *planexv1.Plan
		want []string
	}{
		{"valid", s("sql.query", &planexv1.RetryPolicy{MaxAttempts: 5, InitialBackoff: durationpb.New(time.Second), BackoffMultiplier: 1.5}), nil},
		{"too many attempts", s("sql.query", &planexv1.RetryPolicy{MaxAttempts: 21}), []string{"retry.max_attempts: must be in [0, 20], got 21"}},
		{"backoffs", s("sql.query", &planexv1.RetryPolicy{InitialBackoff: durationpb.New(time.Minute), MaxBackoff: durationpb.New(time.Second), BackoffMultiplier: 0.5}),
			[]string{"retry.max_backoff: 1s is below initial_backoff 1m0s", "retry.backoff_multiplier: must be 0 (inherit) or in [1, 100], got 0.5"}},
		{"never retried code", s("sql.query", &planexv1.RetryPolicy{RetryableCodes: []planexv1.ErrorCode{planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT}}),
			[]string{"retry.retryable_codes[0]: ERROR_CODE_INVALID_ARGUMENT is never retried"}},
		{"unsafe code for an external tool", s("email.send", &planexv1.RetryPolicy{RetryableCodes: []planexv1.ErrorCode{planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN}}),
			[]string{"retry.retryable_codes[1]: ERROR_CODE_OUTCOME_UNKNOWN cannot be retried for tool email.send"}},
		{"bad timeouts", &planexv1.Plan{Confidence: 1, Steps: []*planexv1.Step{{Id: "a", Tool: "sql.query",
			ScheduleToStartTimeout: durationpb.New(-time.Second), HeartbeatTimeout: durationpb.New(0)}}},
			[]string{"schedule_to_start_timeout: must be positive", "heartbeat_timeout: must be positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(tt.plan, cat, DefaultLimits())
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Validate = %v, want a ValidationError", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
