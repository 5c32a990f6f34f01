package telemetry_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/planex-dev/planex/internal/telemetry"
)

// TestSpansAndLogsHideIssue26Formats: the formats issue 26 found in three
// exported span statuses and the planner's DEBUG log — planex API keys,
// nkey seeds, Stripe and Google keys, HTTP Basic credentials and a key
// split by a zero-width space — are masked in every part of an exported
// span and in log lines.
func TestSpansAndLogsHideIssue26Formats(t *testing.T) {
	secrets := []string{
		"pxk_" + "Qm9vT2Jhc2U2NHVybEtleUZvclBsYW5leEFQSWtleTAx",
		"SUA" + strings.Repeat("MJUWY3DPEB3W64TMMQQGC3TEEBXW4ZJAORSXG5A", 2)[:55],
		"sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc",
		"AIza" + "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
		"Basic " + "YWRtaW46czNjcjN0LXB3",
		"sk-" + "\u200b" + "proj-ABCDEFGHIJKLMNOPQRST",
	}
	exp := tracetest.NewInMemoryExporter()
	tel, err := telemetry.Setup(t.Context(), telemetry.Config{ServiceName: "test", Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	var buf bytes.Buffer
	logger, err := telemetry.NewLogger(&buf, "debug", "json", nil)
	if err != nil {
		t.Fatal(err)
	}
	tracer := otel.Tracer("test")
	for _, s := range secrets {
		_, linked := tracer.Start(t.Context(), "linked")
		linked.End()
		_, span := tracer.Start(t.Context(), "query "+s, trace.WithLinks(trace.Link{SpanContext: linked.SpanContext(), Attributes: []attribute.KeyValue{attribute.String("why", s)}}))
		span.SetAttributes(attribute.String("db.statement", "SELECT '"+s+"'"), attribute.StringSlice("args", []string{s}))
		span.RecordError(errors.New("cast of " + s))
		span.SetStatus(codes.Error, "invalid input syntax: "+s)
		span.End()
		logger.Debug("plan request for goal "+s, "goal", s, "err", errors.New("echo "+s))
	}
	if err := tel.TracerProvider.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	var dump strings.Builder
	for _, sp := range exp.GetSpans() {
		dump.WriteString(sp.Name + "\n" + sp.Status.Description + "\n")
		for _, kv := range sp.Attributes {
			dump.WriteString(kv.Value.Emit() + "\n")
		}
		for _, ev := range sp.Events {
			for _, kv := range ev.Attributes {
				dump.WriteString(kv.Value.Emit() + "\n")
			}
		}
		for _, l := range sp.Links {
			for _, kv := range l.Attributes {
				dump.WriteString(kv.Value.Emit() + "\n")
			}
		}
	}
	for _, s := range secrets {
		tail := s[len(s)-16:]
		if strings.Contains(dump.String(), tail) {
			t.Errorf("exported spans hold %q:\n%s", s, dump.String())
		}
		if strings.Contains(buf.String(), tail) {
			t.Errorf("log holds %q:\n%s", s, buf.String())
		}
	}
	if !strings.Contains(dump.String(), "invalid input syntax: [REDACTED]") {
		t.Errorf("status not masked as expected:\n%s", dump.String())
	}
}
