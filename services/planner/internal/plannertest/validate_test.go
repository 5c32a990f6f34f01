package plannertest

import (
	"net/http"
	"strings"
	"testing"
)

func TestFakeChecksRequestsLikeTheProviders(t *testing.T) {
	openAIHeader := http.Header{"Authorization": {"Bearer sk-x"}, "Content-Type": {"application/json"}}
	obj := func(props map[string]any, required []any, extra bool) map[string]any {
		m := map[string]any{"type": "object", "properties": props, "required": required}
		if !extra {
			m["additionalProperties"] = false
		}
		return m
	}
	openAI := func(temp float64, schema map[string]any) map[string]any {
		return map[string]any{
			"model": "m", "temperature": temp, "max_completion_tokens": 100.0,
			"messages":        []any{map[string]any{"role": "user", "content": "hi"}},
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "plan", "strict": true, "schema": schema}},
		}
	}
	good := obj(map[string]any{"a": map[string]any{"type": "string"}}, []any{"a"}, false)
	anthropicHeader := http.Header{"X-Api-Key": {"k"}, "Anthropic-Version": {"2023-06-01"}}
	anthropic := func(temp float64) map[string]any {
		return map[string]any{"model": "m", "max_tokens": 100.0, "temperature": temp,
			"messages":    []any{map[string]any{"role": "user", "content": "hi"}},
			"tools":       []any{map[string]any{"name": "submit_plan", "input_schema": map[string]any{"type": "object"}}},
			"tool_choice": map[string]any{"type": "tool", "name": "submit_plan"}}
	}
	tests := []struct {
		name   string
		path   string
		header http.Header
		body   map[string]any
		code   int
		want   string
	}{
		{"openai valid", "/v1/chat/completions", openAIHeader, openAI(0.1, good), 0, ""},
		{"openai no key", "/v1/chat/completions", http.Header{"Content-Type": {"application/json"}}, openAI(0.1, good), 401, "API key"},
		{"openai temperature", "/v1/chat/completions", openAIHeader, openAI(2.5, good), 400, "temperature"},
		{"openai strict without additionalProperties", "/v1/chat/completions", openAIHeader,
			openAI(0.1, obj(map[string]any{"a": map[string]any{"type": "string"}}, []any{"a"}, true)), 400, "additionalProperties"},
		{"openai strict with an optional property", "/v1/chat/completions", openAIHeader,
			openAI(0.1, obj(map[string]any{"a": map[string]any{"type": "string"}, "b": map[string]any{"type": "string"}}, []any{"a"}, false)), 400, "Missing 'b'"},
		{"openai strict nested object", "/v1/chat/completions", openAIHeader,
			openAI(0.1, obj(map[string]any{"a": map[string]any{"type": "array", "items": obj(map[string]any{"x": map[string]any{"type": "integer"}}, []any{}, false)}}, []any{"a"}, false)), 400, "Missing 'x'"},
		{"anthropic valid", "/v1/messages", anthropicHeader, anthropic(1), 0, ""},
		{"anthropic temperature", "/v1/messages", anthropicHeader, anthropic(1.5), 400, "temperature: range: 0..1"},
		{"anthropic version header", "/v1/messages", http.Header{"X-Api-Key": {"k"}}, anthropic(0.1), 400, "anthropic-version"},
		{"anthropic no key", "/v1/messages", http.Header{"Anthropic-Version": {"2023-06-01"}}, anthropic(0.1), 401, "x-api-key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, msg := checkRequest(tt.path, tt.header, tt.body)
			if code != tt.code || !strings.Contains(msg, tt.want) {
				t.Fatalf("checkRequest = %d %q, want %d containing %q", code, msg, tt.code, tt.want)
			}
		})
	}
}
