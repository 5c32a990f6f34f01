package anthropic_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/planex-dev/planex/services/planner/anthropic"
	"github.com/planex-dev/planex/services/planner/internal/plannertest"
	"github.com/planex-dev/planex/services/planner/llm"
	"github.com/planex-dev/planex/services/planner/prompt"
)

func TestProvider(t *testing.T) {
	plannertest.RunProviderSuite(t, plannertest.Harness{
		Name:           "anthropic",
		Path:           "/v1/messages",
		MaxTokensField: "max_tokens",
		New:            func(c llm.ProviderConfig) llm.Provider { return anthropic.New(c) },
		Answer: func(round int, answer string) plannertest.Reply {
			if !json.Valid([]byte(answer)) {
				// The API always sends a JSON object as tool input; broken
				// model output shows up as a field of the wrong type, such
				// as steps serialised into a string.
				answer = fmt.Sprintf(`{"confidence": 0.5, "steps": %q}`, answer)
			}
			return plannertest.AnthropicAnswer(fmt.Sprintf("toolu_%d", round), answer)
		},
		Refusal: plannertest.AnthropicRefusal,
		Truncated: func(round int, partial string) plannertest.Reply {
			// The API parses the tool input written so far: an object
			// missing the fields the model did not reach.
			if !json.Valid([]byte(partial)) {
				partial += "}"
			}
			return plannertest.AnthropicTruncated(fmt.Sprintf("toolu_%d", round), prompt.SchemaName, partial)
		},
		Error: func(code int, headers map[string]string, detail string) plannertest.Reply {
			return plannertest.AnthropicError(code, headers, "api_error", detail)
		},
		CheckRequest: func(t *testing.T, r plannertest.Request, goal string) {
			b := r.Body
			if b["model"] != plannertest.SuiteModel || b["temperature"] != 0.1 || b["max_tokens"] != 4096.0 {
				t.Errorf("model %v temperature %v max_tokens %v", b["model"], b["temperature"], b["max_tokens"])
			}
			if r.Header.Get("X-Api-Key") != plannertest.SuiteAPIKey || r.Header.Get("Anthropic-Version") == "" {
				t.Errorf("headers x-api-key %q anthropic-version %q", r.Header.Get("X-Api-Key"), r.Header.Get("Anthropic-Version"))
			}
			system, _ := b["system"].([]any)
			if len(system) != 1 || system[0].(map[string]any)["text"] != prompt.System() {
				t.Errorf("system = %v", b["system"])
			}
			tools, _ := b["tools"].([]any)
			tool, _ := tools[0].(map[string]any)
			schema, _ := tool["input_schema"].(map[string]any)
			props, _ := schema["properties"].(map[string]any)
			if len(tools) != 1 || tool["name"] != prompt.SchemaName || schema["type"] != "object" || props["steps"] == nil || schema["additionalProperties"] != false {
				t.Errorf("tools = %v", b["tools"])
			}
			if tc, _ := b["tool_choice"].(map[string]any); tc["type"] != "tool" || tc["name"] != prompt.SchemaName {
				t.Errorf("tool_choice = %v", b["tool_choice"])
			}
			msgs, _ := b["messages"].([]any)
			if len(msgs) != 1 || msgs[0].(map[string]any)["role"] != "user" {
				t.Fatalf("messages = %v", msgs)
			}
			if text, _ := plannertest.Objects(msgs[0])[0]["text"].(string); !strings.Contains(text, "# Goal\n"+goal) {
				t.Errorf("user message lacks the goal:\n%s", text)
			}
		},
		RepairText: func(t *testing.T, r plannertest.Request, _ string) string {
			msgs, _ := r.Body["messages"].([]any)
			if len(msgs) != 3 {
				t.Fatalf("repair conversation = %v", msgs)
			}
			use := plannertest.Objects(msgs[1])
			result := plannertest.Objects(msgs[2])
			if msgs[1].(map[string]any)["role"] != "assistant" || use[0]["type"] != "tool_use" || use[0]["id"] != "toolu_0" || use[0]["name"] != prompt.SchemaName {
				t.Errorf("assistant turn = %v", msgs[1])
			}
			if msgs[2].(map[string]any)["role"] != "user" || result[0]["type"] != "tool_result" || result[0]["tool_use_id"] != "toolu_0" || result[0]["is_error"] != true {
				t.Errorf("tool result turn = %v", msgs[2])
			}
			switch c := result[0]["content"].(type) {
			case string:
				return c
			case []any:
				text, _ := c[0].(map[string]any)["text"].(string)
				return text
			}
			return ""
		},
	})
}
