package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime/quotedprintable"
	"net/mail"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/internal/freeport"
	"github.com/planex-dev/planex/services/executor/emailpool"
)

// TestRunbookGoalsAreGrounded: a runbook goal about a topic no document is
// about fails with "no runbook about X" and sends nothing (the first-hour
// report found four of these mailing an unrelated runbook and exiting 0);
// an on-topic one mails the whole runbook, markdown and table intact.
func TestRunbookGoalsAreGrounded(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the dev stack once per goal; skipped with -short")
	}
	dataDir := t.TempDir()
	outbox := filepath.Join(dataDir, "outbox")
	for _, topic := range []string{"coffee machine cleaning", "holiday party planning", "office plant watering", "team lunch orders", "quantum teleportation"} {
		t.Run(topic, func(t *testing.T) {
			code, run, stderr := runDev(t, dataDir, "Find the runbook for "+topic+" and send it to oncall@example.com")
			if code != 3 || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_FAILED {
				t.Fatalf("exit %d, run %v %v %q; want exit 3 and a failed run\n%s", code, run.GetStatus(), run.GetStopReason(), run.GetStopMessage(), stderr)
			}
			// A step that found nothing is the data saying no, not the
			// planner's error (issue 18) nor a broken step (issue 27):
			// NO_DATA, with the playbook's message alone.
			if run.GetStopReason() != planexv1.StopReason_STOP_REASON_NO_DATA {
				t.Errorf("stop reason %v, want NO_DATA", run.GetStopReason())
			}
			msg := run.GetStopMessage()
			if !strings.HasPrefix(msg, "no runbook about "+topic) || !strings.HasSuffix(msg, "Nothing was sent.") {
				t.Errorf("stop message %q, want \"no runbook about %s … Nothing was sent.\" alone", msg, topic)
			}
			for _, bad := range []string{"EXPECTATION_FAILED", "INVALID_ARGUMENT", "on_failure", "step_failed", "index out of bounds", "${{"} {
				if strings.Contains(msg, bad) {
					t.Errorf("stop message %q shows planner internals (%s)", msg, bad)
				}
			}
			for _, id := range []string{"draft", "send"} {
				if s := stepByID(run, id); s.GetStatus() == planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
					t.Errorf("step %s ran", id)
				}
			}
			if msgs, _ := emailpool.ListOutbox(outbox); len(msgs) != 0 {
				t.Fatalf("an off-topic goal sent %d mails", len(msgs))
			}
		})
	}

	t.Run("on topic", func(t *testing.T) {
		code, run, stderr := runDev(t, dataDir, "Find the runbook for failed payment retries and send it to oncall@example.com")
		if code != 0 {
			t.Fatalf("exit %d, run %v %q\n%s", code, run.GetStatus(), run.GetStopMessage(), stderr)
		}
		msgs, err := emailpool.ListOutbox(outbox)
		if err != nil || len(msgs) != 1 {
			t.Fatalf("outbox: %d mails, %v; want 1", len(msgs), err)
		}
		body := mailBody(t, msgs[0].Path)
		var doc demo.Doc
		for _, d := range demo.Runbooks() {
			if d.ID == "runbook-failed-payment-retries" {
				doc = d
			}
		}
		if !strings.Contains(body, strings.TrimSpace(doc.Body)) {
			t.Fatalf("the mail does not carry the whole runbook; body:\n%s", body)
		}
		if !strings.Contains(body, "| 2 | day 3 |") || strings.Contains(body, "**") {
			t.Errorf("table missing or search highlights in the mail:\n%s", body)
		}
		if msgs[0].Subject != doc.Title {
			t.Errorf("subject %q, want %q", msgs[0].Subject, doc.Title)
		}
	})
}

// mailBody reads the decoded text body of an .eml file.
func mailBody(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := mail.ReadMessage(f)
	if err != nil {
		t.Fatal(err)
	}
	var r io.Reader = m.Body
	if strings.EqualFold(m.Header.Get("Content-Transfer-Encoding"), "quoted-printable") {
		r = quotedprintable.NewReader(r)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(b), "\r\n", "\n")
}

