package policy_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/policy"
)

func args(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDefaultPolicy(t *testing.T) {
	set, err := policy.Load(policy.Builtin)
	if err != nil {
		t.Fatal(err)
	}
	run := &planexv1.Run{Id: "r1", Goal: "g"}
	p := &planexv1.Plan{Revision: 1, Confidence: 0.9}
	specs := map[string]*planexv1.ToolSpec{
		"sql.query":  {Name: "sql.query", SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ},
		"sql.exec":   {Name: "sql.exec", SideEffect: planexv1.SideEffect_SIDE_EFFECT_WRITE},
		"email.send": {Name: "email.send", SideEffect: planexv1.SideEffect_SIDE_EFFECT_EXTERNAL},
	}
	for _, tc := range []struct {
		name, tool string
		args       map[string]any
		want       policy.Action
		rule       string
	}{
		{"read allowed", "sql.query", map[string]any{"query": "select 1"}, policy.Allow, ""},
		{"sql.exec waits", "sql.exec", map[string]any{"statement": "delete from t"}, policy.RequireApproval, "sql-exec-needs-approval"},
		{"mail inside waits", "email.send", map[string]any{"to": []any{"a@example.com"}}, policy.RequireApproval, "side-effects-need-approval"},
		{"mail outside denied", "email.send", map[string]any{"to": []any{"a@example.com", "b@evil.test"}}, policy.Deny, "mail-allowed-domains"},
		{"cc outside denied", "email.send", map[string]any{"to": []any{"a@example.com"}, "cc": []any{"x@EVIL.test"}}, policy.Deny, "mail-allowed-domains"},
		{"unregistered tool waits", "web.post", map[string]any{}, policy.RequireApproval, "side-effects-need-approval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &planexv1.Step{Id: "s", Tool: tc.tool}
			d := set.EvalStep(policy.StepInput(run, p, s, args(t, tc.args), specs[tc.tool], time.Now()))
			if d.Action != tc.want || d.Rule != tc.rule {
				t.Fatalf("decision %s by %q (%s), want %s by %q", d.Action, d.Rule, d.Reason, tc.want, tc.rule)
			}
		})
	}
	low := set.EvalPlan(policy.PlanInput(run, &planexv1.Plan{Revision: 1, Confidence: 0.4}, time.Now()))
	if low.Action != policy.RequireApproval || low.Rule != "low-confidence-plan" {
		t.Fatalf("plan with confidence 0.4: %+v, want require_approval", low)
	}
	if d := set.EvalPlan(policy.PlanInput(run, p, time.Now())); d.Action != policy.Allow {
		t.Fatalf("plan with confidence 0.9: %+v, want allow", d)
	}
}

