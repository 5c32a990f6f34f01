package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// TestRunsAnswerAnswersTheDemoQuestion: the customer-report demo asks
// which customer to report on; `planex gates` shows the question, a
// wrong-typed answer is refused with the schema's message and the run
// keeps waiting, and the answer from `planex runs answer` is what the SQL
// step reports on.
func TestRunsAnswerAnswersTheDemoQuestion(t *testing.T) {
	ctx, stack, client := startDefaultDevStack(t)
	addr := stack.Addr

	started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Ask which customer to report on"})
	if err != nil {
		t.Fatal(err)
	}
	id := started.GetRun().GetId()
	waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return r.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING })

	out, err := planexIn(t, "gates", "--addr", addr, "--run", id)
	if err != nil || !strings.Contains(out, "ask.r1") || !strings.Contains(out, " input ") || !strings.Contains(out, "asks: Which customer should the report cover?") {
		t.Fatalf("gates: %v\n%s", err, out)
	}
	_, err = planexIn(t, "runs", "answer", "--addr", addr, id, "--value", "7")
	if exitCode(err) != exitUsage || !strings.Contains(err.Error(), "answer: expected string, got number 7") {
		t.Fatalf("runs answer --value 7: %v (exit %d), want the schema's message", err, exitCode(err))
	}
	_, err = planexIn(t, "runs", "approve", "--addr", addr, id)
	if err == nil || !strings.Contains(err.Error(), "waits at no gate") && !strings.Contains(err.Error(), "nothing to approve") {
		t.Fatalf("runs approve of a run that asks a question: %v", err)
	}
	got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
	if err != nil || got.GetRun().GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING {
		t.Fatalf("after the refused answer: %v %s", err, got.GetRun().GetStatus())
	}

	out, err = planexIn(t, "runs", "answer", "--addr", addr, id, "ask", "--value", "Acme Corp")
	if err != nil || !strings.Contains(out, `gate ask.r1 of run `+id+`: answered "Acme Corp"`) {
		t.Fatalf("runs answer: %v\n%s", err, out)
	}
	final := waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return isTerminal(r.GetStatus()) })
	if final.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || !strings.HasPrefix(final.GetResult().GetStringValue(), "Acme Corp: revenue ") {
		t.Fatalf("run %s %q, result %v", final.GetStatus(), final.GetStopMessage(), final.GetResult())
	}
	if out, err := planexIn(t, "replay", "--addr", addr, "--auto-approve", "email.send", id); err != nil || !strings.Contains(out, "replayed") {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	if out, err := planexIn(t, "audit", "verify", "--addr", addr, id); err != nil || !strings.Contains(out, "events verified") {
		t.Fatalf("audit verify: %v\n%s", err, out)
	}

	// planex run at a terminal asks the question itself.
	again, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Report on a customer I choose"})
	if err != nil {
		t.Fatal(err)
	}
	var said bytes.Buffer
	p := &prompter{in: bufio.NewReader(strings.NewReader("Initech\n")), out: &said, actor: "tester"}
	run, err := followInteractive(ctx, client, addr, again.GetRun().GetId(), &liveView{w: io.Discard}, p)
	if err != nil || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || !strings.HasPrefix(run.GetResult().GetStringValue(), "Initech: revenue ") ||
		!strings.Contains(said.String(), "step ask asks:\n  Which customer should the report cover?") {
		t.Fatalf("interactive answer: %v %s %v\n%s", err, run.GetStatus(), run.GetResult(), said.String())
	}
}

func TestAnswerValues(t *testing.T) {
	in := &planexv1.HumanInput{Choices: []*structpb.Value{structpb.NewStringValue("eu"), structpb.NewNumberValue(2), structpb.NewStringValue("7")}}
	for _, tt := range []struct {
		how, arg, want, err string
	}{
		{"value", `{"customer": "acme"}`, `{"customer":"acme"}`, ""},
		{"value", `"acme"`, `"acme"`, ""},
		{"value", `Acme Corp`, `"Acme Corp"`, ""},
		{"value", `12`, `12`, ""},
		{"value", `{"customer":`, "", "not valid JSON"},
		{"choice", "eu", `"eu"`, ""},
		{"choice", "2", `2`, ""}, // the choice 2 itself, before the second choice
		{"choice", "7", `"7"`, ""},
		{"choice", "1", `"eu"`, ""},
		{"choice", "asia", "", `"asia" is not one of the choices 1) "eu", 2) 2, 3) "7"`},
	} {
		var v *structpb.Value
		var err error
		if tt.how == "value" {
			v, err = parseAnswer(tt.arg)
		} else {
			v, err = pickChoice(in, tt.arg)
		}
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s %s: %v, want %q", tt.how, tt.arg, err, tt.err)
			}
			continue
		}
		b, _ := json.Marshal(v.AsInterface())
		if err != nil || string(b) != tt.want {
			t.Errorf("%s %s: %s %v, want %s", tt.how, tt.arg, b, err, tt.want)
		}
	}
}
