package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/planex-dev/planex/internal/eval"
)

const (
	demoSuite    = "../../eval/demo/suite.yaml"
	faultsSuite  = "../../eval/demo/faults.yaml"
	demoCassette = "../../eval/demo/cassette"
)

func readReport(t *testing.T, path string) eval.Report {
	t.Helper()
	r, err := eval.ReadReport(path)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// scores are a report without what differs between two runs of the same
// decisions: run ids and latencies.
func scores(r eval.Report) eval.Report {
	r.Mode = ""
	r.Metrics.LatencyP50MS, r.Metrics.LatencyP95MS = 0, 0
	tasks := make([]eval.TaskResult, len(r.Tasks))
	for i, t := range r.Tasks {
		t.RunID, t.LatencyMS = "", 0
		tasks[i] = t
	}
	r.Tasks = tasks
	return r
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEvalDemoSuiteLiveThenOffline runs the demo suite live on a dev
// stack, recording a cassette, then deletes the stack's data (demo
// database, search index, outbox, NATS store) and runs the suite again
// offline from the cassette: no executor service and no tool backend
// exist, yet every task passes with identical scores.
func TestEvalDemoSuiteLiveThenOffline(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dev stack; skipped with -short")
	}
	dir := t.TempDir()
	data, cas := filepath.Join(dir, "data"), filepath.Join(dir, "cassette")
	live, offline := filepath.Join(dir, "live.json"), filepath.Join(dir, "offline.json")
	if out, err := planexIn(t, "eval", demoSuite, "--dev", "--data-dir", data, "--record", cas, "--report", live, "--parallel", "3"); err != nil {
		t.Fatalf("live: %v\n%s", err, out)
	}
	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}
	out, err := planexIn(t, "eval", demoSuite, "--replay", cas, "--report", offline)
	if err != nil {
		t.Fatalf("offline: %v\n%s", err, out)
	}
	if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the offline run created the dev data dir: %v", err)
	}
	l, o := readReport(t, live), readReport(t, offline)
	if l.Mode != "live" || o.Mode != "replay" || l.Metrics.Passed != 6 || o.Metrics.Passed != 6 {
		t.Fatalf("live %s %d/6, offline %s %d/6:\n%s", l.Mode, l.Metrics.Passed, o.Mode, o.Metrics.Passed, out)
	}
	if a, b := jsonOf(t, scores(l)), jsonOf(t, scores(o)); a != b {
		t.Fatalf("scores differ:\nlive:\n%s\noffline:\n%s", a, b)
	}
}

// TestDemoSuiteReplaysOffline is the CI gate: the repository's demo suite
// passes offline from its recorded cassette, with JUnit XML for the CI.
func TestDemoSuiteReplaysOffline(t *testing.T) {
	dir := t.TempDir()
	junit := filepath.Join(dir, "junit.xml")
	out, err := planexIn(t, "eval", demoSuite, "--replay", demoCassette, "--junit", junit, "--parallel", "6")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "suite demo: 6/6 passed") {
		t.Fatalf("table:\n%s", out)
	}
	data, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &doc); err != nil || len(doc.Suites) != 1 || doc.Suites[0].Tests != 6 || doc.Suites[0].Failures != 0 {
		t.Fatalf("junit: %v\n%s", err, data)
	}
}

