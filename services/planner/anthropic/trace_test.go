package anthropic_test

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/planner/anthropic"
	"github.com/planex-dev/planex/services/planner/internal/plannertest"
	"github.com/planex-dev/planex/services/planner/llm"
)

// Each model call is a "chat <model>" client span with the GenAI
// semantic conventions' attributes, token usage included: one for the
// first answer, one for the repair round, and error.type on a failure.
// Not parallel: it swaps the global tracer provider.
func TestModelCallSpansFollowGenAIConventions(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	valid := plannertest.Answer(false, plannertest.CountStep)
	f := plannertest.NewFake(t, plannertest.AnthropicAnswer("toolu_0", `{"steps": "not a list"}`), plannertest.AnthropicAnswer("toolu_1", valid))
	b, err := llm.New(anthropic.New(llm.ProviderConfig{BaseURL: f.URL, APIKey: plannertest.SuiteAPIKey, Model: plannertest.SuiteModel}),
		llm.Options{Name: "anthropic", Model: plannertest.SuiteModel, Validate: plannertest.Validate})
	if err != nil {
		t.Fatal(err)
	}
	req := &planexv1.PlanRequest{RunId: "run-1", Goal: "How many open support tickets are there?", Tools: plannertest.Catalog(t), Revision: 1}
	if _, err := b.Plan(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	f.Script(plannertest.AnthropicError(http.StatusUnauthorized, nil, "authentication_error", "invalid x-api-key"))
	if _, err := b.Plan(context.Background(), req); err == nil {
		t.Fatal("a 401 answer planned")
	}

	var calls []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "chat "+plannertest.SuiteModel {
			calls = append(calls, s)
		}
	}
	if len(calls) != 3 {
		t.Fatalf("%d chat spans, want 3 (answer, repair, refused call)", len(calls))
	}
	for i, s := range calls {
		a := attrMap(s.Attributes())
		if s.SpanKind() != trace.SpanKindClient || a["gen_ai.operation.name"] != "chat" || a["gen_ai.provider.name"] != "anthropic" ||
			a["gen_ai.request.model"] != plannertest.SuiteModel || a["gen_ai.request.max_tokens"] == nil || a["planex.planner.round"] != []int64{0, 1, 0}[i] {
			t.Errorf("call %d: kind %v, attributes %v", i, s.SpanKind(), a)
		}
		if i < 2 && (a["gen_ai.usage.input_tokens"] != int64(plannertest.FakeInputTokens) || a["gen_ai.usage.output_tokens"] != int64(plannertest.FakeOutputTokens) ||
			a["gen_ai.response.model"] != "claude-test-2025") {
			t.Errorf("call %d: usage and response model %v", i, a)
		}
	}
	if a := attrMap(calls[2].Attributes()); a["error.type"] != "401" {
		t.Errorf("refused call: error.type %v, want 401", a["error.type"])
	}
}

func attrMap(kvs []attribute.KeyValue) map[string]any {
	m := map[string]any{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}
