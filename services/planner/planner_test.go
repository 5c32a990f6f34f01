package planner_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/planner"
	"github.com/planex-dev/planex/services/planner/internal/plannertest"
	"github.com/planex-dev/planex/services/planner/playbook"
)

// startPlanner runs the planner service with the given flags against an
// embedded NATS server and returns a client; the service stops, and Run's
// error is checked, when the test ends.
func startPlanner(t *testing.T, args ...string) planexv1.PlannerServiceClient {
	t.Helper()
	srv := natstest.Start(t)
	var cfg planner.Config
	fs := pflag.NewFlagSet("planner", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse(append([]string{"--grpc-addr=127.0.0.1:0", "--nats-url=" + srv.URL(), "--shutdown-grace=2s", "--plaintext", "--auth-disabled"}, args...)); err != nil {
		t.Fatal(err)
	}
	cfg.Backend.BuiltinPlaybooks = playbook.DemoFS
	ready := make(chan net.Addr, 1)
	cfg.OnReady = func(a net.Addr) { ready <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- planner.Run(ctx, cfg, natstest.Logger(t), nil) }()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("planner did not start: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("planner not ready within 20s")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("planner did not stop within 10s")
		}
	})
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	// SERVING is reported once NATS is up and the streams exist.
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health: %v %v", r, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return planexv1.NewPlannerServiceClient(conn)
}

