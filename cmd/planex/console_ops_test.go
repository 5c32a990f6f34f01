package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/runner"
)

// browser drives one headless Chromium tab against a console, as
// cmd/internal/consoletest does.
type browser struct {
	t       *testing.T
	tab     context.Context
	base    string
	token   string
	timeout time.Duration
}

func newBrowser(t *testing.T, base, token string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(testChromium(t)), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("lang", "en-US"))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	tab, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(cancelTab)
	// A focused page, as in a window in front: focus events fire.
	focused := chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, emulation.SetFocusEmulationEnabled, emulation.SetFocusEmulationEnabledParams{Enabled: true})
		return err
	})
	if err := chromedp.Do(tab, chromedp.EmulateViewport(1280, 900), focused); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	return &browser{t: t, tab: tab, base: base, token: token, timeout: 30 * time.Second}
}

// do runs browser actions with a deadline.
func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.tab, b.timeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v\n%s", what, err, b.text())
	}
}

// evalJS evaluates a JavaScript expression in the tab (promises awaited).
func evalJS[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.tab, b.timeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("evaluate %.80q: %v\n%s", expr, err, b.text())
	}
	return v
}

// wait polls until expr is truthy in the page.
func (b *browser) wait(what, expr string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.tab, b.timeout)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(b.timeout))); err != nil {
		b.t.Fatalf("waiting for %s (%s): %v\n%s", what, expr, err, b.text())
	}
}

// text is the page's address and visible text, for failure messages.
func (b *browser) text() string {
	ctx, cancel := context.WithTimeout(b.tab, 3*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash + "\n" + document.body.innerText.slice(0, 3000)`))
	if err != nil {
		return "(page text unavailable: " + err.Error() + ")"
	}
	return "page:\n" + s
}

// shot writes a screenshot of the page to $PLANEX_ARTIFACTS/console (as
// the console's browser test does), for people to look at.
func (b *browser) shot(name string) {
	b.t.Helper()
	base := os.Getenv("PLANEX_ARTIFACTS")
	if base == "" {
		base = filepath.Join(os.TempDir(), "planex-artifacts")
	}
	dir := filepath.Join(base, "console")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.tab, b.timeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o640); err != nil {
		b.t.Fatal(err)
	}
}

// axe checks the page with axe-core (PLANEX_TEST_AXE or
// ~/.cache/planex/axe, as .ci/run installs it) and fails on serious or
// critical violations; without axe-core it logs that it did not check.
func (b *browser) axe(page string) {
	b.t.Helper()
	dir := os.Getenv("PLANEX_TEST_AXE")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "planex", "axe")
	}
	src, err := os.ReadFile(filepath.Join(dir, "node_modules", "axe-core", "axe.min.js"))
	if err != nil {
		b.t.Logf("axe-core not installed (%v): %s not checked", err, page)
		return
	}
	if !evalJS[bool](b, `typeof axe !== "undefined"`) {
		evalJS[bool](b, string(src)+";true")
	}
	type violation struct {
		ID     string `json:"id"`
		Impact string `json:"impact"`
		Help   string `json:"help"`
		Nodes  []struct {
			HTML string `json:"html"`
		} `json:"nodes"`
	}
	for _, v := range evalJS[[]violation](b, `axe.run(document, {resultTypes: ["violations"]}).then(r => r.violations)`) {
		if v.Impact == "serious" || v.Impact == "critical" {
			var at []string
			for _, n := range v.Nodes {
				at = append(at, n.HTML)
			}
			b.t.Errorf("axe %s: %s %s: %s\n  at %s", page, v.Impact, v.ID, v.Help, strings.Join(at, "\n  at "))
		}
	}
}

// open navigates to a console route, signed in through the URL fragment.
func (b *browser) open(route string) {
	b.t.Helper()
	b.do("open "+route, chromedp.Navigate(b.base+"#token="+url.QueryEscape(b.token)+"&next="+url.QueryEscape(route)))
}

// setField sets an input's or textarea's value as typing would (an input
// event follows).
func (b *browser) setField(sel, value string) {
	b.t.Helper()
	evalJS[bool](b, fmt.Sprintf(`(() => { const e = document.querySelector(%q); e.value = %q; e.dispatchEvent(new Event('input', {bubbles: true})); return true; })()`, sel, value))
}

// click waits for an enabled element and clicks it in the same
// evaluation: the run page redraws its rows as events arrive, so a node
// looked up first and clicked later may be gone.
func (b *browser) click(sel string) {
	b.t.Helper()
	b.wait("click "+sel, fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e || e.disabled) return false;
		if (e.click) e.click(); else e.dispatchEvent(new MouseEvent("click", {bubbles: true})); return true; })()`, sel))
}

