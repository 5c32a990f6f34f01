package main

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/planex-dev/planex/internal/eval"
)

// gatesSuite decides the close-ticket gates as a user would: approve one,
// reject one (the playbook replans and reads the ticket again), and
// leave one to no rule, which fails its task at once and cancels the run.
const gatesSuite = `
name: gates
tasks:
  - name: close-approved
    goal: Close support ticket 400
    gates: [{step: close, decision: approve, comment: checked with the customer}]
    expect:
      status: succeeded
      result: [{regexp: '^Closed support ticket 400 '}]
      trajectory:
        match: subset
        calls: [{tool: sql.exec, outcome: succeeded}]
  - name: close-rejected
    goal: Close support ticket 401
    gates: [{step: "*", decision: reject, comment: not today}]
    expect:
      status: succeeded
      result: [{regexp: 'closing it was rejected at its approval gate'}]
  - name: close-undecided
    goal: Close support ticket 402
    expect:
      status: cancelled
`

// TestEvalDevDecidesGatesAndExportsTraces runs a gated suite live on a dev
// stack with OTEL_EXPORTER_OTLP_ENDPOINT pointing at an in-process OTLP
// receiver, recording a cassette, then offline from that cassette: the
// harness decides each gate as its task says (approve, reject), a gate no
// rule decides fails its task at once naming the rule to add, both runs
// score the same, and the dev stack's spans reach the receiver.
func TestEvalDevDecidesGatesAndExportsTraces(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dev stack; skipped with -short")
	}
	recv := startSpanReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.addr)
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")

	dir := t.TempDir()
	suite := writeTemp(t, "gates.yaml", gatesSuite)
	cas := filepath.Join(dir, "cassette")
	live, offline := filepath.Join(dir, "live.json"), filepath.Join(dir, "offline.json")
	out, err := planexIn(t, "eval", suite, "--dev", "--data-dir", filepath.Join(dir, "data"), "--record", cas, "--report", live, "--task-timeout", "90s")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitFailed || !strings.Contains(err.Error(), "1 of 3 tasks failed") {
		t.Fatalf("live: %v\n%s", err, out)
	}
	l := readReport(t, live)
	checkGateTasks(t, "live", l)
	if n := recv.spans("planex-dev"); n == 0 {
		t.Fatalf("no span of service planex-dev reached the OTLP receiver (got %v)", recv.byService())
	}

	out, err = planexIn(t, "eval", suite, "--replay", cas, "--report", offline, "--task-timeout", "90s")
	if !errors.As(err, &ee) || ee.code != exitFailed {
		t.Fatalf("offline: %v\n%s", err, out)
	}
	o := readReport(t, offline)
	checkGateTasks(t, "offline", o)
	if a, b := jsonOf(t, scores(l)), jsonOf(t, scores(o)); a != b {
		t.Fatalf("scores differ:\nlive:\n%s\noffline:\n%s", a, b)
	}
}

func checkGateTasks(t *testing.T, mode string, r eval.Report) {
	t.Helper()
	byName := map[string]eval.TaskResult{}
	for _, task := range r.Tasks {
		byName[task.Name] = task
	}
	if a := byName["close-approved"]; !a.Passed || len(a.Gates) != 1 || !strings.HasPrefix(a.Gates[0], "approve gate ") {
		t.Errorf("%s: approved task %+v", mode, a)
	}
	if rj := byName["close-rejected"]; !rj.Passed || len(rj.Gates) != 1 || !strings.HasPrefix(rj.Gates[0], "reject gate ") {
		t.Errorf("%s: rejected task %+v", mode, rj)
	}
	u := byName["close-undecided"]
	if u.Passed || u.Status != "cancelled" || len(u.Failures) != 1 ||
		!strings.Contains(u.Failures[0], "(step close) opened") || !strings.Contains(u.Failures[0], "add gates: [{step: close, decision: approve}]") {
		t.Errorf("%s: undecided task %+v", mode, u)
	}
	if u.LatencyMS > 60_000 {
		t.Errorf("%s: the undecided task took %.0fms: it waited for the task timeout", mode, u.LatencyMS)
	}
}

