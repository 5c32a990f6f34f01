package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/mcpserver"
)

// gatedPlaybook counts a customer's open tickets behind an approval gate.
const gatedPlaybook = `
name: gated-tickets
description: Count the open tickets of a customer after a human approved the query
examples:
  - Carefully count the open tickets of Acme Corp
match:
  - '(?i)^carefully count the open tickets of (?P<customer>.+)$'
params:
  customer: {required: true}
steps:
  - id: count
    tool: sql.query
    requires_approval: true
    args:
      sql: >-
        SELECT count(t.id) FROM customers c JOIN support_tickets t ON t.customer_id = c.id
        WHERE t.status = 'open' AND lower(c.name) = lower(?)
      params: ["${{ params.customer }}"]
answer: "string(int(steps.count.output.rows[0][0])) + ' open tickets'"
`

// TestMCPServerDrivesRuns connects the Go SDK's MCP client to `planex mcp`
// (the real binary on stdio) in front of a supervisor, planner and sql
// executor run as processes.
func TestMCPServerDrivesRuns(t *testing.T) {
	books := t.TempDir()
	if err := os.WriteFile(filepath.Join(books, "gated.yaml"), []byte(gatedPlaybook), 0o644); err != nil {
		t.Fatal(err)
	}
	supAddr := startProcessStack(t, books, nil)

	var mu sync.Mutex
	var progress []*mcp.ProgressNotificationParams
	client := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "v1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress = append(progress, req.Params)
			mu.Unlock()
		},
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: exec.Command(planexBin, "mcp", "--plaintext", "--addr", supAddr)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	call := func(name string, args map[string]any, meta mcp.Meta) map[string]any {
		t.Helper()
		got, msg := callTool(ctx, t, cs, name, args, meta)
		if msg != "" {
			t.Fatalf("%s: %v", name, msg)
		}
		return got
	}
	waitForTools(ctx, t, cs)

	run := call("start_run", map[string]any{"goal": "Carefully count the open tickets of Acme Corp"}, mcp.Meta{"progressToken": "p1"})
	if run["status"] != "RUN_STATUS_WAITING" {
		t.Fatalf("start_run returned %v, want a run waiting for approval", run["status"])
	}
	gates, _ := run["gates"].([]any)
	if len(gates) != 1 {
		t.Fatalf("gates %v", run["gates"])
	}
	gate := gates[0].(map[string]any)
	run = waitForApprovedRun(ctx, t, cs, call("decide", map[string]any{"run_id": run["id"], "gate_id": gate["id"], "decision": "approve"}, nil))
	mu.Lock()
	checkProgress(t, slices.Clone(progress), "p1")
	mu.Unlock()
	checkEventsResource(ctx, t, cs, run["id"].(string))

	listed := call("list_runs", map[string]any{"status": "succeeded"}, nil)
	if runs, _ := listed["runs"].([]any); len(runs) != 1 {
		t.Errorf("list_runs: %v", listed)
	}

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "decide", Arguments: map[string]any{"run_id": run["id"], "gate_id": "x", "decision": "maybe"}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, `decision "maybe"`) {
		t.Errorf("bad decision: %v %+v", err, res)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "decide", Arguments: map[string]any{"run_id": run["id"], "gate_id": "x", "decision": "approve", "stop": true}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "stop: only with decision reject") {
		t.Errorf("approve with stop: %v %+v", err, res)
	}

	// A rejection goes back to the planner (this playbook has no branch
	// for it: the run stops REJECTED naming it); stop ends the run at once.
	for _, stop := range []bool{false, true} {
		run = call("start_run", map[string]any{"goal": "Carefully count the open tickets of Acme Corp"}, nil)
		gate := run["gates"].([]any)[0].(map[string]any)
		run = call("decide", map[string]any{"run_id": run["id"], "gate_id": gate["id"], "decision": "reject", "comment": "too broad", "stop": stop}, nil)
		for deadline := time.Now().Add(30 * time.Second); run["stop_reason"] == nil; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("rejected run (stop %v) did not stop: %v", stop, run["status"])
			}
			run = call("get_run", map[string]any{"run_id": run["id"]}, nil)
		}
		want := "no on_failure branch for a rejection"
		if stop {
			want = "the run was stopped at the decider's request"
		}
		if msg, _ := run["stop_message"].(string); run["stop_reason"] != "STOP_REASON_REJECTED" || !strings.Contains(msg, "too broad") || !strings.Contains(msg, want) {
			t.Errorf("rejected run (stop %v): %v %q, want REJECTED with %q", stop, run["stop_reason"], msg, want)
		}
	}
}