// needRPC fails the test at once when the supervisor does not implement a
// call the console relies on (rather than timing out in the browser).
func needRPC(t *testing.T, name string, err error) {
	t.Helper()
	if status.Code(err) == codes.Unimplemented {
		t.Fatalf("the supervisor does not implement %s: %v", name, err)
	}
}

// TestConsoleOperations drives the console's operator pages in headless
// Chromium against a dev stack in this process: a search from URL
// parameters (and a saved view), the Raw and JSON tabs, a reset from a
// step of a failed run through the dialog (the step reruns after the
// "fix" and the run succeeds), a fork from a step with edited arguments,
// and a batch approval of the runs a label selects, with the dry run's
// count typed to confirm.
func TestConsoleOperations(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the dev stack and Chromium; skipped with -short")
	}
	testChromium(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	// The "broken tool": sql.query fails for Initech's count until the
	// test fixes it.
	var broken, lose atomic.Bool
	f := parseDevFlags(t, "--data-dir="+filepath.Join(t.TempDir(), "data"))
	f.services.ConsoleAddr = "127.0.0.1:0"
	// A policy gate on sql.exec, for the gate cards' rule, approvers and SLA.
	policy := filepath.Join(t.TempDir(), "ops.yaml")
	if err := os.WriteFile(policy, []byte(`name: ops
rules:
  - name: sql-exec-needs-approval
    when: step.tool == "sql.exec"
    action: require_approval
    reason: sql.exec changes the database
    approvers: ["role:admin", "role:operator"]
    gate_timeout: 4h
`), 0o600); err != nil {
		t.Fatal(err)
	}
	f.services.Policies = []string{policy}
	f.services.WrapTool = func(tool runner.Tool) runner.Tool {
		switch tool.Spec().GetName() {
		case "sql.exec":
			// The connection drops after the UPDATE was sent: nobody knows
			// whether the ticket was closed.
			return runner.FaultTool(tool, func(c runner.Call) runner.Fault {
				if lose.Load() && c.StepID == "close" {
					return runner.Fault{Err: &runner.Error{Code: planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN, Message: "injected: the connection dropped after the UPDATE was sent"}}
				}
				return runner.Fault{}
			})
		case "sql.query":
		default:
			return tool
		}
		return runner.FaultTool(tool, func(c runner.Call) runner.Fault {
			if broken.Load() && c.StepID == "count" && strings.Contains(c.Args.String(), "Initech") {
				return runner.Fault{Err: &runner.Error{Code: planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, Message: "injected: the tickets table is being migrated"}}
			}
			return runner.Fault{}
		})
	}
	stack, client := startTestDevStack(t.Context(), t, f, io.Discard)
	tok, err := os.ReadFile(stack.Credentials.CLITokenFile)
	if err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, stack.ConsoleURL, strings.TrimSpace(string(tok)))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	start := func(goal string, labels map[string]string) string {
		t.Helper()
		resp, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: goal, Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetRun().GetId()
	}
	is := func(s planexv1.RunStatus) func(*planexv1.Run) bool {
		return func(r *planexv1.Run) bool { return r.GetStatus() == s }
	}

	acme := start("How many open support tickets does Acme Corp have?", map[string]string{"team": "ops"})
	globexOps := start("How many open support tickets does Globex have?", map[string]string{"team": "ops"})
	globexBilling := start("How many open support tickets does Globex have?", map[string]string{"team": "billing"})
	for _, id := range []string{acme, globexOps, globexBilling} {
		waitForRun(ctx, t, client, id, is(planexv1.RunStatus_RUN_STATUS_SUCCEEDED))
	}

	t.Run("search from the URL", func(t *testing.T) {
		probe, err := client.ListRuns(ctx, &planexv1.ListRunsRequest{Filter: &planexv1.RunFilter{LabelSelector: "team=ops", GoalContains: "globex"}})
		needRPC(t, "ListRuns.filter", err)
		if err == nil && len(probe.GetRuns()) == 3 {
			t.Fatal("the supervisor ignores ListRunsRequest.filter")
		}
		b.t = t
		b.open("#/runs?goal=globex&selector=team%3Dops")
		b.wait("only the Globex run of team ops", fmt.Sprintf(`(() => { const r = [...document.querySelectorAll("#runs tbody tr[data-run-id]")]; return r.length === 1 && r[0].dataset.runId === %q; })()`, globexOps))
		if got := evalJS[[]string](b, `[document.querySelector("#f-goal").value, document.querySelector("#f-selector").value]`); got[0] != "globex" || got[1] != "team=ops" {
			t.Errorf("search form shows %q, want the URL's goal and selector", got)
		}
		// The form writes the search back into the URL.
		b.setField("#f-selector", "team in (ops, billing)")
		b.click(`#search button[type=submit]`)
		b.wait("both Globex runs", `document.querySelectorAll("#runs tbody tr[data-run-id]").length === 2 && new URLSearchParams(location.hash.split("?")[1]).get("selector") === "team in (ops, billing)"`)
		// A bad selector is refused at the field.
		b.setField("#f-selector", "team in (ops")
		b.click(`#search button[type=submit]`)
		b.wait("the selector error", `document.querySelector("#f-selector-error").textContent.includes("Label selector") && document.querySelector("#f-selector").getAttribute("aria-invalid") === "true"`)
		// A saved view comes back after a reload and opens its search.
		b.click(".views-panel summary")
		b.setField("#view-name", "globex, any team")
		b.click("#save-view")
		b.do("the runs page again", chromedp.Navigate(b.base+"#/runs"), chromedp.Reload())
		b.wait("every run listed", `document.querySelectorAll("#runs tbody tr[data-run-id]").length === 3`)
		b.click(".views-panel summary")
		b.click("#views a")
		b.wait("the saved search", `document.querySelectorAll("#runs tbody tr[data-run-id]").length === 2 && document.querySelector("#f-goal").value === "globex"`)
		b.shot("runs-search.png")
		b.axe("runs search")
	})

	t.Run("raw events and JSON", func(t *testing.T) {
		b.t = t
		w, err := client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: acme, FromSequence: 1})
		if err != nil {
			t.Fatal(err)
		}
		var events []*planexv1.RunEvent
		for {
			m, err := w.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			events = append(events, m.GetEvent())
		}
		b.open("#/runs/" + acme)
		b.click("#tab-raw")
		b.wait("every event in the Raw tab", fmt.Sprintf(`document.querySelectorAll("#raw-events tbody tr").length === %d && !document.querySelector("#panel-raw").hidden && document.querySelector("#panel-overview").hidden`, len(events)))
		last := events[len(events)-1]
		row := fmt.Sprintf(`#raw-events tbody tr[data-seq="%d"]`, last.GetSequence())
		got := evalJS[[]string](b, fmt.Sprintf(`(() => { const r = document.querySelector(%q); const h = r.querySelectorAll(".hash"); return [r.dataset.kind, h[0].title, h[1].title, h[1].textContent, r.querySelector("pre").textContent]; })()`, row))
		if want := hex.EncodeToString(last.GetHash()); got[2] != want || got[1] != hex.EncodeToString(last.GetPrevHash()) || got[0] != "finished" {
			t.Errorf("last raw row: kind %q prev %q hash %q; want finished, %x, %s", got[0], got[1], got[2], last.GetPrevHash(), want)
		}
		if !strings.HasSuffix(got[3], "…") || !strings.Contains(got[4], "RUN_STATUS_SUCCEEDED") {
			t.Errorf("last raw row: hash shown %q (want it shortened), payload %q", got[3], got[4])
		}
		b.do("focus the hash", chromedp.Focus(chromedp.CSS(row+" td:nth-child(5) .hash")))
		b.wait("the whole hash while focused", fmt.Sprintf(`document.activeElement.textContent === %q`, hex.EncodeToString(last.GetHash())))
		if first := evalJS[string](b, `document.querySelector("#raw-events tbody tr").dataset.kind`); first != "created" {
			t.Errorf("first raw row is %q, want created", first)
		}
		b.shot("run-raw.png")
		b.axe("raw events")
		b.click("#tab-json")
		var run planexv1.Run
		if err := protojson.Unmarshal([]byte(evalJS[string](b, `document.querySelector("#run-json").textContent`)), &run); err != nil || run.GetId() != acme || len(run.GetSteps()) != 2 {
			t.Errorf("JSON tab: %v, run %s with %d steps; want the run", err, run.GetId(), len(run.GetSteps()))
		}
	})

	t.Run("reset from a step of a failed run", func(t *testing.T) {
		b.t = t
		_, err := client.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: acme, Reason: "probe", DryRun: true})
		needRPC(t, "ResetRun", err)
		broken.Store(true)
		id := start("How many open support tickets does Initech have?", nil)
		failed := waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return r.GetFinishedAt() != nil })
		if failed.GetStatus() != planexv1.RunStatus_RUN_STATUS_FAILED {
			t.Fatalf("with the broken tool the run ended %s (%s), want FAILED", failed.GetStatus(), failed.GetStopMessage())
		}
		broken.Store(false) // the fix
		b.open("#/runs/" + id)
		b.wait("the failed step in the DAG", `document.querySelector('[data-current] g.node[data-step-id="count"]')?.dataset.status === "failed"`)
		b.click(`[data-current] g.node[data-step-id="count"]`)
		b.wait("the step selected", `document.querySelector('[data-current] g.node[data-step-id="count"]').classList.contains("selected")`)
		b.click("#reset-step")
		b.wait("the reset dialog", `document.querySelector("dialog[open] #op-reason")`)
		// No reason: refused at the field before any call.
		b.click("#op-preview")
		b.wait("the reason required", `document.querySelector("#op-reason-error").textContent.includes("reason")`)
		b.setField("#op-reason", "the tickets table migration is done")
		b.click("#op-preview")
		b.wait("the preview", `document.querySelector('#op-preview-out .rerun li[data-step-id="count"]') && document.querySelector('#op-preview-out .kept li[data-step-id="customers"]') && !document.querySelector("#op-confirm").disabled`)
		b.shot("run-reset-dialog.png")
		b.axe("reset dialog")
		b.click("#op-confirm")
		done := waitForRun(ctx, t, client, id, is(planexv1.RunStatus_RUN_STATUS_SUCCEEDED))
		if done.GetResets() != 1 || !strings.Contains(done.GetResult().GetStringValue(), "Initech has") {
			t.Errorf("after the reset: %d resets, result %q; want one reset and Initech's count", done.GetResets(), done.GetResult().GetStringValue())
		}
		b.wait("the run succeeded on its page, with the reset in its history", `document.querySelector("#run-status .badge")?.textContent === "succeeded" &&
			document.querySelector("#run-history li.reset") && document.querySelector("#run-history")?.textContent.includes("the tickets table migration is done")`)
	})

	t.Run("reset a run whose outcome is unknown", func(t *testing.T) {
		b.t = t
		_, err := client.ResetRun(ctx, &planexv1.ResetRunRequest{RunId: acme, Reason: "probe", DryRun: true})
		needRPC(t, "ResetRun", err)
		lose.Store(true)
		id := start("Close support ticket 400", nil)
		var gate string
		waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool {
			for _, g := range r.GetGates() {
				if g.GetStepId() == "close" && g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
					gate = g.GetId()
				}
			}
			return gate != ""
		})
		if _, err := client.Decide(ctx, &planexv1.DecideRequest{RunId: id, GateId: gate, Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE}); err != nil {
			t.Fatal(err)
		}
		stopped := waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return r.GetFinishedAt() != nil })
		lose.Store(false)
		if stopped.GetStopReason() != planexv1.StopReason_STOP_REASON_ESCALATED {
			t.Fatalf("with the lost outcome the run stopped %s (%s), want ESCALATED", stopped.GetStopReason(), stopped.GetStopMessage())
		}
		b.open("#/runs/" + id)
		b.click("#reset-run")
		b.wait("the decision asked for up front", `document.querySelector("dialog[open] #uo-close")`)
		b.setField("#op-reason", "the DBA checked: ticket 400 is closed")
		// Undecided, the supervisor refuses; the dialog says so there.
		b.click("#op-preview")
		b.wait("the refusal at the decisions", `document.querySelector("#op-unknown-error").textContent.includes("unknown")`)
		b.axe("reset dialog with an unknown outcome")
		// "Run it again": the close starts over, behind its gate again.
		evalJS[bool](b, `(() => { const s = document.querySelector("#uo-close"); s.value = "UNKNOWN_OUTCOME_ACTION_RETRY"; s.dispatchEvent(new Event("change", {bubbles: true})); return true; })()`)
		b.click("#op-preview")
		b.wait("the preview rerunning close", `document.querySelector('#op-preview-out .rerun li[data-step-id="close"]') && document.querySelector('#op-preview-out .kept li[data-step-id="ticket"]') && !document.querySelector("#op-confirm").disabled`)
		b.click("#op-confirm")
		var again string
		waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool {
			for _, g := range r.GetGates() {
				if g.GetStepId() == "close" && g.GetId() != gate && g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
					again = g.GetId()
				}
			}
			return again != ""
		})
		if _, err := client.Decide(ctx, &planexv1.DecideRequest{RunId: id, GateId: again, Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE}); err != nil {
			t.Fatal(err)
		}
		done := waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return r.GetFinishedAt() != nil && r.GetResets() == 1 })
		if done.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || !strings.HasPrefix(done.GetResult().GetStringValue(), "Closed support ticket 400") {
			t.Errorf("after the decision: %s %q, result %q; want the close run again and the run succeeded", done.GetStatus(), done.GetStopMessage(), done.GetResult().GetStringValue())
		}
		b.wait("the decision in the history", `document.querySelector("#run-history")?.textContent.includes("close retry")`)
	})

	t.Run("fork from a step with edited arguments", func(t *testing.T) {
		b.t = t
		_, err := client.ForkRun(ctx, &planexv1.ForkRunRequest{RunId: acme, Reason: "probe", DryRun: true})
		needRPC(t, "ForkRun", err)
		b.open("#/runs/" + acme)
		b.wait("the run's steps", `document.querySelector('#steps tr[data-step-id="count"]')`)
		b.click(`#step-count summary`)
		b.click(`#step-count button.fork-here`)
		b.wait("the fork dialog with the step's arguments", `document.querySelector("dialog[open] #op-args").value.includes("Acme Corp")`)
		b.setField("#op-reason", "the same count for Globex")
		// A schema violation is caught in the browser, at the field.
		b.setField("#op-args", `{"sql": 5}`)
		b.click("#op-preview")
		b.wait("the schema error at the arguments", `document.querySelector("#op-args-error").textContent.includes("args.sql: want string") && document.querySelector("#op-args").getAttribute("aria-invalid") === "true"`)
		b.setField("#op-args", strings.ReplaceAll(evalJS[string](b, `document.querySelector("#op-args").defaultValue`), "Acme Corp", "Globex"))
		b.click("#op-preview")
		b.wait("the preview", `document.querySelector('#op-preview-out .rerun li[data-step-id="count"]') && document.querySelector('#op-preview-out .kept li[data-step-id="customers"]')`)
		b.click("#op-confirm")
		b.wait("the fork's page", fmt.Sprintf(`location.hash.startsWith("#/runs/") && !location.hash.endsWith(%q) && document.querySelector("#forked-from-link")`, acme))
		forkID := strings.TrimPrefix(evalJS[string](b, `decodeURIComponent(location.hash)`), "#/runs/")
		fork := waitForRun(ctx, t, client, forkID, is(planexv1.RunStatus_RUN_STATUS_SUCCEEDED))
		if fork.GetForkedFrom().GetRunId() != acme || !strings.HasPrefix(fork.GetResult().GetStringValue(), "Globex has") {
			t.Errorf("fork: from %q, result %q; want a fork of %s answering for Globex", fork.GetForkedFrom().GetRunId(), fork.GetResult().GetStringValue(), acme)
		}
		b.wait("the link back to the original", fmt.Sprintf(`document.querySelector("#forked-from-link").getAttribute("href") === "#/runs/" + %q`, acme))
		b.open("#/runs/" + acme)
		b.wait("the fork linked from the original", fmt.Sprintf(`[...document.querySelectorAll("#run-history a.fork-link")].some((a) => a.textContent === %q)`, forkID))
	})

	t.Run("batch approve by label", func(t *testing.T) {
		b.t = t
		st, err := client.RunBatch(ctx, &planexv1.RunBatchRequest{Filter: &planexv1.RunFilter{LabelSelector: "batch=b1"}, Operation: &planexv1.RunBatchRequest_Cancel{Cancel: &planexv1.BatchCancel{}}, DryRun: true})
		if err == nil {
			_, err = st.Recv()
		}
		needRPC(t, "RunBatch", err)
		var picked []string
		for _, n := range []int{410, 412, 414} {
			picked = append(picked, start(fmt.Sprintf("Close support ticket %d", n), map[string]string{"batch": "b1"}))
		}
		other := start("Close support ticket 415", map[string]string{"batch": "b2"})
		for _, id := range append(picked, other) {
			waitForRun(ctx, t, client, id, is(planexv1.RunStatus_RUN_STATUS_WAITING))
		}
		// Each gate card shows its rule, approvers, SLA counting down, and
		// the SQL it would run.
		b.open("#/gates")
		card := fmt.Sprintf(`article.gate[data-run-id=%q]`, picked[0])
		b.wait("the gate card", fmt.Sprintf(`document.querySelector(%q)`, card+" .sla-left"))
		facts := evalJS[[]string](b, fmt.Sprintf(`(() => { const c = document.querySelector(%q); return [c.querySelector(".gate-rule").textContent, c.querySelector(".gate-approvers").textContent,
			c.querySelector(".sla-left").textContent, c.querySelector('[data-arg="sql"] code.language-sql').textContent]; })()`, card))
		if facts[0] != "ops · sql-exec-needs-approval" || facts[1] != "role:admin, role:operator" || !regexp.MustCompile(`^(3h 59m|4h 00m) \d\ds left$`).MatchString(facts[2]) || !strings.Contains(facts[3], "UPDATE support_tickets") {
			t.Errorf("gate card: rule %q, approvers %q, SLA %q, SQL %q", facts[0], facts[1], facts[2], facts[3])
		}
		b.shot("gates-policy.png")
		b.wait("the SLA counting down", fmt.Sprintf(`document.querySelector(%q).textContent !== %q`, card+" .sla-left", facts[2]))

		b.open("#/runs?selector=batch%3Db1")
		b.wait("the three runs", `document.querySelectorAll("#runs tbody tr[data-run-id]").length === 3`)
		b.click("#batch-approve")
		b.wait("the dry run's count", `document.querySelector("#batch-count").dataset.count === "3" && document.querySelectorAll("#batch-sample li a").length === 3`)
		b.setField("#batch-reason", "release 5.2 approved by the change board")
		b.setField("#batch-confirm", "2")
		b.click("#batch-run")
		b.wait("a wrong count refused at the field", `document.querySelector("#batch-confirm-error").textContent.includes("Type 3")`)
		b.setField("#batch-confirm", "3")
		b.click("#batch-run")
		b.wait("the batch finished", `document.querySelector("#batch-status").dataset.finished === "1" && document.querySelector("#batch-status").dataset.done === "3" && document.querySelector("#batch-status").dataset.failed === "0"`)
		b.shot("runs-batch.png")
		for _, id := range picked {
			r := waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return r.GetFinishedAt() != nil })
			if r.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
				t.Fatalf("run %s after the batch approval: %s %s", id, r.GetStatus(), r.GetStopMessage())
			}
			if g := r.GetGates(); len(g) == 0 || !strings.HasSuffix(g[0].GetComment(), "release 5.2 approved by the change board") || !strings.HasPrefix(g[0].GetDecidedVia(), "batch console-") {
				t.Errorf("run %s: gates %v, want the batch's reason as the comment, decided via the console's batch", id, g)
			}
		}
		if r, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: other}); err != nil || r.GetRun().GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING {
			t.Errorf("the run outside the selector: %v %v, want it still waiting", r.GetRun().GetStatus(), err)
		}
	})
}

