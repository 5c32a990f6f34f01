package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/planex-dev/planex/internal/redact"
	"github.com/planex-dev/planex/internal/telemetry"
)

func TestLoggerCorrelatesAndRedacts(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel, err := telemetry.Setup(t.Context(), telemetry.Config{ServiceName: "test", Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })

	var buf bytes.Buffer
	logger, err := telemetry.NewLogger(&buf, "info", "json", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := otel.Tracer("test").Start(t.Context(), "work")
	ctx = telemetry.WithLogAttrs(ctx, slog.String("run_id", "r1"), slog.String("step_id", "s1"))
	logger.InfoContext(ctx, "sending to oncall@example.com", "token", "Bearer abcdefghijk123")
	span.End()

	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("log line is not JSON: %v: %s", err, buf.String())
	}
	if rec["trace_id"] != span.SpanContext().TraceID().String() || rec["span_id"] != span.SpanContext().SpanID().String() {
		t.Fatalf("log line lacks the span's ids: %v", rec)
	}
	if rec["run_id"] != "r1" || rec["step_id"] != "s1" {
		t.Fatalf("log line lacks run and step ids: %v", rec)
	}
	if strings.Contains(buf.String(), "oncall@example.com") || strings.Contains(buf.String(), "abcdefghijk123") {
		t.Fatalf("log line leaks sensitive values: %s", buf.String())
	}
}

func TestExportedSpansAreRedacted(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel, err := telemetry.Setup(t.Context(), telemetry.Config{ServiceName: "test", Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("test").Start(t.Context(), "send")
	span.SetAttributes(attribute.String("email.to", "alice@example.com"), attribute.StringSlice("rcpts", []string{"bob@example.com"}), attribute.Int("n", 2))
	span.End()
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	if err := tel.TracerProvider.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("exported %d spans, want 1", len(spans))
	}
	for _, kv := range spans[0].Attributes {
		if strings.Contains(kv.Value.String(), "@example.com") {
			t.Fatalf("exported attribute %s = %s leaks an address", kv.Key, kv.Value.String())
		}
	}
}

func TestLoggerUsesConfiguredPatterns(t *testing.T) {
	patterns, err := redact.Compile([]string{`employee_id=E\d{6}`})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	logger, err := telemetry.NewLogger(&buf, "info", "json", redact.New(patterns...))
	if err != nil {
		t.Fatal(err)
	}
	logger.Info("lookup", "who", "E123456", "mail", "bob@example.com")
	if out := buf.String(); strings.Contains(out, "E123456") || strings.Contains(out, "bob@example.com") {
		t.Fatalf("configured or default pattern not applied: %s", out)
	}
}

func TestNewLoggerRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct{ level, format, want string }{
		{"loud", "json", `--log-level "loud"`},
		{"info", "xml", `--log-format "xml"`},
	} {
		if _, err := telemetry.NewLogger(&bytes.Buffer{}, tc.level, tc.format, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewLogger(%q, %q) error = %v, want one naming %s", tc.level, tc.format, err, tc.want)
		}
	}
}
