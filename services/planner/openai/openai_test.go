package openai_test

import (
	"strings"
	"testing"

	"github.com/planex-dev/planex/services/planner/internal/plannertest"
	"github.com/planex-dev/planex/services/planner/llm"
	"github.com/planex-dev/planex/services/planner/openai"
	"github.com/planex-dev/planex/services/planner/prompt"
)

func TestProvider(t *testing.T) {
	plannertest.RunProviderSuite(t, plannertest.Harness{
		Name:           "openai",
		Path:           "/v1/chat/completions",
		ArgsAsString:   true,
		MaxTokensField: "max_completion_tokens",
		BasePath:       "/v1",
		New:            func(c llm.ProviderConfig) llm.Provider { return openai.New(c) },
		Answer:         func(_ int, answer string) plannertest.Reply { return plannertest.OpenAIAnswer(answer) },
		Refusal:        plannertest.OpenAIRefusal,
		Truncated:      func(_ int, partial string) plannertest.Reply { return plannertest.OpenAITruncated(partial) },
		Error:          plannertest.OpenAIError,
		CheckRequest: func(t *testing.T, r plannertest.Request, goal string) {
			b := r.Body
			if b["model"] != plannertest.SuiteModel || b["temperature"] != 0.1 || b["max_completion_tokens"] != 4096.0 {
				t.Errorf("model %v temperature %v max_completion_tokens %v", b["model"], b["temperature"], b["max_completion_tokens"])
			}
			if got := r.Header.Get("Authorization"); got != "Bearer "+plannertest.SuiteAPIKey {
				t.Errorf("Authorization = %q", got)
			}
			rf, _ := b["response_format"].(map[string]any)
			js, _ := rf["json_schema"].(map[string]any)
			schema, _ := js["schema"].(map[string]any)
			props, _ := schema["properties"].(map[string]any)
			if rf["type"] != "json_schema" || js["name"] != prompt.SchemaName || js["strict"] != true || schema["additionalProperties"] != false || props["steps"] == nil {
				t.Errorf("response_format = %v", rf)
			}
			msgs := plannertest.Objects(r.Body["messages"])
			if len(msgs) != 2 || msgs[0]["role"] != "system" || msgs[0]["content"] != prompt.System() || msgs[1]["role"] != "user" {
				t.Fatalf("messages = %v", msgs)
			}
			if c, _ := msgs[1]["content"].(string); !strings.Contains(c, "# Goal\n"+goal) || !strings.Contains(c, "## sql.query") {
				t.Errorf("user message lacks the goal or the catalog:\n%s", c)
			}
		},
		RepairText: func(t *testing.T, r plannertest.Request, bad string) string {
			msgs := plannertest.Objects(r.Body["messages"])
			if len(msgs) != 4 || msgs[2]["role"] != "assistant" || msgs[2]["content"] != bad || msgs[3]["role"] != "user" {
				t.Fatalf("repair conversation = %v", msgs)
			}
			s, _ := msgs[3]["content"].(string)
			return s
		},
	})
}
