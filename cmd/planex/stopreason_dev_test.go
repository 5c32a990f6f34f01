package main

import (
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/emailpool"
)

// TestDevStopMessagesStandAlone runs goals the data says no to with
// `planex run --dev` against a dev stack in this process: an unknown
// customer stops NO_DATA with the playbook's message as the whole stop
// message (the failed expect is in the detail), printed alone, and exits
// 3; a recipient at a domain the dev email pool refuses is refused when
// the run plans, before any step (search, fetch, draft) runs.
func TestDevStopMessagesStandAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the dev stack; skipped with -short")
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	data := filepath.Join(t.TempDir(), "data")
	f := parseDevFlags(t, "--data-dir="+data)
	stack, client := startTestDevStack(t.Context(), t, f, io.Discard)
	exitOf := func(t *testing.T, out string, err error) int {
		t.Helper()
		var ee *exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		if err != nil {
			t.Fatalf("planex run: %v\n%s", err, out)
		}
		return exitOK
	}
	runJSON := func(t *testing.T, goal string) (int, *planexv1.Run) {
		t.Helper()
		out, err := planexIn(t, "run", "--dev", "--data-dir", data, "--json", goal)
		code := exitOf(t, out, err)
		var run planexv1.Run
		if err := protojson.Unmarshal([]byte(out), &run); err != nil {
			t.Fatalf("stdout is not a Run (%v):\n%s", err, out)
		}
		return code, &run
	}

	t.Run("unknown customer", func(t *testing.T) {
		const want = "no customer is named Acme Inc; closest: Acme Corp"
		code, run := runJSON(t, "How many open support tickets does Acme Inc have?")
		if code != exitFailed || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_FAILED || run.GetStopReason() != planexv1.StopReason_STOP_REASON_NO_DATA {
			t.Fatalf("exit %d, run %v %v %q; want exit %d, FAILED NO_DATA", code, run.GetStatus(), run.GetStopReason(), run.GetStopMessage(), exitFailed)
		}
		if run.GetStopMessage() != want {
			t.Errorf("stop message %q, want exactly %q", run.GetStopMessage(), want)
		}
		for _, in := range []string{`step "count" (sql.query) failed after 1 attempt`, "EXPECTATION_FAILED", `expect "output.row_count == 1"`} {
			if !strings.Contains(run.GetStopDetail(), in) {
				t.Errorf("stop detail %q lacks %q", run.GetStopDetail(), in)
			}
		}
		// What `runs get --json` answers holds the detail too.
		got, err := client.GetRun(t.Context(), &planexv1.GetRunRequest{RunId: run.GetId()})
		if err != nil || got.GetRun().GetStopDetail() != run.GetStopDetail() {
			t.Fatalf("GetRun: %v, detail %q; want %q", err, got.GetRun().GetStopDetail(), run.GetStopDetail())
		}

		// Without --json: the message alone on the stop line, no internals.
		out, err := planexIn(t, "run", "--dev", "--data-dir", data, "How many open support tickets does Acme Inc have?")
		if code := exitOf(t, out, err); code != exitFailed {
			t.Fatalf("exit %d, want %d\n%s", code, exitFailed, out)
		}
		if !strings.Contains(out, "\nstopped: "+want+"\n") || strings.Contains(out, "stopped: step_failed") || strings.Contains(out, "evaluated to false; no customer") {
			t.Errorf("planex run printed:\n%s\nwant %q alone on the stop line", out, want)
		}
	})

	t.Run("recipient at another domain", func(t *testing.T) {
		before, err := emailpool.ListOutbox(stack.OutboxDir)
		if err != nil {
			t.Fatal(err)
		}
		code, run := runJSON(t, "Find the runbook for failed payment retries and send it to ops@evil.com")
		if code != exitFailed || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_FAILED {
			t.Fatalf("exit %d, run %v %v %q; want exit %d and a failed run", code, run.GetStatus(), run.GetStopReason(), run.GetStopMessage(), exitFailed)
		}
		if msg := run.GetStopMessage(); !strings.Contains(msg, `to: "ops@evil.com" is not valid`) || !strings.Contains(msg, "example.com") {
			t.Errorf("stop message %q, want the recipient refused naming the allowed domain", msg)
		}
		if len(run.GetSteps()) != 0 || run.GetUsage().GetSteps() != 0 {
			t.Errorf("%d steps ran (%v) for a recipient the pool refuses; want none", run.GetUsage().GetSteps(), run.GetSteps())
		}
		after, err := emailpool.ListOutbox(stack.OutboxDir)
		if err != nil || len(after) != len(before) {
			t.Fatalf("outbox: %d mails after %d, %v", len(after), len(before), err)
		}
	})
}
