package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func planexOut(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, planexBin, args...)
	cmd.Env = append(os.Environ(), "PLANEX_PLAINTEXT=true", "PLANEX_AUTH_DISABLED=true")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return string(out), 0
}

func TestPolicyTestEvaluatesAPlanOffline(t *testing.T) {
	plan := writeTemp(t, "plan.json", `{"confidence": 0.4, "steps": [
	  {"id": "q", "tool": "sql.query", "args": {"query": "select 1"}},
	  {"id": "x", "tool": "sql.exec", "args": {"statement": "delete from t"}, "dependsOn": ["q"]},
	  {"id": "m", "tool": "email.send", "args": {"to": ["boss@evil.test"], "subject": "s", "body": "b"}, "dependsOn": ["q"]}
	]}`)
	tools := writeTemp(t, "tools.json", `{"tools": [
	  {"spec": {"name": "sql.query", "pool": "sql", "sideEffect": "SIDE_EFFECT_READ"}},
	  {"spec": {"name": "sql.exec", "pool": "sql", "sideEffect": "SIDE_EFFECT_WRITE"}},
	  {"spec": {"name": "email.send", "pool": "email", "sideEffect": "SIDE_EFFECT_EXTERNAL"}}
	]}`)
	out, code := planexOut(t, "policy", "test", "builtin:default", "--plan", plan, "--tools", tools, "--json")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	var report struct {
		Plan  struct{ Verdict, Rule string }
		Steps []struct{ Step, Verdict, Rule string }
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if report.Plan.Verdict != "require_approval" || report.Plan.Rule != "low-confidence-plan" {
		t.Errorf("plan verdict %+v", report.Plan)
	}
	want := map[string]string{"q": "allow", "x": "require_approval", "m": "deny"}
	for _, s := range report.Steps {
		if want[s.Step] != s.Verdict {
			t.Errorf("step %s: %s (%s), want %s", s.Step, s.Verdict, s.Rule, want[s.Step])
		}
	}
	bad := writeTemp(t, "bad.yaml", "rules:\n  - name: r\n    when: step.tool ==\n    action: deny\n    reason: x\n")
	if out, code := planexOut(t, "policy", "test", bad, "--plan", plan); code == 0 || !strings.Contains(out, "bad.yaml:3: rule \"r\": when:") {
		t.Fatalf("malformed policy: exit %d\n%s", code, out)
	}
}

func TestSupervisorRefusesAMalformedPolicyAtStart(t *testing.T) {
	bad := writeTemp(t, "bad.yaml", "rules:\n  - name: r\n    when: |\n      step.tool == 'x' &&\n      nosuch\n    action: deny\n    reason: x\n")
	out, code := planexOut(t, "supervisor", "--grpc-addr=127.0.0.1:0", "--nats-url=nats://127.0.0.1:1", "--policy", bad)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code == 0 || !strings.Contains(lines[len(lines)-1], "--policy: policy "+bad+":5: rule \"r\": when: 2:1: undeclared reference to 'nosuch'") {
		t.Fatalf("exit %d, last line %q", code, lines[len(lines)-1])
	}
}
