package e2e

import (
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/services/planner/playbook"
)

// cluster is planex as separate processes: planner, executor pools and
// supervisor, sharing one NATS server.
type cluster struct {
	supervisor string
	procs      []*proc
	dataDir    string
	// metrics maps a service name to its /metrics address.
	metrics map[string]string
}

// startCluster starts the services as processes with env added to each.
func startCluster(t *testing.T, natsURL string, env []string, pools ...string) *cluster {
	t.Helper()
	bin := planex(t)
	dir := t.TempDir()
	ctx := ctxT(t, time.Minute)
	dbPath := filepath.Join(dir, "demo.db")
	if err := demo.GenerateDB(ctx, dbPath); err != nil {
		t.Fatal(err)
	}
	books := filepath.Join(dir, "playbooks")
	if err := os.CopyFS(books, mustSub(t, playbook.DemoFS)); err != nil {
		t.Fatal(err)
	}
	c := &cluster{dataDir: dir, metrics: map[string]string{}}
	// Plaintext gRPC without authentication (chosen explicitly); steps are
	// signed by the supervisor and verified by the executors.
	base := []string{"--grpc-addr=127.0.0.1:0", "--nats-url=" + natsURL, "--log-format=json", "--log-level=info", "--plaintext", "--auth-disabled"}
	signingKey, verifyKeys := filepath.Join(dir, "step-signing.key"), filepath.Join(dir, "step-verify")
	if _, err := stepsign.GenerateKeyFiles(signingKey, verifyKeys); err != nil {
		t.Fatal(err)
	}
	// Each service picks its own metrics port (a port found free here
	// could be taken by another test's process before the service binds
	// it) and logs the address it listens on.
	withMetrics := append(slices.Clone(base), "--metrics-addr=127.0.0.1:0")
	metricsOf := func(name string, p *proc) {
		c.metrics[name] = p.waitLog(t, "metrics listening", 10*time.Second)["addr"].(string)
	}

	pl := startProc(t, "planner", bin, append(env, "OTEL_SERVICE_NAME=planex-planner"), append([]string{"planner", "--playbooks=" + books}, withMetrics...)...)
	plannerAddr := pl.waitLog(t, "serving", 60*time.Second)["grpc_addr"].(string)
	metricsOf("planner", pl)
	c.procs = append(c.procs, pl)
	for _, pool := range pools {
		args := append([]string{"executor", "--pool=" + pool, "--step-verify-keys=" + verifyKeys}, withMetrics...)
		switch pool {
		case "sql":
			args = append(args, "--sql-dsn="+dbPath)
		case "email":
			args = append(args, "--email-outbox="+filepath.Join(dir, "outbox"), "--email-allowed-domains=example.com")
		case "search":
			args = append(args, "--search-index="+filepath.Join(dir, "search"))
		}
		p := startProc(t, "executor-"+pool, bin, append(env, "OTEL_SERVICE_NAME=planex-executor-"+pool), args...)
		p.waitLog(t, "serving", 60*time.Second)
		metricsOf("executor-"+pool, p)
		c.procs = append(c.procs, p)
	}
	sup := startProc(t, "supervisor", bin, append(env, "OTEL_SERVICE_NAME=planex-supervisor"),
		append([]string{"supervisor", "--planner-addr=" + plannerAddr, "--auto-approve=email.send", "--step-signing-key-file=" + signingKey}, withMetrics...)...)
	c.supervisor = sup.waitLog(t, "serving", 60*time.Second)["grpc_addr"].(string)
	metricsOf("supervisor", sup)
	c.procs = append(c.procs, sup)
	return c
}

