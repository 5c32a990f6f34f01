package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	_ "modernc.org/sqlite"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/freeport"
	"github.com/planex-dev/planex/internal/tlsconfig"
	"github.com/planex-dev/planex/services/executor/emailpool"
)

// runDev runs `planex run --dev --json` for goal on dataDir and returns
// the exit code, the decoded Run and stderr.
func runDev(t *testing.T, dataDir, goal string) (int, *planexv1.Run, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, planex(t), "run", "--dev", "--json", "--data-dir", dataDir, goal)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("planex run: %v", err)
	}
	if code == 1 {
		return code, nil, stderr.String()
	}
	var run planexv1.Run
	if err := protojson.Unmarshal(stdout.Bytes(), &run); err != nil {
		t.Fatalf("stdout is not a protojson Run (%v):\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	return code, &run, stderr.String()
}

func queryInt(t *testing.T, dbPath, q string, args ...any) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+dbPath+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func stepByID(r *planexv1.Run, id string) *planexv1.StepState {
	for _, s := range r.GetSteps() {
		if s.GetStepId() == id {
			return s
		}
	}
	return nil
}

func outboxTo(t *testing.T, dir, addr string) int {
	t.Helper()
	msgs, err := emailpool.ListOutbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range msgs {
		for _, to := range m.To {
			if strings.Contains(to, addr) {
				n++
			}
		}
	}
	return n
}

// TestDemoGoalsEndToEnd runs every demo goal (and paraphrases) through
// `planex run --dev --json`, the one-command demo.
func TestDemoGoalsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the dev stack once per goal; skipped with -short")
	}
	dataDir := t.TempDir()
	dbPath := filepath.Join(dataDir, "demo.db")
	outbox := filepath.Join(dataDir, "outbox")
	openTickets := func(customer string) int {
		return queryInt(t, dbPath, `SELECT count(*) FROM support_tickets t JOIN customers c ON c.id = t.customer_id WHERE c.name = ? AND t.status = 'open'`, customer)
	}

	tests := []struct {
		name  string
		goal  string
		check func(t *testing.T, r *planexv1.Run)
	}{
		{
			name: "open tickets",
			goal: "How many open support tickets does Acme Corp have?",
			check: func(t *testing.T, r *planexv1.Run) {
				want := openTickets("Acme Corp")
				if got := r.GetResult().GetStringValue(); !strings.Contains(got, fmt.Sprint(want)) {
					t.Errorf("result %q does not state the database's count %d", got, want)
				}
			},
		},
		{
			name: "open tickets paraphrase",
			goal: "how many open tickets does Globex have",
			check: func(t *testing.T, r *planexv1.Run) {
				want := openTickets("Globex")
				if got := r.GetResult().GetStringValue(); !strings.Contains(got, fmt.Sprint(want)) || !strings.Contains(got, "Globex") {
					t.Errorf("result %q does not state Globex's count %d", got, want)
				}
			},
		},
		{
			name: "top customers email",
			goal: "Email the account team a summary of the top 5 customers by revenue in 2025",
			check: func(t *testing.T, r *planexv1.Run) {
				for _, id := range []string{"top", "draft", "send"} {
					if s := stepByID(r, id); s.GetStatus() != planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
						t.Errorf("step %s: %v", id, s.GetStatus())
					}
				}
				if n := outboxTo(t, outbox, "account-team@example.com"); n != 1 {
					t.Errorf("account-team received %d mails, want 1", n)
				}
			},
		},
		{
			name: "runbook email",
			goal: "Find the runbook for failed payment retries and send it to oncall@example.com",
			check: func(t *testing.T, r *planexv1.Run) {
				if n := outboxTo(t, outbox, "oncall@example.com"); n != 1 {
					t.Errorf("oncall received %d mails, want 1", n)
				}
			},
		},
		{
			name: "compare customers in parallel",
			goal: "Compare revenue and open tickets for Acme Corp and Globex",
			check: func(t *testing.T, r *planexv1.Run) {
				a, b := stepByID(r, "revenue_a"), stepByID(r, "revenue_b")
				if a == nil || b == nil {
					t.Fatalf("branches missing: %v", r.GetSteps())
				}
				// The branches overlap: each was dispatched before the other
				// finished.
				if !a.GetDispatchedAt().AsTime().Before(b.GetFinishedAt().AsTime()) || !b.GetDispatchedAt().AsTime().Before(a.GetFinishedAt().AsTime()) {
					t.Errorf("branches ran one after the other: a %v..%v, b %v..%v",
						a.GetDispatchedAt().AsTime(), a.GetFinishedAt().AsTime(), b.GetDispatchedAt().AsTime(), b.GetFinishedAt().AsTime())
				}
				res := r.GetResult().GetStringValue()
				if !strings.Contains(res, "Acme Corp") || !strings.Contains(res, "Globex") {
					t.Errorf("result %q does not compare both customers", res)
				}
			},
		},
		{
			name: "replan through schema",
			goal: "What is the average order value by region in 2025?",
			check: func(t *testing.T, r *planexv1.Run) {
				if n := len(r.GetPlans()); n != 2 {
					t.Fatalf("%d plan revisions, want 2 (a failed query, then a replan through sql.schema)", n)
				}
				var tools []string
				for _, s := range r.GetPlans()[1].GetSteps() {
					tools = append(tools, s.GetTool())
				}
				if !strings.Contains(strings.Join(tools, ","), "sql.schema") {
					t.Errorf("revision 2 does not read the schema: %v", tools)
				}
				for _, region := range []string{"APAC", "EMEA", "LATAM", "NA"} {
					if !strings.Contains(r.GetResult().GetStringValue(), region) {
						t.Errorf("result lacks region %s: %q", region, r.GetResult().GetStringValue())
					}
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, run, stderr := runDev(t, dataDir, tt.goal)
			if code != 0 || run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
				t.Fatalf("exit %d, run %v %v %q\nstderr:\n%s", code, run.GetStatus(), run.GetStopReason(), run.GetStopMessage(), stderr)
			}
			if len(run.GetPlans()) == 0 || len(run.GetSteps()) < len(run.GetPlans()[len(run.GetPlans())-1].GetSteps()) {
				t.Fatalf("run lacks its plan or steps: %d plans, %d steps", len(run.GetPlans()), len(run.GetSteps()))
			}
			if run.GetTraceId() == "" {
				t.Error("run has no trace id")
			}
			tt.check(t, run)
		})
	}

	t.Run("no playbook matches", func(t *testing.T) {
		code, run, _ := runDev(t, dataDir, "Make me a sandwich")
		if code != 3 || run.GetStopReason() != planexv1.StopReason_STOP_REASON_PLANNER_ERROR {
			t.Fatalf("exit %d, stop %v; want 3 and PLANNER_ERROR", code, run.GetStopReason())
		}
		msg := run.GetStopMessage()
		for _, want := range []string{"no playbook matches", "How many open support tickets", "--playbooks", "--planner-backend"} {
			if !strings.Contains(msg, want) {
				t.Errorf("stop message lacks %q:\n%s", want, msg)
			}
		}
	})
}

