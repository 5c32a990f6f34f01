package main

import (
	"slices"
	"strings"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/emailpool"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// planex runs reset and fork against a dev stack: a reset from the
// plan's first step runs it and its dependents again and waits for the
// run (exit 0 when it succeeds); a fork shares what it may; audit verify
// and replay understand both logs; a refusal says what to do.
func TestRunsResetAndForkCLI(t *testing.T) {
	ctx, stack, client := startDefaultDevStack(t)
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

// TestRunsResetNeverResendsMail: a run that mailed a runbook is reset
// from its first step with `planex runs reset --wait`: the steps run
// again, and the outbox the email pool delivers to still holds the one
// mail (a side effect that succeeded is never repeated); the reset run
// verifies and replays.
func TestRunsResetNeverResendsMail(t *testing.T) {
	ctx, stack, client := startDefaultDevStack(t)
	addr := stack.Addr
	mails := func() []string {
		t.Helper()
		msgs, err := emailpool.ListOutbox(stack.OutboxDir)
		if err != nil {
			t.Fatal(err)
		}
		var subjects []string
		for _, m := range msgs {
			subjects = append(subjects, m.Subject)
		}
		return subjects
	}
	started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Find the runbook for failed payment retries and send it to oncall@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	id := started.GetRun().GetId()
	approveUntilDone := func() *planexv1.Run {
		t.Helper()
		for {
			run := waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool {
				return isTerminal(r.GetStatus()) || r.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING
			})
			if isTerminal(run.GetStatus()) {
				return run
			}
			for _, g := range run.GetGates() {
				if runlog.GateOpen(run, g) {
					if _, err := client.Decide(ctx, &planexv1.DecideRequest{RunId: id, GateId: g.GetId(), Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, Actor: "reset-test"}); err != nil {
						t.Fatalf("approve %s: %v", g.GetId(), err)
					}
				}
			}
		}
	}
	run := approveUntilDone()
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("runbook run: %s %q", run.GetStatus(), run.GetStopMessage())
	}
	before := mails()
	if len(before) != 1 {
		t.Fatalf("outbox after the run: %q, want one mail", before)
	}
	plan := run.GetPlans()[len(run.GetPlans())-1]
	first := plan.GetSteps()[0].GetId()
	send := ""
	for _, st := range plan.GetSteps() {
		if st.GetTool() == "email.send" {
			send = st.GetId()
		}
	}
	if send == "" || send == first {
		t.Fatalf("the plan sends no mail after its first step: %v", plan)
	}
	out, err := planexIn(t, "runs", "reset", "--addr", addr, "--from-step", first, "--reason", "the runbook was edited", "--wait", id)
	// The send, after the point, succeeded: it is kept, not run again.
	if _, keeps, _ := strings.Cut(out, "keeps "); err != nil || !strings.Contains(out, "runs again "+first) || !slices.Contains(strings.Fields(strings.ReplaceAll(keeps, ",", " ")), send) {
		t.Fatalf("reset --wait: %v\n%s (want %s kept)", err, out, send)
	}
	after, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
	if err != nil || after.GetRun().GetResets() != 1 || after.GetRun().GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("after the reset: %v %v", after.GetRun(), err)
	}
	if got := mails(); !slices.Equal(got, before) {
		t.Fatalf("outbox after the reset: %q, want the one mail %q", got, before)
	}
	if out, err := planexIn(t, "audit", "verify", "--addr", addr, id); err != nil || !strings.Contains(out, "events verified") {
		t.Fatalf("audit verify: %v\n%s", err, out)
	}
	if out, err := planexIn(t, "replay", "--addr", addr, "--auto-approve", "email.send", id); err != nil || !strings.Contains(out, "replayed") {
		t.Fatalf("replay: %v\n%s", err, out)
	}
}
