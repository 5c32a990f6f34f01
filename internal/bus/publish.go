package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

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
// into the headers and publishes to JetStream, returning the ack. A
// transient failure (see Transient) is tried again with backoff for up to
// PublishRetryBound, within ctx; the required message id makes that safe.
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
	for tries, backoff, giveUp := 1, publishBackoffMin, time.Now().Add(PublishRetryBound); err != nil && Transient(err); tries++ {
		// The message id makes trying again safe: a publish that was
		// stored after all is acknowledged as a duplicate.
		if time.Now().Add(backoff).After(giveUp) {
			err = fmt.Errorf("gave up after %d tries: %w", tries, err)
			break
		}
		span.AddEvent("retry", trace.WithAttributes(attribute.Int("planex.tries", tries), attribute.String("error", err.Error())))
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			err = fmt.Errorf("%w (after %d tries: %w)", ctx.Err(), tries, err)
		}
		if ctx.Err() != nil {
			break
		}
		backoff = min(2*backoff, publishBackoffMax)
		ack, err = js.PublishMsg(ctx, msg, opts...)
	}
	if err != nil {
		err = fmt.Errorf("publish to %s: %w", p.Subject, err)
		recordErr(span, err)
		return nil, err
	}
	span.SetAttributes(attribute.Int64("messaging.nats.stream.sequence", int64(ack.Sequence)),
		attribute.Bool("messaging.nats.duplicate", ack.Duplicate))
	return ack, nil
}

// PublishRetryBound bounds the time Publish spends trying again after
// transient failures (within its context's deadline).
const PublishRetryBound = 5 * time.Second

// publishBackoffMin and publishBackoffMax are the first and the longest
// pause between two tries of a publish.
const (
	publishBackoffMin = 50 * time.Millisecond
	publishBackoffMax = time.Second
)

// JetStream API error codes that only say "not now".
const (
	// errCodeClusterNotAvailable: JetStream system temporarily unavailable
	// (no meta leader during a node loss).
	errCodeClusterNotAvailable jetstream.ErrorCode = 10008
	// errCodeDuplicateInProcess: duplicate message id is in process —
	// another publish with the same id is being stored; trying again
	// returns its outcome (a duplicate acknowledgement, or success when it
	// failed).
	errCodeDuplicateInProcess jetstream.ErrorCode = 10158
)

// Transient reports JetStream publish failures that trying again shortly
// can cure: no stream answered (a stream leader change, a NATS node being
// lost or restarted), the cluster is temporarily unavailable, or a publish
// with the same message id is still in process. Publish tries these again
// with backoff for up to PublishRetryBound; a timeout is not among them
// (the caller's deadline decides).
func Transient(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return true
	case errors.As(err, &apiErr):
		return apiErr.ErrorCode == errCodeDuplicateInProcess || apiErr.ErrorCode == errCodeClusterNotAvailable
	}
	return false
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
