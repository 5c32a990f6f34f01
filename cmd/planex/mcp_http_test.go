package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/planex-dev/planex/internal/authn"
)

// bearer adds an Authorization header to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// TestMCPOverHTTP connects the Go SDK's streamable-HTTP client to the
// supervisor's MCP endpoint (supervisor --mcp-addr) with API keys of
// different roles: a runner starts a run and follows it with progress
// notifications, an approver decides its gate, a viewer reads it and its
// events resource but may not start runs, and a request without
// credentials is refused with 401.
func TestMCPOverHTTP(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "gated.yaml"), []byte(gatedPlaybook), 0o644); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	var keyLines []string
	for name, roles := range map[string][]authn.Role{"rita": {authn.RoleRunner}, "abe": {authn.RoleApprover}, "vic": {authn.RoleViewer}} {
		key, line, err := authn.GenerateAPIKey(name, roles...)
		if err != nil {
			t.Fatal(err)
		}
		keys[name] = key
		keyLines = append(keyLines, line)
	}
	keyFile := filepath.Join(dir, "keys")
	if err := os.WriteFile(keyFile, []byte(strings.Join(keyLines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var log lines
	startProcessStack(t, dir, &log, "--mcp-addr=127.0.0.1:0", "--auth-disabled=false", "--auth-api-keys-file="+keyFile)
	url := logField(t, &log, "mcp listening", "mcp_url")

	// Without credentials: 401 with a Bearer challenge, no detail.
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("unauthenticated: %d, WWW-Authenticate %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if _, err := mcp.NewClient(&mcp.Implementation{Name: "anon", Version: "v1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{"pxk_wrong", http.DefaultTransport}}}, nil); err == nil {
		t.Fatal("a client with an unknown API key connected")
	}

	var mu sync.Mutex
	var progress []*mcp.ProgressNotificationParams
	connect := func(who string) *mcp.ClientSession {
		t.Helper()
		c := mcp.NewClient(&mcp.Implementation{Name: who, Version: "v1"}, &mcp.ClientOptions{
			ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
				mu.Lock()
				progress = append(progress, req.Params)
				mu.Unlock()
			},
		})
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url,
			HTTPClient: &http.Client{Transport: bearer{keys[who], http.DefaultTransport}}}, nil)
		if err != nil {
			t.Fatalf("%s connects: %v", who, err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	rita, abe, vic := connect("rita"), connect("abe"), connect("vic")
	waitForTools(ctx, t, vic) // as the viewer

	// A viewer may not start runs: a tool error without detail.
	if _, msg := callTool(ctx, t, vic, "start_run", map[string]any{"goal": "Carefully count the open tickets of Acme Corp"}, nil); msg != "permission denied" {
		t.Fatalf("start_run as viewer: %q, want permission denied", msg)
	}

	run, msg := callTool(ctx, t, rita, "start_run", map[string]any{"goal": "Carefully count the open tickets of Acme Corp"}, mcp.Meta{"progressToken": "h1"})
	if msg != "" || run["status"] != "RUN_STATUS_WAITING" {
		t.Fatalf("start_run as runner: %v %s, want a run waiting for approval", run["status"], msg)
	}
	gate := run["gates"].([]any)[0].(map[string]any)
	decide := map[string]any{"run_id": run["id"], "gate_id": gate["id"], "decision": "approve"}
	if _, msg := callTool(ctx, t, rita, "decide", decide, nil); msg != "permission denied" {
		t.Fatalf("decide as runner: %q, want permission denied", msg)
	}
	if run, msg = callTool(ctx, t, abe, "decide", decide, nil); msg != "" {
		t.Fatalf("decide as approver: %s", msg)
	}
	run = waitForApprovedRun(ctx, t, vic, run) // the viewer follows it
	mu.Lock()
	checkProgress(t, slices.Clone(progress), "h1")
	mu.Unlock()
	checkEventsResource(ctx, t, vic, run["id"].(string))
}

// logField waits for the JSON log line with msg and returns its key.
func logField(t *testing.T, l *lines, msg, key string) string {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, line := range l.all() {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
				if v, ok := m[key].(string); ok {
					return v
				}
			}
		}
	}
	t.Fatalf("no log line %q with %s", msg, key)
	return ""
}
