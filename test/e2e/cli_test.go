package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/freeport"
)

// cli runs the planex binary and returns stdout, stderr and the exit code.
func cli(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, planex(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	case err != nil:
		t.Fatalf("planex %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), 0
}

// TestClientCommands drives the client commands against `planex dev`.
func TestClientCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	dataDir := t.TempDir()
	books := t.TempDir()
	if err := os.WriteFile(filepath.Join(books, "close.yaml"), []byte(closeTicketPlaybook), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeport.Addr(t)
	startProc(t, "planex dev", planex(t), nil, "dev", "--data-dir", dataDir, "--grpc-addr", addr, "--playbooks", books)
	waitServing(t, dataDir, addr)

	// sql.exec requires approval: the run waits (exit 4) until a human
	// approves; a rejected one goes back to the planner, which has no
	// other plan here: it fails (exit 3).
	out, _, code := cli(t, "run", "--addr", addr, "--json", "Close support ticket 410")
	var waiting planexv1.Run
	if code != 4 || protojson.Unmarshal([]byte(out), &waiting) != nil || waiting.GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING {
		t.Fatalf("gated run: exit %d (want 4)\n%s", code, out)
	}
	if _, errOut, code := cli(t, "runs", "approve", waiting.GetId(), "--addr", addr, "--actor", "alice"); code != 0 {
		t.Fatalf("runs approve: exit %d: %s", code, errOut)
	}
	if _, errOut, code := cli(t, "runs", "watch", waiting.GetId(), "--addr", addr); code != 0 {
		t.Fatalf("runs watch after approval: exit %d: %s", code, errOut)
	}
	out, _, code = cli(t, "run", "--addr", addr, "--json", "Close support ticket 412")
	if code != 4 || protojson.Unmarshal([]byte(out), &waiting) != nil {
		t.Fatalf("second gated run: exit %d\n%s", code, out)
	}
	if _, errOut, code := cli(t, "runs", "reject", waiting.GetId(), "--addr", addr, "--actor", "carol", "--comment", "not today"); code != 0 {
		t.Fatalf("runs reject: exit %d: %s", code, errOut)
	}
	// The rejection goes back to the planner; this playbook has no branch
	// for it, so the run stops REJECTED naming the rejection.
	if _, _, code := cli(t, "runs", "watch", waiting.GetId(), "--addr", addr); code != 3 {
		t.Fatalf("runs watch of a rejected run: exit %d, want 3", code)
	}
	out, _, _ = cli(t, "runs", "get", waiting.GetId(), "--addr", addr, "--json")
	var rejected planexv1.Run
	if protojson.Unmarshal([]byte(out), &rejected) != nil || rejected.GetStopReason() != planexv1.StopReason_STOP_REASON_REJECTED ||
		!strings.Contains(rejected.GetStopMessage(), `rejected by carol: not today; playbook close-ticket has no on_failure branch for a rejection of step "close"`) {
		t.Fatalf("rejected run without a branch for it: %s %q", rejected.GetStopReason(), rejected.GetStopMessage())
	}
	db := filepath.Join(dataDir, "demo.db")
	if queryInt(t, db, "SELECT count(*) FROM support_tickets WHERE id = 410 AND status = 'closed'") != 1 ||
		queryInt(t, db, "SELECT count(*) FROM support_tickets WHERE id = 412 AND status = 'open'") != 1 {
		t.Fatal("want ticket 410 closed (approved) and ticket 412 still open (rejected)")
	}

	var errOut string
	out, errOut, code = cli(t, "run", "--addr", addr, "--json", "--label", "team=e2e", "Find the runbook for failed payment retries and send it to finance@example.com")
	if code != 0 {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
	var run planexv1.Run
	if err := protojson.Unmarshal([]byte(out), &run); err != nil {
		t.Fatalf("run --json stdout is not one Run: %v\n%s", err, out)
	}
	if run.GetLabels()["team"] != "e2e" {
		t.Fatalf("label not set: %v", run.GetLabels())
	}

	out, _, code = cli(t, "runs", "get", run.GetId(), "--addr", addr, "--json")
	var got planexv1.Run
	if code != 0 || protojson.Unmarshal([]byte(out), &got) != nil || got.GetId() != run.GetId() {
		t.Fatalf("runs get: exit %d\n%s", code, out)
	}

	out, _, code = cli(t, "runs", "list", "--addr", addr, "--json", "--status", "succeeded", "--label", "team=e2e")
	var list planexv1.ListRunsResponse
	if code != 0 || protojson.Unmarshal([]byte(out), &list) != nil || len(list.GetRuns()) != 1 || list.GetRuns()[0].GetId() != run.GetId() {
		t.Fatalf("runs list: exit %d\n%s", code, out)
	}

	out, _, code = cli(t, "runs", "watch", run.GetId(), "--addr", addr, "--json", "--from", "2")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var first, last planexv1.RunEvent
	if code != 0 || protojson.Unmarshal([]byte(lines[0]), &first) != nil || protojson.Unmarshal([]byte(lines[len(lines)-1]), &last) != nil {
		t.Fatalf("runs watch: exit %d\n%s", code, out)
	}
	if first.GetSequence() != 2 || last.GetFinished() == nil {
		t.Fatalf("runs watch --from 2: first seq %d, last %v", first.GetSequence(), last.GetPayload())
	}

	out, _, code = cli(t, "tools", "--addr", addr, "--json")
	var tools planexv1.ListToolsResponse
	if code != 0 || protojson.Unmarshal([]byte(out), &tools) != nil || len(tools.GetTools()) < 7 {
		t.Fatalf("tools: exit %d\n%s", code, out)
	}

	out, _, code = cli(t, "outbox", "--dir", filepath.Join(dataDir, "outbox"), "--json")
	var mails []struct{ To []string }
	if code != 0 || json.Unmarshal([]byte(out), &mails) != nil || len(mails) != 1 || mails[0].To[0] != "finance@example.com" {
		t.Fatalf("outbox: exit %d\n%s", code, out)
	}

	_, errOut, code = cli(t, "runs", "get", "01NOPE", "--addr", addr)
	if code != 1 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "01NOPE") {
		t.Fatalf("unknown run: exit %d, stderr %q; want exit 1 and one line naming the id", code, errOut)
	}
	_, errOut, code = cli(t, "runs", "list", "--addr", freeport.Addr(t))
	if code != 1 || !strings.Contains(errOut, "cannot reach the supervisor") {
		t.Fatalf("unreachable supervisor: exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = cli(t, "run")
	if code != 1 || !strings.Contains(errOut, "goal") {
		t.Fatalf("run without a goal: exit %d, stderr %q", code, errOut)
	}
}

// closeTicketPlaybook closes a ticket with sql.exec, a write tool that
// waits for approval.
const closeTicketPlaybook = `name: close-ticket
description: Close a support ticket
examples:
  - Close support ticket 3
match:
  - '(?i)^close (?:support )?ticket (?P<id>\d+)$'
params:
  id:
    type: int
    required: true
steps:
  - id: close
    tool: sql.exec
    args:
      sql: "UPDATE support_tickets SET status = 'closed', closed_at = '2025-12-31 12:00:00' WHERE id = ?"
      params: ["${{ params.id }}"]
answer: "'closed'"
`