// checkProgress checks the progress notifications of one followed run:
// at least two, all with the token, increasing, each with a message.
func checkProgress(t *testing.T, got []*mcp.ProgressNotificationParams, token string) {
	t.Helper()
	if len(got) < 2 {
		t.Fatalf("got %d progress notifications, want one per event", len(got))
	}
	for i, p := range got {
		if p.ProgressToken != token || (i > 0 && p.Progress <= got[i-1].Progress) || p.Message == "" {
			t.Fatalf("progress %d: %+v (token %s, increasing, with a message)", i, p, token)
		}
	}
}

// checkEventsResource reads a finished run's events resource: the whole
// log, from created to finished.
func checkEventsResource(ctx context.Context, t *testing.T, cs *mcp.ClientSession, runID string) {
	t.Helper()
	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.RunEventsPrefix + runID + "/events"})
	if err != nil {
		t.Fatal(err)
	}
	var events []map[string]any
	if err := json.Unmarshal([]byte(rr.Contents[0].Text), &events); err != nil || len(events) < 4 ||
		events[0]["created"] == nil || events[len(events)-1]["finished"] == nil {
		t.Fatalf("events resource: %v %s", err, rr.Contents[0].Text)
	}
}

// callTool calls the MCP tool name: it returns the structured result, or
// the text of a tool error.
func callTool(ctx context.Context, t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, meta mcp.Meta) (map[string]any, string) {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args, Meta: meta})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		return nil, res.Content[0].(*mcp.TextContent).Text
	}
	return res.StructuredContent.(map[string]any), ""
}

// waitForTools checks that cs offers planex's MCP tools and waits until
// list_tools shows the sql tools (the executor registered).
func waitForTools(ctx context.Context, t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	if want := []string{"answer_input", "batch_runs", "cancel_run", "create_schedule", "decide", "fork_run", "get_run", "list_runs", "list_schedules", "list_tools", "pause_schedule", "reset_run", "start_run"}; !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		got, msg := callTool(ctx, t, cs, "list_tools", map[string]any{}, nil)
		if msg != "" {
			t.Fatalf("list_tools: %s", msg)
		}
		if tools, _ := got["tools"].([]any); len(tools) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no tools registered")
		}
	}
}

// waitForApprovedRun follows run (the gated playbook's, just approved)
// through cs's get_run until it succeeds, checks its result and returns
// it.
func waitForApprovedRun(ctx context.Context, t *testing.T, cs *mcp.ClientSession, run map[string]any) map[string]any {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); run["status"] != "RUN_STATUS_SUCCEEDED"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) || strings.Contains(run["status"].(string), "FAILED") {
			t.Fatalf("run after approval: %v %v", run["status"], run["stop_message"])
		}
		var msg string
		if run, msg = callTool(ctx, t, cs, "get_run", map[string]any{"run_id": run["id"]}, nil); msg != "" {
			t.Fatalf("get_run: %s", msg)
		}
	}
	if res, _ := run["result"].(string); !strings.HasSuffix(res, "open tickets") {
		t.Errorf("result %v", run["result"])
	}
	return run
}

const addPlaybook = `
name: mcp-add
description: Add two numbers with the calc MCP server
examples:
  - Add 2 and 3
match:
  - '(?i)^add (?P<a>\d+) and (?P<b>\d+)$'
params:
  a: {type: int, required: true}
  b: {type: int, required: true}
steps:
  - id: add
    tool: mcp.calc_add
    args: {a: "${{ params.a }}", b: "${{ params.b }}"}
answer: "string(int(steps.add.output.sum))"
---
name: mcp-mul
description: Multiply two numbers with the calc MCP server's tool added at runtime
examples:
  - Multiply 4 and 5
match:
  - '(?i)^multiply (?P<a>\d+) and (?P<b>\d+)$'
params:
  a: {type: int, required: true}
  b: {type: int, required: true}
steps:
  - id: mul
    tool: mcp.calc_mul
    args: {a: "${{ params.a }}", b: "${{ params.b }}"}
answer: "string(int(steps.mul.output.sum))"
`

