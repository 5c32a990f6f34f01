package sqlpool

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestQuerySpanHidesLiterals(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	fx := sqliteFixture(t, Config{})
	if _, terr := call(t, fx.pool, "sql.query", map[string]any{"sql": "SELECT id FROM t WHERE name = 'name-1' AND id < 42 -- note"}); terr != nil {
		t.Fatal(terr)
	}
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].Name() != "SELECT" {
		t.Fatalf("spans %v", spans)
	}
	got := map[string]string{}
	for _, kv := range spans[0].Attributes() {
		got[string(kv.Key)] = kv.Value.String()
	}
	if got["db.system"] != "sqlite" || got["db.operation"] != "SELECT" || got["db.query.text"] != "SELECT id FROM t WHERE name = ? AND id < ?" {
		t.Fatalf("span attributes %v", got)
	}
	for _, v := range got {
		if strings.Contains(v, "name-1") || strings.Contains(v, "42") {
			t.Fatalf("span leaks a literal: %v", got)
		}
	}
}
