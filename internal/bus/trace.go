package bus

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

const instrumentation = "github.com/planex-dev/planex/internal/bus"

// HeaderCarrier adapts nats.Header to propagation.TextMapCarrier so W3C
// trace context and baggage travel with every message.
type HeaderCarrier nats.Header

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the first value of key.
func (c HeaderCarrier) Get(key string) string { return nats.Header(c).Get(key) }

// Set replaces the values of key.
func (c HeaderCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

// Keys lists the header keys.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes ctx's trace context into h.
func Inject(ctx context.Context, h nats.Header) {
	otel.GetTextMapPropagator().Inject(ctx, HeaderCarrier(h))
}

// Extract returns ctx enriched with the trace context found in h.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, HeaderCarrier(h))
}

// messagingAttrs are the OpenTelemetry messaging semantic convention
// attributes of a NATS operation.
func messagingAttrs(op, subject, msgID string) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "nats"),
		attribute.String("messaging.operation.type", op),
		attribute.String("messaging.destination.name", subject),
	}
	if msgID != "" {
		attrs = append(attrs, attribute.String("messaging.message.id", msgID))
	}
	return attrs
}

// StartConsumerSpan starts the consumer ("process") span of a received
// message as a child of the producer span whose context the message
// carries. attrs are added to the span (planex.* attributes).
func StartConsumerSpan(ctx context.Context, msg *nats.Msg, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx = Extract(ctx, msg.Header)
	ctx, span := otel.Tracer(instrumentation).Start(ctx, "process "+spanSubject(msg.Subject), trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(append(messagingAttrs("process", msg.Subject, msg.Header.Get(nats.MsgIdHdr)), attrs...)...)
	}
	return ctx, span
}

// StartLinkedConsumerSpan starts the consumer ("process") span of a
// received message in a trace of its own, linked to the producer span
// whose context the message carries instead of parented on it (the
// messaging conventions allow either). For messages handled long after
// they were sent, or after the operation that sent them ended — a timer
// firing at its due time, a notice arriving after its run finished — so
// that their handling does not stretch the sender's trace.
func StartLinkedConsumerSpan(ctx context.Context, msg *nats.Msg, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	link := trace.LinkFromContext(Extract(ctx, msg.Header))
	ctx, span := otel.Tracer(instrumentation).Start(ctx, "process "+spanSubject(msg.Subject),
		trace.WithNewRoot(), trace.WithLinks(link), trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(append(messagingAttrs("process", msg.Subject, msg.Header.Get(nats.MsgIdHdr)), attrs...)...)
	}
	return ctx, span
}

// spanSubject shortens a subject for use in a span name, keeping span
// names low-cardinality: run ids are replaced by a placeholder.
func spanSubject(subject string) string {
	if runID, kind, err := ParseEngineSubject(subject); err == nil && runID != "" {
		if kind == KindTimer {
			return SubjectTimersPrefix + "{run}"
		}
		return SubjectEnginePrefix + "{run}." + kind
	}
	if _, pool, ok := ParseDispatchSubject(subject); ok {
		return SubjectEventsPrefix + "{run}." + routedStepToken + "." + pool
	}
	if _, ok := RunOfLogSubject(subject); !ok && strings.HasPrefix(subject, SubjectEventsPrefix) {
		return subject // a request published apart: no run id in it
	}
	if rest, ok := strings.CutPrefix(subject, SubjectEventsPrefix); ok && rest != "" {
		if strings.HasSuffix(rest, "."+routedLogToken) {
			return SubjectEventsPrefix + "{run}." + routedLogToken
		}
		return SubjectEventsPrefix + "{run}"
	}
	return subject
}

// recordErr marks span failed with err.
func recordErr(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}
