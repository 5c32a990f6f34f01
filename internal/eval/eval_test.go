package eval

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

const suiteYAML = `
name: demo
limits: {max_steps: 10}
tasks:
  - name: tickets
    goal: How many open tickets does Acme Corp have?
    expect:
      result:
        - regexp: 'Acme Corp has \d+ open'
        - cel: 'run.usage.steps <= 2 && result.startsWith("Acme")'
      trajectory:
        match: ordered
        calls:
          - tool: sql.query
            args:
              sql: {regexp: '(?i)select count'}
            outcome: succeeded
`

func run(status planexv1.RunStatus, result string, steps int32) *planexv1.Run {
	return &planexv1.Run{Id: "R1", Status: status, Result: structpb.NewStringValue(result), Usage: &planexv1.BudgetUsage{Steps: steps, Tokens: 10}}
}

func dispatched(step, tool, sql string, attempt int32) *planexv1.RunEvent {
	args, _ := structpb.NewStruct(map[string]any{"sql": sql})
	return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{StepId: step, Attempt: attempt, Tool: tool, ResolvedArgs: args}}}
}

func succeeded(step string, attempt int32) *planexv1.RunEvent {
	return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{StepId: step, Attempt: attempt}}}
}

func failed(step string, attempt int32) *planexv1.RunEvent {
	return &planexv1.RunEvent{Payload: &planexv1.RunEvent_StepFailed{StepFailed: &planexv1.StepFailed{StepId: step, Attempt: attempt,
		Error: &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, Message: "injected"}}}}
}

func TestScorePassesAndFailsWithReasons(t *testing.T) {
	s, err := ParseSuite([]byte(suiteYAML))
	if err != nil {
		t.Fatal(err)
	}
	task := s.Tasks[0]
	ok := Score(s, task, Observation{Run: run(planexv1.RunStatus_RUN_STATUS_SUCCEEDED, "Acme Corp has 3 open tickets", 1),
		Events: []*planexv1.RunEvent{dispatched("count", "sql.query", "SELECT count(*) FROM t", 1), succeeded("count", 1)}, Latency: time.Second})
	if !ok.Passed || ok.ToolCalls != 1 || ok.Steps != 1 || ok.LatencyMS != 1000 {
		t.Fatalf("good run scored %+v", ok)
	}
	bad := Score(s, task, Observation{Run: run(planexv1.RunStatus_RUN_STATUS_SUCCEEDED, "Acme Corp has 3 open tickets", 2),
		Events: []*planexv1.RunEvent{dispatched("count", "sql.query", "SELECT count(*) FROM t", 1), failed("count", 1),
			dispatched("count", "sql.query", "select count(*) from t", 2), succeeded("count", 2)}})
	if bad.Passed || bad.ToolFailures != 1 {
		t.Fatalf("retried run scored %+v", bad)
	}
	text := strings.Join(bad.Failures, "\n")
	for _, want := range []string{
		"trajectory differs (ordered; - expected, + actual):",
		"  + sql.query (step count, attempt 1) failed: unavailable: injected",
		"    sql.query (step count, attempt 2) succeeded",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("failures lack %q:\n%s", want, text)
		}
	}
	wrong := Score(s, task, Observation{Run: run(planexv1.RunStatus_RUN_STATUS_FAILED, "Globex", 11)})
	text = strings.Join(wrong.Failures, "\n")
	for _, want := range []string{"status: got failed", `result: value: "Globex" does not match`, "limits.max_steps: 11 steps, limit 10", "- sql.query(sql) succeeded"} {
		if !strings.Contains(text, want) {
			t.Errorf("failures lack %q:\n%s", want, text)
		}
	}
}

