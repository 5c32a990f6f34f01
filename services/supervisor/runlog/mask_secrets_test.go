package runlog_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/redact"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// TestExportMasksSecretsInEveryText: the export's patterns reach every
// string of an event — a goal, labels and a step error recorded before
// the API and the engine masked them, a table cell next to its column —
// and issue 26's formats (a planex API key) among them; what holds none
// is left as it is.
func TestExportMasksSecretsInEveryText(t *testing.T) {
	pxk := "pxk_" + "Qm9vT2Jhc2U2NHVybEtleUZvclBsYW5leEFQSWtleTAx"
	stripe := "sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc"
	rows, _ := structpb.NewValue(map[string]any{
		"columns": []any{map[string]any{"name": "password"}}, "rows": []any{[]any{"hunter22"}},
	})
	events := []*planexv1.RunEvent{
		{Sequence: 1, Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "use " + pxk, Labels: map[string]string{"k": stripe}}}},
		{Sequence: 2, Payload: &planexv1.RunEvent_StepFailed{StepFailed: &planexv1.StepFailed{StepId: "q",
			Error: &planexv1.StepError{Code: planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, Message: "cast of " + "sk-\u200b" + "proj-ABCDEFGHIJKLMNOPQRST"}}}},
		{Sequence: 3, Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{StepId: "t", Output: rows}}},
		{Sequence: 4, Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{Message: "done with " + stripe}}},
		{Sequence: 5, Payload: &planexv1.RunEvent_StepStarted{StepStarted: &planexv1.StepStarted{StepId: "q", ExecutorId: "e1"}}},
	}
	exp := runlog.NewMask(nil, redact.New(redact.SecretPatterns()...)).Export(events)
	for i, e := range exp {
		text := protojson.Format(e.Event)
		for _, leak := range []string{pxk, stripe, "proj-ABCDEFGHIJKLMNOPQRST", "hunter22"} {
			if strings.Contains(text, leak) {
				t.Errorf("event %d exports %q: %s", i+1, leak, text)
			}
		}
		if want := i < 4; e.Redacted != want {
			t.Errorf("event %d: redacted = %v, want %v", i+1, e.Redacted, want)
		}
	}
	if exp[4].Event != events[4] {
		t.Error("an event with nothing to mask was copied")
	}
	if !strings.Contains(events[0].GetCreated().GetGoal(), pxk) {
		t.Error("the stored event was modified")
	}
	// The API's mask (no patterns) leaves texts alone.
	if api := runlog.NewMask(nil, nil).Export(events); api[1].Redacted {
		t.Error("the API's mask redacted an error message")
	}
}
