package bus

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
)

// HeaderContentType names the payload's protobuf message type.
const HeaderContentType = "Planex-Type"

// Publication is one protobuf message to publish to JetStream.
type Publication struct {
	// Subject to publish on.
	Subject string
	// Msg is the payload, encoded with proto.Marshal.
	Msg proto.Message
	// MsgID sets Nats-Msg-Id for server-side deduplication. Required: every
	// planex publish is deduplicated.
	MsgID string
	// ExpectLastSubjectSeq, when set, makes the publish fail unless the
	// subject's last sequence is *ExpectLastSubjectSeq (0: no message yet).
	ExpectLastSubjectSeq *uint64
	// Header adds headers to the message.
	Header nats.Header
	// Attrs are added to the producer span (planex.* attributes).
	Attrs []attribute.KeyValue
	// Sign, when set, returns headers that sign the encoded payload as
	// published on Subject (step requests: internal/stepsign).
	Sign func(subject string, data []byte) nats.Header
}

// Publish encodes p.Msg, injects the trace context of a new producer span
// into the headers and publishes to JetStream, returning the ack.
func Publish(ctx context.Context, js jetstream.JetStream, p Publication) (*jetstream.PubAck, error) {
	if p.MsgID == "" {
		return nil, fmt.Errorf("publish to %s: message id is required", p.Subject)
	}
	data, err := proto.Marshal(p.Msg)
	if err != nil {
		return nil, fmt.Errorf("encode %T for %s: %w", p.Msg, p.Subject, err)
	}
	attrs := append(messagingAttrs("publish", p.Subject, p.MsgID), p.Attrs...)
	attrs = append(attrs, attribute.Int("messaging.message.body.size", len(data)))
	ctx, span := otel.Tracer(instrumentation).Start(ctx, "publish "+spanSubject(p.Subject),
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	defer span.End()

	msg := nats.NewMsg(p.Subject)
	msg.Data = data
	for k, vs := range p.Header {
		for _, v := range vs {
			msg.Header.Add(k, v)
		}
	}
	msg.Header.Set(HeaderContentType, string(p.Msg.ProtoReflect().Descriptor().FullName()))
	Inject(ctx, msg.Header)
	if p.Sign != nil {
		for k, vs := range p.Sign(p.Subject, data) {
			msg.Header[k] = vs
		}
	}

	opts := []jetstream.PublishOpt{jetstream.WithMsgID(p.MsgID)}
	if p.ExpectLastSubjectSeq != nil {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(*p.ExpectLastSubjectSeq))
	}
	ack, err := js.PublishMsg(ctx, msg, opts...)
	if err != nil {
		err = fmt.Errorf("publish to %s: %w", p.Subject, err)
		recordErr(span, err)
		return nil, err
	}
	span.SetAttributes(attribute.Int64("messaging.nats.stream.sequence", int64(ack.Sequence)),
		attribute.Bool("messaging.nats.duplicate", ack.Duplicate))
	return ack, nil
}

// Decode unmarshals a message payload into into, with an error naming the
// subject on failure (a poison message: callers Term it).
func Decode(msg *nats.Msg, into proto.Message) error {
	if err := proto.Unmarshal(msg.Data, into); err != nil {
		return fmt.Errorf("decode %T from %s: %w", into, msg.Subject, err)
	}
	return nil
}

// NatsMsg returns the *nats.Msg view of a JetStream message, for Decode and
// StartConsumerSpan.
func NatsMsg(m jetstream.Msg) *nats.Msg {
	return &nats.Msg{Subject: m.Subject(), Data: m.Data(), Header: m.Headers()}
}