// slowerPlaybook holds its data directory for a few seconds: one slow
// query, then a mail.
const slowerPlaybook = `name: slower-report
description: Count slowly, then mail the count
examples:
  - Slowly report to oncall@example.com
match:
  - '(?i)^slowly report to (?P<to>\S+@\S+)$'
params:
  to:
    required: true
steps:
  - id: slow
    tool: sql.query
    args:
      sql: "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 4000000) SELECT count(*) AS n FROM c"
    timeout: 2m
  - id: draft
    tool: email.draft
    depends_on: [slow]
    args:
      to: ["${{ params.to }}"]
      subject: Slow report
      body: "count: ${{ steps.slow.output.rows[0][0] }}"
  - id: send
    tool: email.send
    depends_on: [draft]
    args:
      draft_id: "${{ steps.draft.output.draft_id }}"
answer: "'sent'"
`

// bg is a planex process whose stdout and stderr are kept.
type bg struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error
}

func (b *bg) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.out.Write(p)
}

func (b *bg) Output() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.out.String()
}

func startBG(t *testing.T, env []string, args ...string) *bg {
	t.Helper()
	b := &bg{cmd: exec.Command(planex(t), args...), done: make(chan struct{})}
	b.cmd.Env = append(os.Environ(), env...)
	b.cmd.Stdout, b.cmd.Stderr = b, b
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { b.err = b.cmd.Wait(); close(b.done) }()
	t.Cleanup(func() {
		_ = b.cmd.Process.Kill()
		<-b.done
		if t.Failed() {
			t.Logf("--- planex %s ---\n%s", strings.Join(args, " "), tail(b.Output(), 40))
		}
	})
	return b
}

// waitHolder waits until the data directory's lock file names pid.
func waitHolder(t *testing.T, dataDir string, pid int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(filepath.Join(dataDir, "planex.lock"))
		if strings.Contains(string(b), fmt.Sprintf(`"pid":%d,`, pid)) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("pid %d did not lock %s within %v", pid, dataDir, timeout)
}

// TestConcurrentRunDevOnOneDataDir: a second `planex run --dev` on a data
// directory another one holds exits non-zero within 5 s and says who holds
// it (the first-hour report saw it hang for 13 minutes, ignoring SIGTERM);
// the first one is not disturbed, and SIGTERM ends a run --dev in its
// grace period.
func TestConcurrentRunDevOnOneDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	dataDir := t.TempDir()
	books := t.TempDir()
	if err := os.WriteFile(filepath.Join(books, "slower.yaml"), []byte(slowerPlaybook), 0o644); err != nil {
		t.Fatal(err)
	}
	first := startBG(t, nil, "run", "--dev", "--json", "--data-dir", dataDir, "--playbooks", books, "Slowly report to oncall@example.com")
	waitHolder(t, dataDir, first.cmd.Process.Pid, 90*time.Second)

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	second := exec.CommandContext(ctx, planex(t), "run", "--dev", "--data-dir", dataDir, "How many open support tickets does Acme Corp have?")
	out, err := second.CombinedOutput()
	took := time.Since(start)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("second run --dev: %v, want a non-zero exit\n%s", err, out)
	}
	if took > 5*time.Second {
		t.Errorf("second run --dev took %v to fail, want under 5s", took)
	}
	want := "data dir " + dataDir + " in use by pid " + strconv.Itoa(first.cmd.Process.Pid)
	if !strings.Contains(string(out), want) || !strings.Contains(string(out), "use --data-dir") {
		t.Errorf("second run --dev said %q, want %q and the --data-dir hint", out, want)
	}

	select {
	case <-first.done:
	case <-time.After(3 * time.Minute):
		t.Fatal("first run --dev did not finish")
	}
	var run planexv1.Run
	if first.err != nil {
		t.Fatalf("first run --dev: %v", first.err)
	}
	if err := protojson.Unmarshal([]byte(first.Output()[strings.Index(first.Output(), "{"):]), &run); err != nil || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("first run: %v %v", run.GetStatus(), err)
	}

	// SIGTERM while the slow step runs: the process ends within the grace
	// period (10s) and the next process gets the directory.
	term := startBG(t, nil, "run", "--dev", "--data-dir", dataDir, "--playbooks", books, "Slowly report to oncall@example.com")
	waitHolder(t, dataDir, term.cmd.Process.Pid, 90*time.Second)
	if err := term.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-term.done:
	case <-time.After(15 * time.Second):
		t.Fatal("run --dev did not end within 15s of SIGTERM")
	}
	if code, run, stderr := runDev(t, dataDir, "How many open support tickets does Globex have?"); code != 0 {
		t.Fatalf("run --dev after SIGTERM: exit %d %v\n%s", code, run.GetStopMessage(), stderr)
	}
}

