package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// TestConsoleAnswersAnInputGate: the customer-report demo's question is
// answered in Chromium from the form the gate card generates from the
// answer's schema; a wrong-typed answer (typed as JSON) is refused with
// the schema's message under the form and the run keeps waiting.
func TestConsoleAnswersAnInputGate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the dev stack and Chromium; skipped with -short")
	}
	testChromium(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	f := parseDevFlags(t, "--data-dir="+filepath.Join(t.TempDir(), "data"))
	f.services.ConsoleAddr = "127.0.0.1:0"
	stack, client := startTestDevStack(t.Context(), t, f, io.Discard)
	tok, err := os.ReadFile(stack.Credentials.CLITokenFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	resp, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Ask which customer to report on"})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetRun().GetId()
	waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return r.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING })

	b := newBrowser(t, stack.ConsoleURL, strings.TrimSpace(string(tok)))
	card := fmt.Sprintf(`article.gate[data-run-id=%q]`, id)
	b.open("#/gates?run=" + id)
	b.wait("the question and its form", fmt.Sprintf(`(() => { const c = document.querySelector(%q); return c && c.querySelector(".question")?.textContent.startsWith("Which customer should the report cover?") &&
		c.querySelector(".answer-form input[type=text]") && c.querySelector("button.answer") && !c.querySelector("button.edit"); })()`, card))
	// Bulk approval cannot pick it: approving a question without its
	// answer is not a decision.
	if evalJS[bool](b, fmt.Sprintf(`!!document.querySelector(%q).querySelector("input.pick")`, card)) {
		t.Fatal("the input gate's card can be selected for bulk approval")
	}
	b.axe("gates with an input gate")

	// A number where the schema wants a string: refused, shown, still open.
	evalJS[bool](b, fmt.Sprintf(`(() => { document.querySelector(%q).querySelector("details").open = true; return true; })()`, card))
	b.setField(card+" textarea.answer-json", "7")
	b.click(card + " button.answer")
	b.wait("the schema's message", fmt.Sprintf(`document.querySelector(%q).querySelector(".answer-error")?.textContent.includes("answer: expected string, got number 7")`, card))
	if d := evalJS[string](b, fmt.Sprintf(`document.querySelector(%q).dataset.decided || ""`, card)); d != "" {
		t.Fatalf("card marked decided (%s) after a refused answer", d)
	}
	got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
	if err != nil || got.GetRun().GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING || got.GetRun().GetGates()[0].GetDecision() != planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
		t.Fatalf("after the refused answer: %v %s %v", err, got.GetRun().GetStatus(), got.GetRun().GetGates())
	}
	b.shot("input-gate-refused.png")

	// The form's answer.
	b.setField(card+" textarea.answer-json", "")
	b.setField(card+" .answer-form input[type=text]", "Globex")
	b.click(card + " button.answer")
	b.wait("the gate answered", fmt.Sprintf(`document.querySelector(%q)?.dataset.decided === "DECISION_KIND_APPROVE" && document.querySelector(%q).querySelector(".result").textContent.startsWith("Answered.")`, card, card))
	final := waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return isTerminal(r.GetStatus()) })
	if final.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || !strings.HasPrefix(final.GetResult().GetStringValue(), "Globex: revenue ") ||
		final.GetGates()[0].GetAnswer().GetStringValue() != "Globex" || final.GetGates()[0].GetActor() != "console" {
		t.Fatalf("run %s %q, result %v, gate %v", final.GetStatus(), final.GetStopMessage(), final.GetResult(), final.GetGates()[0])
	}
}