// TestDevConsoleAddr: the console's address in `planex dev`: the default
// 127.0.0.1:7480, a free port when it is taken (said in the banner) or
// when the supervisor is not on its default address, as given with
// --console-addr, and off with --no-console or an empty --console-addr.
func TestDevConsoleAddr(t *testing.T) {
	// Hold 7480 (or find it held already): the default falls back.
	if l, err := net.Listen("tcp", defaultDevConsoleAddr); err == nil {
		defer l.Close()
	}
	addr, note := devConsoleAddr(defaultDevConsoleAddr, false, false, defaultDevGRPCAddr)
	if addr != "127.0.0.1:0" || !strings.Contains(note, "127.0.0.1:7480 is taken") {
		t.Errorf("default with 7480 taken: %q %q, want a free port and a note saying so", addr, note)
	}
	for _, tt := range []struct {
		flag      string
		set, off  bool
		grpc      string
		want      string
		wantEmpty bool
	}{
		{flag: defaultDevConsoleAddr, grpc: "127.0.0.1:0", want: "127.0.0.1:0"},
		{flag: "127.0.0.1:9999", set: true, grpc: defaultDevGRPCAddr, want: "127.0.0.1:9999"},
		{flag: "", set: true, grpc: defaultDevGRPCAddr, want: ""},
		{flag: defaultDevConsoleAddr, off: true, grpc: defaultDevGRPCAddr, want: ""},
	} {
		if got, note := devConsoleAddr(tt.flag, tt.set, tt.off, tt.grpc); got != tt.want || note != "" {
			t.Errorf("devConsoleAddr(%q, set %v, off %v, %q) = %q %q, want %q", tt.flag, tt.set, tt.off, tt.grpc, got, note, tt.want)
		}
	}
}