// TestDevServesMCPServers runs the dev stack with --mcp-config pointing at
// a Go SDK server over streamable HTTP and a playbook using its tool; a
// tool the server adds at runtime appears in `planex tools` and runs in a
// plan without a restart, and the stack's own MCP endpoint (TLS, API key)
// lists it.
func TestDevServesMCPServers(t *testing.T) {
	type addIn struct {
		A float64 `json:"a"`
		B float64 `json:"b"`
	}
	type addOut struct {
		Sum float64 `json:"sum"`
	}
	ms := mcp.NewServer(&mcp.Implementation{Name: "calc", Version: "v1"}, nil)
	mcp.AddTool(ms, &mcp.Tool{Name: "add", Description: "Adds two numbers.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, addOut, error) {
			return nil, addOut{Sum: in.A + in.B}, nil
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ms }, nil))
	t.Cleanup(hs.Close)

	dir := t.TempDir()
	cfg, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"calc": map[string]any{"url": hs.URL}}})
	cfgPath := filepath.Join(dir, "mcp.json")
	books := filepath.Join(dir, "playbooks")
	if err := os.Mkdir(books, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(books, "add.yaml"), []byte(addPlaybook), 0o644); err != nil {
		t.Fatal(err)
	}
	f := parseDevFlags(t, "--data-dir="+filepath.Join(dir, "data"), "--mcp-config="+cfgPath, "--playbooks="+books)
	f.services.MCPAddr = devMCPAddr(defaultDevMCPAddr, false, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	stack, client := startTestDevStack(ctx, t, f, os.Stderr)

	// runGoal runs goal to its end; it reports whether the planner refused
	// the plan for an unknown tool (tolerated when retry is set).
	runGoal := func(goal, want string, retry bool) (unknownTool bool) {
		t.Helper()
		started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: goal})
		if err != nil {
			t.Fatal(err)
		}
		for {
			got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: started.GetRun().GetId()})
			if err != nil {
				t.Fatal(err)
			}
			if r := got.GetRun(); mcpserver.RunEnded(r.GetStatus()) {
				if retry && r.GetStopReason() == planexv1.StopReason_STOP_REASON_PLANNER_ERROR && strings.Contains(r.GetStopMessage(), "unknown tool") {
					return true
				}
				if r.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || r.GetResult().GetStringValue() != want {
					t.Fatalf("%s: run %v %v %s: result %v", goal, r.GetStatus(), r.GetStopReason(), r.GetStopMessage(), r.GetResult())
				}
				return false
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: run did not end", goal)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	runGoal("Add 2 and 3", "5", false)

	// The server adds a tool: the running pool registers it.
	mcp.AddTool(ms, &mcp.Tool{Name: "mul", Description: "Multiplies two numbers.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, addOut, error) {
			return nil, addOut{Sum: in.A * in.B}, nil
		})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, err := exec.CommandContext(ctx, planexBin, "tools", "--addr", stack.Addr, "--json").Output()
		if err != nil {
			t.Fatalf("planex tools: %v", err)
		}
		if strings.Contains(string(out), `"mcp.calc_mul"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tool added at runtime is not in planex tools:\n%s", out)
		}
	}
	// The supervisor plans against a catalog cached for a second, so the
	// first plan may still be refused as naming an unknown tool.
	for deadline := time.Now().Add(10 * time.Second); runGoal("Multiply 4 and 5", "20", true); {
		if time.Now().After(deadline) {
			t.Fatal("plans naming the tool added at runtime are still refused")
		}
	}

	// The dev stack's MCP endpoint: TLS with the stack's CA, the CLI's key.
	if stack.MCPURL == "" || !strings.HasPrefix(stack.MCPURL, "https://") {
		t.Fatalf("dev MCP URL %q, want https://", stack.MCPURL)
	}
	ca, err := os.ReadFile(stack.Credentials.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	token, err := os.ReadFile(stack.Credentials.CLITokenFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "dev-client", Version: "v1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: stack.MCPURL, HTTPClient: &http.Client{Transport: bearer{strings.TrimSpace(string(token)), tr}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "list_tools", Arguments: map[string]any{"pool": "mcp"}})
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "mcp.calc_mul") {
		t.Fatalf("list_tools over the dev MCP endpoint: %v %+v", err, res)
	}
}
