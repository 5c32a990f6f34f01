package consoletest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/planex-dev/planex/cmd/internal/devstack"
	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// demoGoals are the five goals of the demo playbooks that succeed without
// a human (docs/deploy.md).
var demoGoals = []string{
	"How many open support tickets does Acme Corp have?",
	"Compare revenue and open tickets for Acme Corp and Globex",
	"What is the average order value by region in 2025?",
	"Send the runbook for failed payment retries to oncall@example.com",
	"Email the account team a summary of the top 5 customers by revenue in 2025",
}

// chromiumPath finds Chromium: PLANEX_TEST_CHROMIUM, else chromium or
// chromium-browser on PATH.
func chromiumPath(t *testing.T) string {
	if p := os.Getenv("PLANEX_TEST_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no Chromium: install Debian's chromium package (.ci/run does) or set PLANEX_TEST_CHROMIUM")
	return ""
}

// axeSource reads axe.min.js from PLANEX_TEST_AXE (an npm prefix) or
// ~/.cache/planex/axe.
func axeSource(t *testing.T) string {
	dir := os.Getenv("PLANEX_TEST_AXE")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "planex", "axe")
	}
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", "axe-core", "axe.min.js"))
	if err != nil {
		t.Skipf("no axe-core (%v): npm install --prefix %s axe-core (.ci/run does) or set PLANEX_TEST_AXE", err, dir)
	}
	return string(b)
}

// artifacts is where screenshots go: $PLANEX_ARTIFACTS/console, else a
// directory kept after the test (its path is logged).
func artifacts(t *testing.T) string {
	base := os.Getenv("PLANEX_ARTIFACTS")
	if base == "" {
		base = filepath.Join(os.TempDir(), "planex-artifacts")
	}
	dir := filepath.Join(base, "console")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

type harness struct {
	t       *testing.T
	stack   *devstack.Stack
	client  planexv1.SupervisorServiceClient
	token   string
	base    string
	axe     string
	art     string
	timeout time.Duration
}

func startStack(t *testing.T) (*devstack.Stack, planexv1.SupervisorServiceClient, string) {
	// A tracer provider, as planex dev sets up, so that runs have trace ids
	// for the Jaeger link.
	tp := sdktrace.NewTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var opts devstack.ServiceOptions
	opts.RegisterFlags(pflag.NewFlagSet("dev", pflag.ContinueOnError))
	opts.ConsoleAddr = "127.0.0.1:0"
	opts.JaegerURL = "http://127.0.0.1:16686"
	stack, err := devstack.Start(t.Context(), devstack.Config{
		DataDir:  t.TempDir(),
		GRPCAddr: "127.0.0.1:0",
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Services: opts,
		Command:  "dev",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stack.Stop(); err != nil {
			t.Errorf("stop dev stack: %v", err)
		}
	})
	tok, err := os.ReadFile(stack.Credentials.CLITokenFile)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tok))
	r, err := tlsconfig.NewReloader(tlsconfig.Files{CAFile: stack.Credentials.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(stack.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsconfig.ClientConfig(r, ""))),
		grpc.WithPerRPCCredentials(authn.Bearer(token)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return stack, planexv1.NewSupervisorServiceClient(conn), token
}

// newTab opens a browser tab; the first call starts the browser.
func newTab(t *testing.T, parent context.Context) context.Context {
	ctx, cancel := chromedp.NewContext(parent)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	return ctx
}

// do runs browser actions with a deadline.
func (h *harness) do(ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	h.t.Helper()
	tctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	if err := chromedp.Do(tctx, actions...); err != nil {
		h.t.Fatalf("%s: %v\n%s", what, err, pageText(ctx))
	}
}

// eval evaluates a JavaScript expression (promises awaited).
func eval[T any](h *harness, ctx context.Context, expr string) T {
	h.t.Helper()
	tctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	v, err := chromedp.Run(tctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		h.t.Fatalf("evaluate %.80q: %v\n%s", expr, err, pageText(ctx))
	}
	return v
}

// waitJS waits until expr is truthy in the page.
func (h *harness) waitJS(ctx context.Context, what, expr string) {
	h.t.Helper()
	tctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	if _, err := chromedp.Run(tctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(h.timeout))); err != nil {
		h.t.Fatalf("waiting for %s (%s): %v\n%s", what, expr, err, pageText(ctx))
	}
}