// TestQuickStartOutbox follows the README's quick start with the default
// data directory: `planex outbox` right after `planex run --dev` shows the
// mail the run sent.
func TestQuickStartOutbox(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	cache := t.TempDir()
	env := []string{"XDG_CACHE_HOME=" + cache, "HOME=" + t.TempDir()}
	run := exec.Command(planex(t), "run", "--dev", "Find the runbook for failed payment retries and send it to oncall@example.com")
	run.Env = append(os.Environ(), env...)
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("planex run --dev: %v\n%s", err, out)
	}
	outbox := exec.Command(planex(t), "outbox")
	outbox.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	outbox.Stdout, outbox.Stderr = &stdout, &stderr
	if err := outbox.Run(); err != nil {
		t.Fatalf("planex outbox: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "oncall@example.com") || !strings.Contains(stdout.String(), "Runbook: Failed payment retries") {
		t.Fatalf("planex outbox after the quick start shows:\n%s", stdout.String())
	}
	if want := filepath.Join(cache, "planex", "run-dev", "outbox"); !strings.Contains(stderr.String(), want) {
		t.Errorf("planex outbox does not say it reads %s: %q", want, stderr.String())
	}

	jsonOut := exec.Command(planex(t), "outbox", "--json")
	jsonOut.Env = append(os.Environ(), env...)
	b, err := jsonOut.Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"messageId": "<planex.`) || strings.Contains(string(b), `\u003c`) || strings.Contains(string(b), `"MessageID"`) {
		t.Errorf("outbox --json is not lowerCamel without HTML escapes:\n%s", b)
	}
}

