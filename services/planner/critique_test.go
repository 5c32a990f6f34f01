package planner_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/planner"
	"github.com/planex-dev/planex/services/planner/internal/plannertest"
)

func critiqueRequest(out *structpb.Value) *planexv1.CritiqueRequest {
	args, _ := structpb.NewStruct(map[string]any{"query": "select count(*) from tickets"})
	return &planexv1.CritiqueRequest{
		RunId: "run-c", Goal: "How many open tickets?", StepId: "count", Attempt: 1, Description: "count the open tickets",
		Tool: &planexv1.ToolSpec{Name: "sql.query", Description: "read-only SQL"}, Args: args, Output: out,
	}
}

// TestCritiqueOpenAI asks the model critic through the fake OpenAI server,
// which checks the request like the API does (strict schema rules, name).
func TestCritiqueOpenAI(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-local")
	fake := plannertest.NewFake(t)
	srv, err := planner.NewServer(modelConfig(fake), natstest.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	out := structpb.NewStringValue("no rows")

	t.Run("fail verdict", func(t *testing.T) {
		fake.Script(plannertest.OpenAIAnswer(`{"verdict":"fail","reason":"the count is missing: the query returned no rows"}`))
		resp, err := srv.Critique(ctx, critiqueRequest(out))
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetPassed() || resp.GetReason() != "the count is missing: the query returned no rows" || resp.GetBackend() != "openai" ||
			resp.GetUsage().GetInputTokens() != plannertest.FakeInputTokens {
			t.Fatalf("response %v", resp)
		}
		body := fake.Requests()[0].Body
		rf := body["response_format"].(map[string]any)["json_schema"].(map[string]any)
		if rf["name"] != "submit_verdict" || rf["strict"] != true {
			t.Fatalf("response_format %v", rf)
		}
		msgs := body["messages"].([]any)
		if user := msgs[1].(map[string]any)["content"].(string); !strings.Contains(user, `"no rows"`) || !strings.Contains(user, "count the open tickets") {
			t.Fatalf("prompt does not show the step and its result: %s", user)
		}
	})

	t.Run("invalid verdict is repaired", func(t *testing.T) {
		fake.Script(plannertest.OpenAIAnswer(`{"verdict":"maybe","reason":""}`), plannertest.OpenAIAnswer(`{"verdict":"pass","reason":"one row with the count"}`))
		resp, err := srv.Critique(ctx, critiqueRequest(out))
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetPassed() || resp.GetUsage().GetInputTokens() != 2*plannertest.FakeInputTokens {
			t.Fatalf("response %v", resp)
		}
		reqs := fake.Requests()
		repair := reqs[len(reqs)-1].Body["messages"].([]any)
		if last := repair[len(repair)-1].(map[string]any)["content"].(string); !strings.Contains(last, `verdict: "maybe", want pass or fail`) {
			t.Fatalf("repair message %q", last)
		}
	})

	t.Run("still invalid is Aborted with usage", func(t *testing.T) {
		fake.Script(plannertest.OpenAIAnswer(`{"verdict":"fail"}`), plannertest.OpenAIAnswer(`not json`))
		_, err := srv.Critique(ctx, critiqueRequest(out))
		if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "not a verdict object") {
			t.Fatalf("err = %v", err)
		}
	})

	// A verdict in a Markdown code fence is read like a plan in one: the
	// planner and the critic share the parsing (prompt.StripFence).
	for name, text := range map[string]string{
		"json fence":           "```json\n{\"verdict\":\"pass\",\"reason\":\"one row with the count\"}\n```",
		"bare fence":           "```\n{\"verdict\":\"pass\",\"reason\":\"one row with the count\"}\n```",
		"one-line fence":       "```json {\"verdict\":\"pass\",\"reason\":\"one row with the count\"}```",
		"fence and whitespace": "\n  ```JSON\n{\"verdict\": \"pass\", \"reason\": \"one row with the count\"}\n```  \n",
	} {
		t.Run("verdict in a "+name, func(t *testing.T) {
			fake.Script(plannertest.OpenAIAnswer(text))
			resp, err := srv.Critique(ctx, critiqueRequest(out))
			if err != nil {
				t.Fatal(err)
			}
			if !resp.GetPassed() || resp.GetReason() != "one row with the count" {
				t.Fatalf("response %v", resp)
			}
			if n := len(fake.Requests()); n != 1 {
				t.Errorf("%d requests, want 1: the fenced verdict needs no repair", n)
			}
		})
	}

	t.Run("verdict cut at the output cap twice is final", func(t *testing.T) {
		fake.Script(plannertest.OpenAITruncated(`{"verdict":"fail","reason":"the count is`))
		_, err := srv.Critique(ctx, critiqueRequest(out))
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--planner-max-output-tokens (now 1024)") {
			t.Fatalf("err = %v, want FailedPrecondition naming --planner-max-output-tokens", err)
		}
		if n := len(fake.Requests()); n != 2 {
			t.Errorf("%d requests, want 2", n)
		}
	})

	t.Run("refusal fails closed", func(t *testing.T) {
		fake.Script(plannertest.OpenAIRefusal("I cannot help with that"))
		resp, err := srv.Critique(ctx, critiqueRequest(out))
		if err != nil || resp.GetPassed() || !strings.Contains(resp.GetReason(), "refused") {
			t.Fatalf("resp %v, err %v", resp, err)
		}
	})

	t.Run("budget too small", func(t *testing.T) {
		fake.Script()
		r := critiqueRequest(out)
		r.RemainingTokens = 10
		if _, err := srv.Critique(ctx, r); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("bad request names the field", func(t *testing.T) {
		r := critiqueRequest(out)
		r.StepId, r.Tool = "", nil
		_, err := srv.Critique(ctx, r)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "step_id: required") || !strings.Contains(err.Error(), "tool.name: required") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestCritiqueAnthropic(t *testing.T) {
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-local")
	fake := plannertest.NewFake(t)
	cfg := modelConfig(fake)
	cfg.Backend = planner.BackendAnthropic
	cfg.Anthropic = planner.ProviderConfig{BaseURL: fake.URL, Model: "claude-test"}
	srv, err := planner.NewServer(cfg, natstest.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	fake.Script(plannertest.AnthropicToolAnswer("toolu_1", "submit_verdict", `{"verdict":"fail","reason":"empty"}`))
	resp, err := srv.Critique(context.Background(), critiqueRequest(structpb.NewStringValue("")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetPassed() || resp.GetReason() != "empty" || resp.GetBackend() != "anthropic" {
		t.Fatalf("response %v", resp)
	}
	body := fake.Requests()[0].Body
	if tc := body["tool_choice"].(map[string]any); tc["name"] != "submit_verdict" {
		t.Fatalf("tool_choice %v", tc)
	}
}

func TestCritiquePlaybookIsDeterministic(t *testing.T) {
	cfg := modelConfig(plannertest.NewFake(t))
	cfg.Backend = planner.BackendPlaybook
	cfg.Playbooks = []string{planner.BuiltinDemoPlaybooks}
	srv, err := planner.NewServer(cfg, natstest.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		out  *structpb.Value
		pass bool
	}{
		{structpb.NewStringValue(" "), false},
		{structpb.NewListValue(&structpb.ListValue{}), false},
		{structpb.NewNullValue(), false},
		{structpb.NewNumberValue(0), true},
		{structpb.NewStringValue("42"), true},
	} {
		resp, err := srv.Critique(context.Background(), critiqueRequest(c.out))
		if err != nil || resp.GetPassed() != c.pass || resp.GetUsage().GetInputTokens() != 0 {
			t.Errorf("output %v: resp %v, err %v; want passed %v", c.out, resp, err, c.pass)
		}
	}
}
