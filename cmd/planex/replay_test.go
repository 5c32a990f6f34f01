package main

import (
	"errors"
	"strings"
	"testing"
)

const demoLogs = "../../services/supervisor/engine/testdata/demo/"

func TestReplayCommand(t *testing.T) {
	out, err := planexIn(t, "replay", demoLogs+"top-customers-email.jsonl", "--tools", demoLogs+"tools.json", "--auto-approve", "email.send")
	if err != nil || !strings.Contains(out, "14 events replayed, 4 decisions made again identically") {
		t.Fatalf("%v\n%s", err, out)
	}
	// Decided without the dev stack's auto-approval, the send waits for a
	// gate: the first divergence is the recorded dispatch of email.send.
	_, err = planexIn(t, "replay", demoLogs+"top-customers-email.jsonl", "--tools", demoLogs+"tools.json")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitFailed ||
		!strings.Contains(err.Error(), "replay diverges at event 11 (deciding after event 10): recorded step_dispatched, the engine now decides gate_opened") {
		t.Fatalf("divergence: %v", err)
	}
}
