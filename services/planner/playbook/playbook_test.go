package playbook_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/services/planner/internal/plannertest"
	"github.com/planex-dev/planex/services/planner/playbook"
)

const reportYAML = `name: report
description: Mail a report of the top customers
examples:
  - send the top 3 customers to the finance team
match:
  - '(?i)^send the top (?:(?P<n>\w+) )?customers to (?:the )?(?P<to>.+?)(?: as (?P<format>\w+))?$'
params:
  n: {type: int, default: 5, min: 1, max: 50}
  to:
    required: true
    lookup: {finance team: finance@example.com, "On-Call": oncall@example.com}
    pattern: '^[^@ ]+@[^@ ]+$'
  format:
    default: text
    transform: [trim, upper]
  region:
    description: from the run's inputs only
    transform: [title]
steps:
  - id: top
    description: Top ${{ params.n }} for ${{ params.to }}
    tool: sql.query
    args:
      sql: SELECT name FROM customers LIMIT ?
      params: ["${{ params.n }}", "${{ params.region }}", "n=${{ params.n }}"]
  - id: draft
    tool: email.draft
    depends_on: [top]
    args:
      to: ["${{ params.to }}"]
      subject: Top ${{ params.n }} (${{ params.format }})
      body: "${{ steps.top.output.rows.map(r, string(r[0])).join(', ') }}"
  - id: send
    tool: email.send
    depends_on: [draft]
    args: {draft_id: "${{ steps.draft.output.draft_id }}"}
answer: "'sent to ' + params.to + ' (params.to stays text)'"
on_failure:
  - name: smaller
    when: {step: top, code: TIMEOUT}
    steps:
      - id: top_small
        tool: sql.query
        args: {sql: SELECT name FROM customers LIMIT 1}
      - id: draft
        tool: email.draft
        depends_on: [top_small]
        args:
          to: ["${{ params.to }}"]
          subject: Top customer
          body: "${{ steps.top_small.output.rows[0][0] }}"
      - id: send2
        tool: email.send
        depends_on: [draft]
        args: {draft_id: "${{ steps.draft.output.draft_id }}"}
    answer: "'sent the top customer to ' + params.to"
  - name: any-send-failure
    when: {step: send, message: '(?i)smtp'}
    steps:
      - id: resend
        tool: email.send
        depends_on: [draft]
        args: {draft_id: "${{ steps.draft.output.draft_id }}"}
    answer: "'resent to ' + params.to"
`

func loadYAML(t *testing.T, files map[string]string) (*playbook.Set, error) {
	t.Helper()
	fsys := fstest.MapFS{}
	for name, text := range files {
		fsys[name] = &fstest.MapFile{Data: []byte(text)}
	}
	return playbook.Load(playbook.Source{FS: fsys, Name: "pb"})
}

func mustLoad(t *testing.T, files map[string]string) *playbook.Set {
	t.Helper()
	set, err := loadYAML(t, files)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return set
}

func TestMatchBindsCaptures(t *testing.T) {
	set := mustLoad(t, map[string]string{"report.yaml": reportYAML})
	tools := plannertest.Catalog(t)
	cases := []struct {
		name   string
		goal   string
		inputs map[string]any
		want   map[string]any
	}{
		{
			name: "captures, lookup, defaults",
			goal: "Send the top 3 customers to the Finance   Team",
			want: map[string]any{
				"top.params[0]": 3.0, "top.params[1]": nil, "top.params[2]": "n=3",
				"draft.to[0]": "finance@example.com", "draft.subject": "Top 3 (TEXT)",
			},
		},
		{
			name: "number word, upper transform, explicit address kept as is",
			goal: "send the top twelve customers to Ops.Lead@Example.org as csv",
			want: map[string]any{"top.params[0]": 12.0, "draft.to[0]": "Ops.Lead@Example.org", "draft.subject": "Top 12 (CSV)"},
		},
		{
			name:   "optional capture absent, param from inputs with title case",
			goal:   "send the top customers to on-call",
			inputs: map[string]any{"region": "north america"},
			want:   map[string]any{"top.params[0]": 5.0, "top.params[1]": "North America", "draft.to[0]": "oncall@example.com"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in, err := structpb.NewStruct(tc.inputs)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := set.Plan(context.Background(), &planexv1.PlanRequest{Goal: tc.goal, Inputs: in, Tools: tools, Revision: 1})
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			p := resp.GetPlan()
			if err := plan.Validate(p, plan.NewCatalog(tools), plan.DefaultLimits()); err != nil {
				t.Fatalf("invalid plan: %v", err)
			}
			for path, want := range tc.want {
				if got := argAt(t, p, path); got != want {
					t.Errorf("%s = %#v, want %#v", path, got, want)
				}
			}
			// Engine references stay; params in CEL become literals, never
			// text inside string literals.
			if got := argAt(t, p, "draft.body"); got != "${{ steps.top.output.rows.map(r, string(r[0])).join(', ') }}" {
				t.Errorf("body = %q, engine reference changed", got)
			}
			to := argAt(t, p, "draft.to[0]").(string)
			if want := "'sent to ' + " + `"` + to + `"` + " + ' (params.to stays text)'"; p.GetAnswer() != want {
				t.Errorf("answer = %q, want %q", p.GetAnswer(), want)
			}
			if got := p.GetSteps()[0].GetDescription(); !strings.HasPrefix(got, "Top ") || strings.Contains(got, "${{") {
				t.Errorf("description = %q, want parameters substituted", got)
			}
		})
	}
}