// pageText is the visible text of the page, for failure messages.
func pageText(ctx context.Context) string {
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	s, err := chromedp.Run(tctx, chromedp.Evaluate[string](`location.hash + "\nfocus: " + (document.activeElement ? document.activeElement.outerHTML.slice(0, 200) : "none") + "\n" + document.body.innerText.slice(0, 3000)`))
	if err != nil {
		return "(page text unavailable: " + err.Error() + ")"
	}
	return "page:\n" + s
}

// open navigates a tab to a console route, signing in through the URL
// fragment as `planex dev` users can.
func (h *harness) open(ctx context.Context, route string) {
	h.t.Helper()
	h.do(ctx, "open "+route, chromedp.Navigate(h.base+"#token="+url.QueryEscape(h.token)+"&next="+url.QueryEscape(route)))
}

func (h *harness) screenshot(ctx context.Context, name string) {
	h.t.Helper()
	tctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		h.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(h.art, name), png, 0o640); err != nil {
		h.t.Fatal(err)
	}
}

// axeCheck runs axe-core on the page and fails on serious or critical
// violations.
func (h *harness) axeCheck(ctx context.Context, page string) {
	h.t.Helper()
	if !eval[bool](h, ctx, `typeof axe !== "undefined"`) {
		eval[bool](h, ctx, h.axe+";true")
	}
	type violation struct {
		ID     string `json:"id"`
		Impact string `json:"impact"`
		Help   string `json:"help"`
		Nodes  []struct {
			Target []any  `json:"target"`
			HTML   string `json:"html"`
		} `json:"nodes"`
	}
	vs := eval[[]violation](h, ctx, `axe.run(document, {resultTypes: ["violations"]}).then(r => r.violations)`)
	for _, v := range vs {
		if v.Impact != "serious" && v.Impact != "critical" {
			h.t.Logf("axe %s (%s): %s: %s", page, v.Impact, v.ID, v.Help)
			continue
		}
		var where []string
		for _, n := range v.Nodes {
			where = append(where, fmt.Sprint(n.Target)+" "+n.HTML)
		}
		h.t.Errorf("axe %s: %s violation %s: %s\n  at %s", page, v.Impact, v.ID, v.Help, strings.Join(where, "\n  at "))
	}
}

// waitRun polls the supervisor until cond holds for the run.
func (h *harness) waitRun(id, what string, cond func(*planexv1.Run) bool) *planexv1.Run {
	h.t.Helper()
	deadline := time.Now().Add(h.timeout)
	for {
		resp, err := h.client.GetRun(h.t.Context(), &planexv1.GetRunRequest{RunId: id})
		if err != nil {
			h.t.Fatalf("GetRun %s: %v", id, err)
		}
		if cond(resp.GetRun()) {
			return resp.GetRun()
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("run %s (%s): not %s within %s; status %s, stop %s", id, resp.GetRun().GetGoal(), what, h.timeout, resp.GetRun().GetStatus(), resp.GetRun().GetStopMessage())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func hasStatus(s planexv1.RunStatus) func(*planexv1.Run) bool {
	return func(r *planexv1.Run) bool { return r.GetStatus() == s }
}

// cssStatus is the console's name of a step status ("waiting-approval").
func cssStatus(s planexv1.StepStatus) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.String(), "STEP_STATUS_")), "_", "-")
}

// startFromForm starts a run through the runs page's form and returns its
// id (the console opens the run page).
func (h *harness) startFromForm(ctx context.Context, goal string) string {
	h.t.Helper()
	h.do(ctx, "runs page", chromedp.Navigate(h.base+"#/runs"), chromedp.WaitVisible(chromedp.CSS("#goal")))
	h.do(ctx, "start "+goal, chromedp.SetValue(chromedp.CSS("#goal"), goal), chromedp.Click(chromedp.CSS("#start-run button[type=submit]")))
	h.waitJS(ctx, "the run page", `location.hash.startsWith("#/runs/") && document.querySelector("#run-meta dd")`)
	hash := eval[string](h, ctx, `location.hash`)
	id, err := url.PathUnescape(strings.TrimPrefix(hash, "#/runs/"))
	if err != nil {
		h.t.Fatal(err)
	}
	return id
}

