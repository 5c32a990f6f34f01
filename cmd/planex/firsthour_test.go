package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// TestHelpIsPlain: help lists boolean flags as --flag, and defaults as
// rules ($XDG_CACHE_HOME/...), not this user's home directory.
func TestHelpIsPlain(t *testing.T) {
	home, _ := os.UserHomeDir()
	for _, args := range [][]string{{"run", "--help"}, {"dev", "--help"}, {"outbox", "--help"}, {"--help"}} {
		root := newRootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		help := out.String()
		if strings.Contains(help, "[=true|false]") {
			t.Errorf("%v shows [=true|false]:\n%s", args, help)
		}
		if home != "" && home != "/" && strings.Contains(help, home) {
			t.Errorf("%v shows the home directory %s:\n%s", args, home, help)
		}
		if !strings.Contains(help, "-h, --help") {
			t.Errorf("%v lacks the help flag:\n%s", args, help)
		}
	}
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"run", "--help"})
	_ = root.Execute()
	for _, want := range []string{"      --dev ", "$XDG_CACHE_HOME/planex/run-dev", "--next-step", "--redact-pattern"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("run --help lacks %q:\n%s", want, out.String())
		}
	}
}

func TestFinishedLineDoesNotRepeatTheStatus(t *testing.T) {
	line := func(st planexv1.RunStatus, why planexv1.StopReason, msg string) string {
		return eventLine(&planexv1.RunEvent{Sequence: 9, Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{Status: st, StopReason: why, Message: msg}}})
	}
	if got := line(planexv1.RunStatus_RUN_STATUS_SUCCEEDED, planexv1.StopReason_STOP_REASON_SUCCEEDED, ""); !strings.HasSuffix(got, "#9 run succeeded") {
		t.Errorf("succeeded: %q", got)
	}
	if got := line(planexv1.RunStatus_RUN_STATUS_FAILED, planexv1.StopReason_STOP_REASON_PLANNER_ERROR, "no runbook about x"); !strings.HasSuffix(got, "#9 run failed (planner_error): no runbook about x") {
		t.Errorf("failed: %q", got)
	}
	waiting := &planexv1.Run{Status: planexv1.RunStatus_RUN_STATUS_WAITING}
	if got := stopReasonText(waiting); got != "-" {
		t.Errorf("stop reason of a waiting run: %q", got)
	}
}
