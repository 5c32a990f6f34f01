package main

import (
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// TestListedStatusShowsCorruptRuns checks the status `planex runs list`
// shows for a run ListRuns marks corrupt, and that only a non-terminal
// run with the corrupt stop message is shown so.
func TestListedStatusShowsCorruptRuns(t *testing.T) {
	broken := &runlog.BrokenEventError{RunID: "RUN1", Sequence: 6, StreamSeq: 57, NotEvent: true, Reason: "it does not decode as one"}
	tests := []struct {
		name string
		run  *planexv1.Run
		want string
	}{
		{"corrupt running run", runlog.MarkCorrupt(&planexv1.Run{Id: "RUN1", Status: planexv1.RunStatus_RUN_STATUS_RUNNING}, broken), "corrupt (running)"},
		{"intact running run", &planexv1.Run{Id: "RUN1", Status: planexv1.RunStatus_RUN_STATUS_RUNNING}, "running"},
		{"finished run whose step error mimics the mark", &planexv1.Run{Id: "RUN1", Status: planexv1.RunStatus_RUN_STATUS_FAILED, StopMessage: broken.Advice()}, "failed"},
		{"mark of another run", runlog.MarkCorrupt(&planexv1.Run{Id: "RUN2", Status: planexv1.RunStatus_RUN_STATUS_WAITING}, broken), "waiting"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := listedStatus(tt.run); got != tt.want {
				t.Fatalf("listedStatus = %q, want %q", got, tt.want)
			}
		})
	}
}
