package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// planex runs reset and fork against a dev stack: a reset from the
// plan's first step runs it and its dependents again and waits for the
// run (exit 0 when it succeeds); a fork shares what it may; audit verify
// and replay understand both logs; a refusal says what to do.
func TestRunsResetAndForkCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the dev stack; skipped with -short")
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	stack, client := startTestDevStack(ctx, t, parseDevFlags(t, "--data-dir="+filepath.Join(t.TempDir(), "data")), io.Discard)
	addr := stack.Addr
	started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "How many open support tickets does Acme Corp have?"})
	if err != nil {
		t.Fatal(err)
	}
	id := started.GetRun().GetId()
	run := waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return isTerminal(r.GetStatus()) })
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || len(run.GetPlans()) == 0 {
		t.Fatalf("demo run: %s %q", run.GetStatus(), run.GetStopMessage())
	}
	first := run.GetPlans()[len(run.GetPlans())-1].GetSteps()[0].GetId()

	// Nothing failed: a reset without a point has nothing to do, and says
	// what the user can do instead.
	out, err := planexIn(t, "runs", "reset", "--addr", addr, "--reason", "again", id)
	if exitCode(err) == exitOK || !strings.Contains(err.Error(), "nothing to reset") || !strings.Contains(err.Error(), "from_step") {
		t.Fatalf("reset of a succeeded run without a point: %v\n%s", err, out)
	}
	if out, err := planexIn(t, "runs", "reset", "--addr", addr, id); exitCode(err) != exitUsage || !strings.Contains(err.Error(), "--reason is required") {
		t.Fatalf("reset without --reason: %v\n%s", err, out)
	}
	out, err = planexIn(t, "runs", "reset", "--addr", addr, "--from-step", first, "--dry-run", id)
	if err != nil || !strings.Contains(out, "would reset") || !strings.Contains(out, first) {
		t.Fatalf("reset --dry-run: %v\n%s", err, out)
	}
	out, err = planexIn(t, "runs", "reset", "--addr", addr, "--from-step", first, "--reason", "recompute after a data fix", "--wait", id)
	if err != nil || !strings.Contains(out, "runs again "+first) {
		t.Fatalf("reset --wait: %v\n%s", err, out)
	}
	after, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
	if err != nil || after.GetRun().GetResets() != 1 || after.GetRun().GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("after the reset: %v %v", after.GetRun(), err)
	}
	out, err = planexIn(t, "runs", "fork", "--addr", addr, "--from-step", first, "--reason", "try it in a new run", "--label", "experiment=1", "--wait", id)
	if err != nil || !strings.Contains(out, "forked from "+id) {
		t.Fatalf("fork --wait: %v\n%s", err, out)
	}
	fork := strings.Fields(out)[1]
	for _, rid := range []string{id, fork} {
		if out, err := planexIn(t, "audit", "verify", "--addr", addr, rid); err != nil || !strings.Contains(out, "events verified") {
			t.Fatalf("audit verify %s: %v\n%s", rid, err, out)
		}
		if out, err := planexIn(t, "replay", "--addr", addr, "--auto-approve", "email.send", rid); err != nil || !strings.Contains(out, "replayed") {
			t.Fatalf("replay %s: %v\n%s", rid, err, out)
		}
	}
}