// checkDAG compares the current revision's DAG on the run page with the
// supervisor's step states.
func (h *harness) checkDAG(ctx context.Context, run *planexv1.Run) {
	h.t.Helper()
	plan := run.GetPlans()[len(run.GetPlans())-1]
	want := stepStatuses(run, plan)
	js := `Object.fromEntries([...document.querySelectorAll("[data-current] svg.dag g.node")].map(g => [g.dataset.stepId, g.dataset.status]))`
	var got map[string]string
	deadline := time.Now().Add(h.timeout)
	for {
		got = eval[map[string]string](h, ctx, js)
		if fmt.Sprint(got) == fmt.Sprint(want) {
			break
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("run %s (%s): DAG nodes %v, want %v", run.GetId(), run.GetGoal(), got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	edges := eval[int](h, ctx, `document.querySelectorAll("[data-current] svg.dag path.edge").length`)
	wantEdges := 0
	for _, s := range plan.GetSteps() {
		wantEdges += len(s.GetDependsOn())
	}
	if edges != wantEdges {
		h.t.Errorf("run %s: %d edges drawn, want %d (one per dependency)", run.GetId(), edges, wantEdges)
	}
}

// stepStatuses are the states of plan's steps: the latest state recorded
// in the plan's revision or kept from an earlier one; a step the revision
// added or changed has none before it (pending).
func stepStatuses(run *planexv1.Run, plan *planexv1.Plan) map[string]string {
	l := plan.GetLineage()
	out := map[string]string{}
	for _, s := range plan.GetSteps() {
		fresh := l.GetPreviousRevision() > 0 && (slices.Contains(l.GetAdded(), s.GetId()) || slices.Contains(l.GetChanged(), s.GetId()))
		var best *planexv1.StepState
		for _, st := range run.GetSteps() {
			rev := max(st.GetPlanRevision(), 1)
			if st.GetStepId() != s.GetId() || rev > plan.GetRevision() || (fresh && rev != plan.GetRevision()) {
				continue
			}
			if best == nil || rev >= max(best.GetPlanRevision(), 1) {
				best = st
			}
		}
		out[s.GetId()] = "pending"
		if best != nil {
			out[s.GetId()] = cssStatus(best.GetStatus())
		}
	}
	return out
}

// gateSel selects the gate card of a run.
func gateSel(runID string) string { return fmt.Sprintf(`article.gate[data-run-id=%q]`, runID) }

func TestConsole(t *testing.T) {
	chromium := chromiumPath(t)
	axe := axeSource(t)
	stack, client, token := startStack(t)
	h := &harness{t: t, stack: stack, client: client, token: token, base: stack.ConsoleURL, axe: axe, art: artifacts(t), timeout: 30 * time.Second}

	allocOpts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 800), chromedp.Flag("lang", "en-US"))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), allocOpts...)
	t.Cleanup(cancel)
	tab := newTab(t, actx)

	// Without a token, the supervisor refuses the console's calls and the
	// page asks for one; a wrong one is refused at the field.
	h.do(tab, "console without a token", chromedp.Navigate(h.base), chromedp.WaitVisible(chromedp.CSS("#token")))
	h.do(tab, "wrong token", chromedp.SetValue(chromedp.CSS("#token"), "planex_wrong"), chromedp.Click(chromedp.CSS("form button[type=submit]")))
	h.waitJS(tab, "the refusal at the token field", `document.querySelector("#token-error") && document.querySelector("#token-error").textContent.includes("valid token")`)
	h.do(tab, "sign in", chromedp.SetValue(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("form button[type=submit]")))
	h.waitJS(tab, "the runs table", `document.querySelector("#runs tbody")`)

	// The five demo goals, started from the runs page: each DAG shows the
	// supervisor's step states.
	var compareRun string
	var replanned []string
	for _, goal := range demoGoals {
		id := h.startFromForm(tab, goal)
		run := h.waitRun(id, "succeeded", hasStatus(planexv1.RunStatus_RUN_STATUS_SUCCEEDED))
		h.waitJS(tab, "succeeded on the run page", `document.querySelector("#run-status .badge").textContent === "succeeded"`)
		h.checkDAG(tab, run)
		h.waitJS(tab, "the result", `document.querySelector("#run-result pre")`)
		h.waitJS(tab, "the finished event in the timeline", `document.querySelector("#timeline li[data-kind=finished]")`)
		if strings.HasPrefix(goal, "Compare") {
			compareRun = id
		}
		if len(run.GetPlans()) > 1 {
			// A replan: every revision has its DAG, the earlier ones with
			// the states they ended in, and the lineage is spelled out.
			replanned = append(replanned, id)
			h.waitJS(tab, "every revision drawn", fmt.Sprintf(`document.querySelectorAll("#plans .revision svg.dag").length === %d`, len(run.GetPlans())))
			first := run.GetPlans()[0]
			js := fmt.Sprintf(`Object.fromEntries([...document.querySelectorAll('#plans .revision[data-revision="%d"] g.node')].map(g => [g.dataset.stepId, g.dataset.status]))`, max(first.GetRevision(), 1))
			if got, want := eval[map[string]string](h, tab, js), stepStatuses(run, first); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("run %s revision 1 DAG: %v, want %v", id, got, want)
			}
			h.waitJS(tab, "the lineage", `document.querySelector("#plans").textContent.includes("Replan of revision 1")`)
			eval[bool](h, tab, `document.querySelectorAll("#plans details.revision").forEach(d => { d.open = true; }); true`)
			h.screenshot(tab, "run-replan.png")
		}
	}

	if len(replanned) == 0 {
		t.Errorf("no demo goal replanned: the replan view went unchecked")
	}

	// Run detail: Jaeger link, step details, times in the viewer's zone.
	h.do(tab, "Tokyo time zone", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, emulation.SetTimezoneOverride, emulation.SetTimezoneOverrideParams{TimezoneID: "Asia/Tokyo"})
		return err
	}))
	h.do(tab, "compare run page", chromedp.Navigate(h.base+"#/runs/"+compareRun), chromedp.Reload())
	h.waitJS(tab, "the compare run's DAG", `document.querySelectorAll("[data-current] svg.dag g.node[data-status=succeeded]").length === 6`)
	if href := eval[string](h, tab, `document.querySelector("#trace-link").href`); !strings.HasPrefix(href, "http://127.0.0.1:16686/trace/") {
		t.Errorf("trace link %q: want the Jaeger UI's /trace/<id>", href)
	}
	zoneOK := eval[bool](h, tab, `(() => { const t = document.querySelector("#run-meta time"); const d = new Date(t.dateTime);
		const f = (tz) => new Intl.DateTimeFormat(undefined, {dateStyle: "medium", timeStyle: "medium", timeZone: tz}).format(d);
		return t.textContent === f("Asia/Tokyo") && t.textContent !== f("UTC"); })()`)
	if !zoneOK {
		t.Errorf("run page times are not in the viewer's time zone (Asia/Tokyo)")
	}
	// Keyboard: focus a DAG node, Enter opens that step's details.
	h.do(tab, "focus node", chromedp.Focus(chromedp.CSS(`[data-current] g.node[data-step-id="summary"]`)), chromedp.KeyEvent("\r"))
	h.waitJS(tab, "the step's details opened by keyboard", `document.querySelector("#step-summary").open && document.activeElement.closest("#step-summary")`)
	h.screenshot(tab, "run.png")
	h.axeCheck(tab, "run detail")

	// Tools catalog with schemas.
	h.do(tab, "tools page", chromedp.Navigate(h.base+"#/tools"))
	h.waitJS(tab, "sql.exec in the catalog", `document.querySelector('article[data-tool="sql.exec"] details pre')`)
	h.axeCheck(tab, "tools")

	// A gated run followed live on its run page in one tab, approved from
	// the gates page in another.
	live := h.startFromForm(tab, "Close support ticket 400")
	h.waitJS(tab, "the gated step waiting, live", `document.querySelector('[data-current] g.node[data-step-id="close"]')?.dataset.status === "waiting-approval"`)
	eval[bool](h, tab, `window.__sameDocument = true; window.__cls = 0;
		new PerformanceObserver(l => { for (const e of l.getEntries()) if (!e.hadRecentInput) window.__cls += e.value; }).observe({type: "layout-shift"}); true`)
	var others []string
	for _, n := range []int{410, 412, 414, 415} {
		resp, err := client.StartRun(t.Context(), &planexv1.StartRunRequest{Goal: fmt.Sprintf("Close support ticket %d", n)})
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, resp.GetRun().GetId())
		h.waitRun(resp.GetRun().GetId(), "waiting", hasStatus(planexv1.RunStatus_RUN_STATUS_WAITING))
	}
	gates := newTab(t, tab)
	h.open(gates, "#/gates")
	for _, id := range append([]string{live}, others...) {
		h.waitJS(gates, "the gate of "+id, fmt.Sprintf(`document.querySelector(%q)`, gateSel(id)))
	}
	h.screenshot(gates, "gates.png")
	h.axeCheck(gates, "gates")

	h.do(gates, "approve", chromedp.Click(chromedp.CSS(gateSel(live)+" button.approve")))
	h.waitJS(gates, "the approval", fmt.Sprintf(`document.querySelector(%q).textContent.startsWith("Approved")`, gateSel(live)+" .result"))
	h.waitJS(tab, "the run finishing live on its page", `document.querySelector("#run-status .badge").textContent === "succeeded" &&
		document.querySelector('[data-current] g.node[data-step-id="close"]').dataset.status === "succeeded" &&
		document.querySelector("#timeline li[data-kind=finished]") && window.__sameDocument === true`)
	if cls := eval[float64](h, tab, `window.__cls`); cls >= 0.1 {
		t.Errorf("layout shift while the run streamed: %.3f (want < 0.1)", cls)
	}
	h.waitRun(live, "succeeded", hasStatus(planexv1.RunStatus_RUN_STATUS_SUCCEEDED))

	// Edited arguments are validated: bad JSON in the browser, a schema
	// violation by the supervisor, each shown at the field.
	bad := others[0]
	card := gateSel(bad)
	h.do(gates, "open the arguments", chromedp.Click(chromedp.CSS(card+" details summary")))
	h.do(gates, "malformed JSON", chromedp.SetValue(chromedp.CSS(card+" textarea"), "{"), chromedp.Click(chromedp.CSS(card+" button.edit")))
	h.waitJS(gates, "the JSON error at the field", fmt.Sprintf(`document.querySelector(%q).textContent.includes("not valid JSON") && document.querySelector(%q).getAttribute("aria-invalid") === "true"`,
		card+" details .field-error", card+" textarea"))
	h.do(gates, "schema violation", chromedp.SetValue(chromedp.CSS(card+" textarea"), `{"sql": 5}`), chromedp.Click(chromedp.CSS(card+" button.edit")))
	h.waitJS(gates, "the supervisor's error at the field", fmt.Sprintf(`[...document.querySelectorAll(%q)].some(e => e.textContent.includes("edited_args"))`, card+" .field-error"))

	// Reject needs a reason; with one, the run goes back to the planner:
	// close-ticket's branch for a rejection reads the ticket again and
	// reports it left open (revision 2).
	h.do(gates, "reject without reason", chromedp.Click(chromedp.CSS(card+" button.reject")))
	h.waitJS(gates, "the reason required", fmt.Sprintf(`[...document.querySelectorAll(%q)].some(e => e.textContent.includes("Give a reason"))`, card+" .field-error"))
	h.do(gates, "reject", chromedp.SetValue(chromedp.CSS(card+` input[id^="reason-"]`), "wrong ticket"), chromedp.Click(chromedp.CSS(card+" button.reject")))
	h.waitJS(gates, "the rejection", fmt.Sprintf(`document.querySelector(%q).textContent.startsWith("Rejected and sent back to the planner")`, card+" .result"))
	replan := h.waitRun(bad, "replanned", hasStatus(planexv1.RunStatus_RUN_STATUS_SUCCEEDED))
	if g := replan.GetGates()[0]; g.GetComment() != "wrong ticket" || g.GetDecision() != planexv1.DecisionKind_DECISION_KIND_REJECT || g.GetStopRun() {
		t.Errorf("rejected gate: decision %s comment %q stop_run %v, want REJECT with the reason", g.GetDecision(), g.GetComment(), g.GetStopRun())
	}
	if len(replan.GetPlans()) != 2 || !strings.Contains(replan.GetResult().GetStringValue(), "was left open") {
		t.Errorf("after the rejection: %d plan revisions, result %q; want the replan's answer", len(replan.GetPlans()), replan.GetResult().GetStringValue())
	}
	// Its run page draws both revisions: close skipped in the first, the
	// re-read in the second.
	h.do(tab, "replanned run page", chromedp.Navigate(h.base+"#/runs/"+bad))
	h.waitJS(tab, "both revisions drawn", `document.querySelectorAll("#plans .revision svg.dag").length === 2 &&
		document.querySelector("#plans").textContent.includes("Replan of revision 1") &&
		document.querySelector('[data-current] g.node[data-step-id="recheck"]')?.dataset.status === "succeeded" &&
		document.querySelector('#plans .revision[data-revision="1"] g.node[data-step-id="close"]')?.dataset.status === "skipped"`)
	h.screenshot(tab, "run-rejected-replan.png")

	// "Stop the run" makes the rejection final.
	stopped := others[3]
	others = others[:3]
	stopCard := gateSel(stopped)
	h.do(gates, "reject and stop", chromedp.SetValue(chromedp.CSS(stopCard+` input[id^="reason-"]`), "not this one"),
		chromedp.Click(chromedp.CSS(stopCard+" input.stop-run")), chromedp.Click(chromedp.CSS(stopCard+" button.reject")))
	h.waitJS(gates, "the final rejection", fmt.Sprintf(`document.querySelector(%q).textContent.startsWith("Rejected and the run stopped")`, stopCard+" .result"))
	rejected := h.waitRun(stopped, "rejected", func(r *planexv1.Run) bool { return r.GetStopReason() == planexv1.StopReason_STOP_REASON_REJECTED })
	if !rejected.GetGates()[0].GetStopRun() || !strings.Contains(rejected.GetStopMessage(), "not this one; the run was stopped at the decider's request") || len(rejected.GetPlans()) != 1 {
		t.Errorf("stopped run: %q, %d revisions, gate %v", rejected.GetStopMessage(), len(rejected.GetPlans()), rejected.GetGates()[0])
	}

	// Several gates at once.
	for _, id := range others[1:] {
		h.do(gates, "select "+id, chromedp.Click(chromedp.CSS(gateSel(id)+" input.pick")))
	}
	h.do(gates, "approve selected", chromedp.Click(chromedp.CSS("#approve-selected")))
	for _, id := range others[1:] {
		h.waitJS(gates, "approval of "+id, fmt.Sprintf(`document.querySelector(%q).textContent.startsWith("Approved")`, gateSel(id)+" .result"))
		h.waitRun(id, "succeeded", hasStatus(planexv1.RunStatus_RUN_STATUS_SUCCEEDED))
	}

	// The rejected run's page shows why it stopped.
	h.do(tab, "rejected run page", chromedp.Navigate(h.base+"#/runs/"+stopped))
	h.waitJS(tab, "the stop reason", `document.querySelector("#run-meta").textContent.includes("rejected")`)

	// Runs list: filters and live rows, checked with axe in light and dark.
	h.do(tab, "runs list", chromedp.Navigate(h.base+"#/runs"))
	h.waitJS(tab, "all runs listed", `document.querySelectorAll("#runs tbody tr[data-run-id]").length === 10`)
	// Live: a run started elsewhere appears without a reload.
	eval[bool](h, tab, `window.__sameDocument = true`)
	extra, err := client.StartRun(t.Context(), &planexv1.StartRunRequest{Goal: "How many open support tickets does Globex have?"})
	if err != nil {
		t.Fatal(err)
	}
	h.waitJS(tab, "the new run listed live", fmt.Sprintf(`document.querySelector('#runs tbody tr[data-run-id=%q]') && window.__sameDocument`, extra.GetRun().GetId()))
	h.waitRun(extra.GetRun().GetId(), "succeeded", hasStatus(planexv1.RunStatus_RUN_STATUS_SUCCEEDED))
	h.waitJS(tab, "its status updated live", fmt.Sprintf(`document.querySelector('#runs tbody tr[data-run-id=%q] .badge').textContent === "succeeded"`, extra.GetRun().GetId()))
	// Pagination with the API's page tokens: 11 runs, 4 per page.
	h.do(tab, "4 per page", chromedp.Navigate(h.base+"#/runs?size=4"))
	pageIDs := func() string {
		return eval[string](h, tab, `[...document.querySelectorAll("#runs tbody tr[data-run-id]")].map(r => r.dataset.runId).join(",")`)
	}
	var seen []string
	for page := 1; page <= 3; page++ {
		h.waitJS(tab, fmt.Sprintf("page %d", page), fmt.Sprintf(`document.querySelector(".pager span").textContent === "Page %d" && document.querySelectorAll("#runs tbody tr[data-run-id]").length === %d`, page, []int{4, 4, 3}[page-1]))
		seen = append(seen, strings.Split(pageIDs(), ",")...)
		if page < 3 {
			h.do(tab, "next page", chromedp.Click(chromedp.CSS(".pager button:last-child")))
		}
	}
	slices.Sort(seen)
	if len(slices.Compact(seen)) != 11 {
		t.Errorf("three pages listed %d distinct runs, want all 11", len(seen))
	}
	h.do(tab, "previous page", chromedp.Click(chromedp.CSS(".pager button:first-child")))
	h.waitJS(tab, "page 2 again", `document.querySelector(".pager span").textContent === "Page 2"`)
	h.do(tab, "runs list", chromedp.Navigate(h.base+"#/runs"))
	h.waitJS(tab, "all runs listed", `document.querySelectorAll("#runs tbody tr[data-run-id]").length === 11`)
	h.screenshot(tab, "runs.png")
	h.axeCheck(tab, "runs list")
	h.do(tab, "status filter", chromedp.Navigate(h.base+"#/runs?status="+strings.TrimPrefix(rejected.GetStatus().String(), "RUN_STATUS_")))
	h.waitJS(tab, "only the rejected run", fmt.Sprintf(`(() => { const rows = [...document.querySelectorAll("#runs tbody tr[data-run-id]")]; return rows.length === 1 && rows[0].dataset.runId === %q; })()`, stopped))
	h.do(tab, "dark mode", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}})
		return err
	}), chromedp.Navigate(h.base+"#/runs/"+compareRun))
	h.waitJS(tab, "dark colours", `getComputedStyle(document.body).backgroundColor === "rgb(13, 17, 23)" && document.querySelector("[data-current] svg.dag")`)
	h.axeCheck(tab, "run detail (dark)")
	h.screenshot(tab, "run-dark.png")

	// A phone: the page fits the width (tables and the DAG scroll inside
	// their own boxes).
	h.do(tab, "phone", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateScale(2)), chromedp.Navigate(h.base+"#/runs"), chromedp.Navigate(h.base+"#/runs/"+compareRun))
	h.waitJS(tab, "the DAG on a phone", `document.querySelector("[data-current] svg.dag")`)
	if w := eval[[]int](h, tab, `[document.documentElement.scrollWidth, window.innerWidth]`); w[0] > w[1] {
		t.Errorf("run page on a phone: %dpx wide in a %dpx viewport", w[0], w[1])
	}
	h.screenshot(tab, "run-phone.png")
}
