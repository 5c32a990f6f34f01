package plannertest

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// The fake checks every request the way the provider's API does and
// answers 400 (or 401) in the provider's error shape, as the real API
// would, before any scripted reply: required headers, required fields,
// value ranges, and for OpenAI the rules of strict structured outputs.

// checkRequest returns the status and message the provider would answer
// with, or 0 when the request is valid.
func checkRequest(path string, h http.Header, body map[string]any) (int, string) {
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return checkOpenAI(h, body)
	case strings.HasSuffix(path, "/messages"):
		return checkAnthropic(h, body)
	}
	return http.StatusNotFound, "unknown path " + path
}

func checkOpenAI(h http.Header, b map[string]any) (int, string) {
	if !strings.HasPrefix(h.Get("Authorization"), "Bearer ") {
		return http.StatusUnauthorized, "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth."
	}
	if !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
		return http.StatusBadRequest, "Content-Type must be application/json"
	}
	if m, _ := b["model"].(string); m == "" {
		return http.StatusBadRequest, "you must provide a model parameter"
	}
	msgs, _ := b["messages"].([]any)
	if len(msgs) == 0 {
		return http.StatusBadRequest, "'messages' must contain at least one message"
	}
	for i, m := range Objects(msgs) {
		role, _ := m["role"].(string)
		if !slices.Contains([]string{"system", "developer", "user", "assistant", "tool"}, role) {
			return http.StatusBadRequest, fmt.Sprintf("Invalid value for 'messages[%d].role': %q", i, role)
		}
		if _, ok := m["content"]; !ok && role != "assistant" {
			return http.StatusBadRequest, fmt.Sprintf("Missing required parameter: 'messages[%d].content'", i)
		}
	}
	if t, ok := b["temperature"]; ok {
		if f, _ := t.(float64); f < 0 || f > 2 {
			return http.StatusBadRequest, fmt.Sprintf("Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got %v instead.", t)
		}
	}
	if t, ok := b["max_completion_tokens"]; ok {
		if f, _ := t.(float64); f < 1 {
			return http.StatusBadRequest, fmt.Sprintf("Invalid 'max_completion_tokens': integer below minimum value. Expected a value >= 1, but got %v instead.", t)
		}
	}
	if rf, ok := b["response_format"].(map[string]any); ok && rf["type"] == "json_schema" {
		js, _ := rf["json_schema"].(map[string]any)
		name, _ := js["name"].(string)
		if !regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`).MatchString(name) {
			return http.StatusBadRequest, fmt.Sprintf("Invalid 'response_format.json_schema.name': %q", name)
		}
		if js["strict"] == true {
			schema, _ := js["schema"].(map[string]any)
			if schema["type"] != "object" {
				return http.StatusBadRequest, fmt.Sprintf("Invalid schema for response_format '%s': schema must be a JSON Schema of 'type: \"object\"'", name)
			}
			if msg := strictSchema(schema, "context=()"); msg != "" {
				return http.StatusBadRequest, fmt.Sprintf("Invalid schema for response_format '%s': In %s", name, msg)
			}
		}
	}
	return 0, ""
}

// strictSchema applies the rules of OpenAI's strict mode: every object
// sets additionalProperties to false and lists all its properties as
// required; every subschema has a type or a $ref/anyOf.
func strictSchema(s map[string]any, at string) string {
	if _, ok := s["$ref"]; ok {
		return ""
	}
	if alts, ok := s["anyOf"].([]any); ok {
		for i, sub := range alts {
			m, _ := sub.(map[string]any)
			if msg := strictSchema(m, fmt.Sprintf("%s, 'anyOf', %d", at, i)); msg != "" {
				return msg
			}
		}
		return ""
	}
	if _, ok := s["type"]; !ok {
		return at + ": schema must have a 'type' key."
	}
	isType := func(want string) bool {
		switch t := s["type"].(type) {
		case string:
			return t == want
		case []any:
			return slices.Contains(t, any(want))
		}
		return false
	}
	if isType("object") {
		if s["additionalProperties"] != false {
			return at + ": 'additionalProperties' is required to be supplied and to be false."
		}
		props, _ := s["properties"].(map[string]any)
		req, _ := s["required"].([]any)
		for k, v := range props {
			if !slices.Contains(req, any(k)) {
				return fmt.Sprintf("%s: 'required' is required to be supplied and to be an array including every key in properties. Missing '%s'.", at, k)
			}
			m, _ := v.(map[string]any)
			if msg := strictSchema(m, fmt.Sprintf("%s, 'properties', '%s'", at, k)); msg != "" {
				return msg
			}
		}
	}
	if isType("array") {
		if items, ok := s["items"].(map[string]any); ok {
			if msg := strictSchema(items, at+", 'items'"); msg != "" {
				return msg
			}
		}
	}
	if defs, ok := s["$defs"].(map[string]any); ok {
		for k, v := range defs {
			m, _ := v.(map[string]any)
			if msg := strictSchema(m, fmt.Sprintf("%s, '$defs', '%s'", at, k)); msg != "" {
				return msg
			}
		}
	}
	return ""
}

var anthropicToolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

func checkAnthropic(h http.Header, b map[string]any) (int, string) {
	if h.Get("X-Api-Key") == "" && !strings.HasPrefix(h.Get("Authorization"), "Bearer ") {
		return http.StatusUnauthorized, "x-api-key header is required"
	}
	if h.Get("Anthropic-Version") == "" {
		return http.StatusBadRequest, "anthropic-version: header is required"
	}
	if m, _ := b["model"].(string); m == "" {
		return http.StatusBadRequest, "model: Field required"
	}
	if f, ok := b["max_tokens"].(float64); !ok || f < 1 {
		return http.StatusBadRequest, "max_tokens: Field required (an integer of at least 1)"
	}
	if t, ok := b["temperature"]; ok {
		if f, _ := t.(float64); f < 0 || f > 1 {
			return http.StatusBadRequest, fmt.Sprintf("temperature: range: 0..1 (got %v)", t)
		}
	}
	msgs := Objects(b["messages"])
	if len(msgs) == 0 {
		return http.StatusBadRequest, "messages: at least one message is required"
	}
	for i, m := range msgs {
		want := "user"
		if i%2 == 1 {
			want = "assistant"
		}
		if m["role"] != want {
			return http.StatusBadRequest, fmt.Sprintf("messages: roles must alternate between \"user\" and \"assistant\", starting with \"user\" (messages.%d.role is %v)", i, m["role"])
		}
	}
	var names []string
	for i, t := range Objects(b["tools"]) {
		name, _ := t["name"].(string)
		if !anthropicToolName.MatchString(name) {
			return http.StatusBadRequest, fmt.Sprintf("tools.%d.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'", i)
		}
		schema, _ := t["input_schema"].(map[string]any)
		if schema["type"] != "object" {
			return http.StatusBadRequest, fmt.Sprintf("tools.%d.custom.input_schema.type: Input should be 'object'", i)
		}
		names = append(names, name)
	}
	if tc, ok := b["tool_choice"].(map[string]any); ok && tc["type"] == "tool" {
		if name, _ := tc["name"].(string); !slices.Contains(names, name) {
			return http.StatusBadRequest, fmt.Sprintf("tool_choice: tool %q not found in tools", name)
		}
	}
	return 0, ""
}