// slowPlaybook holds one deliberately slow query (a recursive count in
// SQLite) before a draft and a send, so a test can kill the stack while a
// step is running.
const slowPlaybook = `name: slow-report
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
    # Ample time for the attempt JetStream redelivers after the restart.
    timeout: 2m
    args:
      sql: "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 400000) SELECT count(*) AS n FROM c"
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

// TestDevKilledMidRunResumes kills `planex dev` with SIGKILL while a step
// of a run is executing, restarts it on the same data dir, and checks the
// run finishes from its log, the step attempt is not duplicated, and the
// mail goes out exactly once.
func TestDevKilledMidRunResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	dataDir, addr, start := restartableDev(t, slowPlaybook)
	dev := start()

	conn := devConn(t, dataDir, addr)
	client := planexv1.NewSupervisorServiceClient(conn)
	ctx := ctxT(t, 3*time.Minute)
	started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Slowly report to oncall@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	id := started.GetRun().GetId()

	// Kill the whole stack once the slow step is running on an executor.
	stream, err := client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("run ended before the slow step started: %v", err)
		}
		if s := resp.GetEvent().GetStepStarted(); s != nil && s.GetStepId() == "slow" {
			break
		}
		if resp.GetEvent().GetFinished() != nil {
			t.Fatal("run finished before it could be killed mid-step")
		}
	}
	if err := dev.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-dev.exit

	start()
	stream, err = client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	dispatched := map[string]int{}
	for {
		resp, err := stream.Recv()
		if err != nil {
			break
		}
		ev := resp.GetEvent()
		if ev.GetSequence() != last+1 {
			t.Fatalf("event sequence jumps from %d to %d", last, ev.GetSequence())
		}
		last = ev.GetSequence()
		if d := ev.GetStepDispatched(); d != nil {
			dispatched[fmt.Sprintf("%s/%d", d.GetStepId(), d.GetAttempt())]++
		}
	}
	got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetRun().GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run after restart: %v %v %s", got.GetRun().GetStatus(), got.GetRun().GetStopReason(), got.GetRun().GetStopMessage())
	}
	for k, n := range dispatched {
		if n != 1 {
			t.Errorf("attempt %s dispatched %d times", k, n)
		}
	}
	if n := outboxTo(t, filepath.Join(dataDir, "outbox"), "oncall@example.com"); n != 1 {
		t.Fatalf("oncall received %d mails, want exactly 1", n)
	}
}

// devConn connects to a `planex dev` stack the way its CLI does: TLS
// verified by the CA and the CLI's API key, both generated into
// <data-dir>/credentials.
func devConn(t *testing.T, dataDir, addr string) *grpc.ClientConn {
	t.Helper()
	creds := filepath.Join(dataDir, "credentials")
	deadline := time.Now().Add(90 * time.Second)
	var token []byte
	for {
		var err error
		if token, err = os.ReadFile(filepath.Join(creds, "cli.token")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev stack credentials: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r, err := tlsconfig.NewReloader(tlsconfig.Files{CAFile: filepath.Join(creds, "ca.pem")})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsconfig.ClientConfig(r, ""))),
		grpc.WithPerRPCCredentials(authn.Bearer(strings.TrimSpace(string(token)))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitServing waits until the supervisor at addr answers ListTools, i.e.
// the dev stack is up.
func waitServing(t *testing.T, dataDir, addr string) {
	t.Helper()
	client := planexv1.NewSupervisorServiceClient(devConn(t, dataDir, addr))
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := client.ListTools(ctx, &planexv1.ListToolsRequest{})
		cancel()
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("supervisor at %s not serving within 90s", addr)
}

// restartableDev prepares a `planex dev` on a fresh data dir serving the
// playbook as slow.yaml, for tests that kill and restart it: start runs it
// and waits until it serves.
func restartableDev(t *testing.T, playbook string) (dataDir, addr string, start func() *proc) {
	t.Helper()
	dataDir = t.TempDir()
	books := filepath.Join(t.TempDir(), "playbooks")
	if err := os.MkdirAll(books, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(books, "slow.yaml"), []byte(playbook), 0o644); err != nil {
		t.Fatal(err)
	}
	addr = freeport.Addr(t)
	start = func() *proc {
		p := startProc(t, "planex dev", planex(t), nil, "dev", "--data-dir", dataDir, "--grpc-addr", addr, "--playbooks", books, "--log-level", "info")
		waitServing(t, dataDir, addr)
		return p
	}
	return dataDir, addr, start
}