// TestDevServesTheConsoleByDefault runs `planex dev` as a user does: the
// banner prints the console's URL with the dev CLI's token in the
// fragment, the console serves it, and Chromium opening that one URL is
// signed in (the runs page, no sign-in form, the token gone from the
// address bar). With --no-console there is no console line.
func TestDevServesTheConsoleByDefault(t *testing.T) {
	if testing.Short() {
		t.Skip("runs planex dev; skipped with -short")
	}
	dev := func(t *testing.T, extra ...string) (map[string]string, string) {
		data := filepath.Join(t.TempDir(), "data")
		cmd := exec.Command(planexBin, append([]string{"dev", "--data-dir", data, "--grpc-addr", "127.0.0.1:0", "--mcp-addr", ""}, extra...)...)
		cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		banner := map[string]string{}
		done := make(chan error, 1)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if f := strings.Fields(sc.Text()); len(f) >= 2 {
					banner[f[0]] = f[1]
				}
				if strings.HasPrefix(sc.Text(), "Ctrl-C stops") {
					done <- nil
					_, _ = io.Copy(io.Discard, out)
					return
				}
			}
			done <- fmt.Errorf("planex dev ended its output before the banner: %v", sc.Err())
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("planex dev printed no banner within 60s")
		}
		return banner, data
	}

	t.Run("default", func(t *testing.T) {
		banner, data := dev(t)
		link := banner["console"]
		base, frag, ok := strings.Cut(link, "#token=")
		if !ok {
			t.Fatalf("console line %q: want the URL with #token=", link)
		}
		tok, err := os.ReadFile(filepath.Join(data, "credentials", "cli.token"))
		if err != nil {
			tok, err = os.ReadFile(banner["credentials"] + "/cli.token")
		}
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := url.QueryUnescape(frag); got != strings.TrimSpace(string(tok)) {
			t.Errorf("the URL's token %q is not the dev CLI's", got)
		}
		resp, err := http.Get(base)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", base, resp.Status)
		}
		b := newBrowser(t, base, "")
		b.do("open the banner's URL", chromedp.Navigate(link))
		b.wait("the runs page, signed in", `document.querySelector("#runs tbody") && !document.querySelector("#token") && !location.hash.includes("token")`)
	})

	t.Run("--no-console", func(t *testing.T) {
		banner, _ := dev(t, "--no-console")
		if c, ok := banner["console"]; ok {
			t.Errorf("--no-console: the banner has a console line %q", c)
		}
	})
}