// TestInjectedSQLFailure fails sql.query on attempt 1 of every step: the
// replan task still passes, the strict task fails with a readable diff of
// its trajectory.
func TestInjectedSQLFailure(t *testing.T) {
	report := filepath.Join(t.TempDir(), "faults.json")
	out, err := planexIn(t, "eval", faultsSuite, "--replay", demoCassette, "--report", report)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitFailed || !strings.Contains(err.Error(), "1 of 2 tasks failed") {
		t.Fatalf("exit: %v\n%s", err, out)
	}
	r := readReport(t, report)
	byName := map[string]eval.TaskResult{}
	for _, task := range r.Tasks {
		byName[task.Name] = task
	}
	if replan := byName["replan-through-schema"]; !replan.Passed || replan.ToolFailures != 3 || replan.Replans != 1 {
		t.Fatalf("replan task: %+v", replan)
	}
	strict := byName["open-tickets-strict"]
	if strict.Passed || strict.Status != "succeeded" {
		t.Fatalf("strict task: %+v", strict)
	}
	want := "trajectory differs (ordered; - expected, + actual):\n" +
		"  + sql.query (step customers, attempt 1) failed: unavailable: injected outage of the demo database\n" +
		"    sql.query (step customers, attempt 2) succeeded\n" +
		"  + sql.query (step count, attempt 1) failed: unavailable: injected outage of the demo database\n" +
		"    sql.query (step count, attempt 2) succeeded"
	if len(strict.Failures) != 1 || strict.Failures[0] != want {
		t.Fatalf("strict failures:\n%s\nwant:\n%s", strings.Join(strict.Failures, "\n"), want)
	}
	if !strings.Contains(out, "open-tickets-strict failed:\n  trajectory differs") {
		t.Fatalf("table:\n%s", out)
	}
}

