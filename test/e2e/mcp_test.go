package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
)

// mcpPlaybook plans with tools of the npm reference MCP servers: echo a
// word (read-only) and write it to a file (destructive: approval gate).
const mcpPlaybook = `
name: mcp-echo-save
description: Echo a word through the everything server and save it with the filesystem server
examples:
  - Echo hello and save it as note.txt
match:
  - '(?i)^echo (?P<word>[a-z]+) and save it as (?P<file>[a-z]+\.txt)$'
params:
  word: {required: true}
  file: {required: true}
steps:
  - id: echo
    tool: mcp.everything_echo
    args: {message: "${{ params.word }}"}
  - id: save
    tool: mcp.filesystem_write_file
    depends_on: [echo]
    args: {path: "ROOT/${{ params.file }}", content: "${{ steps.echo.output.text }}"}
answer: "steps.echo.output.text"
---
name: mcp-read
description: Read a file through the filesystem server
examples:
  - Read the file /etc/hostname
match:
  - '(?i)^read the file (?P<path>\S+)$'
params:
  path: {required: true}
steps:
  - id: read
    tool: mcp.filesystem_read_text_file
    args: {path: "${{ params.path }}"}
answer: "steps.read.output.text"
---
name: mcp-long
description: A long read-only operation of the everything server
examples:
  - Run a long operation of 4 seconds
match:
  - '(?i)^run a long operation of (?P<secs>\d+) seconds$'
params:
  secs: {type: int, required: true}
steps:
  - id: long
    tool: mcp.everything_trigger_long_running_operation
    args: {duration: "${{ params.secs }}", steps: 2}
answer: "steps.long.output.text"
`

