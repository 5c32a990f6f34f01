package eval

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Observation is what came of a task's run.
type Observation struct {
	// Run is the final run (nil when it could not be started or followed).
	Run *planexv1.Run
	// Events is the run's log (for the trajectory); without it the
	// trajectory is read from the run's steps (last attempts only).
	Events []*planexv1.RunEvent
	// Latency is the run's wall time as the client saw it.
	Latency time.Duration
	// Err is why there is no run.
	Err error
	// Failures are what the harness saw go wrong while the run went on (a
	// gate no rule of the task decides); each fails the task.
	Failures []string
	// Decisions are the gate decisions the harness made, in order
	// ("approve gate g1 (step close)").
	Decisions []string
}

// TaskResult is a task's score.
type TaskResult struct {
	// Name is the task's name.
	Name string `json:"name"`
	// RunID is the run's id.
	RunID string `json:"run_id,omitempty"`
	// Passed is true when every expectation and limit held.
	Passed bool `json:"passed"`
	// Failures say what did not hold, one per expectation.
	Failures []string `json:"failures,omitempty"`
	// Status and StopReason are the run's (lower case, no prefix).
	Status     string `json:"status"`
	StopReason string `json:"stop_reason,omitempty"`
	// Steps, Replans and Tokens are the run's usage.
	Steps   int   `json:"steps"`
	Replans int   `json:"replans"`
	Tokens  int64 `json:"tokens"`
	// ToolCalls and ToolFailures count step attempts and the failed ones.
	ToolCalls    int `json:"tool_calls"`
	ToolFailures int `json:"tool_failures"`
	// Escalated is true when the run escalated.
	Escalated bool `json:"escalated"`
	// LatencyMS is the run's wall time in milliseconds.
	LatencyMS float64 `json:"latency_ms"`
	// Trajectory are the run's tool calls.
	Trajectory []ToolCall `json:"trajectory,omitempty"`
	// Gates are the gate decisions the harness made for the task.
	Gates []string `json:"gates,omitempty"`
}

// Score checks a task's run against the task (with the suite's limits
// when the task sets none).
func Score(s *Suite, t Task, obs Observation) TaskResult {
	r := TaskResult{Name: t.Name, LatencyMS: float64(obs.Latency) / float64(time.Millisecond)}
	if obs.Run == nil {
		r.Status = "error"
		msg := "no run"
		if obs.Err != nil {
			msg = obs.Err.Error()
		}
		r.Failures = append([]string{msg}, obs.Failures...)
		return r
	}
	run := obs.Run
	r.RunID = run.GetId()
	r.Status = enumName(run.GetStatus().String(), "RUN_STATUS_")
	r.StopReason = enumName(run.GetStopReason().String(), "STOP_REASON_")
	r.Steps, r.Replans, r.Tokens = int(run.GetUsage().GetSteps()), int(run.GetUsage().GetReplans()), run.GetUsage().GetTokens()
	r.Escalated = run.GetStatus() == planexv1.RunStatus_RUN_STATUS_ESCALATED
	r.Trajectory = Calls(run, obs.Events)
	r.ToolCalls = len(r.Trajectory)
	for _, c := range r.Trajectory {
		if c.Outcome == "failed" {
			r.ToolFailures++
		}
	}
	fail := func(format string, args ...any) { r.Failures = append(r.Failures, fmt.Sprintf(format, args...)) }
	r.Gates = obs.Decisions
	r.Failures = append(r.Failures, obs.Failures...)

	want := t.Expect.Status
	if want == "" {
		want = "succeeded"
	}
	if r.Status != want {
		msg := run.GetStopMessage()
		if msg != "" {
			msg = ": " + msg
		}
		fail("status: got %s (%s%s), want %s", r.Status, r.StopReason, msg, want)
	}
	if t.Expect.StopReason != "" && !strings.EqualFold(t.Expect.StopReason, r.StopReason) {
		fail("stop_reason: got %s, want %s", r.StopReason, strings.ToLower(t.Expect.StopReason))
	}
	env := matchEnv{run: runMap(run), result: run.GetResult().AsInterface()}
	for i := range t.Expect.Result {
		if why := t.Expect.Result[i].check(env.result, env); why != "" {
			fail("result: %s", why)
		}
	}
	if tr := t.Expect.Trajectory; tr != nil {
		if diff := checkTrajectory(tr, r.Trajectory, env); diff != "" {
			fail("%s", diff)
		}
	}
	lim := t.Limits
	if lim == (Limits{}) && s != nil {
		lim = s.Limits
	}
	if lim.MaxSteps > 0 && r.Steps > lim.MaxSteps {
		fail("limits.max_steps: %d steps, limit %d", r.Steps, lim.MaxSteps)
	}
	if lim.MaxReplans > 0 && r.Replans > lim.MaxReplans {
		fail("limits.max_replans: %d replans, limit %d", r.Replans, lim.MaxReplans)
	}
	if lim.MaxTokens > 0 && r.Tokens > lim.MaxTokens {
		fail("limits.max_tokens: %d tokens, limit %d", r.Tokens, lim.MaxTokens)
	}
	if lim.MaxLatency.Duration > 0 && obs.Latency > lim.MaxLatency.Duration {
		fail("limits.max_latency: %s, limit %s", obs.Latency.Round(time.Millisecond), lim.MaxLatency)
	}
	r.Passed = len(r.Failures) == 0
	return r
}

