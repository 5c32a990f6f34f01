package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/planex-dev/planex/internal/natstest"
)

// TestDeployedTopologyReplaysTheDemoSuite runs the demo suite against
// services started as processes, as a deployment would: a supervisor, the
// planner with --planner-backend replay and one executor per pool with
// --replay, all answering from the recorded cassette (no model, no
// database, mail relay or index is opened). The suite passes through the
// supervisor's address; a goal the cassette lacks fails naming the
// request.
func TestDeployedTopologyReplaysTheDemoSuite(t *testing.T) {
	srv := natstest.Start(t)
	common := []string{"--grpc-addr=127.0.0.1:0", "--nats-url=" + srv.URL()}
	_, plannerAddr := startService(t, append([]string{"planner", "--planner-backend=replay", "--replay=" + demoCassette}, common...)...)
	for _, pool := range []string{"sql", "email", "search"} {
		startService(t, append([]string{"executor", "--pool=" + pool, "--replay=" + demoCassette}, common...)...)
	}
	_, supAddr := startService(t, append([]string{"supervisor", "--planner-addr=" + plannerAddr, "--auto-approve=email.send"}, common...)...)

	out, err := planexIn(t, "eval", demoSuite, "--addr", supAddr, "--plaintext", "--parallel", "6")
	if err != nil || !strings.Contains(out, "suite demo: 6/6 passed") {
		t.Fatalf("demo suite on the replaying topology: %v\n%s", err, out)
	}

	miss := filepath.Join(t.TempDir(), "miss.yaml")
	if err := os.WriteFile(miss, []byte(`
name: miss
tasks:
  - name: unrecorded
    goal: How many open support tickets does Initech have?
    expect:
      status: failed
      result: [{cel: 'run.stop_message.contains("no recorded answer for plan") && run.stop_message.contains("Initech")'}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := planexIn(t, "eval", miss, "--addr", supAddr, "--plaintext"); err != nil {
		t.Fatalf("a goal the cassette lacks: %v\n%s", err, out)
	}
}

// TestReplayFlagErrors checks the replay flags of the planner and
// executor services name what is wrong before anything starts.
func TestReplayFlagErrors(t *testing.T) {
	empty := t.TempDir()
	srv := natstest.Start(t) // the executor connects before it opens its pool
	tests := map[string][]string{
		"--replay: required with --planner-backend replay":              {"planner", "--planner-backend=replay"},
		"--replay " + demoCassette + ": needs --planner-backend replay": {"planner", "--replay=" + demoCassette},
		`--replay-miss "sometimes": want error or live`:                 {"planner", "--planner-backend=replay", "--replay=" + demoCassette, "--replay-miss=sometimes"},
		"tools.json: no such file or directory":                         {"executor", "--pool=sql", "--replay=" + empty, "--allow-unsigned-steps", "--plaintext", "--auth-disabled", "--grpc-addr=127.0.0.1:0", "--nats-url=" + srv.URL()},
	}
	for want, args := range tests {
		if _, err := planexIn(t, args...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("planex %v: %v, want %q", args, err, want)
		}
	}
}
