package supervisor_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// TestEngineMasksSecretsExecutorsLeft: the harness's fake pool masks
// nothing, like an executor older than output masking (or a compromised
// one). The engine masks what looks like a secret in its outputs (inline
// and in the object store) and step errors before the run log records
// them, so neither the log nor GetRun shows them.
func TestEngineMasksSecretsExecutorsLeft(t *testing.T) {
	h, r := setup(t)
	openAI := "sk-" + "proj-ABCDEFGHIJKLMNOPQRST"
	aws := "AKIA" + "IOSFODNN7EXAMPLE"
	stripe := "sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc"
	ctx := testCtx(t, 20*time.Second)

	id := h.runGoal(t, r, "echo secrets", always(
		step("inline", "test.echo", map[string]any{"value": map[string]any{"k": aws, "password": "hunter22", "note": "kept"}}),
		step("stored", "test.gate", map[string]any{}),
	))
	// An executor's result whose output it stored by reference, unmasked;
	// it takes the attempt's message id, so the fake pool's own result
	// (once the gate opens) is a duplicate.
	waitRun(t, r.client, id, 10*time.Second, "running step stored", func(run *planexv1.Run) bool {
		for _, st := range run.GetSteps() {
			if st.GetStepId() == "stored" && runlog.InFlight(st.GetStatus()) {
				return true
			}
		}
		return false
	})
	data := []byte(`{"rows":[{"key":"` + stripe + `","n":12345678901234567890}],"pad":"` + strings.Repeat("x", 2000) + `"}`)
	name := bus.OutputName(id, "stored", 1)
	if _, err := h.res.Outputs.PutBytes(ctx, name, data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if _, err := bus.Publish(ctx, h.res.JS, bus.Publication{
		Subject: bus.EngineSubject(id, bus.KindResult),
		Msg: &planexv1.StepResult{RunId: id, StepId: "stored", Attempt: 1, PlanRevision: 1, Tool: "test.gate", ExecutorId: "fake-1",
			Status:    planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED,
			OutputRef: &planexv1.OutputRef{Bucket: bus.ObjectOutputs, Name: name, Size: int64(len(data)), Sha256: hex.EncodeToString(sum[:])}},
		MsgID: bus.MsgID(id, "stored", "1", bus.KindResult),
	}); err != nil {
		t.Fatal(err)
	}
	run := succeeded(t, r, id)
	h.pool.openGate()
	failID := h.runGoal(t, r, "fail with a secret", always(noRetry(step("f", "test.fail", map[string]any{"message": "cast of " + openAI}))))
	failed := waitTerminal(t, r.client, failID, 20*time.Second)

	leaks := []string{aws, "hunter22", stripe, openAI}
	noLeak := func(where, text string) {
		t.Helper()
		for _, l := range leaks {
			if strings.Contains(text, l) {
				t.Fatalf("%s holds %q", where, l)
			}
		}
	}
	var stored *planexv1.OutputRef
	for runID, events := range h.allEvents() {
		if runID != id && runID != failID {
			continue
		}
		for _, ev := range events {
			switch p := ev.GetPayload().(type) {
			case *planexv1.RunEvent_StepSucceeded:
				noLeak("StepSucceeded", protojson.Format(p.StepSucceeded))
				if p.StepSucceeded.GetStepId() == "stored" {
					stored = p.StepSucceeded.GetOutputRef()
				}
				if p.StepSucceeded.GetStepId() == "inline" {
					v := p.StepSucceeded.GetOutput().GetStructValue().GetFields()["value"].GetStructValue().GetFields()
					if v["k"].GetStringValue() != "[REDACTED]" || v["password"].GetStringValue() != "[REDACTED]" || v["note"].GetStringValue() != "kept" {
						t.Fatalf("inline output %v: want the key and password masked, the note kept", v)
					}
				}
			case *planexv1.RunEvent_StepFailed:
				noLeak("StepFailed", protojson.Format(p.StepFailed))
				if !strings.Contains(p.StepFailed.GetError().GetMessage(), "cast of [REDACTED]") {
					t.Fatalf("step error %q, want the key masked", p.StepFailed.GetError().GetMessage())
				}
			case *planexv1.RunEvent_Finished:
				noLeak("RunFinished", protojson.Format(p.Finished))
			}
		}
	}
	if stored == nil {
		t.Fatal("the large output was not recorded by reference")
	}
	data, err := h.res.Outputs.GetBytes(ctx, stored.GetName())
	if err != nil {
		t.Fatal(err)
	}
	noLeak("stored output", string(data))
	sum = sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != stored.GetSha256() || int64(len(data)) != stored.GetSize() ||
		!strings.Contains(string(data), `"key":"[REDACTED]"`) || !strings.Contains(string(data), "12345678901234567890") {
		t.Fatalf("stored output (%d bytes) does not match its reference %v or is not masked", len(data), stored)
	}
	// The scripted plans carry the values as arguments; what the run shows
	// of the steps' outputs, errors and its result must not.
	for _, got := range []*planexv1.Run{run, failed} {
		for _, st := range got.GetSteps() {
			noLeak("GetRun output of "+st.GetStepId(), protojson.Format(st.GetOutput()))
			noLeak("GetRun error of "+st.GetStepId(), protojson.Format(st.GetError()))
		}
		noLeak("GetRun result", protojson.Format(got.GetResult()))
		noLeak("GetRun stop message", got.GetStopMessage())
		noLeak("GetRun stop detail", got.GetStopDetail())
	}
}