func TestNoMatch(t *testing.T) {
	set := mustLoad(t, map[string]string{"report.yaml": reportYAML})
	cases := []struct {
		name string
		goal string
		want []string
	}{
		{"unrelated goal", "Book a flight to Lisbon", []string{
			`no playbook matches goal "Book a flight to Lisbon"`,
			`report: Mail a report of the top customers (e.g. "send the top 3 customers to the finance team")`,
			"--playbooks DIR", "--planner-backend openai",
		}},
		{"pattern matches but a param is rejected", "send the top 3 customers to the marketing team", []string{
			`cannot plan goal "send the top 3 customers to the marketing team"`,
			`playbook report: to: value "marketing team" does not match ^[^@ ]+@[^@ ]+$`,
		}},
		{"out of range", "send the top 500 customers to finance team", []string{"playbook report: n: 500 is out of range: must be from 1 to 50"}},
		{"injection attempt", "send the top 3 customers to ${{ steps.x.output }}@x.y", []string{`contains "${{"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := set.Plan(context.Background(), &planexv1.PlanRequest{Goal: tc.goal, Tools: plannertest.Catalog(t)})
			if !errors.Is(err, playbook.ErrNoMatch) {
				t.Fatalf("err = %v, want ErrNoMatch", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
	empty := mustLoad(t, nil)
	_, err := empty.Plan(context.Background(), &planexv1.PlanRequest{Goal: "anything"})
	if !errors.Is(err, playbook.ErrNoMatch) || !strings.Contains(err.Error(), "No playbooks are loaded") {
		t.Errorf("empty set: err = %v", err)
	}
}

func outcome(id string, rev int32, status planexv1.StepStatus, out any, code planexv1.ErrorCode, msg string) *planexv1.StepOutcome {
	o := &planexv1.StepOutcome{StepId: id, Status: status, PlanRevision: rev, Attempt: 1}
	if out != nil {
		v, err := structpb.NewValue(out)
		if err != nil {
			panic(err)
		}
		o.Output = v
	}
	if code != 0 {
		o.Error = &planexv1.StepError{Code: code, Message: msg}
	}
	return o
}

func stepIDs(p *planexv1.Plan) []string {
	var ids []string
	for _, s := range p.GetSteps() {
		ids = append(ids, s.GetId())
	}
	return ids
}

func TestFailureBranches(t *testing.T) {
	set := mustLoad(t, map[string]string{"report.yaml": reportYAML})
	tools := plannertest.Catalog(t)
	const goal = "send the top 3 customers to finance team"
	first, err := set.Plan(context.Background(), &planexv1.PlanRequest{Goal: goal, Tools: tools, Revision: 1})
	if err != nil {
		t.Fatal(err)
	}
	rev1 := first.GetPlan()
	succeeded := planexv1.StepStatus_STEP_STATUS_SUCCEEDED
	failed := planexv1.StepStatus_STEP_STATUS_FAILED
	rows := map[string]any{"rows": []any{[]any{"Acme"}}, "row_count": 1}
	// replan asks for revision 2 after revision 1 had these outcomes.
	replan := func(t *testing.T, outcomes ...*planexv1.StepOutcome) *planexv1.Plan {
		t.Helper()
		h := &planexv1.PlanHistory{Revisions: []*planexv1.Plan{rev1}, Steps: outcomes}
		resp, err := set.Plan(context.Background(), &planexv1.PlanRequest{Goal: goal, Tools: tools, Revision: 2, History: h})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetPlan()
	}

	t.Run("failed first step selects the matching branch", func(t *testing.T) {
		p := replan(t, outcome("top", 1, failed, nil, planexv1.ErrorCode_ERROR_CODE_TIMEOUT, "query timed out"))
		if got := strings.Join(stepIDs(p), ","); got != "draft,top_small,send2" {
			t.Errorf("steps = %s, want draft,top_small,send2", got)
		}
		if p.GetRevision() != 2 || !strings.Contains(p.GetRationale(), `on_failure branch smaller after step "top" failed (TIMEOUT: query timed out)`) {
			t.Errorf("revision %d rationale %q", p.GetRevision(), p.GetRationale())
		}
		if p.GetAnswer() != `'sent the top customer to ' + "finance@example.com"` {
			t.Errorf("answer = %q", p.GetAnswer())
		}
		if err := plan.Validate(p, plan.NewCatalog(tools), plan.DefaultLimits()); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("later failure keeps completed steps as they ran", func(t *testing.T) {
		p := replan(t,
			outcome("top", 1, succeeded, rows, 0, ""),
			outcome("draft", 1, succeeded, map[string]any{"draft_id": "d1"}, 0, ""),
			outcome("send", 1, failed, nil, planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, "SMTP relay down"))
		if got := strings.Join(stepIDs(p), ","); got != "top,draft,resend" {
			t.Fatalf("steps = %s, want top,draft,resend", got)
		}
		l := plan.Lineage(rev1, p, map[string]bool{"top": true, "draft": true})
		if strings.Join(l.GetKept(), ",") != "top,draft" || strings.Join(l.GetAdded(), ",") != "resend" || strings.Join(l.GetDropped(), ",") != "send" {
			t.Errorf("lineage kept=%v added=%v dropped=%v", l.GetKept(), l.GetAdded(), l.GetDropped())
		}
	})

	// rev2 is the plan of the branch "smaller", after top timed out.
	rev2 := replan(t, outcome("top", 1, failed, nil, planexv1.ErrorCode_ERROR_CODE_TIMEOUT, "timeout"))
	rev2.Revision = 2
	for _, tc := range []struct {
		name      string
		revisions []*planexv1.Plan
		steps     []*planexv1.StepOutcome
		want      string // "" for success, else the ErrNoBranch detail
		wantSteps string
	}{
		{"failure without a branch", []*planexv1.Plan{rev1},
			[]*planexv1.StepOutcome{outcome("top", 1, failed, nil, planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, "syntax error")},
			`step "top" failed: syntax error`, ""},
		{"a branch is used once", []*planexv1.Plan{rev1, rev2}, []*planexv1.StepOutcome{
			outcome("top", 1, failed, nil, planexv1.ErrorCode_ERROR_CODE_TIMEOUT, "timeout"),
			outcome("top_small", 2, failed, nil, planexv1.ErrorCode_ERROR_CODE_TIMEOUT, "timeout"),
		}, `step "top_small" failed: timeout`, ""},
		// The supervisor forgets the outcomes of steps a revision dropped:
		// the branch is recognised from the revisions.
		{"the branch stays without the failure in the history", []*planexv1.Plan{rev1, rev2}, []*planexv1.StepOutcome{
			outcome("top_small", 2, succeeded, rows, 0, ""),
		}, "", "draft,top_small,send2"},
		{"a handled failure is not replayed", []*planexv1.Plan{rev1, rev2}, []*planexv1.StepOutcome{
			outcome("top", 1, failed, nil, planexv1.ErrorCode_ERROR_CODE_TIMEOUT, "timeout"),
			outcome("top_small", 2, succeeded, rows, 0, ""),
		}, "", "draft,top_small,send2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &planexv1.PlanHistory{Revisions: tc.revisions, Steps: tc.steps}
			resp, err := set.Plan(context.Background(), &planexv1.PlanRequest{Goal: goal, Tools: tools, Revision: 3, History: h})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got := strings.Join(stepIDs(resp.GetPlan()), ","); got != tc.wantSteps {
					t.Errorf("steps = %s, want %s", got, tc.wantSteps)
				}
				return
			}
			if !errors.Is(err, playbook.ErrNoBranch) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want ErrNoBranch with %q", err, tc.want)
			}
		})
	}

	t.Run("a retried step that succeeded is no failure", func(t *testing.T) {
		p := replan(t,
			outcome("top", 1, failed, nil, planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, "boom"),
			outcome("top", 1, succeeded, rows, 0, ""))
		if got := strings.Join(stepIDs(p), ","); got != "top,draft,send" {
			t.Errorf("steps = %s, want the main plan", got)
		}
	})
}

func TestNextStep(t *testing.T) {
	set := mustLoad(t, map[string]string{"report.yaml": reportYAML})
	tools := plannertest.Catalog(t)
	next := planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP
	const goal = "send the top 3 customers to finance team"
	succeeded := planexv1.StepStatus_STEP_STATUS_SUCCEEDED
	h := &planexv1.PlanHistory{}
	var got []string
	for rev := int32(1); rev <= 4; rev++ {
		resp, err := set.Plan(context.Background(), &planexv1.PlanRequest{Goal: goal, Tools: tools, Revision: rev, Mode: next, History: h})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetStop() {
			got = append(got, "stop:"+resp.GetFinalAnswer().GetStringValue())
			break
		}
		p := resp.GetPlan()
		if err := plan.Validate(p, plan.NewCatalog(tools), plan.DefaultLimits()); err != nil {
			t.Fatalf("revision %d: %v", rev, err)
		}
		got = append(got, strings.Join(stepIDs(p), ","))
		h.Revisions = append(h.Revisions, p)
		last := p.GetSteps()[len(p.GetSteps())-1].GetId()
		h.Steps = append(h.Steps, outcome(last, rev, succeeded, map[string]any{"rows": []any{}, "draft_id": "d"}, 0, ""))
	}
	want := []string{"top", "top,draft", "top,draft,send", "stop:sent to finance@example.com (params.to stays text)"}
	if strings.Join(got, " | ") != strings.Join(want, " | ") {
		t.Errorf("next-step sequence\n got %q\nwant %q", got, want)
	}
}

func TestMalformedPlaybooks(t *testing.T) {
	valid := "name: ok\ndescription: d\nmatch: ['^x$']\nsteps:\n  - id: a\n    tool: sql.query\n    args: {sql: SELECT 1}\n"
	cases := []struct {
		name string
		text string
		want string
	}{
		{"bad YAML", "name: x\n  description: [\n", "pb/bad.yaml: line 2: "},
		{"unknown top-level field", valid + "answr: x\n", `pb/bad.yaml:8: playbook: unknown field "answr"`},
		{"unknown step field", "name: x\ndescription: d\nmatch: ['^x$']\nsteps:\n  - id: a\n    tool: sql.query\n    arg: {}\n", `pb/bad.yaml:7: steps[0]: unknown field "arg"`},
		{"bad regexp", "name: x\ndescription: d\nmatch:\n  - '^(x$'\nsteps:\n  - {id: a, tool: sql.query}\n", "pb/bad.yaml:4: match[0]: bad regular expression: error parsing regexp: missing closing )"},
		{"undeclared capture", "name: x\ndescription: d\nmatch:\n  - '^(?P<who>.+)$'\nsteps:\n  - {id: a, tool: sql.query}\n", `pb/bad.yaml:4: match: capture group "who" is not declared under params`},
		{"unknown dependency", "name: x\ndescription: d\nmatch: ['^x$']\nsteps:\n  - id: a\n    tool: sql.query\n  - id: b\n    tool: sql.query\n    depends_on: [nope]\n", `pb/bad.yaml:7: step "b": depends_on: unknown step "nope"`},
		{"reference to a non-dependency", "name: x\ndescription: d\nmatch: ['^x$']\nsteps:\n  - id: a\n    tool: sql.query\n  - id: b\n    tool: sql.query\n    args: {sql: '${{ steps.a.output.x }}'}\n", `pb/bad.yaml:7: step "b"`},
		{"cycle", "name: x\ndescription: d\nmatch: ['^x$']\nsteps:\n  - {id: a, tool: sql.query, depends_on: [b]}\n  - {id: b, tool: sql.query, depends_on: [a]}\n", "a -> b -> a"},
		{"unknown param in args", "name: x\ndescription: d\nmatch: ['^x$']\nsteps:\n  - id: a\n    tool: sql.query\n    args: {sql: '${{ params.who }}'}\n", `pb/bad.yaml:5: step "a": args.sql: unknown parameter "who"`},
		{"bad answer", valid + "answer: steps.a.output +\n", "pb/bad.yaml:8: answer: "},
		{"bad tool name", "name: x\ndescription: d\nmatch: ['^x$']\nsteps:\n  - {id: a, tool: query}\n", `pb/bad.yaml:5: steps[0].tool: "query" is not a tool name like sql.query`},
		{"example that does not match", valid + "examples: [y]\n", `pb/bad.yaml:1: playbook ok: example "y" does not match: no pattern matches`},
		{"branch on unknown step", valid + "on_failure:\n  - when: {step: zz}\n    steps: [{id: c, tool: sql.query}]\n", `pb/bad.yaml:9: on_failure[0].when.step: unknown step "zz"`},
		{"unknown error code", valid + "on_failure:\n  - when: {code: OOPS}\n    steps: [{id: c, tool: sql.query}]\n", `pb/bad.yaml:9: on_failure[0].when.code: unknown error code "OOPS"`},
		{"bad param default", "name: x\ndescription: d\nmatch: ['^(?P<n>\\d+)$']\nparams:\n  n: {type: int, default: many}\nsteps:\n  - {id: a, tool: sql.query}\n", `pb/bad.yaml:5: params.n.default: value "many" is not an integer`},
		{"missing fields", "name: x\n", `pb/bad.yaml:1: playbook x: missing field "description"`},
		{"duplicate step ids", "name: x\ndescription: d\nmatch: ['^x$']\nsteps:\n  - {id: a, tool: sql.query}\n  - {id: a, tool: sql.query}\n", `pb/bad.yaml:6: steps[1]: duplicate step id "a" (first at line 5)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadYAML(t, map[string]string{"bad.yaml": tc.text, "good.yaml": valid})
			if err == nil {
				t.Fatal("Load accepted a malformed playbook")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not contain %q:\n%v", tc.want, err)
			}
		})
	}
	t.Run("duplicate names in one source", func(t *testing.T) {
		_, err := loadYAML(t, map[string]string{"a.yaml": valid, "b.yaml": valid})
		if err == nil || !strings.Contains(err.Error(), `pb/b.yaml:1: duplicate playbook name "ok" (first defined at pb/a.yaml:1)`) {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("missing directory", func(t *testing.T) {
		_, err := playbook.Load(playbook.Dir(filepath.Join(t.TempDir(), "nope")))
		if err == nil || !strings.Contains(err.Error(), "nope") {
			t.Errorf("err = %v", err)
		}
	})
}

func TestLoadOrderAndOverride(t *testing.T) {
	dir := t.TempDir()
	override := strings.Replace(reportYAML, "description: Mail a report of the top customers", "description: Local override", 1)
	if err := os.WriteFile(filepath.Join(dir, "report.yml"), []byte(override), 0o600); err != nil {
		t.Fatal(err)
	}
	builtin := fstest.MapFS{"x/report.yaml": {Data: []byte(reportYAML)}}
	set, err := playbook.Load(playbook.Dir(dir), playbook.Source{FS: builtin, Name: "builtin"})
	if err != nil {
		t.Fatal(err)
	}
	books := set.Playbooks()
	if len(books) != 1 || books[0].Description != "Local override" || books[0].Source != filepath.Join(dir, "report.yml")+":1" {
		t.Errorf("playbooks = %+v, want the directory's override only", books)
	}
}

func TestDemoPlaybooksLoad(t *testing.T) {
	set := demoSet(t)
	var names []string
	for _, b := range set.Playbooks() {
		names = append(names, b.Name)
		if len(b.Examples) == 0 {
			t.Errorf("%s has no examples", b.Name)
		}
	}
	want := "close-ticket,compare-customers,customer-report,open-tickets,order-value-by-region,send-runbook,top-customers-email"
	if strings.Join(names, ",") != want {
		t.Errorf("demo playbooks = %v, want %s", names, want)
	}
}