// TestBaselineGate compares a worse run (the demo suite with sql.query
// failing its first attempts) with the clean baseline: the gate fails
// naming the metric, the old and new values and the tolerance.
func TestBaselineGate(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.json")
	if out, err := planexIn(t, "eval", demoSuite, "--replay", demoCassette, "--report", base, "--parallel", "6"); err != nil {
		t.Fatalf("baseline: %v\n%s", err, out)
	}
	if out, err := planexIn(t, "eval", demoSuite, "--replay", demoCassette, "--baseline", base, "--parallel", "6"); err != nil {
		t.Fatalf("same run against its baseline: %v\n%s", err, out)
	}
	suite, err := os.ReadFile(demoSuite)
	if err != nil {
		t.Fatal(err)
	}
	worse := filepath.Join(dir, "worse.yaml")
	faulty := strings.Replace(string(suite), "tasks:\n", "faults:\n  - {kind: fail, tool: sql.query, attempt: 1}\ntasks:\n", 1)
	// The strict trajectories would fail too; the gate is about metrics.
	faulty = strings.NewReplacer("match: ordered", "match: subset", "match: unordered", "match: subset", "max_steps: 10", "max_steps: 20").Replace(faulty)
	if err := os.WriteFile(worse, []byte(faulty), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := planexIn(t, "eval", worse, "--replay", demoCassette, "--baseline", base, "--parallel", "6", "--tolerance", "latency_p50_ms=1000%", "--tolerance", "latency_p95_ms=1000%")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitFailed {
		t.Fatalf("worse run passed the gate: %v\n%s", err, out)
	}
	for _, want := range []string{
		"tool_success_rate regressed: old 0.95, new ",
		", tolerance 0.05",
		"steps_per_task regressed: old 3.333, new ",
		", tolerance 10%",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("gate error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "tasks failed") {
		t.Errorf("tasks failed; the test wants only metric regressions:\n%v\n%s", err, out)
	}
}

// TestPlannerAnswersInvalidOnce makes the planner's first answer an
// invalid plan: the engine rejects it, asks again, and the run succeeds
// with one replan.
func TestPlannerAnswersInvalidOnce(t *testing.T) {
	dir := t.TempDir()
	suite := filepath.Join(dir, "invalid.yaml")
	if err := os.WriteFile(suite, []byte(`
name: invalid-plan
tasks:
  - name: open-tickets
    goal: How many open support tickets does Acme Corp have?
    faults: [{kind: planner_invalid}]
    expect:
      status: succeeded
      result: [{cel: 'run.usage.replans == 1 && size(run.plans) == 1'}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "r.json")
	if out, err := planexIn(t, "eval", suite, "--replay", demoCassette, "--report", report); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r := readReport(t, report); r.Tasks[0].Replans != 1 || !r.Tasks[0].Passed {
		t.Fatalf("%+v", r.Tasks[0])
	}
}

func TestEvalUsageErrors(t *testing.T) {
	tests := map[string][]string{
		"run it with --dev or --replay": {"eval", faultsSuite},
		"--record: needs --dev":         {"eval", demoSuite, "--record", t.TempDir()},
		"--parallel 0: want 1 to 64":    {"eval", demoSuite, "--parallel", "0", "--replay", demoCassette},
		`unknown metric "speed"`:        {"eval", demoSuite, "--replay", demoCassette, "--tolerance", "speed=1"},
		`goal: required`:                {"eval", writeTemp(t, "bad.yaml", "tasks: [{name: a}]")},
		"tools.json: no such file or directory (record one with planex eval --dev --record":   {"eval", demoSuite, "--replay", t.TempDir()},
		`--critic-backend "nosuch": want one of playbook, openai, anthropic`:                  {"eval", demoSuite, "--dev", "--critic-backend", "nosuch"},
		`--critic-backend "nosuch": want one of playbook, openai, anthropic (empty: off)`:     {"eval", demoSuite, "--replay", demoCassette, "--critic-backend", "nosuch"},
		"--critic-backend openai: the planner serves only --planner-backend playbook":         {"eval", demoSuite, "--dev", "--critic-backend", "openai"},
		`--critic-backend "nosuch": want one of playbook, openai, anthropic, replay (empty: `: {"supervisor", "--critic-backend", "nosuch", "--planner-addr", "127.0.0.1:1"},
		`"nosuch": want one of playbook, openai, anthropic (empty: off)`:                      {"dev", "--data-dir", t.TempDir(), "--critic-backend", "nosuch"},
		"--gate-latency: needs --baseline":                                                    {"eval", demoSuite, "--replay", demoCassette, "--gate-latency"},
		"gates[0].decision \"maybe\": want approve or reject":                                 {"eval", writeTemp(t, "gates.yaml", "tasks: [{name: a, goal: b, gates: [{step: close, decision: maybe}]}]")},
	}
	for want, args := range tests {
		if _, err := planexIn(t, args...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: %v, want %q", args, err, want)
		}
	}
}

// TestInjectedDropIsTimedOutAndRetried loses sql.query's result on attempt
// 1: the executor acknowledges the step without publishing its result,
// so the supervisor itself times the attempt out (start-to-close) and
// retries it (a read retries TIMEOUT); the run succeeds on attempt 2.
func TestInjectedDropIsTimedOutAndRetried(t *testing.T) {
	dir := t.TempDir()
	suite := filepath.Join(dir, "drop.yaml")
	if err := os.WriteFile(suite, []byte(`
name: dropped-result
tasks:
  - name: open-tickets
    goal: How many open support tickets does Acme Corp have?
    step_timeout: 1s
    faults: [{kind: drop, tool: sql.query, attempt: 1}]
    expect:
      status: succeeded
      result: [{regexp: 'Acme Corp has \d+ open support tickets?'}]
      trajectory:
        match: ordered
        calls:
          - {tool: sql.query, outcome: failed}
          - {tool: sql.query, outcome: succeeded}
          - {tool: sql.query, outcome: failed}
          - {tool: sql.query, outcome: succeeded}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "r.json")
	if out, err := planexIn(t, "eval", suite, "--replay", demoCassette, "--report", report); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	r := readReport(t, report).Tasks[0]
	if !r.Passed || r.ToolFailures != 2 || r.Replans != 0 {
		t.Fatalf("%+v", r)
	}
	for _, c := range []eval.ToolCall{r.Trajectory[0], r.Trajectory[2]} {
		if c.Attempt != 1 || !strings.HasPrefix(c.Error, "timeout: ") || !strings.Contains(c.Error, "start_to_close_timeout") {
			t.Errorf("dropped attempt %+v: want attempt 1 timed out by the supervisor (start_to_close_timeout)", c)
		}
	}
}