// TestEvalRecordsAndReplaysTheModelCritic records a suite whose model
// critic (an OpenAI-compatible server) rejects the first result: the
// critic is asked for real while recording (one replan), its verdicts are
// in the cassette, and the offline replay reproduces the replan without
// asking any model.
func TestEvalRecordsAndReplaysTheModelCritic(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dev stack; skipped with -short")
	}
	var (
		mu    sync.Mutex
		asked int
	)
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		var body map[string]any
		if r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&body) != nil || strictVerdictFormat(body) != "" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"message":"bad request","type":"invalid_request_error","param":null,"code":null}}`))
			return
		}
		msgs := body["messages"].([]any)
		user, _ := msgs[len(msgs)-1].(map[string]any)["content"].(string)
		answer := `{"verdict":"pass","reason":"a number"}`
		if strings.Contains(user, `Step "first"`) {
			answer = `{"verdict":"fail","reason":"one is not the number we want"}`
		}
		mu.Lock()
		asked++
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-1", "object": "chat.completion", "created": 1767139200, "model": "critic-model",
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "logprobs": nil,
				"message": map[string]any{"role": "assistant", "content": answer, "refusal": nil}}},
			"usage": map[string]any{"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
		})
	}))
	t.Cleanup(provider.Close)
	t.Setenv("OPENAI_API_KEY", "sk-critic")

	dir := t.TempDir()
	books := filepath.Join(dir, "books")
	if err := os.MkdirAll(books, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(books, "probe.yaml"), []byte(criticPlaybook), 0o644); err != nil {
		t.Fatal(err)
	}
	suite := writeTemp(t, "critic.yaml", `
name: critic
tasks:
  - name: probe
    goal: Probe the critic
    expect:
      status: succeeded
      result: [{exact: second}]
      trajectory:
        match: ordered
        calls: [{tool: sql.query, outcome: failed}, {tool: sql.query, outcome: succeeded}]
`)
	critic := []string{"--critic-backend=openai", "--critic-tools=sql.query"}
	cas := filepath.Join(dir, "cassette")
	live, offline := filepath.Join(dir, "live.json"), filepath.Join(dir, "offline.json")
	args := append([]string{"eval", suite, "--dev", "--data-dir", filepath.Join(dir, "data"), "--record", cas, "--report", live,
		"--playbooks", books, "--planner-allow-backend-override", "--openai-base-url", provider.URL + "/v1", "--openai-model", "critic-model"}, critic...)
	if out, err := planexIn(t, args...); err != nil {
		t.Fatalf("live: %v\n%s", err, out)
	}
	mu.Lock()
	recorded := asked
	mu.Unlock()
	if recorded != 2 {
		t.Fatalf("the critic's model was asked %d times while recording, want 2 (one per result)", recorded)
	}
	files, err := filepath.Glob(filepath.Join(cas, "critique-sql.query-*.json"))
	if err != nil || len(files) != 2 {
		t.Fatalf("critique recordings %v (%v), want 2", files, err)
	}
	if l := readReport(t, live); l.Tasks[0].Replans != 1 || !l.Tasks[0].Passed {
		t.Fatalf("live: %+v", l.Tasks[0])
	}

	provider.Close()
	if out, err := planexIn(t, append([]string{"eval", suite, "--replay", cas, "--report", offline}, critic...)...); err != nil {
		t.Fatalf("offline: %v\n%s", err, out)
	}
	o := readReport(t, offline)
	if o.Tasks[0].Replans != 1 || !o.Tasks[0].Passed {
		t.Fatalf("offline: %+v", o.Tasks[0])
	}
	if a, b := jsonOf(t, scores(readReport(t, live))), jsonOf(t, scores(o)); a != b {
		t.Fatalf("scores differ:\nlive:\n%s\noffline:\n%s", a, b)
	}
}

// TestBaselineRegressionReported compares a replay with a baseline it
// regressed from: the regression fails the exit code and shows in the
// JUnit XML (a failed test case per regressed metric) and the JSON report;
// the baseline's faster latency is not compared in a replay, unless
// --gate-latency asks for it.
func TestBaselineRegressionReported(t *testing.T) {
	dir := t.TempDir()
	suite := writeTemp(t, "one.yaml", `