// stop sends SIGTERM to every service and waits for a clean exit, so
// their spans are flushed.
func (c *cluster) stop(t *testing.T) {
	t.Helper()
	for _, p := range c.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range c.procs {
		select {
		case err := <-p.exit:
			p.exit <- err
			if err != nil {
				t.Errorf("%s exited with %v after SIGTERM", p.name, err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("%s did not exit within 15s of SIGTERM", p.name)
		}
	}
}

func mustSub(t *testing.T, fsys fs.FS) fs.FS {
	t.Helper()
	sub, err := fs.Sub(fsys, "demo")
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// runToEnd starts a goal on the supervisor and waits for a terminal run.
func runToEnd(t *testing.T, addr, goal string) *planexv1.Run {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := planexv1.NewSupervisorServiceClient(conn)
	ctx := ctxT(t, 2*time.Minute)
	started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: goal})
	if err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	stream, err := client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: started.GetRun().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: started.GetRun().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	return got.GetRun()
}

var (
	emailRE      = regexp.MustCompile(`[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}`)
	sqlLiteralRE = regexp.MustCompile(`'[^']*'|\b(2024|2025)\b|Acme|Globex`)
)

// TestOneTracePerRunInJaeger runs a multi-step demo goal across separate
// service processes exporting to a real Jaeger and reads the trace back
// through Jaeger's HTTP query API.
func TestOneTracePerRunInJaeger(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Jaeger and runs five processes; skipped with -short")
	}
	j := startJaeger(t)
	nats := natstest.Start(t)
	env := []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + j.otlp,
		"OTEL_TRACES_SAMPLER=always_on",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}
	c := startCluster(t, nats.URL(), env, "sql", "email")
	run := runToEnd(t, c.supervisor, "Email the account team a summary of the top 5 customers by revenue in 2025")
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run %s: %v %v %s", run.GetId(), run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
	}
	if run.GetTraceId() == "" {
		t.Fatal("run has no trace id")
	}
	replanned := runToEnd(t, c.supervisor, "What is the average order value by region in 2025?")
	if replanned.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("replanning run: %v %s", replanned.GetStatus(), replanned.GetStopMessage())
	}
	// A gate a person takes a while to decide: its wait is a span.
	const wait = 300 * time.Millisecond
	gated, gate := runGated(t, c.supervisor, "Close support ticket 400", wait)
	if gated.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("gated run: %v %s", gated.GetStatus(), gated.GetStopMessage())
	}
	checkMetrics(t, c.metrics)
	c.stop(t)
	checkGateSpan(t, j, gated, gate, wait)

	wantServices := []string{"planex-supervisor", "planex-planner", "planex-executor-sql", "planex-executor-email"}
	var tr jTrace
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, ok := j.trace(t, run.GetTraceId())
		if ok {
			tr = got
			// Jaeger stores spans as the services' exporters deliver them:
			// wait for every service and for every parent a span names (the
			// checks below fail on one still missing at the deadline).
			missing := missingServices(tr, wantServices)
			if len(missing) == 0 && len(danglingParents(tr)) == 0 {
				break
			} else if time.Now().After(deadline) {
				if len(missing) > 0 {
					t.Fatalf("trace %s lacks spans from %v", run.GetTraceId(), missing)
				}
				break
			}
		} else if time.Now().After(deadline) {
			t.Fatalf("jaeger has no trace %s", run.GetTraceId())
		}
		time.Sleep(200 * time.Millisecond)
	}

	byID := map[string]jSpan{}
	for _, s := range tr.Spans {
		if s.TraceID != run.GetTraceId() {
			t.Fatalf("span %s %q has trace %s, want %s", s.SpanID, s.OperationName, s.TraceID, run.GetTraceId())
		}
		byID[s.SpanID] = s
	}
	service := func(s jSpan) string { return tr.Processes[s.ProcessID].ServiceName }

	var roots []jSpan
	for _, s := range tr.Spans {
		if s.parent() == "" {
			roots = append(roots, s)
		}
	}
	if len(roots) != 1 || roots[0].OperationName != "run" || service(roots[0]) != "planex-supervisor" {
		var names []string
		for _, r := range roots {
			names = append(names, service(r)+"/"+r.OperationName)
		}
		t.Fatalf("want exactly one root span, the supervisor's run span; got %v", names)
	}
	root := roots[0]

	toolSpans := 0
	for _, s := range tr.Spans {
		if !strings.HasPrefix(s.OperationName, "tool ") {
			continue
		}
		toolSpans++
		if !strings.HasPrefix(service(s), "planex-executor-") {
			t.Errorf("tool span %q from %s, want an executor", s.OperationName, service(s))
		}
		sawDispatch := false
		cur := s
		for hops := 0; cur.parent() != ""; hops++ {
			p, ok := byID[cur.parent()]
			if !ok {
				t.Fatalf("tool span %q: ancestor %s missing from the trace", s.OperationName, cur.parent())
			}
			if p.OperationName == "dispatch step" && service(p) == "planex-supervisor" {
				sawDispatch = true
			}
			cur = p
			if hops > 50 {
				t.Fatal("parent chain too long")
			}
		}
		if cur.SpanID != root.SpanID {
			t.Errorf("tool span %q does not reach the run's root span", s.OperationName)
		}
		if !sawDispatch {
			t.Errorf("tool span %q: no supervisor dispatch span among its ancestors", s.OperationName)
		}
		for _, key := range []string{"planex.run_id", "planex.step_id", "planex.attempt", "planex.plan_revision", "planex.tool", "planex.pool"} {
			if _, ok := s.tag(key); !ok {
				t.Errorf("tool span %q lacks %s", s.OperationName, key)
			}
		}
		if v, _ := s.tag("planex.run_id"); v != run.GetId() {
			t.Errorf("tool span %q planex.run_id = %v, want %s", s.OperationName, v, run.GetId())
		}
	}
	if toolSpans < 3 {
		t.Fatalf("found %d tool spans, want one per step (query, draft, send)", toolSpans)
	}

	for _, s := range tr.Spans {
		switch {
		case s.OperationName == "dispatch step", s.OperationName == "plan revision", strings.HasPrefix(s.OperationName, "execute "):
			for _, key := range []string{"planex.run_id", "planex.plan_revision"} {
				if _, ok := s.tag(key); !ok {
					t.Errorf("span %q (%s) lacks %s", s.OperationName, service(s), key)
				}
			}
		}
		for _, tg := range s.Tags {
			str, ok := tg.Value.(string)
			if !ok {
				continue
			}
			if emailRE.MatchString(str) {
				t.Errorf("span %q tag %s carries an e-mail address in clear: %q", s.OperationName, tg.Key, str)
			}
			if strings.HasPrefix(tg.Key, "db.") && sqlLiteralRE.MatchString(str) {
				t.Errorf("span %q tag %s carries an SQL literal: %q", s.OperationName, tg.Key, str)
			}
		}
		for _, l := range s.Logs {
			for _, f := range l.Fields {
				if str, ok := f.Value.(string); ok && emailRE.MatchString(str) {
					t.Errorf("span %q event field %s carries an e-mail address: %q", s.OperationName, f.Key, str)
				}
			}
		}
	}
	if t.Failed() {
		return
	}
	t.Logf("trace %s: %d spans from %v", run.GetTraceId(), len(tr.Spans), wantServices)
}

