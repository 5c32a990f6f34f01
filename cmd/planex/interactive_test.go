package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// TestInteractiveGates decides the demo's close-ticket gate through the
// prompter, with its answers injected and a real editor process (a shell
// script standing in for $EDITOR): an edit that breaks the tool's schema
// is refused with the field named and asked again, a valid edit runs; a
// rejection with stop ends the run; skip leaves the gate open.
func TestInteractiveGates(t *testing.T) {
	dir := t.TempDir()
	// The stack's supervisor also asks the playbook backend's critic about
	// every result (planex dev --critic-backend).
	f := parseDevFlags(t, "--data-dir="+filepath.Join(dir, "data"), "--critic-backend=playbook")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	stack, client := startTestDevStack(ctx, t, f, io.Discard)

	// The editor: its first run writes arguments the schema refuses (sql
	// must be a string), later runs a valid statement.
	count := filepath.Join(dir, "edits")
	editor := filepath.Join(dir, "editor.sh")
	script := `#!/bin/sh
n=$(cat "` + count + `" 2>/dev/null || echo 0)
echo $((n+1)) > "` + count + `"
if [ "$n" = 0 ]; then
  printf '{"sql": 5}' > "$1"
else
  printf '{"sql": "UPDATE support_tickets SET status = '"'"'closed'"'"' WHERE id = CAST(? AS INTEGER)", "params": ["405"]}' > "$1"
fi
`
	if err := os.WriteFile(editor, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(goal, answers string) (*planexv1.Run, string) {
		t.Helper()
		started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: goal})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		p := &prompter{in: bufio.NewReader(strings.NewReader(answers)), out: &out, editor: editor, actor: "tester", tmpDir: dir}
		final, err := followInteractive(ctx, client, stack.Addr, started.GetRun().GetId(), &liveView{w: io.Discard}, p)
		if err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		return final, out.String()
	}

	t.Run("edit", func(t *testing.T) {
		final, out := run("Close support ticket 405", "e\ne\n")
		t.Logf("prompter:\n%s", out)
		if !strings.Contains(out, "refused: decisions[0].edited_args") || !strings.Contains(out, "sql") {
			t.Fatalf("the refused edit does not name the field:\n%s", out)
		}
		if final.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
			t.Fatalf("run %s %q\n%s", final.GetStatus(), final.GetStopMessage(), out)
		}
		g := final.GetGates()[0]
		if g.GetDecision() != planexv1.DecisionKind_DECISION_KIND_EDIT || g.GetActor() != "tester" {
			t.Fatalf("gate %v", g)
		}
		for _, s := range final.GetSteps() {
			if s.GetStepId() == "close" && s.GetResolvedArgs().GetFields()["sql"].GetStringValue() != "UPDATE support_tickets SET status = 'closed' WHERE id = CAST(? AS INTEGER)" {
				t.Fatalf("step close ran with %v, not the edited arguments", s.GetResolvedArgs())
			}
		}
		// Both results went through the model critic before the run
		// moved on.
		stream, err := client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: final.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		var judged []string
		for {
			resp, err := stream.Recv()
			if err != nil {
				break
			}
			if v := resp.GetEvent().GetCriticVerdict(); v != nil && v.GetVerifier() == "model:playbook" && v.GetPassed() {
				judged = append(judged, v.GetStepId())
			}
		}
		if strings.Join(judged, ",") != "ticket,close" {
			t.Fatalf("steps judged by the critic: %v, want ticket,close", judged)
		}
	})
	t.Run("reject and stop", func(t *testing.T) {
		final, out := run("Close support ticket 406", "x\nr\nnot today\ny\n")
		if !strings.Contains(out, `"x": answer a, r, e or s`) {
			t.Fatalf("an unknown answer is not asked again:\n%s", out)
		}
		if final.GetStopReason() != planexv1.StopReason_STOP_REASON_REJECTED || !strings.Contains(final.GetStopMessage(), "not today") {
			t.Fatalf("run %s %s %q", final.GetStatus(), final.GetStopReason(), final.GetStopMessage())
		}
	})
	t.Run("skip", func(t *testing.T) {
		final, out := run("Close support ticket 407", "s\n")
		if final.GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING || !strings.Contains(out, "left open") {
			t.Fatalf("run %s\n%s", final.GetStatus(), out)
		}
	})
	t.Run("end of input leaves the gate open", func(t *testing.T) {
		final, _ := run("Close support ticket 408", "")
		if final.GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING {
			t.Fatalf("run %s", final.GetStatus())
		}
	})
}

func TestGatesTableShowsWhatARejectionDoes(t *testing.T) {
	now := time.Now()
	opened := timestamppb.New(now.Add(-time.Minute))
	var out bytes.Buffer
	err := printGates(&out, []*planexv1.OpenGate{
		{RunId: "r1", Tool: "sql.exec", Gate: &planexv1.Gate{Id: "x.r1", Kind: planexv1.GateKind_GATE_KIND_STEP, OpenedAt: opened, Policy: "p", StopOnReject: true, Reason: "stops"}},
		{RunId: "r2", Tool: "sql.exec", Gate: &planexv1.Gate{Id: "y.r1", Kind: planexv1.GateKind_GATE_KIND_STEP, OpenedAt: opened, ReplanOnReject: true, Reason: "replans"}},
		{RunId: "r3", Tool: "sql.exec", Gate: &planexv1.Gate{Id: "z.r1", Kind: planexv1.GateKind_GATE_KIND_STEP, OpenedAt: opened, Reason: "old record"}},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !strings.Contains(lines[0], "ON REJECT") || len(lines) != 4 {
		t.Fatalf("table:\n%s", out.String())
	}
	for i, want := range []string{"stop", "replan", "stop"} {
		if f := strings.Fields(lines[i+1]); len(f) < 7 || f[6] != want {
			t.Errorf("row %d %q: ON REJECT want %s", i+1, lines[i+1], want)
		}
	}
}
