package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/oidctest"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// testChromium finds Chromium: PLANEX_TEST_CHROMIUM, else chromium or
// chromium-browser on PATH; the test skips without one.
func testChromium(t *testing.T) string {
	t.Helper()
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

// ssoStack is a TLS supervisor trusting both API keys and the test OIDC
// provider's JWTs, a planner with the gated playbook, a sql executor, and
// the `planex console` binary signing browsers in through the provider.
type ssoStack struct {
	idp        *oidctest.Provider
	client     planexv1.SupervisorServiceClient // as the runner "rita" (API key)
	consoleURL string
}

func startSSOStack(t *testing.T, users ...oidctest.User) ssoStack {
	t.Helper()
	dir := t.TempDir()
	idp := oidctest.Start(t, users...)

	ca, err := tlsconfig.NewCA("planex test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	certs, err := ca.IssueFiles(dir, "service", caFile, tlsconfig.Leaf{CommonName: "planex", Hosts: []string{"127.0.0.1", "localhost"}, Server: true, Client: true, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tls := []string{"--plaintext=false", "--tls-cert-file=" + certs.CertFile, "--tls-key-file=" + certs.KeyFile, "--tls-ca-file=" + caFile}

	key, line, err := authn.GenerateAPIKey("rita", authn.RoleRunner)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "keys")
	if err := os.WriteFile(keyFile, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	books := filepath.Join(dir, "books")
	if err := os.MkdirAll(books, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(books, "gated.yaml"), []byte(gatedPlaybook), 0o644); err != nil {
		t.Fatal(err)
	}

	srv := natstest.Start(t)
	common := []string{"--grpc-addr=127.0.0.1:0", "--nats-url=" + srv.URL()}
	_, plannerAddr := startService(t, slices.Concat([]string{"planner", "--playbooks=" + books}, tls, common)...)
	startService(t, append([]string{"executor", "--pool=sql", "--sql-dsn=" + demoDB(t)}, common...)...)
	_, supAddr := startService(t, slices.Concat([]string{"supervisor", "--planner-addr=" + plannerAddr,
		"--auth-disabled=false", "--auth-api-keys-file=" + keyFile}, idp.SupervisorFlags(), tls, common)...)

	r, err := tlsconfig.NewReloader(tlsconfig.Files{CAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(supAddr, grpc.WithTransportCredentials(credentials.NewTLS(tlsconfig.ClientConfig(r, ""))),
		grpc.WithPerRPCCredentials(authn.Bearer(key)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	cmd := exec.Command(planexBin, slices.Concat([]string{"console", "--addr", supAddr, "--plaintext=false", "--tls-ca-file", caFile,
		"--http-addr", "127.0.0.1:0", "--oidc-provider-name", "Test IdP"}, idp.ConsoleFlags())...)
	cmd.Env = serviceEnv()
	cmd.Stderr = os.Stderr
	base := startWatching(t, cmd, cmd.StdoutPipe, nil, "planex console did not print its URL", func(line string) (string, bool) {
		_, rest, ok := strings.Cut(line, "planex console on ")
		if !ok {
			return "", false
		}
		return strings.Fields(rest)[0], true
	})
	return ssoStack{idp: idp, client: planexv1.NewSupervisorServiceClient(conn), consoleURL: base}
}

// TestConsoleSingleSignOn drives Chromium through single sign-on: the
// sign-in page offers "Sign in with Test IdP", the provider's login form
// is filled in, and the console lists runs through a supervisor that
// verifies the provider's JWTs. The role comes from the provider's claim:
// a viewer sees the waiting run but Decide is refused; after signing out
// (at the console and the provider), an approver approves it.
func TestConsoleSingleSignOn(t *testing.T) {
	chromium := testChromium(t)
	vera := oidctest.User{Name: "vera", Password: "viewer-pw", Roles: []string{"viewer"}, DisplayName: "Vera Viewer"}
	abe := oidctest.User{Name: "abe", Password: "approver-pw", Roles: []string{"approver"}, DisplayName: "Abe Approver"}
	st := startSSOStack(t, vera, abe)

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	started, err := st.client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Carefully count the open tickets of Acme Corp"})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRun().GetId()
	run := waitForRun(ctx, t, st.client, runID, func(r *planexv1.Run) bool { return len(r.GetGates()) == 1 })
	gateID := run.GetGates()[0].GetId()

	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1280, 800), chromedp.Flag("lang", "en-US"))...)
	t.Cleanup(cancelAlloc)
	tab, closeTab := chromedp.NewContext(actx)
	t.Cleanup(closeTab)
	// The first action starts the browser, bound to the tab's context (not
	// to a per-action deadline).
	if err := chromedp.Do(tab, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	b := &ssoBrowser{t: t, tab: tab}

	// Signed out: the sign-in page offers the provider first.
	b.do("open the console", chromedp.Navigate(st.consoleURL))
	b.waitJS("the SSO button", `(() => { const b = document.querySelector("#sso-signin"); return b && !b.closest("[hidden]") && b.textContent === "Sign in with Test IdP"; })()`)
	b.waitJS("the token form still there", `!!document.querySelector("#token")`)

	// vera, a viewer, signs in through the provider's login form.
	b.signIn(vera)
	b.waitJS("the run in the list", fmt.Sprintf(`!!document.querySelector('#runs tbody a[href="#/runs/%s"]')`, runID))
	b.waitJS("the sign-out button naming vera", `(() => { const b = document.querySelector("#signout"); return b && !b.hidden && b.dataset.user === "vera"; })()`)
	if b.eval(`document.cookie.includes("planex_session")`) == "true" {
		t.Fatal("the session cookie is readable by the page (want HttpOnly)")
	}
	// The page's own Connect client (cookie + CSRF header): ListRuns works,
	// Decide is refused by the supervisor for a viewer.
	if got := b.eval(`import("/assets/connect.js").then(m => m.call("ListRuns", {})).then(r => String(r.runs.length))`); got != "1" {
		t.Fatalf("ListRuns through the page's client: %s runs, want 1", got)
	}
	decide := fmt.Sprintf(`import("/assets/connect.js").then(m => m.call("Decide", {runId: %q, gateId: %q, decision: "DECISION_KIND_APPROVE"})).then(() => "ok", e => e.code)`, runID, gateID)
	if got := b.eval(decide); got != "permission_denied" {
		t.Fatalf("Decide as a viewer: %s, want permission_denied", got)
	}
	// Without the CSRF header the console refuses the cookie alone.
	if got := b.eval(`fetch("/planex.v1.SupervisorService/ListRuns", {method: "POST", headers: {"Content-Type": "application/json"}, body: "{}"}).then(r => String(r.status))`); got != "403" {
		t.Fatalf("a same-origin call with the cookie but no CSRF token: HTTP %s, want 403", got)
	}

	// Sign out: the console ends the session, the provider too, and the
	// browser comes back to the sign-in page.
	b.do("sign out", chromedp.Click(chromedp.CSS("#signout")))
	b.waitJS("the SSO button after signing out", `!!document.querySelector("#sso-signin")`)
	waitFor(t, "the provider to end vera's session", func() bool { return slices.Contains(st.idp.EndSessions(), "vera") })
	if got := b.eval(`fetch("/auth/me").then(r => r.json()).then(m => String(m.signedIn))`); got != "false" {
		t.Fatalf("/auth/me after signing out: signedIn %s", got)
	}

	// abe, an approver, signs in and approves the gate.
	b.signIn(abe)
	b.waitJS("the run in the list", fmt.Sprintf(`!!document.querySelector('#runs tbody a[href="#/runs/%s"]')`, runID))
	if got := b.eval(decide); got != "ok" {
		t.Fatalf("Decide as an approver: %s", got)
	}
	run = waitForRun(ctx, t, st.client, runID, func(r *planexv1.Run) bool { return r.GetStatus() == planexv1.RunStatus_RUN_STATUS_SUCCEEDED })
	if by := run.GetGates()[0].GetDecidedBy(); by != "jwt:"+st.idp.Issuer+":abe" {
		t.Fatalf("gate decided by %q, want abe's JWT identity", by)
	}
	b.do("sign out", chromedp.Click(chromedp.CSS("#signout")))
	b.waitJS("the SSO button after signing out", `!!document.querySelector("#sso-signin")`)
}

// ssoBrowser drives one Chromium tab with deadlines.
type ssoBrowser struct {
	t   *testing.T
	tab context.Context
}

func (b *ssoBrowser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.tab, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v\n%s", what, err, b.text())
	}
}

func (b *ssoBrowser) eval(expr string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.tab, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[any](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("evaluate %.80q: %v\n%s", expr, err, b.text())
	}
	return fmt.Sprint(v)
}

// waitJS waits until expr is truthy, for at most 30s; evaluation errors
// while the tab navigates (between the console and the provider) are
// retried.
func (b *ssoBrowser) waitJS(what, expr string) {
	b.t.Helper()
	var last error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(b.tab, 5*time.Second)
		v, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+expr+")"))
		cancel()
		if err == nil && v {
			return
		}
		last = err
	}
	b.t.Fatalf("waiting for %s: not within 30s (last error: %v)\n%s", what, last, b.text())
}

func (b *ssoBrowser) text() string {
	ctx, cancel := context.WithTimeout(b.tab, 3*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText.slice(0, 2000)`))
	if err != nil {
		return "(page unavailable: " + err.Error() + ")"
	}
	return "page: " + s
}

// signIn clicks "Sign in with …" and fills in the provider's form as u.
func (b *ssoBrowser) signIn(u oidctest.User) {
	b.t.Helper()
	b.waitJS("the SSO button", `(() => { const b = document.querySelector("#sso-signin"); return b && !b.closest("[hidden]"); })()`)
	b.do("click Sign in with …", chromedp.Click(chromedp.CSS("#sso-signin")))
	ctx, cancel := context.WithTimeout(b.tab, 30*time.Second)
	defer cancel()
	if err := oidctest.BrowserLogin(ctx, u.Name, u.Password); err != nil {
		b.t.Fatalf("login form as %s: %v\n%s", u.Name, err, b.text())
	}
	b.waitJS("back at the console, signed in", `location.hash.startsWith("#/runs") && !!document.querySelector("#runs")`)
}

// waitFor polls cond until it holds, for at most 30s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: not within 30s", what)
		}
	}
}
