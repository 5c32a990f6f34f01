package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/planex-dev/planex/internal/redact"
)

// redactingExporter redacts the name, status description, string
// attributes, event attributes and link attributes of every span before
// it leaves the process, so no e-mail address or token reaches a
// collector whatever the instrumentation recorded (an error's text in a
// span status included).
type redactingExporter struct {
	sdktrace.SpanExporter
	r *redact.Redactor
}

func (e redactingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	out := make([]sdktrace.ReadOnlySpan, len(spans))
	for i, s := range spans {
		out[i] = redactedSpan{ReadOnlySpan: s, r: e.r}
	}
	return e.SpanExporter.ExportSpans(ctx, out)
}

type redactedSpan struct {
	sdktrace.ReadOnlySpan
	r *redact.Redactor
}

func (s redactedSpan) Name() string { return s.r.String(s.ReadOnlySpan.Name()) }

func (s redactedSpan) Links() []sdktrace.Link {
	links := s.ReadOnlySpan.Links()
	out := make([]sdktrace.Link, len(links))
	for i, l := range links {
		l.Attributes = redactAttrs(s.r, l.Attributes)
		out[i] = l
	}
	return out
}

func (s redactedSpan) Attributes() []attribute.KeyValue {
	return redactAttrs(s.r, s.ReadOnlySpan.Attributes())
}

func (s redactedSpan) Events() []sdktrace.Event {
	evs := s.ReadOnlySpan.Events()
	out := make([]sdktrace.Event, len(evs))
	for i, ev := range evs {
		ev.Attributes = redactAttrs(s.r, ev.Attributes)
		out[i] = ev
	}
	return out
}

func (s redactedSpan) Status() sdktrace.Status {
	st := s.ReadOnlySpan.Status()
	st.Description = s.r.String(st.Description)
	return st
}

func redactAttrs(r *redact.Redactor, attrs []attribute.KeyValue) []attribute.KeyValue {
	out := make([]attribute.KeyValue, len(attrs))
	for i, kv := range attrs {
		switch kv.Value.Type() {
		case attribute.STRING:
			out[i] = attribute.String(string(kv.Key), r.String(kv.Value.AsString()))
		case attribute.STRINGSLICE:
			ss := kv.Value.AsStringSlice()
			red := make([]string, len(ss))
			for j, v := range ss {
				red[j] = r.String(v)
			}
			out[i] = attribute.StringSlice(string(kv.Key), red)
		default:
			out[i] = kv
		}
	}
	return out
}
