package prompt_test

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/planner/internal/plannertest"
	"github.com/planex-dev/planex/services/planner/prompt"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the rendered prompt; run go test ./services/planner/prompt -update and review the diff.\ngot:\n%s", path, got)
	}
}

func mustValue(t *testing.T, v any) *structpb.Value {
	t.Helper()
	val, err := structpb.NewValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return val
}

func replanRequest(t *testing.T) *planexv1.PlanRequest {
	t.Helper()
	tools := plannertest.Catalog(t)
	inputs, err := structpb.NewStruct(map[string]any{"year": 2025})
	if err != nil {
		t.Fatal(err)
	}
	args, err := structpb.NewStruct(map[string]any{"sql": "SELECT region, avg(amount) FROM orders GROUP BY region"})
	if err != nil {
		t.Fatal(err)
	}
	big := make([]any, 400)
	for i := range big {
		big[i] = []any{"Customer", float64(i)}
	}
	rev1 := &planexv1.Plan{Revision: 1, Rationale: "group orders by region", Confidence: 0.7, Steps: []*planexv1.Step{
		{Id: "customers", Tool: "sql.query", Args: args},
		{Id: "by_region", Tool: "sql.query", Args: args, DependsOn: []string{"customers"}, Expect: "output.row_count > 0"},
	}, Answer: "steps.by_region.output.rows"}
	return &planexv1.PlanRequest{
		RunId:    "run-1",
		Goal:     "  What is the average order value by region in 2025?  ",
		Inputs:   inputs,
		Tools:    tools,
		Revision: 2,
		Mode:     planexv1.PlanningMode_PLANNING_MODE_FULL,
		Constraints: &planexv1.PlanConstraints{
			MaxSteps: 10, MaxParallelism: 4, RemainingTokens: 20000, RemainingReplans: 2,
			Policies: []string{"Never email addresses outside example.com."},
		},
		History: &planexv1.PlanHistory{
			Revisions: []*planexv1.Plan{{Revision: 0, Steps: []*planexv1.Step{{Id: "old"}}}, rev1},
			Steps: []*planexv1.StepOutcome{
				{StepId: "customers", Tool: "sql.query", Status: planexv1.StepStatus_STEP_STATUS_SUCCEEDED, Attempt: 1, PlanRevision: 1,
					Output: mustValue(t, map[string]any{"rows": big, "row_count": 400})},
				{StepId: "by_region", Tool: "sql.query", Status: planexv1.StepStatus_STEP_STATUS_FAILED, Attempt: 1, PlanRevision: 1,
					Error: &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, Message: "SQL logic error:\n no such column: region (1)"}},
			},
			ReplanReason:     "step by_region failed: no such column: region",
			ValidationErrors: []string{`step "x": tool "sql.magic" is not in the catalog`},
		},
	}
}

func TestSystemGolden(t *testing.T) {
	golden(t, "system.golden", prompt.System())
}

func TestUserGolden(t *testing.T) {
	cases := []struct {
		name    string
		req     func(t *testing.T) *planexv1.PlanRequest
		example *planexv1.Plan
	}{
		{"user_first.golden", func(t *testing.T) *planexv1.PlanRequest {
			return &planexv1.PlanRequest{Goal: "How many open support tickets does Acme Corp have?", Tools: plannertest.Catalog(t), Revision: 1,
				Mode: planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP}
		}, nil},
		{"user_replan.golden", replanRequest, &planexv1.Plan{Steps: []*planexv1.Step{{Id: "q", Tool: "sql.query", Args: &structpb.Struct{Fields: map[string]*structpb.Value{"sql": structpb.NewStringValue("SELECT 1")}}}}, Answer: "steps.q.output.rows[0][0]"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			golden(t, tc.name, prompt.User(tc.req(t), tc.example))
		})
	}
}

func TestUserTruncatesLargeOutputs(t *testing.T) {
	got := prompt.User(replanRequest(t), nil)
	if !strings.Contains(got, "… [truncated, ") {
		t.Error("large output not truncated")
	}
	if len(got) > 40_000 {
		t.Errorf("prompt is %d bytes, want it bounded", len(got))
	}
	if strings.Contains(got, "SQL logic error:\n") {
		t.Error("multi-line error not folded into one line")
	}
}

func TestRepair(t *testing.T) {
	got := prompt.Repair([]string{`step "a": tool "x.y" is not in the catalog`, "a -> b -> a"})
	for _, want := range []string{"- step \"a\": tool \"x.y\" is not in the catalog\n", "- a -> b -> a\n", "escalate=true"} {
		if !strings.Contains(got, want) {
			t.Errorf("repair message lacks %q:\n%s", want, got)
		}
	}
}

