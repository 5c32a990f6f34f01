// Package otlptest is an OTLP/gRPC trace receiver for tests: the real
// wire path of an exporting planex process (OTEL_EXPORTER_OTLP_ENDPOINT
// pointing at it), with the received spans decoded for assertions.
package otlptest

import (
	"context"
	"encoding/hex"
	"net"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// Span is a received span, with ids in hex and attributes as Go values
// (string, bool, int64, float64, []any).
type Span struct {
	// Service is the service.name of the resource that sent it.
	Service string
	// TraceID, SpanID and ParentSpanID are hex; ParentSpanID is empty for
	// a root.
	TraceID, SpanID, ParentSpanID string
	// Name of the span.
	Name string
	// Kind is the OTLP span kind.
	Kind tracepb.Span_SpanKind
	// Start and End times.
	Start, End time.Time
	// Attrs are the span's attributes.
	Attrs map[string]any
	// Events are the span's events.
	Events []Event
	// Links are the span's links.
	Links []Link
	// StatusCode and StatusMessage are the span's status.
	StatusCode    tracepb.Status_StatusCode
	StatusMessage string
}

// Event is a span event.
type Event struct {
	// Name of the event.
	Name string
	// Time of the event.
	Time time.Time
	// Attrs of the event.
	Attrs map[string]any
}

// Link is a span link.
type Link struct {
	// TraceID and SpanID (hex) of the linked span.
	TraceID, SpanID string
	// Attrs of the link.
	Attrs map[string]any
}

// Duration is End - Start.
func (s Span) Duration() time.Duration { return s.End.Sub(s.Start) }

// Receiver is an OTLP/gRPC trace service on loopback keeping every span
// it receives.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	// Endpoint is the value for OTEL_EXPORTER_OTLP_ENDPOINT
	// ("http://127.0.0.1:port": plaintext gRPC).
	Endpoint string
	// Addr is host:port.
	Addr string

	mu    sync.Mutex
	spans []Span
}

// Start serves a receiver until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{Addr: l.Addr().String(), Endpoint: "http://" + l.Addr().String()}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, r)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return r
}

// Export implements the OTLP trace service.
func (r *Receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		service, _ := attrs(rs.GetResource().GetAttributes())["service.name"].(string)
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				got = append(got, decode(service, s))
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.mu.Unlock()
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// Spans returns every span received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Trace returns the spans received so far of one trace (hex id).
func (r *Receiver) Trace(traceID string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

// WaitTrace waits until cond holds for the spans of a trace received so
// far, and returns them; it fails the test at the deadline.
func (r *Receiver) WaitTrace(t testing.TB, traceID string, d time.Duration, what string, cond func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		spans := r.Trace(traceID)
		if cond(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			names := make([]string, len(spans))
			for i, s := range spans {
				names[i] = s.Service + "/" + s.Name
			}
			t.Fatalf("trace %s: %s not received within %s; have %v", traceID, what, d, names)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func decode(service string, s *tracepb.Span) Span {
	out := Span{
		Service: service, TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
		ParentSpanID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Kind: s.GetKind(),
		Start: time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano())),
		Attrs: attrs(s.GetAttributes()), StatusCode: s.GetStatus().GetCode(), StatusMessage: s.GetStatus().GetMessage(),
	}
	for _, e := range s.GetEvents() {
		out.Events = append(out.Events, Event{Name: e.GetName(), Time: time.Unix(0, int64(e.GetTimeUnixNano())), Attrs: attrs(e.GetAttributes())})
	}
	for _, l := range s.GetLinks() {
		out.Links = append(out.Links, Link{TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId()), Attrs: attrs(l.GetAttributes())})
	}
	return out
}

func attrs(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_ArrayValue:
		out := make([]any, 0, len(x.ArrayValue.GetValues()))
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, value(e))
		}
		return out
	default:
		return nil
	}
}
