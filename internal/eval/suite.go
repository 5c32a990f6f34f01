// Package eval scores agent runs against golden tasks: the suite format
// (YAML or JSON), result and trajectory matchers, per-task scores,
// per-suite metrics, reports (terminal table, JSON, JUnit XML) and
// baseline gates. It does not run anything: `planex eval` starts the runs
// and hands each finished run to Score.
package eval

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Suite is a set of golden tasks.
type Suite struct {
	// Name names the suite in reports (default: the file name).
	Name string `yaml:"name" json:"name"`
	// Description is free text.
	Description string `yaml:"description" json:"description,omitempty"`
	// Limits apply to every task that sets none of its own.
	Limits Limits `yaml:"limits" json:"limits,omitzero"`
	// Faults are injected into every task (before the task's own).
	Faults []Fault `yaml:"faults" json:"faults,omitempty"`
	// Tasks are the golden tasks.
	Tasks []Task `yaml:"tasks" json:"tasks"`
}

// Task is one golden task: a goal run as a real run and what must come of it.
type Task struct {
	// Name identifies the task (unique in the suite).
	Name string `yaml:"name" json:"name"`
	// Goal is the run's goal.
	Goal string `yaml:"goal" json:"goal"`
	// Inputs are the run's inputs.
	Inputs map[string]any `yaml:"inputs" json:"inputs,omitempty"`
	// Labels are added to the run's labels.
	Labels map[string]string `yaml:"labels" json:"labels,omitempty"`
	// Mode is the planning mode: "full" (default) or "next-step".
	Mode string `yaml:"mode" json:"mode,omitempty"`
	// Expect is the expected outcome.
	Expect Expect `yaml:"expect" json:"expect"`
	// Limits bound the run for the task to pass.
	Limits Limits `yaml:"limits" json:"limits,omitzero"`
	// Faults are injected into this task's run.
	Faults []Fault `yaml:"faults" json:"faults,omitempty"`
	// StepTimeout is the run's budget.step_timeout: how long an attempt of a
	// step without its own timeout may run. A dropped result is noticed
	// when it expires, so tasks with drop faults set it short ("2s").
	StepTimeout Duration `yaml:"step_timeout" json:"step_timeout,omitzero"`
	// Gates say how the harness decides the run's approval gates, as a
	// user would through the API (Decide). A gate no rule matches fails
	// the task at once and cancels the run, instead of waiting for the
	// task timeout.
	Gates []GateRule `yaml:"gates" json:"gates,omitempty"`
}

// GateRule decides the gates of one step (or of every step).
type GateRule struct {
	// Step is the id of the step whose gate this rule decides; "*" matches
	// every gate, "plan" the gate of a whole plan revision.
	Step string `yaml:"step" json:"step"`
	// Decision is approve or reject.
	Decision string `yaml:"decision" json:"decision"`
	// Comment is recorded with the decision (for a rejection the planner
	// is told).
	Comment string `yaml:"comment" json:"comment,omitempty"`
	// StopRun, with reject, stops the run (REJECTED) instead of sending it
	// back to the planner.
	StopRun bool `yaml:"stop_run" json:"stop_run,omitempty"`
}

// Gate decisions of a GateRule.
const (
	GateApprove = "approve"
	GateReject  = "reject"
)

// GatePlan is GateRule.Step of a plan revision's gate.
const GatePlan = "plan"

// GateRule returns the rule deciding the gate of step (GatePlan for a
// plan gate): the first rule naming the step, else the first "*" rule.
func (t Task) GateRule(step string) (GateRule, bool) {
	for _, r := range t.Gates {
		if r.Step == step {
			return r, true
		}
	}
	for _, r := range t.Gates {
		if r.Step == "*" {
			return r, true
		}
	}
	return GateRule{}, false
}

// Expect is what a task's run must come to.
type Expect struct {
	// Status is the run's final status: succeeded (default), failed,
	// escalated or cancelled.
	Status string `yaml:"status" json:"status,omitempty"`
	// StopReason, when set, is the expected stop reason (step_failed,
	// budget_exceeded, ...).
	StopReason string `yaml:"stop_reason" json:"stop_reason,omitempty"`
	// Result are matchers over the run's result; all must hold.
	Result []Matcher `yaml:"result" json:"result,omitempty"`
	// Trajectory is the expected tool trajectory (unset: not checked).
	Trajectory *Trajectory `yaml:"trajectory" json:"trajectory,omitempty"`
}