// TestSchemaIsStrict checks the rules of OpenAI's strict structured
// output on every object of the schema.
func TestSchemaIsStrict(t *testing.T) {
	tools := plannertest.Catalog(t)
	for _, enc := range []prompt.ArgsEncoding{prompt.ArgsString, prompt.ArgsObject} {
		var walk func(path string, s map[string]any)
		walk = func(path string, s map[string]any) {
			if s["type"] == "object" {
				props, _ := s["properties"].(map[string]any)
				if props == nil {
					if enc == prompt.ArgsString {
						t.Errorf("%s: free-form object in strict schema", path)
					}
					return
				}
				if s["additionalProperties"] != false {
					t.Errorf("%s: additionalProperties not false", path)
				}
				req, _ := s["required"].([]any)
				for name, p := range props {
					if !slices.Contains(req, any(name)) {
						t.Errorf("%s.%s: not required", path, name)
					}
					walk(path+"."+name, p.(map[string]any))
				}
			}
			if items, ok := s["items"].(map[string]any); ok {
				walk(path+"[]", items)
			}
		}
		walk("answer", prompt.Schema(tools, enc))
	}
	s := prompt.Schema(tools, prompt.ArgsString)
	tool := s["properties"].(map[string]any)["steps"].(map[string]any)["items"].(map[string]any)["properties"].(map[string]any)["tool"].(map[string]any)
	if enum, _ := tool["enum"].([]any); len(enum) != len(tools) || !slices.Contains(enum, any("email.send")) {
		t.Errorf("tool enum = %v, want the catalog's names", tool["enum"])
	}
}

func TestParse(t *testing.T) {
	cases := []struct {
		name  string
		text  string
		check func(t *testing.T, r *planexv1.PlanResponse)
		err   string
	}{
		{"plan with args as a string", `{"rationale":"r","confidence":0.8,"stop":false,"escalate":false,"stop_message":"","final_answer":"","answer":"steps.q.output","steps":[{"id":"q","description":"d","tool":"sql.query","args":"{\"sql\":\"SELECT 1\",\"params\":[1]}","depends_on":[],"expect":""}]}`,
			func(t *testing.T, r *planexv1.PlanResponse) {
				s := r.GetPlan().GetSteps()[0]
				if s.GetArgs().GetFields()["sql"].GetStringValue() != "SELECT 1" || r.GetPlan().GetConfidence() != 0.8 || r.GetPlan().GetAnswer() != "steps.q.output" {
					t.Errorf("plan = %v", r.GetPlan())
				}
			}, ""},
		{"plan with args as an object in a code fence", "```json\n{\"confidence\":1,\"steps\":[{\"id\":\"q\",\"tool\":\"sql.query\",\"args\":{\"sql\":\"SELECT 2\"}}]}\n```",
			func(t *testing.T, r *planexv1.PlanResponse) {
				if r.GetPlan().GetSteps()[0].GetArgs().GetFields()["sql"].GetStringValue() != "SELECT 2" {
					t.Errorf("plan = %v", r.GetPlan())
				}
			}, ""},
		{"stop with final answer", `{"stop":true,"final_answer":"Acme has 3 tickets","steps":[]}`,
			func(t *testing.T, r *planexv1.PlanResponse) {
				if !r.GetStop() || r.GetEscalate() || r.GetFinalAnswer().GetStringValue() != "Acme has 3 tickets" || r.GetPlan() != nil {
					t.Errorf("resp = %v", r)
				}
			}, ""},
		{"escalation", `{"stop":true,"escalate":true,"stop_message":"no tool can book flights","steps":[]}`,
			func(t *testing.T, r *planexv1.PlanResponse) {
				if !r.GetStop() || !r.GetEscalate() || r.GetStopMessage() != "no tool can book flights" {
					t.Errorf("resp = %v", r)
				}
			}, ""},
		{"truncated JSON", `{"confidence":0.5,"steps":[{"id":"q"`, nil, "not a valid JSON object"},
		{"text after the object", `{"confidence":0.5,"steps":[]} and more`, nil, "text after the JSON object"},
		{"args not an object", `{"confidence":0.5,"steps":[{"id":"q","tool":"sql.query","args":"[1,2]"}]}`, nil, `steps[0] ("q").args: want a JSON object`},
		{"confidence out of range", `{"confidence":7,"steps":[{"id":"q","tool":"sql.query","args":{}}]}`, nil, "confidence: must be in [0, 1], got 7"},
		{"no steps", `{"confidence":0.5,"steps":[]}`, nil, "steps: empty while stop is false"},
		{"stop without anything", `{"stop":true}`, nil, "final_answer and stop_message are empty"},
		{"empty", "  ", nil, "the answer is empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := prompt.Parse(tc.text)
			if tc.err != "" {
				var ae *prompt.AnswerError
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, &ae) {
					t.Fatalf("err = %v, want AnswerError with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, r)
		})
	}
}

func TestStripFence(t *testing.T) {
	obj := `{"a": 1}`
	cases := []struct{ name, in, want string }{
		{"bare object", "  " + obj + "\n", obj},
		{"json fence", "```json\n" + obj + "\n```", obj},
		{"upper-case info string", "```JSON\n" + obj + "\n```\n", obj},
		{"fence without info string", "```\n" + obj + "\n```", obj},
		{"one-line fence", "```json " + obj + "```", obj},
		{"one-line fence without info string", "```" + obj + "```", obj},
		{"unclosed fence (cut answer)", "```json\n{\"a\":", `{"a":`},
		{"empty", "  ", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := prompt.StripFence(tc.in); got != tc.want {
				t.Errorf("StripFence(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