name: one
tasks:
  - name: open-tickets
    goal: How many open support tickets does Acme Corp have?
`)
	base := filepath.Join(dir, "base.json")
	write := func(steps float64) {
		t.Helper()
		b := eval.Report{Suite: "one", Mode: "replay", Metrics: eval.Metrics{Tasks: 1, Passed: 1, SuccessRate: 1, StepsPerTask: steps, ToolSuccessRate: 1,
			LatencyP50MS: 0.001, LatencyP95MS: 0.001}}
		if err := writeFileWith(base, b.WriteJSON); err != nil {
			t.Fatal(err)
		}
	}

	write(2) // the run's own step count: only latency is worse
	report := filepath.Join(dir, "same.json")
	zero := []string{"--tolerance", "latency_p50_ms=0", "--tolerance", "latency_p95_ms=0"}
	if out, err := planexIn(t, append([]string{"eval", suite, "--replay", demoCassette, "--baseline", base, "--report", report}, zero...)...); err != nil {
		t.Fatalf("latency was gated in a replay: %v\n%s", err, out)
	} else if !strings.Contains(out, "skipped latency_p50_ms: not compared in a replay") {
		t.Fatalf("table does not say latency was skipped:\n%s", out)
	}
	if r := readReport(t, report); r.Baseline == nil || len(r.Baseline.Regressions) != 0 || len(r.Baseline.Skipped) != 2 {
		t.Fatalf("report baseline %+v", r.Baseline)
	}
	out, err := planexIn(t, append([]string{"eval", suite, "--replay", demoCassette, "--baseline", base, "--gate-latency"}, zero...)...)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitFailed || !strings.Contains(err.Error(), "latency_p50_ms regressed") {
		t.Fatalf("--gate-latency: %v\n%s", err, out)
	}

	write(1) // one step per task: the run's two regress
	junit, report := filepath.Join(dir, "r.xml"), filepath.Join(dir, "r.json")
	out, err = planexIn(t, "eval", suite, "--replay", demoCassette, "--baseline", base, "--junit", junit, "--report", report)
	if !errors.As(err, &ee) || ee.code != exitFailed || !strings.Contains(err.Error(), "steps_per_task regressed: old 1, new 2") {
		t.Fatalf("regression: %v\n%s", err, out)
	}
	data, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
			Cases    []struct {
				Name    string `xml:"name,attr"`
				Failure *struct {
					Message string `xml:"message,attr"`
				} `xml:"failure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &doc); err != nil || len(doc.Suites) != 1 || doc.Suites[0].Failures != 1 || doc.Suites[0].Tests != 1+len(eval.GateNames())-2 {
		t.Fatalf("junit: %v\n%s", err, data)
	}
	var failed []string
	for _, c := range doc.Suites[0].Cases {
		if c.Failure != nil {
			failed = append(failed, c.Name+": "+c.Failure.Message)
		}
	}
	if len(failed) != 1 || !strings.HasPrefix(failed[0], "baseline steps_per_task: steps_per_task regressed") {
		t.Fatalf("junit failures %q\n%s", failed, data)
	}
	r := readReport(t, report)
	if !r.Regressed() || r.Baseline.Regressions[0].Metric != "steps_per_task" || r.Baseline.Path != base {
		t.Fatalf("report baseline %+v", r.Baseline)
	}
}

// spanReceiver is an OTLP/gRPC trace receiver counting spans by service.
type spanReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	addr     string
	mu       sync.Mutex
	services map[string]int
}

func (o *spanReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				for _, ss := range rs.GetScopeSpans() {
					o.services[a.GetValue().GetStringValue()] += len(ss.GetSpans())
				}
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (o *spanReceiver) spans(service string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.services[service]
}

func (o *spanReceiver) byService() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]int{}
	for k, v := range o.services {
		out[k] = v
	}
	return out
}

func startSpanReceiver(t *testing.T) *spanReceiver {
	t.Helper()
	o := &spanReceiver{services: map[string]int{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.addr = "http://" + l.Addr().String()
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, o)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return o
}