func TestTrajectoryKinds(t *testing.T) {
	calls := []ToolCall{{Tool: "a", Outcome: "succeeded"}, {Tool: "b", Outcome: "succeeded"}, {Tool: "c", Outcome: "failed"}}
	tests := []struct {
		match string
		want  []string
		ok    bool
	}{
		{"ordered", []string{"a", "b", "c"}, true},
		{"ordered", []string{"b", "a", "c"}, false},
		{"unordered", []string{"c", "b", "a"}, true},
		{"unordered", []string{"c", "a"}, false},
		{"subset", []string{"c", "a"}, true},
		{"subset", []string{"d"}, false},
	}
	for _, tt := range tests {
		tr := &Trajectory{Match: tt.match}
		for _, w := range tt.want {
			tr.Calls = append(tr.Calls, Call{Tool: w})
		}
		if diff := checkTrajectory(tr, calls, matchEnv{}); (diff == "") != tt.ok {
			t.Errorf("%s %v: ok %v, want %v: %s", tt.match, tt.want, diff == "", tt.ok, diff)
		}
	}
}

func TestSuiteErrorsNameTheField(t *testing.T) {
	tests := map[string]string{
		"tasks: []":          "no task",
		"tasks: [{name: a}]": `task "a": goal: required`,
		"tasks: [{name: a, goal: g, expect: {status: done}}]":                                             `expect.status "done"`,
		"tasks: [{name: a, goal: g, expect: {result: [{regexp: '('}]}}]":                                  "expect.result[0]: regexp",
		"tasks: [{name: a, goal: g, expect: {result: [{cel: 'run.'}]}}]":                                  "expect.result[0]: cel",
		"tasks: [{name: a, goal: g, expect: {result: [{}]}}]":                                             "exactly one of exact, regexp and cel",
		"tasks: [{name: a, goal: g, faults: [{kind: fail}]}]":                                             "faults[0]: tool: required",
		"tasks: [{name: a, goal: g, expect: {trajectory: {match: some}}}]":                                "expect.trajectory.match",
		"tasks: [{name: a, goal: g, typo: 1}]":                                                            "field typo not found",
		"tasks: [{name: a, goal: g, limits: {max_latency: soon}}]":                                        "invalid duration",
		"tasks: [{name: a, goal: g, gates: [{decision: approve}]}]":                                       "gates[0].step: required",
		"tasks: [{name: a, goal: g, gates: [{step: close, decision: yes}]}]":                              `gates[0].decision "yes": want approve or reject`,
		"tasks: [{name: a, goal: g, gates: [{step: close, decision: approve, stop_run: true}]}]":          "gates[0].stop_run: only with decision reject",
		"tasks: [{name: a, goal: g, gates: [{step: x, decision: approve}, {step: x, decision: reject}]}]": `gates[1].step "x": decided twice`,
	}
	for in, want := range tests {
		if _, err := ParseSuite([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}

func TestReportsAndBaselineGate(t *testing.T) {
	results := []TaskResult{
		{Name: "a", Passed: true, Status: "succeeded", Steps: 2, ToolCalls: 2, LatencyMS: 100, RunID: "R1"},
		{Name: "b", Passed: false, Status: "failed", Steps: 4, Replans: 1, ToolCalls: 4, ToolFailures: 1, LatencyMS: 300, Failures: []string{"status: got failed\nmore", "x"}},
	}
	rep := Summarize("demo", results)
	m := rep.Metrics
	if m.SuccessRate != 0.5 || m.StepsPerTask != 3 || m.ToolSuccessRate != round(5.0/6) || m.LatencyP50MS != 100 || m.LatencyP95MS != 300 {
		t.Fatalf("metrics %+v", m)
	}
	var table, junit bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "b failed:\n  status: got failed\n  more") || !strings.Contains(table.String(), "1/2 passed") {
		t.Errorf("table:\n%s", table.String())
	}
	if err := rep.WriteJUnit(&junit); err != nil {
		t.Fatal(err)
	}
	var parsed junitSuites
	if err := xml.Unmarshal(junit.Bytes(), &parsed); err != nil || parsed.Suites[0].Failures != 1 || parsed.Suites[0].Cases[1].Failure.Message != "status: got failed" {
		t.Fatalf("junit: %v\n%s", err, junit.String())
	}

	base := Summarize("demo", results[:1])
	if regs := Compare(base, base, DefaultTolerances()); len(regs) != 0 {
		t.Fatalf("a report regresses against itself: %v", regs)
	}
	regs := Compare(base, rep, DefaultTolerances())
	got := map[string]string{}
	for _, r := range regs {
		got[r.Metric] = r.String()
	}
	for metric, want := range map[string]string{
		"success_rate":      "success_rate regressed: old 1, new 0.5, tolerance 0",
		"steps_per_task":    "steps_per_task regressed: old 2, new 3, tolerance 10%",
		"tool_success_rate": "tool_success_rate regressed: old 1, new 0.833, tolerance 0.05",
	} {
		if got[metric] != want {
			t.Errorf("%s: %q, want %q", metric, got[metric], want)
		}
	}
	tol := DefaultTolerances()
	if err := ParseTolerance(tol, "steps_per_task=60%"); err != nil {
		t.Fatal(err)
	}
	for _, r := range Compare(base, rep, tol) {
		if r.Metric == "steps_per_task" {
			t.Errorf("steps_per_task within a 60%% band: %v", r)
		}
	}
	if err := ParseTolerance(tol, "speed=1"); err == nil || !strings.Contains(err.Error(), "unknown metric") {
		t.Errorf("unknown metric: %v", err)
	}
}

func TestGateRulePrefersTheStepOverTheWildcard(t *testing.T) {
	s, err := ParseSuite([]byte(`tasks: [{name: a, goal: g, gates: [{step: "*", decision: reject}, {step: close, decision: approve}]}]`))
	if err != nil {
		t.Fatal(err)
	}
	task := s.Tasks[0]
	if r, ok := task.GateRule("close"); !ok || r.Decision != GateApprove {
		t.Errorf("close: %+v %v, want approve", r, ok)
	}
	if r, ok := task.GateRule(GatePlan); !ok || r.Decision != GateReject {
		t.Errorf("plan: %+v %v, want the wildcard's reject", r, ok)
	}
	if _, ok := (Task{}).GateRule("close"); ok {
		t.Error("a task without gates decides a gate")
	}
}

// TestBaselineRegressionsFailEveryOutput checks that a regression is in
// the JUnit XML (a failed case per regressed metric, counted in
// failures), the JSON report and the table, and that skipped metrics are
// neither compared nor reported as regressions.
func TestBaselineRegressionsFailEveryOutput(t *testing.T) {
	base := Summarize("demo", []TaskResult{{Name: "a", Passed: true, Steps: 2, LatencyMS: 1}})
	cur := Summarize("demo", []TaskResult{{Name: "a", Passed: true, Steps: 4, LatencyMS: 5000}})
	cur.CheckBaseline("base.json", base, DefaultTolerances(), map[string]string{"latency_p50_ms": "not compared", "latency_p95_ms": "not compared"})
	if !cur.Regressed() || len(cur.Baseline.Regressions) != 1 || cur.Baseline.Regressions[0].Metric != "steps_per_task" || len(cur.Baseline.Compared) != len(GateNames())-2 {
		t.Fatalf("baseline %+v", cur.Baseline)
	}
	var junit, js, table bytes.Buffer
	if err := cur.WriteJUnit(&junit); err != nil {
		t.Fatal(err)
	}
	var parsed junitSuites
	if err := xml.Unmarshal(junit.Bytes(), &parsed); err != nil || parsed.Suites[0].Failures != 1 || parsed.Suites[0].Tests != 1+len(GateNames())-2 {
		t.Fatalf("junit: %v\n%s", err, junit.String())
	}
	if err := cur.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"metric": "steps_per_task"`) || !strings.Contains(js.String(), `"path": "base.json"`) {
		t.Errorf("json:\n%s", js.String())
	}
	if err := cur.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"baseline base.json: 6 metrics compared, 1 regressed", "steps_per_task regressed: old 2, new 4", "skipped latency_p50_ms: not compared"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	clean := Summarize("demo", []TaskResult{{Name: "a", Passed: true, Steps: 2}})
	clean.CheckBaseline("base.json", base, DefaultTolerances(), nil)
	if clean.Regressed() {
		t.Errorf("a report regressed against its own numbers: %+v", clean.Baseline)
	}
}
