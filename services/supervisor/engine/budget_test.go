package engine

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

func TestResolveBudget(t *testing.T) {
	l := DefaultLimits()
	tests := []struct {
		name    string
		in      *planexv1.Budget
		want    *planexv1.Budget
		wantErr string
	}{
		{
			name: "defaults",
			want: &planexv1.Budget{MaxSteps: 50, MaxReplans: 3, MaxParallelism: 4, MaxTokens: 200_000, Deadline: durationpb.New(30 * time.Minute)},
		},
		{
			name: "requested values within the ceilings",
			in:   &planexv1.Budget{MaxSteps: 3, MaxReplans: 1, MaxParallelism: 8, MaxTokens: 10, Deadline: durationpb.New(time.Hour), StepTimeout: durationpb.New(time.Second)},
			want: &planexv1.Budget{MaxSteps: 3, MaxReplans: 1, MaxParallelism: 8, MaxTokens: 10, Deadline: durationpb.New(time.Hour), StepTimeout: durationpb.New(time.Second)},
		},
		{name: "steps above ceiling", in: &planexv1.Budget{MaxSteps: 1001}, wantErr: "budget.max_steps 1001: exceeds the server ceiling 1000"},
		{name: "negative parallelism", in: &planexv1.Budget{MaxParallelism: -2}, wantErr: "budget.max_parallelism -2: must not be negative"},
		{name: "tokens above ceiling", in: &planexv1.Budget{MaxTokens: 1 << 40}, wantErr: "budget.max_tokens"},
		{name: "step timeout above ceiling", in: &planexv1.Budget{StepTimeout: durationpb.New(2 * time.Hour)}, wantErr: "budget.step_timeout 2h0m0s: exceeds the server ceiling 1h0m0s"},
		{name: "negative deadline", in: &planexv1.Budget{Deadline: durationpb.New(-time.Second)}, wantErr: "budget.deadline -1s"},
		{name: "invalid duration", in: &planexv1.Budget{Deadline: &durationpb.Duration{Seconds: 1, Nanos: -1}}, wantErr: "budget.deadline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := l.Resolve(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !proto.Equal(got, tt.want) {
				t.Fatalf("Resolve = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestLimitsValidate(t *testing.T) {
	l := DefaultLimits()
	l.Default.MaxSteps = 0
	l.Ceiling.Deadline = time.Minute
	err := l.Validate()
	for _, want := range []string{"--default-max-steps 0: must be positive", "--ceiling-deadline 1m0s: below --default-deadline 30m0s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("err = %v, want %q", err, want)
		}
	}
	if err := DefaultLimits().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestStepTimeoutPrecedence(t *testing.T) {
	l := DefaultLimits()
	sec := func(n int) *durationpb.Duration { return durationpb.New(time.Duration(n) * time.Second) }
	tests := []struct {
		name   string
		step   *planexv1.Step
		budget *planexv1.Budget
		spec   *planexv1.ToolSpec
		want   time.Duration
	}{
		{name: "step", step: &planexv1.Step{Timeout: sec(1)}, budget: &planexv1.Budget{StepTimeout: sec(2)}, spec: &planexv1.ToolSpec{DefaultTimeout: sec(3)}, want: time.Second},
		{name: "run", budget: &planexv1.Budget{StepTimeout: sec(2)}, spec: &planexv1.ToolSpec{DefaultTimeout: sec(3)}, want: 2 * time.Second},
		{name: "tool", spec: &planexv1.ToolSpec{DefaultTimeout: sec(3)}, want: 3 * time.Second},
		{name: "server default", want: 2 * time.Minute},
		{name: "capped at the ceiling", step: &planexv1.Step{Timeout: sec(7200)}, want: time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := l.stepTimeout(tt.step, tt.budget, tt.spec); got != tt.want {
				t.Fatalf("stepTimeout = %s, want %s", got, tt.want)
			}
		})
	}
}