func enumName(s, prefix string) string { return strings.ToLower(strings.TrimPrefix(s, prefix)) }

// runMap is the run as CEL sees it: its protojson with proto field names.
func runMap(run *planexv1.Run) map[string]any {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(run)
	if err != nil {
		return map[string]any{}
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return map[string]any{}
	}
	return m
}

// Calls lists a run's tool calls: every dispatched attempt in order,
// with its outcome, from the run's events; without events, the last
// attempt of each step.
func Calls(run *planexv1.Run, events []*planexv1.RunEvent) []ToolCall {
	var calls []ToolCall
	if len(events) == 0 {
		for _, s := range run.GetSteps() {
			if s.GetAttempt() == 0 {
				continue
			}
			c := ToolCall{Step: s.GetStepId(), Attempt: s.GetAttempt(), Tool: s.GetTool(), Args: s.GetResolvedArgs().AsMap()}
			switch s.GetStatus() {
			case planexv1.StepStatus_STEP_STATUS_SUCCEEDED:
				c.Outcome = "succeeded"
			case planexv1.StepStatus_STEP_STATUS_FAILED, planexv1.StepStatus_STEP_STATUS_OUTCOME_UNKNOWN:
				c.Outcome = "failed"
				c.Error = errorText(s.GetError())
			}
			calls = append(calls, c)
		}
		return calls
	}
	index := map[string]int{}
	key := func(step string, attempt int32) string { return fmt.Sprintf("%s#%d", step, attempt) }
	for _, ev := range events {
		switch p := ev.GetPayload().(type) {
		case *planexv1.RunEvent_StepDispatched:
			d := p.StepDispatched
			index[key(d.GetStepId(), d.GetAttempt())] = len(calls)
			calls = append(calls, ToolCall{Step: d.GetStepId(), Attempt: d.GetAttempt(), Tool: d.GetTool(), Args: d.GetResolvedArgs().AsMap()})
		case *planexv1.RunEvent_StepSucceeded:
			if i, ok := index[key(p.StepSucceeded.GetStepId(), p.StepSucceeded.GetAttempt())]; ok {
				calls[i].Outcome = "succeeded"
			}
		case *planexv1.RunEvent_StepFailed:
			if i, ok := index[key(p.StepFailed.GetStepId(), p.StepFailed.GetAttempt())]; ok {
				calls[i].Outcome, calls[i].Error = "failed", errorText(p.StepFailed.GetError())
			}
		case *planexv1.RunEvent_ExpectationFailed:
			if i, ok := index[key(p.ExpectationFailed.GetStepId(), p.ExpectationFailed.GetAttempt())]; ok {
				calls[i].Outcome, calls[i].Error = "failed", "expectation failed: "+p.ExpectationFailed.GetMessage()
			}
		}
	}
	return calls
}

func errorText(e *planexv1.StepError) string {
	if e == nil {
		return ""
	}
	return enumName(e.GetCode().String(), "ERROR_CODE_") + ": " + e.GetMessage()
}
