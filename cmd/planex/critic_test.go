package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

const criticPlaybook = `
name: critic-probe
description: Read a number; read another one if the critic rejects the first
examples:
  - Probe the critic
match:
  - '(?i)^probe the critic$'
steps:
  - id: first
    tool: sql.query
    args: {sql: "SELECT 1 AS n"}
answer: "'first'"
on_failure:
  - name: rejected-by-the-critic
    when: {step: first, code: EXPECTATION_FAILED}
    rationale: the critic rejected the first number
    steps:
      - id: second
        tool: sql.query
        args: {sql: "SELECT 2 AS n"}
    answer: "'second'"
`

// TestModelCriticThroughAnOpenAICompatibleServer runs planex dev with the
// playbook planner and the model critic on an OpenAI-compatible server
// (a local fake that checks requests the way the API does for strict
// structured output): its failing verdict on the first result causes
// exactly one replan, whose reason carries the verdict, and its tokens are
// counted apart from the planner's.
func TestModelCriticThroughAnOpenAICompatibleServer(t *testing.T) {
	var (
		mu       sync.Mutex
		verdicts []string
	)
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		var body map[string]any
		if r.URL.Path != "/v1/chat/completions" || r.Header.Get("Authorization") != "Bearer sk-critic" || json.NewDecoder(r.Body).Decode(&body) != nil {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"message":"bad request","type":"invalid_request_error","param":null,"code":null}}`))
			return
		}
		if msg := strictVerdictFormat(body); msg != "" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"message":` + strconvQuote(msg) + `,"type":"invalid_request_error","param":"response_format","code":null}}`))
			return
		}
		msgs := body["messages"].([]any)
		user, _ := msgs[len(msgs)-1].(map[string]any)["content"].(string)
		answer := `{"verdict":"pass","reason":"a number"}`
		if strings.Contains(user, `Step "first"`) {
			answer = `{"verdict":"fail","reason":"one is not the number we want"}`
		}
		mu.Lock()
		verdicts = append(verdicts, answer)
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-1", "object": "chat.completion", "created": 1767139200, "model": "critic-model",
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "logprobs": nil,
				"message": map[string]any{"role": "assistant", "content": answer, "refusal": nil}}},
			"usage": map[string]any{"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
		})
	}))
	t.Cleanup(provider.Close)

	dir := t.TempDir()
	books := filepath.Join(dir, "books")
	if err := os.MkdirAll(books, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(books, "probe.yaml"), []byte(criticPlaybook), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OPENAI_API_KEY", "sk-critic")
	f := parseDevFlags(t, "--data-dir="+filepath.Join(dir, "data"), "--playbooks="+books,
		"--planner-allow-backend-override", "--openai-base-url="+provider.URL+"/v1", "--openai-model=critic-model",
		"--critic-backend=openai", "--critic-tools=sql.query")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	_, client := startTestDevStack(ctx, t, f, os.Stderr)

	started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Probe the critic"})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: started.GetRun().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	var replans []string
	var judged []*planexv1.CriticVerdict
	for {
		resp, err := stream.Recv()
		if err != nil {
			break
		}
		ev := resp.GetEvent()
		if r := ev.GetReplanRequested(); r != nil {
			replans = append(replans, r.GetReason())
		}
		if v := ev.GetCriticVerdict(); v != nil {
			judged = append(judged, v)
		}
	}
	got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: started.GetRun().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	run := got.GetRun()
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || run.GetResult().GetStringValue() != "second" {
		t.Fatalf("run %s %q, result %v; want SUCCEEDED with the second number", run.GetStatus(), run.GetStopMessage(), run.GetResult())
	}
	if len(replans) != 1 || !strings.Contains(replans[0], "one is not the number we want") {
		t.Fatalf("replans %q, want one carrying the verdict", replans)
	}
	if len(judged) != 2 || judged[0].GetPassed() || judged[0].GetVerifier() != "model:openai" || !judged[1].GetPassed() {
		t.Fatalf("verdicts %v", judged)
	}
	mu.Lock()
	asked := len(verdicts)
	mu.Unlock()
	if asked != 2 {
		t.Fatalf("the provider was asked %d times, want 2 (one per result)", asked)
	}
	if run.GetCriticTokens() != 240 || run.GetUsage().GetTokens() != 0 {
		t.Fatalf("critic tokens %d, planner tokens %d; want 240 and 0", run.GetCriticTokens(), run.GetUsage().GetTokens())
	}
}

// strictVerdictFormat checks response_format like the API's strict mode:
// a valid name, strict true, an object schema whose properties are all
// required and which allows no other property.
func strictVerdictFormat(body map[string]any) string {
	rf, _ := body["response_format"].(map[string]any)
	js, _ := rf["json_schema"].(map[string]any)
	name, _ := js["name"].(string)
	if rf["type"] != "json_schema" || !regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`).MatchString(name) {
		return "Invalid 'response_format.json_schema.name'"
	}
	schema, _ := js["schema"].(map[string]any)
	props, _ := schema["properties"].(map[string]any)
	req, _ := schema["required"].([]any)
	if js["strict"] != true || schema["type"] != "object" || schema["additionalProperties"] != false || len(req) != len(props) {
		return "Invalid schema for response_format '" + name + "': strict mode needs every property required and additionalProperties false"
	}
	return ""
}

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }
