package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// mailBooks are the playbooks of the backup test: one mail, or two mails
// one after the other, each email.send behind its approval gate.
var mailBooks = map[string]string{
	"notify-once.yaml": `name: notify-once
description: Mail a recipient once, after approval
examples: [notify once a@example.com]
match: ['^notify once (?P<to>\S+@example\.com)$']
params:
  to: {required: true}
steps:
  - id: draft
    description: Draft the mail
    tool: email.draft
    args: {to: ["${{ params.to }}"], subject: once, body: the only mail}
  - id: send
    description: Send it
    tool: email.send
    depends_on: [draft]
    args: {draft_id: "${{ steps.draft.output.draft_id }}"}
`,
	"notify-twice.yaml": `name: notify-twice
description: Mail a recipient twice, each mail approved on its own
examples: [notify twice a@example.com]
match: ['^notify twice (?P<to>\S+@example\.com)$']
params:
  to: {required: true}
steps:
  - id: draft1
    description: Draft the first mail
    tool: email.draft
    args: {to: ["${{ params.to }}"], subject: first, body: the first mail}
  - id: send1
    description: Send the first mail
    tool: email.send
    depends_on: [draft1]
    args: {draft_id: "${{ steps.draft1.output.draft_id }}"}
  - id: draft2
    description: Draft the second mail
    tool: email.draft
    depends_on: [send1]
    args: {to: ["${{ params.to }}"], subject: second, body: the second mail}
  - id: send2
    description: Send the second mail
    tool: email.send
    depends_on: [draft2]
    args: {draft_id: "${{ steps.draft2.output.draft_id }}"}
`,
}

// TestBackupRestoreIntoAFreshClusterResumesGatedRuns is the acceptance
// test of `planex backup` / `planex restore`: on a 3-node cluster A, runs
// wait at gates — one after a mail it sent (alpha), one before any
// (beta) — one has finished (gamma) and one's mail is at the relay while
// the backup is taken (delta). After a restore into a fresh 3-node cluster
// B and the services started there, every run is listed, every log
// verifies, the gates are approved, alpha and beta complete, and the relay
// has received every mail exactly once over the whole test: none sent
// before the backup is sent again (delta's send, in flight at the
// backup, is escalated as an unknown outcome, not repeated).
func TestBackupRestoreIntoAFreshClusterResumesGatedRuns(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	books := t.TempDir()
	for name, body := range mailBooks {
		if err := os.WriteFile(filepath.Join(books, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sink := startMailSink(t)
	sink.hold("delta@example.com")

	a := natstest.StartCluster(t, 3)
	stackA := startMailStack(t, a.URL(), books, sink.addr)
	client := dialT(t, stackA.addr)
	start := func(goal string) string {
		resp, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: goal})
		if err != nil {
			t.Fatalf("start %q: %v", goal, err)
		}
		return resp.GetRun().GetId()
	}
	alpha, beta, gamma, delta := start("notify twice alpha@example.com"), start("notify twice beta@example.com"),
		start("notify once gamma@example.com"), start("notify once delta@example.com")
	approve(ctx, t, client, alpha, "send1")
	approve(ctx, t, client, gamma, "send")
	approve(ctx, t, client, delta, "send")
	waitGate(ctx, t, client, alpha, "send2")
	waitGate(ctx, t, client, beta, "send1")
	waitForRun(ctx, t, client, gamma, func(r *planexv1.Run) bool { return r.GetStatus() == planexv1.RunStatus_RUN_STATUS_SUCCEEDED })
	sink.waitHeld(ctx, t, "delta@example.com")

	dir := filepath.Join(t.TempDir(), "backup")
	out, code := planexCLI(t, "backup", "--nats-url="+a.URL(), "--out="+dir)
	if code != 0 || !strings.Contains(out, "KV_planex-effects") || !strings.Contains(out, "backed up") {
		t.Fatalf("planex backup: exit %d\n%s", code, out)
	}
	if out, code := planexCLI(t, "backup", "verify", dir); code != 0 {
		t.Fatalf("planex backup verify: exit %d\n%s", code, out)
	}
	sink.release()
	waitForRun(ctx, t, client, delta, func(r *planexv1.Run) bool { return r.GetStatus() == planexv1.RunStatus_RUN_STATUS_SUCCEEDED })
	stackA.stop(t)
	a.Shutdown()

	b := natstest.StartCluster(t, 3)
	if out, code := planexCLI(t, "restore", "--in="+dir, "--nats-url="+b.URL(), "--dry-run"); code != 0 || !strings.Contains(out, "nothing was written") {
		t.Fatalf("planex restore --dry-run: exit %d\n%s", code, out)
	}
	out, code = planexCLI(t, "restore", "--in="+dir, "--nats-url="+b.URL(), "--replicas=3")
	if code != 0 || !strings.Contains(out, "4 runs: 4 logs verified") {
		t.Fatalf("planex restore: exit %d\n%s", code, out)
	}
	t.Logf("planex restore:\n%s", out)
	if out, code := planexCLI(t, "restore", "--in="+dir, "--nats-url="+b.URL()); code == 0 || !strings.Contains(out, "PLANEX_EVENTS (") || !strings.Contains(out, "--replace") {
		t.Fatalf("a second restore into the restored cluster: exit %d\n%s", code, out)
	}

	stackB := startMailStack(t, b.URL(), books, sink.addr)
	client = dialT(t, stackB.addr)
	listed, err := client.ListRuns(ctx, &planexv1.ListRunsRequest{PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]planexv1.RunStatus{}
	for _, r := range listed.GetRuns() {
		status[r.GetId()] = r.GetStatus()
	}
	want := map[string]planexv1.RunStatus{alpha: planexv1.RunStatus_RUN_STATUS_WAITING, beta: planexv1.RunStatus_RUN_STATUS_WAITING, gamma: planexv1.RunStatus_RUN_STATUS_SUCCEEDED}
	for id, st := range want {
		if status[id] != st {
			t.Errorf("run %s listed %s after the restore, want %s (listed: %v)", id, status[id], st, status)
		}
	}
	if _, ok := status[delta]; !ok {
		t.Errorf("run %s (delta) not listed after the restore: %v", delta, status)
	}
	for _, id := range []string{alpha, beta, gamma, delta} {
		if out, code := planexCLI(t, "audit", "verify", id, "--nats-url="+b.URL()); code != 0 || !strings.Contains(out, "verified") {
			t.Errorf("planex audit verify %s after the restore: exit %d\n%s", id, code, out)
		}
	}

	approve(ctx, t, client, alpha, "send2")
	approve(ctx, t, client, beta, "send1")
	approve(ctx, t, client, beta, "send2")
	for _, id := range []string{alpha, beta} {
		waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return r.GetStatus() == planexv1.RunStatus_RUN_STATUS_SUCCEEDED })
	}
	d := waitForRun(ctx, t, client, delta, func(r *planexv1.Run) bool { return runlog.Terminal(r.GetStatus()) })
	t.Logf("delta after the restore: %s %s: %s", d.GetStatus(), d.GetStopReason(), d.GetStopMessage())
	if d.GetStatus() == planexv1.RunStatus_RUN_STATUS_SUCCEEDED && sink.count("delta@example.com", "once") > 1 {
		t.Errorf("delta's send, in flight at the backup, was repeated after the restore")
	}

	// Nothing left to deliver: no late repeat can still reach the relay.
	waitDrained(ctx, t, b)
	wantMail := map[string]int{
		"alpha@example.com first": 1, "alpha@example.com second": 1,
		"beta@example.com first": 1, "beta@example.com second": 1,
		"gamma@example.com once": 1, "delta@example.com once": 1,
	}
	if got := sink.all(); fmt.Sprint(got) != fmt.Sprint(wantMail) {
		t.Errorf("mails at the relay over the whole test: %v\nwant each exactly once: %v", got, wantMail)
	}
}

// TestBackupAgainstAnUnreachableNATS fails naming the server, and writes
// no manifest.
func TestBackupAgainstAnUnreachableNATS(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "nats://" + lis.Addr().String()
	lis.Close()
	dir := filepath.Join(t.TempDir(), "b")
	out, code := planexCLI(t, "backup", "--nats-url="+url, "--out="+dir)
	if code == 0 || !strings.Contains(out, url) {
		t.Fatalf("backup against %s: exit %d\n%s", url, code, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "backup.json")); err == nil {
		t.Fatal("a failed backup wrote a manifest")
	}
	if out, code := planexCLI(t, "backup", "--nats-url="+url); code == 0 || !strings.Contains(out, "--out") {
		t.Fatalf("backup without --out: exit %d\n%s", code, out)
	}
	if out, code := planexCLI(t, "restore", "--in="+dir, "--replicas=7"); code == 0 || !strings.Contains(out, "--replicas 7") {
		t.Fatalf("restore --replicas 7: exit %d\n%s", code, out)
	}
}

// TestRestoreRefusesACorruptBackup names the file at fault, through
// `planex backup verify` and `planex restore`, and restores nothing.
func TestRestoreRefusesACorruptBackup(t *testing.T) {
	src := natstest.Start(t)
	src.Setup(t)
	dir := filepath.Join(t.TempDir(), "b")
	if out, code := planexCLI(t, "backup", "--nats-url="+src.URL(), "--out="+dir); code != 0 {
		t.Fatalf("backup: exit %d\n%s", code, out)
	}
	meta := filepath.Join(dir, "streams", "KV_planex-runs", "backup.json")
	data, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(meta, append(data, ' '), 0o600); err != nil {
		t.Fatal(err)
	}
	dst := natstest.Start(t)
	for _, args := range [][]string{{"backup", "verify", dir}, {"restore", "--in=" + dir, "--nats-url=" + dst.URL()}} {
		out, code := planexCLI(t, args...)
		if code != exitFailed || !strings.Contains(out, meta) {
			t.Errorf("planex %s of a corrupt backup: exit %d, want %d naming %s\n%s", args[0], code, exitFailed, meta, out)
		}
	}
	js, err := jetstream.New(dst.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(t.Context(), bus.StreamEvents); err == nil {
		t.Error("a corrupt backup was restored")
	}
}

// planexCLI runs the planex binary with args and returns its combined
// output and exit code.
func planexCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(planexBin, args...)
	cmd.Env = serviceEnv()
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("planex %v: %v", args, err)
	}
	return string(out), 0
}

// mailStack is a planner with the test's playbooks, an email pool sending
// to the sink and a supervisor, as processes on one NATS cluster.
type mailStack struct {
	addr  string
	procs []*exec.Cmd
}

func startMailStack(t *testing.T, natsURL, books, smtpAddr string) *mailStack {
	t.Helper()
	common := []string{"--grpc-addr=127.0.0.1:0", "--nats-url=" + natsURL, "--stream-replicas=3"}
	planner, plannerAddr := startService(t, append([]string{"planner", "--playbooks=" + books}, common...)...)
	executor, _ := startService(t, append([]string{"executor", "--pool=email", "--smtp-addr=" + smtpAddr, "--smtp-starttls=none", "--email-allowed-domains=example.com"}, common...)...)
	supervisor, addr := startService(t, append([]string{"supervisor", "--planner-addr=" + plannerAddr, "--allow-self-approval", "--expect-pools=email"}, common...)...)
	return &mailStack{addr: addr, procs: []*exec.Cmd{supervisor, executor, planner}}
}

// stop ends the stack's processes gracefully, supervisor first.
func (s *mailStack) stop(t *testing.T) {
	t.Helper()
	for _, p := range s.procs {
		_ = p.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%v did not stop within 30s of SIGINT", p.Args)
		}
	}
}

// dialT dials a supervisor of the test's plaintext stack.
func dialT(t *testing.T, addr string) planexv1.SupervisorServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return planexv1.NewSupervisorServiceClient(conn)
}

// waitGate waits until the run waits at the open gate of step and
// returns the gate's id.
func waitGate(ctx context.Context, t *testing.T, client planexv1.SupervisorServiceClient, id, step string) string {
	t.Helper()
	var gate string
	waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool {
		for _, g := range r.GetGates() {
			if g.GetStepId() == step && runlog.GateOpen(r, g) {
				gate = g.GetId()
				return true
			}
		}
		return false
	})
	return gate
}

// approve waits for the open gate of step and approves it.
func approve(ctx context.Context, t *testing.T, client planexv1.SupervisorServiceClient, id, step string) {
	t.Helper()
	gate := waitGate(ctx, t, client, id, step)
	if _, err := client.Decide(ctx, &planexv1.DecideRequest{RunId: id, GateId: gate, Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, Actor: "backup-test"}); err != nil {
		t.Fatalf("approve %s of run %s: %v", gate, id, err)
	}
}

// waitDrained waits until the email pool's consumers on the restored
// cluster have nothing left to deliver or awaiting acknowledgement.
func waitDrained(ctx context.Context, t *testing.T, c *natstest.Cluster) {
	t.Helper()
	js, err := jetstream.New(c.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	for {
		busy := ""
		for _, stream := range []string{bus.StreamEvents, bus.StreamSteps} {
			cons, err := js.Consumer(ctx, stream, bus.PoolConsumer("email"))
			if err != nil {
				continue // the pool consumes from the other stream only
			}
			info, err := cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.NumPending > 0 || info.NumAckPending > 0 {
				busy = fmt.Sprintf("%s on %s: %d pending, %d awaiting ack", info.Name, stream, info.NumPending, info.NumAckPending)
			}
		}
		if busy == "" {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("email pool not drained: %s", busy)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// mailSink is an SMTP relay counting mails by recipient and subject. Mail
// to a held recipient waits in DATA until release.
type mailSink struct {
	addr     string
	mu       sync.Mutex
	mails    map[string]int
	held     map[string]chan struct{} // recipient → closed once its DATA arrived
	released chan struct{}
}

func startMailSink(t *testing.T) *mailSink {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &mailSink{addr: lis.Addr().String(), mails: map[string]int{}, held: map[string]chan struct{}{}, released: make(chan struct{})}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &sinkSession{s: s}, nil }))
	srv.Domain = "localhost"
	srv.ReadTimeout, srv.WriteTimeout = time.Minute, time.Minute
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { s.release(); _ = srv.Close() })
	return s
}

func (s *mailSink) hold(rcpt string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held[rcpt] = make(chan struct{})
}

func (s *mailSink) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.released:
	default:
		close(s.released)
	}
}

// waitHeld waits until a mail to a held recipient is in DATA.
func (s *mailSink) waitHeld(ctx context.Context, t *testing.T, rcpt string) {
	t.Helper()
	s.mu.Lock()
	ch := s.held[rcpt]
	s.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("no mail to %s reached the relay", rcpt)
	}
}

func (s *mailSink) count(rcpt, subject string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mails[rcpt+" "+subject]
}

func (s *mailSink) all() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.mails))
	for k, v := range s.mails {
		out[k] = v
	}
	return out
}

type sinkSession struct {
	s     *mailSink
	rcpts []string
}

func (x *sinkSession) Mail(string, *smtp.MailOptions) error { return nil }

func (x *sinkSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	x.rcpts = append(x.rcpts, strings.ToLower(to))
	return nil
}

func (x *sinkSession) Data(r io.Reader) error {
	subject := ""
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Subject: "); ok && subject == "" {
			subject = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	x.s.mu.Lock()
	var wait bool
	for _, to := range x.rcpts {
		if ch, ok := x.s.held[to]; ok {
			select {
			case <-ch:
			default:
				close(ch)
			}
			wait = true
		}
	}
	released := x.s.released
	x.s.mu.Unlock()
	if wait {
		<-released
	}
	x.s.mu.Lock()
	for _, to := range x.rcpts {
		x.s.mails[to+" "+subject]++
	}
	x.s.mu.Unlock()
	return nil
}

func (x *sinkSession) Reset()        { x.rcpts = nil }
func (x *sinkSession) Logout() error { return nil }