// Matcher checks one value: exactly one of Exact, Regexp and CEL.
type Matcher struct {
	// Path selects a part of the value ("rows.0.1", "summary"); empty: the
	// whole value. Result matchers see the run's result; CEL matchers see
	// the whole run (as `run`) and the result (as `result`) instead.
	Path string `yaml:"path" json:"path,omitempty"`
	// Exact is the expected JSON value.
	Exact any `yaml:"exact" json:"exact,omitempty"`
	// Regexp must match the value (a string, or the JSON of another value).
	Regexp string `yaml:"regexp" json:"regexp,omitempty"`
	// CEL must evaluate to true. Variables: run (the run as protojson),
	// result (the run's result) and, in argument matchers, value.
	CEL string `yaml:"cel" json:"cel,omitempty"`

	re *regexp.Regexp
}

// Trajectory is an expected sequence of tool calls (step attempts).
type Trajectory struct {
	// Match is ordered (the calls, all and in this order), unordered (all
	// and only these calls, in any order) or subset (these calls among
	// others, in any order).
	Match string `yaml:"match" json:"match"`
	// Calls are the expected calls.
	Calls []Call `yaml:"calls" json:"calls"`
}

// Call is one expected tool call.
type Call struct {
	// Tool is the tool name ("sql.query").
	Tool string `yaml:"tool" json:"tool"`
	// Args match the call's resolved arguments by name.
	Args map[string]Matcher `yaml:"args" json:"args,omitempty"`
	// Outcome, when set, is succeeded or failed.
	Outcome string `yaml:"outcome" json:"outcome,omitempty"`
}

// Limits bound a task's run; zero fields are not checked.
type Limits struct {
	// MaxSteps bounds the step attempts.
	MaxSteps int `yaml:"max_steps" json:"max_steps,omitempty"`
	// MaxReplans bounds the replans.
	MaxReplans int `yaml:"max_replans" json:"max_replans,omitempty"`
	// MaxTokens bounds the planner tokens.
	MaxTokens int64 `yaml:"max_tokens" json:"max_tokens,omitempty"`
	// MaxLatency bounds the run's wall time ("30s").
	MaxLatency Duration `yaml:"max_latency" json:"max_latency,omitzero"`
}

// Fault is an injected failure. Kind says which:
//
//   - fail: tool Tool fails on attempt Attempt (default 1) with Code
//     (default UNAVAILABLE) and Message
//   - latency: tool Tool answers Latency later on attempt Attempt (0: every attempt)
//   - drop: tool Tool's attempt Attempt (default 1) runs but its result is
//     lost: the executor acknowledges the step without publishing the
//     result, and the supervisor times the attempt out and retries it or
//     not per the tool's retry policy
//   - planner_invalid: the planner's answer number Attempt (default 1) of
//     the run is invalid (as a model's that stays invalid after repair)
type Fault struct {
	// Kind is fail, latency, drop or planner_invalid.
	Kind string `yaml:"kind" json:"kind"`
	// Tool is the tool the fault hits (not for planner_invalid).
	Tool string `yaml:"tool" json:"tool,omitempty"`
	// Attempt is the attempt (or planner call) it hits.
	Attempt int `yaml:"attempt" json:"attempt,omitempty"`
	// Code is the planex ErrorCode name of a fail (UNAVAILABLE, INTERNAL,
	// INVALID_ARGUMENT, ...).
	Code string `yaml:"code" json:"code,omitempty"`
	// Message is the error message of a fail.
	Message string `yaml:"message" json:"message,omitempty"`
	// Latency is the delay of a latency fault.
	Latency Duration `yaml:"latency" json:"latency,omitzero"`
}

// Duration is a time.Duration written as "1.5s" in suites and reports.
type Duration struct{ time.Duration }

// UnmarshalYAML reads "1.5s".
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes "1.5s".
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }

// IsZero reports a zero duration (omitted in JSON).
func (d Duration) IsZero() bool { return d.Duration == 0 }

// LoadSuite reads and validates a suite file (YAML or JSON).
func LoadSuite(path string) (*Suite, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read suite: %w", err)
	}
	s, err := ParseSuite(data)
	if err != nil {
		return nil, fmt.Errorf("suite %s: %w", path, err)
	}
	if s.Name == "" {
		s.Name = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(baseName(path), ".yaml"), ".yml"), ".json")
	}
	return s, nil
}