// TestApprovalGateTour follows the README tour: planex dev says what it
// auto-approves, the built-in close-ticket goal waits at the sql.exec
// gate, `planex runs approve` lets it finish, `planex runs reject` sends it
// back to the planner (a second revision) and `--stop` ends it.
func TestApprovalGateTour(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	dataDir := t.TempDir()
	addr := freeport.Addr(t)
	dev := startBG(t, nil, "dev", "--data-dir", dataDir, "--grpc-addr", addr)
	waitServing(t, dataDir, addr)
	if out := dev.Output(); !strings.Contains(out, "auto-approved: email.send") {
		t.Errorf("planex dev does not print its auto-approvals:\n%s", out)
	}

	out, errOut, code := cli(t, "run", "--addr", addr, "--json", "Close support ticket 400")
	var waiting planexv1.Run
	if code != 4 || protojson.Unmarshal([]byte(out), &waiting) != nil || waiting.GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING {
		t.Fatalf("close ticket: exit %d (want 4, waiting)\n%s\n%s", code, out, errOut)
	}
	if list, _, _ := cli(t, "runs", "list", "--addr", addr); strings.Contains(list, "unspecified") {
		t.Errorf("runs list shows stop reason unspecified for a waiting run:\n%s", list)
	}
	if _, errOut, code := cli(t, "runs", "approve", waiting.GetId(), "--addr", addr); code != 0 {
		t.Fatalf("runs approve: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := cli(t, "runs", "watch", waiting.GetId(), "--addr", addr); code != 0 {
		t.Fatalf("runs watch after approval: exit %d\n%s", code, errOut)
	}
	out, _, code = cli(t, "runs", "get", waiting.GetId(), "--addr", addr, "--json")
	var done planexv1.Run
	if code != 0 || protojson.Unmarshal([]byte(out), &done) != nil || !strings.Contains(done.GetResult().GetStringValue(), "Closed support ticket 400 of Stark Industries") {
		t.Fatalf("after approval: exit %d\n%s", code, out)
	}
	if queryInt(t, filepath.Join(dataDir, "demo.db"), "SELECT count(*) FROM support_tickets WHERE id = 400 AND status = 'closed'") != 1 {
		t.Fatal("ticket 400 is not closed")
	}

	// A rejection goes back to the planner: close-ticket's branch for it
	// reads the ticket again (plan revision 2) and reports it left open.
	// With --stop the run ends REJECTED.
	for _, tc := range []struct {
		ticket string
		stop   bool
	}{{"414", false}, {"415", true}} {
		out, errOut, code = cli(t, "run", "--addr", addr, "--json", "Close support ticket "+tc.ticket)
		if code != 4 || protojson.Unmarshal([]byte(out), &waiting) != nil {
			t.Fatalf("close ticket %s: exit %d (want 4, waiting)\n%s\n%s", tc.ticket, code, out, errOut)
		}
		args := []string{"runs", "reject", waiting.GetId(), "--addr", addr, "--actor", "bob", "--comment", "the customer still needs it"}
		if tc.stop {
			args = append(args, "--stop")
		}
		rejected, errOut, code := cli(t, args...)
		if code != 0 {
			t.Fatalf("runs reject (stop %v): exit %d\n%s", tc.stop, code, errOut)
		}
		_, _, code = cli(t, "runs", "watch", waiting.GetId(), "--addr", addr)
		out, _, _ = cli(t, "runs", "get", waiting.GetId(), "--addr", addr, "--json")
		var after planexv1.Run
		if err := protojson.Unmarshal([]byte(out), &after); err != nil {
			t.Fatalf("runs get: %v\n%s", err, out)
		}
		if tc.stop {
			if code != 3 || after.GetStopReason() != planexv1.StopReason_STOP_REASON_REJECTED || len(after.GetPlans()) != 1 ||
				!strings.Contains(after.GetStopMessage(), "rejected by bob: the customer still needs it; the run was stopped at the decider's request") {
				t.Fatalf("reject --stop: watch exit %d, run %s %q, %d revisions", code, after.GetStopReason(), after.GetStopMessage(), len(after.GetPlans()))
			}
		} else if code != 0 || !strings.Contains(rejected, "sent back to the planner") || len(after.GetPlans()) != 2 ||
			!strings.Contains(after.GetResult().GetStringValue(), "Support ticket 414 of") || !strings.Contains(after.GetResult().GetStringValue(), "was left open") {
			t.Fatalf("reject: watch exit %d, %d revisions, result %q\n%s", code, len(after.GetPlans()), after.GetResult().GetStringValue(), rejected)
		}
		if n := queryInt(t, filepath.Join(dataDir, "demo.db"), "SELECT count(*) FROM support_tickets WHERE id = "+tc.ticket+" AND status = 'open'"); n != 1 {
			t.Fatalf("ticket %s was changed although its close was rejected", tc.ticket)
		}
	}

	// run --dev on the data directory planex dev serves joins it.
	code, run, stderr := runDev(t, dataDir, "How many open support tickets does Stark Industries have?")
	if code != 0 || !strings.Contains(run.GetResult().GetStringValue(), "0 open support tickets") || !strings.Contains(stderr, "served by planex dev") {
		t.Fatalf("run --dev next to planex dev: exit %d %q\n%s", code, run.GetResult().GetStringValue(), stderr)
	}
}