// TestEndToEndOpenAI is the acceptance scenario: `planex planner
// --backend=openai --openai-base-url=http://127.0.0.1:PORT/v1` against a
// local server speaking the OpenAI wire format, called over real gRPC.
func TestEndToEndOpenAI(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-e2e")
	fake := plannertest.NewFake(t)
	client := startPlanner(t, "--backend=openai", "--openai-base-url="+fake.URL+"/v1", "--openai-model=local-model",
		"--planner-max-retries=1", "--planner-call-timeout=5s", "--planner-allow-backend-override", "--planner-max-output-tokens=3000")
	tools := plannertest.Catalog(t)
	ctx := context.Background()
	req := func() *planexv1.PlanRequest {
		return &planexv1.PlanRequest{RunId: "run-e2e", Goal: "How many open support tickets does Acme Corp have?", Tools: tools, Revision: 1}
	}

	t.Run("valid plan", func(t *testing.T) {
		fake.Script(plannertest.OpenAIAnswer(plannertest.Answer(true, plannertest.CountStep)))
		resp, err := client.Plan(ctx, req())
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetBackend() != "openai" || resp.GetModel() != "gpt-test-2025" || resp.GetPromptVersion() == "" ||
			resp.GetUsage().GetInputTokens() != plannertest.FakeInputTokens || len(resp.GetPlan().GetSteps()) != 1 || resp.GetPlan().GetRevision() != 1 {
			t.Errorf("response = %v", resp)
		}
		reqs := fake.Requests()
		if len(reqs) != 1 || reqs[0].Path != "/v1/chat/completions" || reqs[0].Body["model"] != "local-model" || reqs[0].Header.Get("Authorization") != "Bearer sk-e2e" {
			t.Errorf("provider saw %+v", reqs)
		}
	})

	t.Run("per-run override to the playbook backend", func(t *testing.T) {
		fake.Script()
		r := req()
		r.Backend = "playbook"
		resp, err := client.Plan(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetBackend() != "playbook" || !strings.HasPrefix(resp.GetPlan().GetRationale(), "playbook open-tickets:") || len(fake.Requests()) != 0 {
			t.Errorf("response = %v after %d provider calls", resp, len(fake.Requests()))
		}
	})

	errorCases := []struct {
		name   string
		script []plannertest.Reply
		req    func() *planexv1.PlanRequest
		code   codes.Code
		msg    string
		usage  int64
	}{
		{"missing goal", nil, func() *planexv1.PlanRequest { r := req(); r.Goal = " "; return r }, codes.InvalidArgument, "goal: required", 0},
		{"empty catalog", nil, func() *planexv1.PlanRequest { r := req(); r.Tools = nil; return r }, codes.InvalidArgument, "tools: the catalog is empty", 0},
		{"unknown backend", nil, func() *planexv1.PlanRequest { r := req(); r.Backend = "gemini"; return r }, codes.InvalidArgument, `backend "gemini": not configured`, 0},
		{"no playbook matches", nil, func() *planexv1.PlanRequest {
			r := req()
			r.Backend, r.Goal = "playbook", "Book a flight to Lisbon"
			return r
		}, codes.FailedPrecondition, `no playbook matches goal "Book a flight to Lisbon"`, 0},
		{"budget", []plannertest.Reply{plannertest.OpenAIAnswer("{}")}, func() *planexv1.PlanRequest {
			r := req()
			r.Constraints = &planexv1.PlanConstraints{RemainingTokens: 100}
			return r
		}, codes.ResourceExhausted, "token budget exhausted", 0},
		// Final, so the supervisor stops the run PLANNER_ERROR with the
		// provider's status and message instead of retrying forever.
		{"500 storm", []plannertest.Reply{plannertest.OpenAIError(503, map[string]string{"Retry-After-Ms": "1"}, "upstream overloaded for key sk-e2e")}, req, codes.FailedPrecondition,
			"openai: HTTP 503 Service Unavailable: model provider unavailable: upstream overloaded for key [REDACTED] (gave up after 2 attempts", 0},
		{"invalid after repair", []plannertest.Reply{plannertest.OpenAIAnswer(plannertest.Answer(true, plannertest.Step{ID: "x", Tool: "sql.magic"}))}, req, codes.Aborted, `"sql.magic"`, 2 * plannertest.FakeInputTokens},
		// Final too: every answer is cut at the output cap (finish_reason
		// "length"), so replanning would only spend the replans and end
		// BUDGET_EXCEEDED; the run stops PLANNER_ERROR naming the flag.
		{"always cut at the output cap", []plannertest.Reply{plannertest.OpenAITruncated(`{"rationale": "first count the tickets per`)}, req, codes.FailedPrecondition,
			"raise --planner-max-output-tokens (now 3000)", 2 * plannertest.FakeInputTokens},
	}
	for _, tc := range errorCases {
		t.Run(tc.name, func(t *testing.T) {
			fake.Script(tc.script...)
			_, err := client.Plan(ctx, tc.req())
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("status = %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
			if strings.Contains(st.Message(), "sk-e2e") {
				t.Errorf("message leaks the API key: %q", st.Message())
			}
			var used int64
			for _, d := range st.Details() {
				if u, ok := d.(*planexv1.TokenUsage); ok {
					used = u.GetInputTokens()
				}
			}
			if used != tc.usage {
				t.Errorf("usage detail = %d input tokens, want %d", used, tc.usage)
			}
		})
	}
}

func TestRunRejectsMalformedPlaybooksAtStart(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "broken.yaml", "name: broken\ndescription: d\nmatch: ['^(x$']\nsteps: [{id: a, tool: sql.query}]\n")
	var cfg planner.Config
	fs := pflag.NewFlagSet("planner", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--playbooks", dir, "--nats-url=nats://127.0.0.1:1", "--plaintext", "--auth-disabled"}); err != nil {
		t.Fatal(err)
	}
	err := planner.Run(context.Background(), cfg, natstest.Logger(t), nil)
	if err == nil || !strings.Contains(err.Error(), "broken.yaml:3: match[0]: bad regular expression") {
		t.Fatalf("Run = %v, want the file and line of the bad pattern", err)
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown backend", []string{"--planner-backend=gemini"}, `--planner-backend "gemini": want playbook, openai, anthropic or replay`},
		{"bad base URL", []string{"--openai-base-url=localhost:8080"}, `--openai-base-url "localhost:8080": want an http:// or https:// URL`},
		{"cache mode", []string{"--plan-cache=always"}, `--plan-cache "always": want off, example or reuse`},
		{"escalation without model", []string{"--backend=openai", "--escalation-backend=anthropic"}, "--escalation-model: required with --escalation-backend anthropic"},
		{"escalation from playbooks", []string{"--escalation-backend=openai", "--escalation-model=big"}, "escalation needs a model backend"},
		{"timeout", []string{"--planner-call-timeout=0s"}, "--planner-call-timeout 0s: must be positive"},
		{"threshold", []string{"--escalation-threshold=2"}, "--escalation-threshold 2: want 0 to 1"},
		{"anthropic temperature", []string{"--backend=anthropic", "--planner-temperature=1.5"}, "--planner-temperature 1.5: the anthropic backend accepts 0 to 1"},
		{"anthropic escalation temperature", []string{"--backend=openai", "--escalation-backend=anthropic", "--escalation-model=big", "--planner-temperature=1.2"}, "the anthropic backend accepts 0 to 1"},
		{"openai temperature", []string{"--backend=openai", "--planner-temperature=2.5"}, "--planner-temperature 2.5: want at most 2"},
		{"retry budget", []string{"--planner-retry-budget=-1s"}, "--planner-retry-budget -1s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var cfg planner.Config
			fs := pflag.NewFlagSet("planner", pflag.ContinueOnError)
			cfg.RegisterFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
	var cfg planner.Config
	fs := pflag.NewFlagSet("planner", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--plaintext", "--auth-disabled"}); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
	if cfg.Backend.Backend != planner.BackendPlaybook || cfg.Backend.Temperature != 0.1 {
		t.Errorf("defaults = %+v", cfg.Backend)
	}
}

func TestMissingAPIKey(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "")
	var cfg planner.Config
	fs := pflag.NewFlagSet("planner", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--backend=openai"}); err != nil {
		t.Fatal(err)
	}
	_, err := planner.NewServer(cfg.Backend, natstest.Logger(t), nil)
	if err == nil || !strings.Contains(err.Error(), "set OPENAI_API_KEY or --openai-api-key-file") {
		t.Fatalf("NewServer = %v", err)
	}
	keyFile := writeFile(t, t.TempDir(), "key", "  \n")
	if err := fs.Parse([]string{"--openai-api-key-file=" + keyFile}); err != nil {
		t.Fatal(err)
	}
	if _, err := planner.NewServer(cfg.Backend, natstest.Logger(t), nil); err == nil || !strings.Contains(err.Error(), "file is empty") {
		t.Fatalf("NewServer = %v", err)
	}
}

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// modelConfig is a config whose openai backend talks to fake.
func modelConfig(fake *plannertest.Fake) planner.BackendConfig {
	return planner.BackendConfig{
		Backend:             planner.BackendOpenAI,
		OpenAI:              planner.ProviderConfig{BaseURL: fake.URL + "/v1", Model: "small"},
		Anthropic:           planner.ProviderConfig{BaseURL: "https://api.anthropic.com", Model: "claude"},
		MaxRetries:          0,
		CallTimeout:         5 * time.Second,
		Temperature:         0.1,
		MaxOutputTokens:     1024,
		PlanCache:           planner.CacheOff,
		PlanCacheTTL:        time.Hour,
		EscalationThreshold: 0.5,
	}
}

func TestServerValidatesPlaybookPlansAgainstTheCatalog(t *testing.T) {
	cfg := modelConfig(plannertest.NewFake(t))
	cfg.Backend = planner.BackendPlaybook
	cfg.BuiltinPlaybooks = playbook.DemoFS
	srv, err := planner.NewServer(cfg, natstest.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var sqlOnly []*planexv1.ToolSpec
	for _, s := range plannertest.Catalog(t) {
		if strings.HasPrefix(s.GetName(), "sql.") {
			sqlOnly = append(sqlOnly, s)
		}
	}
	_, err = srv.Plan(context.Background(), &planexv1.PlanRequest{Goal: "Find the runbook for failed payment retries and send it to oncall@example.com", Tools: sqlOnly})
	st, _ := status.FromError(err)
	if st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), `tool "search.query"`) {
		t.Errorf("status = %v %q, want FailedPrecondition naming the missing tool", st.Code(), st.Message())
	}

	resp, err := srv.Plan(context.Background(), &planexv1.PlanRequest{Goal: "How many open support tickets does Acme Corp have?", Tools: sqlOnly})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetPlan().GetRevision() != 1 {
		t.Errorf("a request without revision gets revision %d, want 1", resp.GetPlan().GetRevision())
	}

	_, err = srv.Plan(context.Background(), &planexv1.PlanRequest{Goal: "x", Tools: sqlOnly, Backend: "openai"})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "does not allow a per-run override") {
		t.Errorf("override: %v", err)
	}
}

func TestPlanCache(t *testing.T) {
	_, res := natstest.Start(t).Setup(t)
	kv, err := planner.CreatePlanCache(context.Background(), res.JS, time.Hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	fake := plannertest.NewFake(t)
	tools := plannertest.Catalog(t)
	t.Setenv("OPENAI_API_KEY", "sk-local") // the fake checks the Authorization header as the API does
	goal := "How many open support tickets are there?"
	answer := plannertest.OpenAIAnswer(plannertest.Answer(true, plannertest.CountStep))

	cfg := modelConfig(fake)
	cfg.PlanCache = planner.CacheExample
	example, err := planner.NewServer(cfg, natstest.Logger(t), kv)
	if err != nil {
		t.Fatal(err)
	}
	fake.Script(answer)
	if _, err := example.Plan(context.Background(), &planexv1.PlanRequest{Goal: goal, Tools: tools}); err != nil {
		t.Fatal(err)
	}
	// Same goal spelled differently: the stored plan is offered as an example.
	if _, err := example.Plan(context.Background(), &planexv1.PlanRequest{Goal: "how many open support tickets are there", Tools: tools}); err != nil {
		t.Fatal(err)
	}
	reqs := fake.Requests()
	user := func(i int) string {
		msgs, _ := reqs[i].Body["messages"].([]any)
		s, _ := msgs[1].(map[string]any)["content"].(string)
		return s
	}
	if len(reqs) != 2 || strings.Contains(user(0), "# Example") || !strings.Contains(user(1), "# Example") || !strings.Contains(user(1), "support_tickets") {
		t.Fatalf("example not offered: %d requests", len(reqs))
	}

	cfg.PlanCache = planner.CacheReuse
	reuse, err := planner.NewServer(cfg, natstest.Logger(t), kv)
	if err != nil {
		t.Fatal(err)
	}
	fake.Script(answer)
	resp, err := reuse.Plan(context.Background(), &planexv1.PlanRequest{Goal: goal + "  ", Tools: tools, Revision: 1})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetBackend() != "cache" || len(fake.Requests()) != 0 || resp.GetPlan().GetSteps()[0].GetId() != "count" || resp.GetPlan().GetRevision() != 1 {
		t.Errorf("reuse: backend %q after %d provider calls", resp.GetBackend(), len(fake.Requests()))
	}
	// Another catalog is another key.
	if _, err := reuse.Plan(context.Background(), &planexv1.PlanRequest{Goal: goal, Tools: tools[:2]}); err != nil {
		t.Fatal(err)
	}
	if len(fake.Requests()) != 1 {
		t.Errorf("a different catalog reused a plan")
	}
}

func TestEscalation(t *testing.T) {
	small := plannertest.NewFake(t)
	big := plannertest.NewFake(t)
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-local")
	t.Setenv("OPENAI_API_KEY", "sk-local")
	cfg := modelConfig(small)
	cfg.Anthropic.BaseURL = big.URL
	cfg.EscalationBackend = planner.BackendAnthropic
	cfg.EscalationModel = "claude-big"
	srv, err := planner.NewServer(cfg, natstest.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := plannertest.Catalog(t)
	unsure := strings.Replace(plannertest.Answer(true, plannertest.CountStep), `"confidence":0.9`, `"confidence":0.2`, 1)
	magic := plannertest.Answer(true, plannertest.Step{ID: "m", Tool: "sql.magic"})
	cases := []struct {
		name      string
		small     string
		big       plannertest.Reply
		backend   string
		bigCalls  int
		smallCall int
	}{
		{"confident answer stays", plannertest.Answer(true, plannertest.CountStep), nil, "openai", 0, 1},
		{"low confidence escalates", unsure, plannertest.AnthropicAnswer("toolu_1", plannertest.Answer(false, plannertest.CountStep)), "anthropic", 1, 1},
		{"invalid answer escalates", magic, plannertest.AnthropicAnswer("toolu_1", plannertest.Answer(false, plannertest.CountStep)), "anthropic", 1, 2},
		{"failed escalation keeps the first answer", unsure, plannertest.AnthropicError(400, nil, "invalid_request_error", "bad"), "openai", 1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			small.Script(plannertest.OpenAIAnswer(tc.small))
			big.Script(tc.big)
			resp, err := srv.Plan(context.Background(), &planexv1.PlanRequest{Goal: "count open tickets", Tools: tools})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetBackend() != tc.backend || len(big.Requests()) != tc.bigCalls || len(small.Requests()) != tc.smallCall {
				t.Errorf("backend %q, calls small %d big %d", resp.GetBackend(), len(small.Requests()), len(big.Requests()))
			}
			if want := int64(tc.bigCalls+tc.smallCall) * plannertest.FakeInputTokens; tc.backend == "anthropic" && resp.GetUsage().GetInputTokens() != want {
				t.Errorf("usage %v, want %d input tokens over both models", resp.GetUsage(), want)
			}
			if tc.backend == "anthropic" {
				if m := big.Requests()[0].Body["model"]; m != "claude-big" {
					t.Errorf("escalation model = %v", m)
				}
			}
		})
	}
}

func TestTelemetry(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prevM, prevT := otel.GetMeterProvider(), otel.GetTracerProvider()
	otel.SetMeterProvider(mp)
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetMeterProvider(prevM); otel.SetTracerProvider(prevT) })

	t.Setenv("OPENAI_API_KEY", "sk-local")
	fake := plannertest.NewFake(t, plannertest.OpenAIAnswer(plannertest.Answer(true, plannertest.CountStep)))
	srv, err := planner.NewServer(modelConfig(fake), natstest.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Plan(context.Background(), &planexv1.PlanRequest{RunId: "run-7", Goal: "g", Tools: plannertest.Catalog(t), Revision: 2}); err != nil {
		t.Fatal(err)
	}
	var span sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "planner openai" {
			span = s
		}
	}
	if span == nil {
		t.Fatal("no planner span")
	}
	attrs := map[string]string{}
	for _, a := range span.Attributes() {
		attrs[string(a.Key)] = a.Value.String()
	}
	if attrs["planex.run_id"] != "run-7" || attrs["planex.plan_revision"] != "2" || attrs["planex.tokens.input"] != "100" {
		t.Errorf("span attributes = %v", attrs)
	}
	// The model call is a GenAI client span under it.
	var chat sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if strings.HasPrefix(s.Name(), "chat ") && s.Parent().SpanID() == span.SpanContext().SpanID() {
			chat = s
		}
	}
	if chat == nil {
		t.Fatal("no chat span under the planner span")
	}
	chatAttrs := map[string]string{}
	for _, a := range chat.Attributes() {
		chatAttrs[string(a.Key)] = a.Value.Emit()
	}
	if chatAttrs["gen_ai.provider.name"] != "openai" || chatAttrs["gen_ai.operation.name"] != "chat" || chatAttrs["gen_ai.usage.input_tokens"] != "100" {
		t.Errorf("chat span attributes = %v", chatAttrs)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					typ, _ := p.Attributes.Value("type")
					got[m.Name+"/"+typ.AsString()] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					got[m.Name] += int64(p.Count)
				}
			}
		}
	}
	if got["planex.planner.tokens/input"] != 100 || got["planex.planner.tokens/output"] != 20 || got["planex.planner.duration"] != 1 {
		t.Errorf("metrics = %v", got)
	}
}
