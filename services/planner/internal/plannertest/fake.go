package plannertest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Usage the fake replies report.
const (
	FakeInputTokens  = 100
	FakeOutputTokens = 20
)

// Request is one request the fake received.
type Request struct {
	// Path of the request, e.g. /v1/chat/completions.
	Path string
	// Header of the request.
	Header http.Header
	// Body decoded from JSON.
	Body map[string]any
	// At is when the request arrived.
	At time.Time
}

// Reply writes one response.
type Reply func(w http.ResponseWriter, r *http.Request)

// Fake is a local HTTP server standing in for a model provider. It checks
// each request as the provider's API does (headers, required fields, value
// ranges such as temperature, OpenAI's strict schema rules) and answers an
// invalid one with the provider's 400 or 401; valid requests get a script
// of replies, in order; the last one repeats.
type Fake struct {
	// URL of the server.
	URL string

	mu       sync.Mutex
	requests []Request
	script   []Reply
}

// NewFake starts a fake provider that is closed when the test ends.
func NewFake(t testing.TB, script ...Reply) *Fake {
	t.Helper()
	f := &Fake{script: script}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	f.URL = srv.URL
	return f
}

// Script replaces the script and forgets the requests received so far.
func (f *Fake) Script(replies ...Reply) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.script = replies
	f.requests = nil
}

// Requests returns what the fake received so far.
func (f *Fake) Requests() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Request(nil), f.requests...)
}

func (f *Fake) serve(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var body map[string]any
	if err := json.Unmarshal(data, &body); err != nil {
		http.Error(w, "body is not JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	n := len(f.requests)
	f.requests = append(f.requests, Request{Path: r.URL.Path, Header: r.Header.Clone(), Body: body, At: time.Now()})
	if code, msg := checkRequest(r.URL.Path, r.Header, body); code != 0 {
		f.mu.Unlock()
		if strings.HasSuffix(r.URL.Path, "/messages") {
			kind := "invalid_request_error"
			if code == http.StatusUnauthorized {
				kind = "authentication_error"
			}
			AnthropicError(code, nil, kind, msg)(w, r)
			return
		}
		writeJSON(w, code, map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "param": nil, "code": nil}})
		return
	}
	var reply Reply
	switch {
	case len(f.script) == 0:
		reply = Status(http.StatusInternalServerError, nil, `{"error":{"message":"no script"}}`)
	case n < len(f.script):
		reply = f.script[n]
	default:
		reply = f.script[len(f.script)-1]
	}
	f.mu.Unlock()
	reply(w, r)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Status answers with a status, headers and a raw JSON body.
func Status(code int, headers map[string]string, body string) Reply {
	return func(w http.ResponseWriter, _ *http.Request) {
		for k, v := range headers {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}
}

// Hang answers nothing until the client gives up.
func Hang() Reply {
	return func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(30 * time.Second):
		}
	}
}

// OpenAIAnswer is a Chat Completions response whose message content is
// content, as the API documents it.
func OpenAIAnswer(content string) Reply {
	return openAIMessage(map[string]any{"role": "assistant", "content": content, "refusal": nil}, "stop")
}

// OpenAITruncated is a Chat Completions response cut off at the output
// cap: finish_reason "length", the content as far as the model got.
func OpenAITruncated(content string) Reply {
	return openAIMessage(map[string]any{"role": "assistant", "content": content, "refusal": nil}, "length")
}

// OpenAIRefusal is a Chat Completions response carrying a refusal.
func OpenAIRefusal(text string) Reply {
	return openAIMessage(map[string]any{"role": "assistant", "content": nil, "refusal": text}, "stop")
}

func openAIMessage(msg map[string]any, finish string) Reply {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{
			"id":      "chatcmpl-test",
			"object":  "chat.completion",
			"created": 1767139200,
			"model":   "gpt-test-2025",
			"choices": []any{map[string]any{"index": 0, "message": msg, "logprobs": nil, "finish_reason": finish}},
			"usage": map[string]any{
				"prompt_tokens": FakeInputTokens, "completion_tokens": FakeOutputTokens, "total_tokens": FakeInputTokens + FakeOutputTokens,
			},
		})
	}
}

// OpenAIError is an error response in the API's shape.
func OpenAIError(code int, headers map[string]string, message string) Reply {
	return Status(code, headers, fmt.Sprintf(`{"error":{"message":%q,"type":"server_error","param":null,"code":null}}`, message))
}

// AnthropicAnswer is a Messages response whose content is a submit_plan
// tool call with the given JSON input.
func AnthropicAnswer(id, input string) Reply { return AnthropicToolAnswer(id, "submit_plan", input) }

// AnthropicToolAnswer is a Messages response whose content is a call of
// the named tool with the given JSON input.
func AnthropicToolAnswer(id, tool, input string) Reply {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, anthropicMessage([]any{
			map[string]any{"type": "tool_use", "id": id, "name": tool, "input": json.RawMessage(input)},
		}, "tool_use"))
	}
}

// AnthropicTruncated is a Messages response cut off at max_tokens while
// the model was writing the named tool's input: stop_reason "max_tokens",
// and the tool_use block holds what the API could parse of the input so
// far (an object missing the fields not written yet).
func AnthropicTruncated(id, tool, partialInput string) Reply {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, anthropicMessage([]any{
			map[string]any{"type": "tool_use", "id": id, "name": tool, "input": json.RawMessage(partialInput)},
		}, "max_tokens"))
	}
}

// AnthropicRefusal is a Messages response with stop_reason "refusal".
func AnthropicRefusal(text string) Reply {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, anthropicMessage([]any{map[string]any{"type": "text", "text": text}}, "refusal"))
	}
}

func anthropicMessage(content []any, stop string) map[string]any {
	return map[string]any{
		"id": "msg_test", "type": "message", "role": "assistant", "model": "claude-test-2025",
		"content": content, "stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]any{
			"input_tokens": FakeInputTokens, "output_tokens": FakeOutputTokens,
			"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
		},
	}
}

// AnthropicError is an error response in the API's shape.
func AnthropicError(code int, headers map[string]string, kind, message string) Reply {
	return Status(code, headers, fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%q}}`, kind, message))
}