// danglingParents are the parents named by spans of tr that tr does not
// hold.
func danglingParents(tr jTrace) []string {
	have := map[string]bool{}
	for _, s := range tr.Spans {
		have[s.SpanID] = true
	}
	var out []string
	for _, s := range tr.Spans {
		if p := s.parent(); p != "" && !have[p] {
			out = append(out, p)
		}
	}
	return out
}

func missingServices(tr jTrace, want []string) []string {
	have := map[string]bool{}
	for _, s := range tr.Spans {
		have[tr.Processes[s.ProcessID].ServiceName] = true
	}
	var missing []string
	for _, w := range want {
		if !have[w] {
			missing = append(missing, w)
		}
	}
	return missing
}

// checkMetrics scrapes every service's /metrics and checks the planex
// metrics have non-zero counts after the runs.
func checkMetrics(t *testing.T, addrs map[string]string) {
	t.Helper()
	want := map[string][]string{
		"supervisor":     {"planex_runs_started_total", "planex_runs_finished_total", "planex_steps_dispatched_total", "planex_steps_finished_total", "planex_replans_total", "planex_engine_handle_duration_seconds_count", "planex_planner_call_duration_seconds_count"},
		"planner":        {"planex_planner_duration_seconds_count"},
		"executor-sql":   {"planex_executor_steps_total", "planex_executor_step_duration_seconds_count"},
		"executor-email": {"planex_executor_steps_total", "planex_executor_step_duration_seconds_count"},
	}
	present := map[string][]string{
		"supervisor":   {"planex_consumer_pending"},
		"executor-sql": {"planex_executor_steps_in_flight"},
	}
	for svc, names := range want {
		body := scrape(t, addrs[svc])
		for _, name := range names {
			if v := metricSum(body, name); v <= 0 {
				t.Errorf("%s /metrics: %s = %v, want > 0", svc, name, v)
			}
		}
		for _, name := range present[svc] {
			if !strings.Contains(body, "\n"+name) {
				t.Errorf("%s /metrics lacks %s", svc, name)
			}
		}
	}
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// metricSum adds the values of every series of a metric in Prometheus
// text format.
func metricSum(body, name string) float64 {
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		fields := strings.Fields(line)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// runGated starts a goal whose plan opens a gate, approves the gate as
// "e2e" after wait, and returns the finished run and the gate's id.
func runGated(t *testing.T, addr, goal string, wait time.Duration) (*planexv1.Run, string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := planexv1.NewSupervisorServiceClient(conn)
	ctx := ctxT(t, 2*time.Minute)
	started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: goal})
	if err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	id := started.GetRun().GetId()
	var gate string
	for deadline := time.Now().Add(time.Minute); gate == ""; time.Sleep(50 * time.Millisecond) {
		got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range got.GetRun().GetGates() {
			if g.GetDecision() == planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED {
				gate = g.GetId()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s opened no gate within a minute: %v", id, got.GetRun().GetStatus())
		}
	}
	time.Sleep(wait) // the person reading the request
	if _, err := client.Decide(ctx, &planexv1.DecideRequest{RunId: id, GateId: gate, Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, Actor: "e2e"}); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	stream, err := client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	return got.GetRun(), gate
}

// checkGateSpan reads the gated run's trace back from Jaeger: its gate is
// a span under the root lasting the recorded wait, naming the decider,
// and no span of the trace ends after the root.
func checkGateSpan(t *testing.T, j *jaeger, run *planexv1.Run, gateID string, wait time.Duration) {
	t.Helper()
	var tr jTrace
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got, ok := j.trace(t, run.GetTraceId())
		if ok && slices.ContainsFunc(got.Spans, func(s jSpan) bool { return s.OperationName == "run" }) && len(danglingParents(got)) == 0 {
			tr = got
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("jaeger has no complete trace %s with its root (ok %v, %d spans)", run.GetTraceId(), ok, len(got.Spans))
		}
	}
	var root, gate jSpan
	for _, s := range tr.Spans {
		if s.OperationName == "run" && s.parent() == "" {
			root = s
		}
		if v, _ := s.tag("planex.gate_id"); v == gateID && strings.HasPrefix(s.OperationName, "gate ") {
			gate = s
		}
	}
	if root.SpanID == "" || gate.SpanID == "" {
		t.Fatalf("trace %s: root %q, gate span %q", run.GetTraceId(), root.SpanID, gate.SpanID)
	}
	var rec *planexv1.Gate
	for _, g := range run.GetGates() {
		if g.GetId() == gateID {
			rec = g
		}
	}
	want := rec.GetDecidedAt().AsTime().Sub(rec.GetOpenedAt().AsTime())
	// Jaeger keeps microseconds.
	if got := time.Duration(gate.Duration) * time.Microsecond; got < wait || got > want+time.Microsecond || got < want-time.Microsecond {
		t.Errorf("gate span lasts %s; the gate waited %s (at least %s)", got, want, wait)
	}
	if v, _ := gate.tag("planex.gate.decider"); v != "e2e" {
		t.Errorf("gate span decider %v, want e2e", v)
	}
	if v, _ := gate.tag("planex.gate.decision"); v != "approve" {
		t.Errorf("gate span decision %v, want approve", v)
	}
	if gate.parent() != root.SpanID {
		t.Errorf("gate span's parent %s is not the root %s", gate.parent(), root.SpanID)
	}
	// Nothing of the run starts after its root ended. An executor's
	// messaging spans may end a little after it: the executor's publish of
	// the last result ends when JetStream acknowledges it, and the
	// supervisor can consume that result and end the run first (seen in
	// CI: 397µs). What must not happen is work begun after the run ended.
	rootEnd := root.StartTime + root.Duration
	for _, s := range tr.Spans {
		if s.StartTime > rootEnd {
			t.Errorf("span %q starts %dµs after the root ended", s.OperationName, s.StartTime-rootEnd)
		} else if end := s.StartTime + s.Duration; end > rootEnd && !strings.HasPrefix(s.OperationName, "publish ") && !strings.HasPrefix(s.OperationName, "process ") {
			t.Errorf("span %q ends %dµs after the root", s.OperationName, end-rootEnd)
		}
	}
}
