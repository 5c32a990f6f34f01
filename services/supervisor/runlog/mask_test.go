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

// TestMaskEvents masks one run's events as the API (fields only) and the
// export (fields and credential patterns) do, and fail closed.
func TestMaskEvents(t *testing.T) {
	specs := []*planexv1.ToolSpec{{Name: "email.draft", SensitiveFields: []string{"to", "body"}}, {Name: "sql.query"}}
	st := func(m map[string]any) *structpb.Struct { s, _ := structpb.NewStruct(m); return s }
	val := func(v any) *structpb.Value { x, _ := structpb.NewValue(v); return x }
	const token = "ghp_0123456789abcdefghijABCDEFGHIJ012345"
	events := []*planexv1.RunEvent{
		{Sequence: 1, Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "g", Inputs: st(map[string]any{"to": "a@example.com", "n": 1})}}},
		{Sequence: 2, Payload: &planexv1.RunEvent_PlanRevised{PlanRevised: &planexv1.PlanRevised{Plan: &planexv1.Plan{Steps: []*planexv1.Step{
			{Id: "q", Tool: "sql.query", Args: st(map[string]any{"sql": "SELECT " + token})},
			{Id: "d", Tool: "email.draft", Args: st(map[string]any{"to": "a@example.com", "subject": "s"})},
		}}}}},
		{Sequence: 3, Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{StepId: "d", Tool: "email.draft", ResolvedArgs: st(map[string]any{"to": "a@example.com", "body": "secret", "subject": "s"})}}},
		{Sequence: 4, Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{StepId: "d", Output: val(map[string]any{"to": "a@example.com", "id": "x"})}}},
		{Sequence: 5, Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{StepId: "q", Output: val(map[string]any{"rows": []any{"x"}})}}},
		{Sequence: 6, Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{Result: val(map[string]any{"d": map[string]any{"to": "a@example.com"}})}}},
	}
	text := func(ev *planexv1.RunEvent) string { b, _ := protojson.Marshal(ev); return string(b) }

	api := runlog.NewMask(specs, nil).Export(events)
	exp := runlog.NewMask(specs, redact.New(redact.SecretPatterns()...)).Export(events)
	all := runlog.MaskAll().Export(events)
	for i, ev := range events {
		a, x, c := text(api[i].Event), text(exp[i].Event), text(all[i].Event)
		if strings.Contains(a, "a@example.com") || strings.Contains(x, "a@example.com") || strings.Contains(a, "secret") {
			t.Errorf("event %d shows a sensitive field:\napi %s\nexport %s", i+1, a, x)
		}
		if strings.Contains(x, token) || strings.Contains(c, token) {
			t.Errorf("event %d: the export shows a credential: %s", i+1, x)
		}
		if ev.GetCreated() == nil && ev.GetFinished() == nil && strings.Contains(c, `"to"`) {
			t.Errorf("event %d: fail-closed mask shows fields: %s", i+1, c)
		}
	}
	// The API shows what no field or pattern hides; only changed events
	// are marked redacted.
	if !strings.Contains(text(api[1].Event), token) || api[2].Event.GetStepDispatched().GetResolvedArgs().GetFields()["subject"].GetStringValue() != "s" {
		t.Errorf("api mask hides too much: %s %s", text(api[1].Event), text(api[2].Event))
	}
	if api[4].Redacted || exp[4].Redacted || !api[3].Redacted || !exp[1].Redacted {
		t.Errorf("redacted marks: api %v export %v", []bool{api[1].Redacted, api[3].Redacted, api[4].Redacted}, []bool{exp[1].Redacted, exp[4].Redacted})
	}
	if got := runlog.NewMask(specs, nil).Run(&planexv1.Run{Inputs: events[0].GetCreated().GetInputs(), Steps: []*planexv1.StepState{{Tool: "email.draft", ResolvedArgs: st(map[string]any{"body": "secret"})}}}); strings.Contains(text(&planexv1.RunEvent{Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Inputs: got.GetInputs()}}}), "a@example.com") ||
		got.GetSteps()[0].GetResolvedArgs().GetFields()["body"].GetStringValue() != redact.Mask {
		t.Errorf("run not masked: %v", got)
	}
	var none *runlog.Mask
	if none.Event(events[3], map[string]string{}) != events[3] {
		t.Error("a nil mask changed an event")
	}
}
