package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/oidctest"
)

// TestConsoleOperatorAcceptance is issue 30's acceptance test, in one
// Chromium session against the SSO stack (TLS supervisor, planner with the
// gated playbook, sql executor, `planex console`): an operator signs in
// through the OIDC provider, searches, opens a run, resets it from a step,
// approves the gates of a batch of 10 runs selected by label, and sees them
// finish. The runs are started by the runner API key "rita", so the
// operator's approvals are not self-approvals.
func TestConsoleOperatorAcceptance(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a process stack and Chromium; skipped with -short")
	}
	chromium := testChromium(t)
	olga := oidctest.User{Name: "olga", Password: "operator-pw", Roles: []string{"operator"}, DisplayName: "Olga Operator"}
	st := startSSOStack(t, olga)

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	start := func(goal string, labels map[string]string) string {
		t.Helper()
		resp, err := st.client.StartRun(ctx, &planexv1.StartRunRequest{Goal: goal, Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetRun().GetId()
	}
	is := func(s planexv1.RunStatus) func(*planexv1.Run) bool {
		return func(r *planexv1.Run) bool { return r.GetStatus() == s }
	}

	// The run to repair and a run the search must leave out.
	acme := start("Carefully count the open tickets of Acme Corp", map[string]string{"acceptance": "reset"})
	other := start("Carefully count the open tickets of Globex", map[string]string{"acceptance": "other"})
	for _, id := range []string{acme, other} {
		waitForRun(ctx, t, st.client, id, is(planexv1.RunStatus_RUN_STATUS_WAITING))
	}

	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1280, 900), chromedp.Flag("lang", "en-US"))...)
	t.Cleanup(cancelAlloc)
	tab, closeTab := chromedp.NewContext(actx)
	t.Cleanup(closeTab)
	if err := chromedp.Do(tab, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	b := &ssoBrowser{t: t, tab: tab}
	// click waits for an enabled element and clicks it in the same
	// evaluation (pages redraw as they poll); SVG nodes get a click event.
	click := func(sel string) {
		t.Helper()
		b.waitJS("click "+sel, fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e || e.disabled) return false;
			if (e.click) e.click(); else e.dispatchEvent(new MouseEvent("click", {bubbles: true})); return true; })()`, sel))
	}
	// setField sets a field's value as typing would (an input event follows).
	setField := func(sel, value string) {
		t.Helper()
		b.waitJS("fill "+sel, fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e) return false; e.value = %q; e.dispatchEvent(new Event('input', {bubbles: true})); return true; })()`, sel, value))
	}
	// approveOnGatesPage approves run id's open gate with its card's
	// Approve button, from the run page's "Decide … open gate" link.
	approveOnGatesPage := func(id string) {
		t.Helper()
		b.waitJS("the run page of "+id, fmt.Sprintf(`location.hash === "#/runs/" + %q`, id))
		click("#decide-link")
		card := fmt.Sprintf(`article.gate[data-run-id=%q]`, id)
		b.waitJS("the gate card", fmt.Sprintf(`location.hash.startsWith("#/gates?run=") && document.querySelectorAll("article.gate").length === 1 && document.querySelector(%q)`, card))
		click(card + " button.approve")
		b.waitJS("the gate approved", fmt.Sprintf(`document.querySelector(%q)?.dataset.decided === "DECISION_KIND_APPROVE"`, card))
	}

	// 1. Sign in through the provider as the operator.
	b.do("open the console", chromedp.Navigate(st.consoleURL))
	b.waitJS("the SSO button", `document.querySelector("#sso-signin")?.textContent === "Sign in with Test IdP"`)
	b.signIn(olga)
	b.waitJS("the sign-out button naming olga", `(() => { const b = document.querySelector("#signout"); return b && !b.hidden && b.dataset.user === "olga"; })()`)

	// The first run's gate, approved from its page.
	b.do("open the run", chromedp.Navigate(st.consoleURL+"#/runs/"+acme))
	approveOnGatesPage(acme)
	first := waitForRun(ctx, t, st.client, acme, is(planexv1.RunStatus_RUN_STATUS_SUCCEEDED))
	if got := first.GetGates()[0].GetDecidedBy(); got != "jwt:"+st.idp.Issuer+":olga" {
		t.Fatalf("gate decided by %q, want olga's JWT identity", got)
	}

	// 2. Search: the goal word and the label selector pick exactly the
	// Acme run.
	b.do("the runs page", chromedp.Navigate(st.consoleURL+"#/runs"))
	b.waitJS("both runs listed", `document.querySelectorAll("#runs tbody tr[data-run-id]").length === 2`)
	setField("#f-goal", "acme")
	setField("#f-selector", "acceptance in (reset, other)")
	click(`#search button[type=submit]`)
	b.waitJS("only the Acme run, succeeded", fmt.Sprintf(`(() => { const r = [...document.querySelectorAll("#runs tbody tr[data-run-id]")];
		return r.length === 1 && r[0].dataset.runId === %q && r[0].querySelector(".badge")?.textContent === "succeeded" &&
			new URLSearchParams(location.hash.split("?")[1]).get("goal") === "acme"; })()`, acme))

	// 3. Open it and reset it from the count step through the dialog.
	click(fmt.Sprintf(`#runs tbody a[href="#/runs/%s"]`, acme))
	b.waitJS("the succeeded step in the DAG", `document.querySelector('[data-current] g.node[data-step-id="count"]')?.dataset.status === "succeeded"`)
	click(`[data-current] g.node[data-step-id="count"]`)
	b.waitJS("the step selected", `document.querySelector('[data-current] g.node[data-step-id="count"]').classList.contains("selected")`)
	click("#reset-step")
	b.waitJS("the reset dialog", `document.querySelector("dialog[open] #op-reason")`)
	setField("#op-reason", "the ticket counts were reloaded from the backup")
	click("#op-preview")
	b.waitJS("the preview rerunning count", `document.querySelector('#op-preview-out .rerun li[data-step-id="count"]') && !document.querySelector("#op-confirm").disabled`)
	click("#op-confirm")
	// The step is gated: the reset opens a new gate, approved like the first.
	waitForRun(ctx, t, st.client, acme, func(r *planexv1.Run) bool {
		return r.GetResets() == 1 && r.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING
	})
	b.do("the run page again", chromedp.Navigate(st.consoleURL+"#/runs/"+acme))
	approveOnGatesPage(acme)
	reset := waitForRun(ctx, t, st.client, acme, func(r *planexv1.Run) bool { return r.GetFinishedAt() != nil && r.GetResets() == 1 })
	if reset.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || !strings.HasSuffix(reset.GetResult().GetStringValue(), " open tickets") || len(reset.GetGates()) != 2 {
		t.Fatalf("after the reset: %s (%s), %d resets, %d gates, result %q; want SUCCEEDED, 1 reset, 2 gates and a count",
			reset.GetStatus(), reset.GetStopMessage(), reset.GetResets(), len(reset.GetGates()), reset.GetResult().GetStringValue())
	}
	b.do("the reset run's page", chromedp.Navigate(st.consoleURL+"#/runs/"+acme))
	b.waitJS("the run succeeded on its page, with the reset in its history", `document.querySelector("#run-status .badge")?.textContent === "succeeded" &&
		document.querySelector("#run-history li.reset") && document.querySelector("#run-history").textContent.includes("the ticket counts were reloaded from the backup")`)

	// 4. Ten runs behind their gates, approved as a batch by label.
	customers := []string{"Acme Corp", "Globex", "Initech", "Umbrella", "Hooli", "Stark Industries", "Wayne Enterprises", "Wonka", "Tyrell", "Cyberdyne"}
	batch := make([]string, 0, len(customers))
	for _, c := range customers {
		batch = append(batch, start("Carefully count the open tickets of "+c, map[string]string{"acceptance": "batch-1"}))
	}
	for _, id := range batch {
		waitForRun(ctx, t, st.client, id, is(planexv1.RunStatus_RUN_STATUS_WAITING))
	}
	b.do("the runs page", chromedp.Navigate(st.consoleURL+"#/runs"))
	b.waitJS("every run listed", `document.querySelectorAll("#runs tbody tr[data-run-id]").length === 12`)
	setField("#f-goal", "")
	setField("#f-selector", "acceptance=batch-1")
	click(`#search button[type=submit]`)
	inBatch := fmt.Sprintf(`new Set(%s)`, jsStrings(batch))
	b.waitJS("the ten runs, waiting", fmt.Sprintf(`(() => { const want = %s; const r = [...document.querySelectorAll("#runs tbody tr[data-run-id]")];
		return r.length === 10 && r.every((x) => want.has(x.dataset.runId) && x.querySelector(".badge")?.textContent === "waiting"); })()`, inBatch))
	click("#batch-approve")
	b.waitJS("the dry run's count", `document.querySelector("#batch-count")?.dataset.count === "10" && !document.querySelector("#batch-run").disabled`)
	setField("#batch-reason", "change 4711 approved by the change board")
	setField("#batch-confirm", "10")
	click("#batch-run")
	b.waitJS("the batch finished", `(() => { const s = document.querySelector("#batch-status").dataset; return s.finished === "1" && s.done === "10" && s.failed === "0"; })()`)
	if got := b.eval(`document.querySelector("#batch-status").textContent`); !strings.HasPrefix(got, "10 of 10 done, 0 failed") {
		t.Errorf("batch progress says %q, want 10 of 10 done, 0 failed", got)
	}

	// 5. They finish: all ten succeeded, in the API and in the page's list.
	for _, id := range batch {
		r := waitForRun(ctx, t, st.client, id, func(r *planexv1.Run) bool { return r.GetFinishedAt() != nil })
		if r.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
			t.Fatalf("run %s after the batch approval: %s %s", id, r.GetStatus(), r.GetStopMessage())
		}
		g := r.GetGates()
		if len(g) != 1 || g[0].GetDecidedBy() != "jwt:"+st.idp.Issuer+":olga" || !strings.HasSuffix(g[0].GetComment(), "change 4711 approved by the change board") {
			t.Errorf("run %s: gates %v, want one decided by olga with the batch's reason", id, g)
		}
	}
	b.waitJS("the ten runs succeeded in the list", fmt.Sprintf(`(() => { const want = %s; const r = [...document.querySelectorAll("#runs tbody tr[data-run-id]")];
		return r.length === 10 && r.every((x) => want.has(x.dataset.runId) && x.querySelector(".badge")?.textContent === "succeeded"); })()`, inBatch))
	if r, err := st.client.GetRun(ctx, &planexv1.GetRunRequest{RunId: other}); err != nil || r.GetRun().GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING {
		t.Errorf("the run outside the searches: %v %v, want it still waiting", r.GetRun().GetStatus(), err)
	}
}

// jsStrings is ss as a JavaScript array literal.
func jsStrings(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
