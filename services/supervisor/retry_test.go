package supervisor_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

func flaky(id, tool string, fail int, code string) *planexv1.Step {
	return step(id, tool, map[string]any{"fail": fail, "code": code})
}

// fastRetry keeps a step's default codes and attempts but backs off 50ms.
func fastRetry(s *planexv1.Step, attempts int32) *planexv1.Step {
	s.Retry = &planexv1.RetryPolicy{MaxAttempts: attempts, InitialBackoff: durationpb.New(50 * time.Millisecond), MaxBackoff: durationpb.New(100 * time.Millisecond)}
	return s
}

func dispatchedAttempts(evs []*planexv1.RunEvent, stepID string) []int32 {
	var out []int32
	for _, ev := range evs {
		if d := ev.GetStepDispatched(); d != nil && d.GetStepId() == stepID {
			out = append(out, d.GetAttempt())
		}
	}
	return out
}

// Retryable failures of a read are retried as new attempts (new
// StepDispatched events, counted in usage.steps), without calling the
// planner again; non-retryable failures and tools that are not safe to
// repeat go to the planner.
func TestStepRetryPolicy(t *testing.T) {
	h, r := setup(t)
	tests := []struct {
		name       string
		step       *planexv1.Step
		budget     *planexv1.Budget
		attempts   []int32
		status     planexv1.RunStatus
		reason     planexv1.StopReason
		plannerRun int // planner calls
	}{
		{name: "read, UNAVAILABLE twice, default policy", step: flaky("a", "test.flaky", 2, "UNAVAILABLE"),
			attempts: []int32{1, 2, 3}, status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, reason: planexv1.StopReason_STOP_REASON_SUCCEEDED, plannerRun: 1},
		{name: "read, TIMEOUT once, explicit backoff", step: fastRetry(flaky("a", "test.flaky", 1, "TIMEOUT"), 2),
			attempts: []int32{1, 2}, status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, reason: planexv1.StopReason_STOP_REASON_SUCCEEDED, plannerRun: 1},
		{name: "read, TOOL_FAILED is not retried", step: flaky("a", "test.flaky", 1, "TOOL_FAILED"),
			attempts: []int32{1}, status: planexv1.RunStatus_RUN_STATUS_FAILED, reason: planexv1.StopReason_STOP_REASON_STEP_FAILED, plannerRun: 2},
		{name: "read, retries exhausted", step: fastRetry(flaky("a", "test.flaky", 5, "UNAVAILABLE"), 3),
			attempts: []int32{1, 2, 3}, status: planexv1.RunStatus_RUN_STATUS_FAILED, reason: planexv1.StopReason_STOP_REASON_STEP_FAILED, plannerRun: 2},
		{name: "retries count against max_steps", step: fastRetry(flaky("a", "test.flaky", 5, "UNAVAILABLE"), 10), budget: &planexv1.Budget{MaxSteps: 2},
			attempts: []int32{1, 2}, status: planexv1.RunStatus_RUN_STATUS_FAILED, reason: planexv1.StopReason_STOP_REASON_STEP_FAILED, plannerRun: 2},
		{name: "external, not idempotent: no retry", step: flaky("a", "test.flakysend", 1, "UNAVAILABLE"),
			attempts: []int32{1}, status: planexv1.RunStatus_RUN_STATUS_FAILED, reason: planexv1.StopReason_STOP_REASON_STEP_FAILED, plannerRun: 2},
		{name: "external, explicit UNAVAILABLE retry", step: func() *planexv1.Step {
			s := fastRetry(flaky("a", "test.flakysend", 1, "UNAVAILABLE"), 2)
			s.Retry.RetryableCodes = []planexv1.ErrorCode{planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE}
			return s
		}(), attempts: []int32{1, 2}, status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, reason: planexv1.StopReason_STOP_REASON_SUCCEEDED, plannerRun: 1},
		{name: "idempotent write retries TIMEOUT", step: fastRetry(flaky("a", "test.flakyput", 1, "TIMEOUT"), 0),
			attempts: []int32{1, 2}, status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, reason: planexv1.StopReason_STOP_REASON_SUCCEEDED, plannerRun: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			goal := "retry " + tt.name
			// The planner gives up on any failure, as a playbook without an
			// on_failure branch does.
			h.planner.on(goal, func(n int, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
				if n == 0 {
					return planOf(tt.step), nil
				}
				return noBranch(req), nil
			})
			id := start(t, r.client, &planexv1.StartRunRequest{Goal: goal, Budget: tt.budget})
			run := waitTerminal(t, r.client, id, 20*time.Second)
			if run.GetStatus() != tt.status || run.GetStopReason() != tt.reason {
				t.Fatalf("run %s %s %q, want %s %s", run.GetStatus(), run.GetStopReason(), run.GetStopMessage(), tt.status, tt.reason)
			}
			evs := watchAll(t, r.client, id, 1)
			assertOnce(t, h, id, evs)
			if got := dispatchedAttempts(evs, "a"); !equalInts(got, tt.attempts) {
				t.Fatalf("attempts %v, want %v (events %v)", got, tt.attempts, payloads(evs))
			}
			retrying := 0
			for _, ev := range evs {
				if ev.GetStepRetrying() != nil {
					retrying++
				}
			}
			if got := retrying; got != len(tt.attempts)-1 {
				t.Fatalf("%d StepRetrying events for %d attempts", got, len(tt.attempts))
			}
			if run.GetUsage().GetSteps() != int32(len(tt.attempts)) {
				t.Fatalf("usage.steps %d, want %d", run.GetUsage().GetSteps(), len(tt.attempts))
			}
			if got := len(h.planner.requests(id)); got != tt.plannerRun {
				t.Fatalf("planner called %d times, want %d", got, tt.plannerRun)
			}
			if tt.status == planexv1.RunStatus_RUN_STATUS_FAILED && !contains(run.GetStopMessage(), `step "a"`) {
				t.Fatalf("stop message %q does not name the step", run.GetStopMessage())
			}
		})
	}
}