// TestMCPPoolEndToEnd runs plans whose tools come from the npm reference
// MCP servers, served by `planex executor --pool mcp` as a process.
func TestMCPPoolEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	dir := os.Getenv("PLANEX_TEST_MCP_SERVERS")
	if dir == "" {
		t.Skip("PLANEX_TEST_MCP_SERVERS is unset (see .ci/run: npm install --prefix DIR @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("node is not installed: %v", err)
	}
	mods := filepath.Join(dir, "node_modules", "@modelcontextprotocol")
	work := t.TempDir()
	root := filepath.Join(work, "files")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	root, _ = filepath.EvalSymlinks(root)
	cfg, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{
		"everything": map[string]any{"command": node, "args": []string{filepath.Join(mods, "server-everything", "dist", "index.js"), "stdio"}},
		"filesystem": map[string]any{"command": node, "args": []string{filepath.Join(mods, "server-filesystem", "dist", "index.js"), root}},
	}})
	cfgPath := filepath.Join(work, "mcp.json")
	books := filepath.Join(work, "playbooks")
	if err := os.Mkdir(books, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(books, "mcp.yaml"), []byte(strings.ReplaceAll(mcpPlaybook, "ROOT", root)), 0o644); err != nil {
		t.Fatal(err)
	}

	ns := natstest.Start(t)
	bin := planex(t)
	base := []string{"--grpc-addr=127.0.0.1:0", "--nats-url=" + ns.URL(), "--plaintext", "--auth-disabled", "--log-format=json", "--log-level=info"}
	ex := startProc(t, "executor-mcp", bin, nil, append([]string{"executor", "--pool=mcp", "--mcp-config=" + cfgPath, "--allow-unsigned-steps"}, base...)...)
	exAddr := ex.waitLog(t, "serving", 90*time.Second)["grpc_addr"].(string)
	pl := startProc(t, "planner", bin, nil, append([]string{"planner", "--playbooks=" + books}, base...)...)
	plannerAddr := pl.waitLog(t, "serving", 60*time.Second)["grpc_addr"].(string)
	sup := startProc(t, "supervisor", bin, nil, append([]string{"supervisor", "--planner-addr=" + plannerAddr}, base...)...)
	addr := sup.waitLog(t, "serving", 60*time.Second)["grpc_addr"].(string)

	// Each MCP server's session is reported by the executor's health service.
	hconn, err := grpc.NewClient(exAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hconn.Close()
	for _, name := range []string{"planex.mcp.everything", "planex.mcp.filesystem"} {
		hr, err := healthpb.NewHealthClient(hconn).Check(ctxT(t, 10*time.Second), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %s: %v %v", name, hr.GetStatus(), err)
		}
	}

	// The tools are in the catalog with their schemas.
	out, _, code := cli(t, "tools", "--plaintext", "--addr", addr, "--json")
	var tools planexv1.ListToolsResponse
	if code != 0 || protojson.Unmarshal([]byte(out), &tools) != nil {
		t.Fatalf("planex tools: exit %d\n%s", code, out)
	}
	var echo, write *planexv1.ToolSpec
	for _, rt := range tools.GetTools() {
		ts := rt.GetSpec()
		switch ts.GetName() {
		case "mcp.everything_echo":
			echo = ts
		case "mcp.filesystem_write_file":
			write = ts
		}
	}
	if echo.GetArgsSchema().GetFields()["properties"].GetStructValue().GetFields()["message"] == nil || !write.GetRequiresApproval() {
		t.Fatalf("catalog: echo %v, write_file %v", echo, write)
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := planexv1.NewSupervisorServiceClient(conn)
	ctx := ctxT(t, 2*time.Minute)

	// A plan calling both servers; the destructive write waits for approval.
	started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Echo hello and save it as note.txt"})
	if err != nil {
		t.Fatal(err)
	}
	id := started.GetRun().GetId()
	run := waitRun(t, client, id, func(r *planexv1.Run) bool { return r.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING })
	var gate *planexv1.Gate
	for _, g := range run.GetGates() {
		if g.GetStepId() == "save" && g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
			gate = g
		}
	}
	if gate == nil {
		t.Fatalf("no open gate on step save: %v", run.GetGates())
	}
	if _, err := os.Stat(filepath.Join(root, "note.txt")); !os.IsNotExist(err) {
		t.Fatalf("note.txt exists before approval: %v", err)
	}
	if _, err := client.Decide(ctx, &planexv1.DecideRequest{RunId: id, GateId: gate.GetId(), Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, Actor: "e2e"}); err != nil {
		t.Fatal(err)
	}
	run = waitRun(t, client, id, terminal)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run %v: %v %s", run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
	if b, err := os.ReadFile(filepath.Join(root, "note.txt")); err != nil || !strings.Contains(string(b), "hello") {
		t.Fatalf("note.txt: %q %v", b, err)
	}

	// isError fails the step with the server's message.
	started, err = client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Read the file /etc/hostname"})
	if err != nil {
		t.Fatal(err)
	}
	run = waitRun(t, client, started.GetRun().GetId(), terminal)
	var read *planexv1.StepState
	for _, s := range run.GetSteps() {
		if s.GetStepId() == "read" {
			read = s
		}
	}
	if run.GetStatus() == planexv1.RunStatus_RUN_STATUS_SUCCEEDED || read.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED ||
		!strings.Contains(strings.ToLower(read.GetError().GetMessage()), "access denied") {
		t.Fatalf("run %v, step read %v", run.GetStatus(), read)
	}

	// Killing the server mid-call: the read-only tool is retried on the
	// restarted server and the run succeeds.
	started, err = client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Run a long operation of 4 seconds"})
	if err != nil {
		t.Fatal(err)
	}
	id = started.GetRun().GetId()
	waitRun(t, client, id, func(r *planexv1.Run) bool {
		return len(r.GetSteps()) == 1 && r.GetSteps()[0].GetStatus() == planexv1.StepStatus_STEP_STATUS_RUNNING
	})
	pid := childWith(t, ex.cmd.Process.Pid, "server-everything")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	run = waitRun(t, client, id, terminal)
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || !strings.Contains(run.GetResult().GetStringValue(), "completed") {
		t.Fatalf("run after the kill: %v %v %s (result %v)", run.GetStatus(), run.GetStopReason(), run.GetStopMessage(), run.GetResult())
	}
	if !strings.Contains(ex.Logs(), "went away during trigger-long-running-operation") {
		t.Error("the executor did not log the broken call: the kill did not land mid-call")
	}
}

// childWith returns the pid of the child process of parent whose command
// line contains s.
func childWith(t *testing.T, parent int, s string) int {
	t.Helper()
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", parent))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, field := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(field)
			if err != nil {
				continue
			}
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if strings.Contains(string(cmdline), s) {
				return pid
			}
		}
	}
	t.Fatalf("no child process of %d runs %s", parent, s)
	return 0
}

func terminal(r *planexv1.Run) bool {
	switch r.GetStatus() {
	case planexv1.RunStatus_RUN_STATUS_SUCCEEDED, planexv1.RunStatus_RUN_STATUS_FAILED,
		planexv1.RunStatus_RUN_STATUS_ESCALATED, planexv1.RunStatus_RUN_STATUS_CANCELLED:
		return true
	}
	return false
}

// waitRun polls the run until cond holds.
func waitRun(t *testing.T, client planexv1.SupervisorServiceClient, id string, cond func(*planexv1.Run) bool) *planexv1.Run {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	for {
		got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
		if err != nil {
			t.Fatalf("GetRun %s: %v", id, err)
		}
		if cond(got.GetRun()) {
			return got.GetRun()
		}
		if terminal(got.GetRun()) {
			t.Fatalf("run ended %v (%v %s) before the awaited state", got.GetRun().GetStatus(), got.GetRun().GetStopReason(), got.GetRun().GetStopMessage())
		}
		select {
		case <-ctx.Done():
			t.Fatalf("run %s: still %v", id, got.GetRun().GetStatus())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
