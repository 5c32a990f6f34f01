package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// waitForRun polls a run until done says it is where the test wants it.
func waitForRun(ctx context.Context, t *testing.T, client planexv1.SupervisorServiceClient, id string, done func(*planexv1.Run) bool) *planexv1.Run {
	t.Helper()
	for {
		got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
		if err != nil {
			t.Fatal(err)
		}
		if done(got.GetRun()) {
			return got.GetRun()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("run %s: still %s: %v", id, got.GetRun().GetStatus(), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// exitCode is the exit code planex would end with for err.
func exitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	}
	return exitUsage
}

// TestCLIFindsAndExplainsTheDevStack: every command that talks to a
// running planex dev finds it with nothing but --addr — runs export,
// audit verify and replay read its NATS with the supervisor's nkey, as
// runs list reaches its gRPC API —, a token of the caller's own keeps the
// dev CA, and the answers a user cannot act on are replaced: --plaintext
// against TLS, approving a finished run, a rejection's plan revision, a
// missing outbox.
func TestCLIFindsAndExplainsTheDevStack(t *testing.T) {
	ctx, stack, client := startDefaultDevStack(t)
	addr := stack.Addr

	started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "How many open support tickets does Acme Corp have?"})
	if err != nil {
		t.Fatal(err)
	}
	id := started.GetRun().GetId()
	waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return isTerminal(r.GetStatus()) })

	t.Run("export, verify and replay find its NATS", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "run.jsonl")
		if out, err := planexIn(t, "runs", "export", "--addr", addr, "--no-redact", "-o", file, id); err != nil {
			t.Fatalf("runs export: %v\n%s", err, out)
		}
		if b, err := os.ReadFile(file); err != nil || !strings.Contains(string(b), id) {
			t.Fatalf("export %s: %v\n%s", file, err, b)
		}
		if out, err := planexIn(t, "audit", "verify", "--addr", addr, id); err != nil || !strings.Contains(out, "events verified") {
			t.Fatalf("audit verify RUN_ID: %v\n%s", err, out)
		}
		if out, err := planexIn(t, "replay", "--addr", addr, "--auto-approve", "email.send", id); err != nil || !strings.Contains(out, "replayed") {
			t.Fatalf("replay RUN_ID: %v\n%s", err, out)
		}
		// No planex dev at --addr: a connection error says how to point
		// the command at one (the default URL may reach another NATS
		// server on this machine, so the hint is checked directly).
		none := storeFlags{dev: devStore{addr: "127.0.0.1:1"}}
		if hint := none.dev.apply(&none); !strings.Contains(hint, "no planex dev serves --addr 127.0.0.1:1") || !strings.Contains(hint, "--nats-nkey-file") {
			t.Fatalf("hint without a dev stack: %q", hint)
		}
		dev := storeFlags{dev: devStore{addr: addr}}
		if hint := dev.dev.apply(&dev); dev.url != stack.NATSURL || dev.auth.NKeySeedFile != stack.Credentials.NATSSeedFiles["supervisor"] || !strings.Contains(hint, addr) {
			t.Fatalf("dev context of %s: url %q, nkey %q, hint %q", addr, dev.url, dev.auth.NKeySeedFile, hint)
		}
	})

	t.Run("a token of one's own keeps the dev CA", func(t *testing.T) {
		token, err := os.ReadFile(stack.Credentials.CLITokenFile)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := planexIn(t, "runs", "list", "--addr", addr, "--token", strings.TrimSpace(string(token))); err != nil || !strings.Contains(out, id) {
			t.Fatalf("runs list --token: %v\n%s", err, out)
		}
		t.Setenv("PLANEX_TOKEN", strings.TrimSpace(string(token)))
		if out, err := planexIn(t, "runs", "list", "--addr", addr); err != nil || !strings.Contains(out, id) {
			t.Fatalf("runs list with PLANEX_TOKEN: %v\n%s", err, out)
		}
	})

	t.Run("plaintext against TLS says so", func(t *testing.T) {
		_, err := planexIn(t, "runs", "list", "--addr", addr, "--plaintext")
		if err == nil || !strings.Contains(err.Error(), "serves TLS: drop --plaintext") || strings.Contains(err.Error(), "is `planex dev`") {
			t.Fatalf("runs list --plaintext against TLS: %v", err)
		}
	})

	t.Run("approving a finished run says it finished", func(t *testing.T) {
		_, err := planexIn(t, "runs", "approve", "--addr", addr, id)
		if err == nil || !strings.Contains(err.Error(), "run "+id+" finished (succeeded): nothing to approve") || strings.Contains(err.Error(), "0 open gates") {
			t.Fatalf("runs approve of a finished run: %v", err)
		}
	})

	t.Run("a rejection names the plan being replaced", func(t *testing.T) {
		gated, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Close support ticket 410"})
		if err != nil {
			t.Fatal(err)
		}
		gid := gated.GetRun().GetId()
		waitForRun(ctx, t, client, gid, func(r *planexv1.Run) bool { return r.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING })
		out, err := planexIn(t, "runs", "reject", "--addr", addr, "--comment", "not today", gid)
		if err != nil {
			t.Fatalf("runs reject: %v\n%s", err, out)
		}
		if strings.Contains(out, "at plan revision 1") || !strings.Contains(out, "sent back to the planner") {
			t.Fatalf("runs reject says:\n%s", out)
		}
		final := waitForRun(ctx, t, client, gid, func(r *planexv1.Run) bool { return isTerminal(r.GetStatus()) })
		if n := len(final.GetPlans()); n < 2 {
			t.Fatalf("the rejected run has %d plans, want a new one", n)
		}
	})

	t.Run("dev credentials prints paths, never the token", func(t *testing.T) {
		out, err := planexIn(t, "dev", "credentials", "--addr", addr)
		if err != nil {
			t.Fatal(err)
		}
		token, _ := os.ReadFile(stack.Credentials.CLITokenFile)
		for _, want := range []string{"PLANEX_DEV_ADDR=" + addr, "PLANEX_DEV_CA_FILE=" + shellQuote(stack.Credentials.CAFile), "PLANEX_DEV_TOKEN_FILE=" + shellQuote(stack.Credentials.CLITokenFile), "PLANEX_DEV_NATS_URL=" + stack.NATSURL} {
			if !strings.Contains(out, want) {
				t.Errorf("dev credentials lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, strings.TrimSpace(string(token))) {
			t.Errorf("dev credentials printed the CLI's token")
		}
		if _, err := planexIn(t, "dev", "credentials", "--addr", "127.0.0.1:1"); exitCode(err) != exitUsage {
			t.Errorf("dev credentials without a stack: %v", err)
		}
	})
}

// TestRunDevOfAGatedGoalSaysHowToDecideIt: `planex run --dev` of a goal
// that waits at a gate stops its own stack on exit, so it must not send
// the user to `planex runs get`: it says to start planex dev on the same
// data directory and decide there.
func TestRunDevOfAGatedGoalSaysHowToDecideIt(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the dev stack; skipped with -short")
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	data := filepath.Join(t.TempDir(), "data")
	_, err := planexIn(t, "run", "--dev", "--data-dir", data, "Close support ticket 412")
	if exitCode(err) != exitEscalated {
		t.Fatalf("run --dev of a gated goal: %v (exit %d), want exit 4", err, exitCode(err))
	}
	msg := err.Error()
	if strings.Contains(msg, "planex runs get") || !strings.Contains(msg, "planex dev --data-dir "+shellQuote(data)) || !strings.Contains(msg, "planex runs approve") {
		t.Fatalf("run --dev of a gated goal says: %s", msg)
	}
}

func TestOutboxRefusesAMissingDirectory(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nonexistent")
	_, err := planexIn(t, "outbox", "--dir", missing)
	if exitCode(err) == exitOK || !strings.Contains(err.Error(), "--dir "+missing+": no such directory") {
		t.Fatalf("outbox --dir %s: %v", missing, err)
	}
	empty := t.TempDir()
	if _, err := planexIn(t, "outbox", "--dir", empty); err != nil {
		t.Fatalf("an empty outbox: %v", err)
	}
}

// TestRunHelpShowsTheRunFlags: run --help lists the run's own flags and
// leaves the dev stack's server flags to --help-dev.
func TestRunHelpShowsTheRunFlags(t *testing.T) {
	for _, cmd := range []string{"run", "eval"} {
		help, err := planexIn(t, cmd, "--help")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(help, "--planner-backend") || strings.Contains(help, "--critic-on-fail") || !strings.Contains(help, "--help-dev") || !strings.Contains(help, "--data-dir") {
			t.Errorf("%s --help:\n%s", cmd, help)
		}
		if n := strings.Count(help, "\n      --") + strings.Count(help, "\n  -"); n > 30 {
			t.Errorf("%s --help lists %d flags:\n%s", cmd, n, help)
		}
		all, err := planexIn(t, cmd, "--help-dev")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(all, "--planner-backend") || !strings.Contains(all, "--critic-on-fail") {
			t.Errorf("%s --help-dev lacks the dev stack flags:\n%s", cmd, all)
		}
	}
	// The flags still work without being listed.
	if _, err := planexIn(t, "run", "--planner-backend", "nosuch", "--plaintext", "--addr", "127.0.0.1:1", "x"); err == nil {
		t.Error("run to an unreachable address succeeded")
	}
}

func TestRejectionOutcomeNamesTheReplacedRevision(t *testing.T) {
	planning := &planexv1.Run{Status: planexv1.RunStatus_RUN_STATUS_PLANNING, Plans: []*planexv1.Plan{{Revision: 1}}}
	if got := afterReject(planning); strings.Contains(got, "at plan revision 1") || !strings.Contains(got, "new plan to replace revision 1") {
		t.Errorf("planning again after r1: %q", got)
	}
	running := &planexv1.Run{Status: planexv1.RunStatus_RUN_STATUS_RUNNING, Plans: []*planexv1.Plan{{Revision: 1}, {Revision: 2}}}
	if got := afterReject(running); !strings.Contains(got, "running plan revision 2") {
		t.Errorf("already running r2: %q", got)
	}
}

func TestPermissionDeniedShowsTheGatesApprovers(t *testing.T) {
	err := rpcError("127.0.0.1:7400", status.Error(codes.PermissionDenied, "permission denied: gate close.r1 may be decided by role:admin only; you are apikey:bob"))
	if !strings.Contains(err.Error(), "gate close.r1 may be decided by role:admin") || strings.Contains(err.Error(), "lacks the role") {
		t.Errorf("approver outside the gate's approvers: %v", err)
	}
	err = rpcError("127.0.0.1:7400", status.Error(codes.PermissionDenied, "permission denied"))
	if !strings.Contains(err.Error(), "lacks the role") {
		t.Errorf("a generic refusal: %v", err)
	}
}