// A step that times out, retries and times out again stops the run with
// STEP_TIMEOUT when the planner gives up, and with the step's message.
func TestStepTimeoutStopReason(t *testing.T) {
	h, r := setup(t)
	slow := func() *planexv1.Step {
		s := fastRetry(step("slow", "test.sleep", map[string]any{"ms": 3000}), 2)
		s.Timeout = durationpb.New(200 * time.Millisecond)
		return s
	}
	h.planner.on("timeout gives up", func(n int, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
		if n == 0 {
			return planOf(slow()), nil
		}
		if req.GetHistory().GetReplanReason() == "" {
			t.Errorf("replan without a reason")
		}
		return noBranch(req), nil
	})
	for _, tc := range []struct {
		goal   string
		budget *planexv1.Budget
		calls  int
	}{
		{"timeout gives up", nil, 2},
	} {
		id := start(t, r.client, &planexv1.StartRunRequest{Goal: tc.goal, Budget: tc.budget})
		run := waitTerminal(t, r.client, id, 20*time.Second)
		if run.GetStopReason() != planexv1.StopReason_STOP_REASON_STEP_TIMEOUT || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_FAILED {
			t.Fatalf("%s: %s %s %q, want FAILED STEP_TIMEOUT", tc.goal, run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
		}
		if !contains(run.GetStopMessage(), `step "slow" (test.sleep) failed after 2 attempts`) || !contains(run.GetStopMessage(), "start_to_close_timeout") {
			t.Fatalf("%s: stop message %q", tc.goal, run.GetStopMessage())
		}
		if got := len(h.planner.requests(id)); got != tc.calls {
			t.Fatalf("%s: planner calls %d, want %d", tc.goal, got, tc.calls)
		}
	}
}

func equalInts(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Heartbeats extend a running attempt's liveness: a step that heartbeats
// every 100ms outlives a 400ms heartbeat timeout, one that never
// heartbeats is timed out by it long before its start-to-close timeout.
func TestHeartbeatTimeout(t *testing.T) {
	h, r := setup(t)
	withBeat := func(s *planexv1.Step) *planexv1.Step {
		s.HeartbeatTimeout = durationpb.New(400 * time.Millisecond)
		s.Timeout = durationpb.New(10 * time.Second)
		return noRetry(s)
	}
	giveUp := func(s *planexv1.Step) script {
		return func(n int, _ *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
			if n == 0 {
				return planOf(s), nil
			}
			return &planexv1.PlanResponse{Stop: true, GiveUp: true}, nil
		}
	}
	alive := h.runGoal(t, r, "heartbeats", giveUp(withBeat(step("a", "test.beat", map[string]any{"ms": 1500}))))
	silent := h.runGoal(t, r, "no heartbeats", giveUp(withBeat(step("a", "test.sleep", map[string]any{"ms": 5000}))))
	succeeded(t, r, alive)
	run := waitTerminal(t, r.client, silent, 20*time.Second)
	if run.GetStopReason() != planexv1.StopReason_STOP_REASON_STEP_TIMEOUT || !contains(run.GetStopMessage(), "heartbeat_timeout") {
		t.Fatalf("silent step: %s %q, want STEP_TIMEOUT by heartbeat_timeout", run.GetStopReason(), run.GetStopMessage())
	}
}

// Arguments resolved from a large output that could not fit in a step
// request fail the step with INVALID_ARGUMENT naming the size, instead of
// a publish that can never succeed.
func TestOversizedArgumentsFailTheStep(t *testing.T) {
	h, r := setup(t)
	id := h.runGoal(t, r, "huge args", giveUpAfter(nil,
		step("big", "test.big", map[string]any{"bytes": 1_500_000}),
		step("echo", "test.echo", map[string]any{"value": "${{ steps.big.output.data }}"}, "big"),
	))
	run := waitTerminal(t, r.client, id, 20*time.Second)
	st := runlog.Step(run, "echo")
	if run.GetStopReason() != planexv1.StopReason_STOP_REASON_STEP_FAILED || st.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || !contains(st.GetError().GetMessage(), "NATS max payload") {
		t.Fatalf("run %s %q, step error %v", run.GetStopReason(), run.GetStopMessage(), st.GetError())
	}
}