func TestMalformedPolicyNamesFileAndLine(t *testing.T) {
	for _, tc := range []struct {
		name, text, want string
	}{
		{"cel syntax", "rules:\n  - name: a\n    when: step.tool ==\n    action: deny\n    reason: x\n", "bad.yaml:3: rule \"a\": when: 1:"},
		{"cel block line", "rules:\n  - name: b\n    when: |\n      step.tool == \"x\" &&\n      nosuch.field\n    action: deny\n    reason: x\n", "bad.yaml:5: rule \"b\": when: 2:"},
		{"not bool", "rules:\n  - name: c\n    when: size(step)\n    action: deny\n    reason: x\n", "bad.yaml:3: rule \"c\": when: evaluates to"},
		{"action", "rules:\n  - name: d\n    when: \"true\"\n    action: maybe\n", "bad.yaml:2: rule \"d\": action \"maybe\""},
		{"reason", "rules:\n  - name: e\n    when: \"true\"\n    action: deny\n", "reason: required"},
		{"timeout", "rules:\n  - name: f\n    when: \"true\"\n    action: require_approval\n    reason: r\n    gate_timeout: soon\n", "gate_timeout \"soon\""},
		{"yaml", "rules: [\n", "bad.yaml: yaml:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.yaml")
			if err := os.WriteFile(path, []byte(tc.text), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := policy.Load(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestMostRestrictiveWinsAndFailsClosed(t *testing.T) {
	pol := `name: p
rules:
  - name: allow-all
    when: "true"
    action: allow
  - name: first-approval
    when: "true"
    action: require_approval
    reason: first
    approvers: [alice]
  - name: second-approval
    when: "true"
    action: require_approval
    reason: second
  - name: broken-at-runtime
    when: step.args.missing == 1
    action: require_approval
    reason: never
`
	p, err := policy.Parse("p.yaml", []byte(pol))
	if err != nil {
		t.Fatal(err)
	}
	full := policyset(t, pol)
	d := full.EvalStep(policy.Input{Step: map[string]any{"args": map[string]any{"missing": 1}}})
	if d.Action != policy.RequireApproval || d.Rule != "first-approval" || d.Approvers[0] != "alice" {
		t.Fatalf("decision %+v, want first-approval", d)
	}
	d = full.EvalStep(policy.Input{Step: map[string]any{"args": map[string]any{}}})
	if d.Action != policy.Deny || d.Rule != "broken-at-runtime" || !strings.Contains(d.Message(), "cannot be evaluated") {
		t.Fatalf("decision %+v, want a fail-closed deny", d)
	}
	if len(p.Rules) != 4 {
		t.Fatalf("%d rules", len(p.Rules))
	}
}

func policyset(t *testing.T, text string) *policy.Set {
	t.Helper()
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := policy.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func TestWatcherReloadsAndKeepsOldOnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("rules:\n  - name: deny-x\n    when: step.tool == 'x'\n    action: deny\n    reason: no x\n")
	w, err := policy.NewWatcher(natstest.Logger(t), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	x := policy.Input{Step: map[string]any{"tool": "x"}}
	if w.Current().EvalStep(x).Action != policy.Deny {
		t.Fatal("x not denied")
	}
	write("rules:\n  - name: deny-x\n    when: step.tool ==\n    action: deny\n    reason: no x\n")
	if w.Check(ctx) {
		t.Fatal("a broken policy was loaded")
	}
	if w.Current().EvalStep(x).Action != policy.Deny {
		t.Fatal("the previous policy is no longer in force after a bad reload")
	}
	write("rules:\n  - name: approve-x\n    when: step.tool == 'x'\n    action: require_approval\n    reason: ask\n")
	if !w.Check(ctx) {
		t.Fatal("the fixed policy was not loaded")
	}
	if w.Current().EvalStep(x).Action != policy.RequireApproval {
		t.Fatal("the new policy is not in force")
	}
}

func TestResultRules(t *testing.T) {
	set := policyset(t, `rules:
  - name: empty
    on: result
    when: output_empty
    action: deny
    reason: empty result
    on_fail: escalate
  - name: schema
    on: result
    when: size(output_schema_errors) > 0
    action: deny
    reason: bad shape
`)
	for _, tc := range []struct {
		name  string
		in    policy.Input
		want  policy.Action
		rule  string
		escal bool
	}{
		{"rows", policy.Input{Output: map[string]any{"rows": []any{map[string]any{"a": 1.0}}}, OutputEmpty: policy.IsEmpty(map[string]any{"rows": []any{map[string]any{"a": 1.0}}})}, policy.Allow, "", false},
		{"empty rows", policy.Input{Output: map[string]any{"rows": []any{}}, OutputEmpty: policy.IsEmpty(map[string]any{"rows": []any{}})}, policy.Deny, "empty", true},
		{"schema", policy.Input{Output: map[string]any{"x": 1.0}, OutputSchemaErrors: []string{"args.rows: required"}}, policy.Deny, "schema", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := set.EvalResult(tc.in)
			if d.Action != tc.want || d.Rule != tc.rule || d.Escalate != tc.escal {
				t.Fatalf("%+v, want %s by %q (escalate %v)", d, tc.want, tc.rule, tc.escal)
			}
		})
	}
	if !policy.IsEmpty(map[string]any{"a": "", "b": []any{nil}}) || policy.IsEmpty(map[string]any{"n": 0.0}) || policy.IsEmpty(false) {
		t.Fatal("IsEmpty: zero numbers and false are values, empty strings and lists are not")
	}
	if _, err := policy.Parse("r.yaml", []byte("rules:\n  - name: r\n    on: result\n    when: \"true\"\n    action: require_approval\n    reason: x\n")); err == nil || !strings.Contains(err.Error(), "r.yaml:2") {
		t.Fatalf("require_approval on a result rule: %v, want an error at r.yaml:2", err)
	}
}

// The ConfigMap the Kubernetes component ships is the embedded default.
func TestShippedConfigMapIsTheDefaultPolicy(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "k8s", "components", "policy", "default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != string(policy.DefaultYAML) {
		t.Fatal("deploy/k8s/components/policy/default.yaml differs from internal/policy/default.yaml; copy it over")
	}
}