func baseName(p string) string {
	if i := strings.LastIndexAny(p, `/\`); i >= 0 {
		return p[i+1:]
	}
	return p
}

// ParseSuite decodes and validates a suite; unknown fields are errors.
func ParseSuite(data []byte) (*Suite, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var s Suite
	if err := dec.Decode(&s); err != nil {
		return nil, err
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

var (
	statuses   = []string{"succeeded", "failed", "escalated", "cancelled"}
	matchKinds = []string{"ordered", "unordered", "subset"}
	faultKinds = []string{"fail", "latency", "drop", "planner_invalid"}
	outcomes   = []string{"succeeded", "failed"}
	errNoTasks = errors.New("tasks: the suite has no task")
	planModes  = []string{"", "full", "next-step"}
)

// Validate checks the suite and compiles its regular expressions and CEL
// programs; errors name the task and field.
func (s *Suite) Validate() error {
	if len(s.Tasks) == 0 {
		return errNoTasks
	}
	var errs []error
	for i, f := range s.Faults {
		if err := f.validate(); err != nil {
			errs = append(errs, fmt.Errorf("faults[%d]: %w", i, err))
		}
	}
	seen := map[string]bool{}
	for i := range s.Tasks {
		t := &s.Tasks[i]
		where := fmt.Sprintf("tasks[%d]", i)
		if t.Name != "" {
			where = fmt.Sprintf("task %q", t.Name)
		}
		if err := t.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
		if seen[t.Name] {
			errs = append(errs, fmt.Errorf("%s: name: used twice", where))
		}
		seen[t.Name] = true
	}
	return errors.Join(errs...)
}

func (t *Task) validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if t.Name == "" {
		add("name: required")
	}
	if strings.TrimSpace(t.Goal) == "" {
		add("goal: required")
	}
	if t.StepTimeout.Duration < 0 {
		add("step_timeout %s: must not be negative", t.StepTimeout)
	}
	if !oneOf(t.Mode, planModes) {
		add("mode %q: want full or next-step", t.Mode)
	}
	if t.Expect.Status != "" && !oneOf(t.Expect.Status, statuses) {
		add("expect.status %q: want one of %s", t.Expect.Status, strings.Join(statuses, ", "))
	}
	for i := range t.Expect.Result {
		if err := t.Expect.Result[i].compile(); err != nil {
			add("expect.result[%d]: %v", i, err)
		}
	}
	if tr := t.Expect.Trajectory; tr != nil {
		if !oneOf(tr.Match, matchKinds) {
			add("expect.trajectory.match %q: want one of %s", tr.Match, strings.Join(matchKinds, ", "))
		}
		for i := range tr.Calls {
			c := &tr.Calls[i]
			if c.Tool == "" {
				add("expect.trajectory.calls[%d].tool: required", i)
			}
			if c.Outcome != "" && !oneOf(c.Outcome, outcomes) {
				add("expect.trajectory.calls[%d].outcome %q: want succeeded or failed", i, c.Outcome)
			}
			for name, m := range c.Args {
				if err := m.compile(); err != nil {
					add("expect.trajectory.calls[%d].args.%s: %v", i, name, err)
				}
				c.Args[name] = m
			}
		}
	}
	for i, f := range t.Faults {
		if err := f.validate(); err != nil {
			add("faults[%d]: %v", i, err)
		}
	}
	steps := map[string]bool{}
	for i, g := range t.Gates {
		switch {
		case strings.TrimSpace(g.Step) == "":
			add("gates[%d].step: required (a step id, %q for a plan gate, or \"*\" for every gate)", i, GatePlan)
		case steps[g.Step]:
			add("gates[%d].step %q: decided twice", i, g.Step)
		}
		steps[g.Step] = true
		if g.Decision != GateApprove && g.Decision != GateReject {
			add("gates[%d].decision %q: want approve or reject", i, g.Decision)
		}
		if g.StopRun && g.Decision != GateReject {
			add("gates[%d].stop_run: only with decision reject", i)
		}
	}
	return errors.Join(errs...)
}

func (f Fault) validate() error {
	switch {
	case !oneOf(f.Kind, faultKinds):
		return fmt.Errorf("kind %q: want one of %s", f.Kind, strings.Join(faultKinds, ", "))
	case f.Kind != "planner_invalid" && f.Tool == "":
		return fmt.Errorf("tool: required for a %s fault", f.Kind)
	case f.Attempt < 0:
		return fmt.Errorf("attempt %d: want 1 or more", f.Attempt)
	case f.Kind == "latency" && f.Latency.Duration <= 0:
		return errors.New("latency: required for a latency fault (\"2s\")")
	}
	return nil
}

func (m *Matcher) compile() error {
	n := 0
	if m.Exact != nil {
		n++
	}
	if m.Regexp != "" {
		n++
		re, err := regexp.Compile(m.Regexp)
		if err != nil {
			return fmt.Errorf("regexp: %w", err)
		}
		m.re = re
	}
	if m.CEL != "" {
		n++
		if _, err := compileCEL(m.CEL); err != nil {
			return fmt.Errorf("cel: %w", err)
		}
	}
	if n != 1 {
		return errors.New("want exactly one of exact, regexp and cel")
	}
	return nil
}

func oneOf(s string, set []string) bool {
	for _, x := range set {
		if s == x {
			return true
		}
	}
	return false
}
