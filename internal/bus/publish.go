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
	// ExpectLastSubjectSeqFilter, with ExpectLastSubjectSeq, checks the
	// last sequence of this subject filter instead of Subject's (NATS
	// 2.11+; older servers ignore it and check Subject).
	ExpectLastSubjectSeqFilter string
	// Header adds headers to the message.
	Header nats.Header
	// Attrs are added to the producer span (planex.* attributes).
	Attrs []attribute.KeyValue
	// Sign, when set, returns headers that sign the encoded payload as
	// published on Subject (step requests: internal/stepsign).
	Sign func(subject string, data []byte) nats.Header
	// Encoded, when set, is called with the encoded payload before it is
	// sent (the run log remembers a digest of what it appended).
	Encoded func(data []byte)
	// ScheduleAt, when set, publishes the message as a message schedule
	// (NATS 2.12+, a stream with AllowMsgSchedules) that the server fires
	// once into ScheduleTarget at that second (see Resources.HoldTimer).
	ScheduleAt time.Time
	// ScheduleTarget is the subject a schedule fires into.
	ScheduleTarget string
}

// Publish encodes p.Msg, injects the trace context of a new producer span
// into the headers and publishes to JetStream, returning the ack. A
// transient failure (see Transient) is tried again with backoff for up to
// PublishRetryBound, within ctx; the required message id makes that safe.
func Publish(ctx context.Context, js jetstream.JetStream, p Publication) (*jetstream.PubAck, error) {
	out, err := prepare(ctx, p)
	if err != nil {
		return nil, err
	}
	defer out.span.End()
	ack, err := out.send(ctx, js)
	return out.finish(ack, err)
}

// Pending is a publish started by PublishAsync; Wait returns its outcome.
type Pending struct {
	out *outgoing
	js  jetstream.JetStream
	fut jetstream.PubAckFuture
	err error // the message could not be built or handed to the connection
}

// PublishAsync starts the publish of p without waiting for its
// acknowledgement (one round trip shared by every publish started before
// their Waits). The message is sent exactly as Publish would send it.
// Several publishes started on the same connection reach the server in the
// order they were started.
func PublishAsync(ctx context.Context, js jetstream.JetStream, p Publication) *Pending {
	out, err := prepare(ctx, p)
	if err != nil {
		return &Pending{err: err}
	}
	fut, err := js.PublishMsgAsync(out.msg, out.opts...)
	if err != nil {
		// Not handed to the connection (too many pending): Wait publishes
		// it synchronously.
		fut = nil
	}
	return &Pending{out: out, js: js, fut: fut}
}

// asyncAckWait bounds the wait for an asynchronous publish's
// acknowledgement before it is published again synchronously (JetStream's
// default API timeout).
const asyncAckWait = 5 * time.Second

// Wait returns the acknowledgement of a publish started by PublishAsync.
// When the asynchronous publish failed transiently, did not get its
// acknowledgement before ctx's deadline, or could not be started, it is
// published again synchronously as Publish does (within ctx): the message
// id makes a repeat harmless.
func (p *Pending) Wait(ctx context.Context) (*jetstream.PubAck, error) {
	if p.err != nil {
		return nil, p.err
	}
	defer p.out.span.End()
	if p.fut != nil {
		// A lost acknowledgement (a connection cut) is not waited for
		// longer than a synchronous publish would wait for it.
		t := time.NewTimer(asyncAckWait)
		defer t.Stop()
		select {
		case <-t.C:
		case ack := <-p.fut.Ok():
			return p.out.finish(ack, nil)
		case err := <-p.fut.Err():
			if !Transient(err) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
				return p.out.finish(nil, err)
			}
		case <-ctx.Done():
			return p.out.finish(nil, fmt.Errorf("await acknowledgement: %w", ctx.Err()))
		}
	}
	ack, err := p.out.send(ctx, p.js)
	return p.out.finish(ack, err)
}

// outgoing is an encoded publication with its producer span.
type outgoing struct {
	subject string
	msg     *nats.Msg
	opts    []jetstream.PublishOpt
	span    trace.Span
}

// prepare encodes p and starts its producer span; the caller ends it.
func prepare(ctx context.Context, p Publication) (*outgoing, error) {
	if p.MsgID == "" {
		return nil, fmt.Errorf("publish to %s: message id is required", p.Subject)
	}
	data, err := proto.Marshal(p.Msg)
	if err != nil {
		return nil, fmt.Errorf("encode %T for %s: %w", p.Msg, p.Subject, err)
	}
	ctx, span := otel.Tracer(instrumentation).Start(ctx, "publish "+spanSubject(p.Subject), trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() { // built only for a span that keeps them: a publish is on every step's path
		attrs := append(messagingAttrs("publish", p.Subject, p.MsgID), p.Attrs...)
		span.SetAttributes(append(attrs, attribute.Int("messaging.message.body.size", len(data)))...)
	}

	if p.Encoded != nil {
		p.Encoded(data)
	}
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
	switch {
	case p.ExpectLastSubjectSeq != nil && p.ExpectLastSubjectSeqFilter != "":
		opts = append(opts, jetstream.WithExpectLastSequenceForSubject(*p.ExpectLastSubjectSeq, p.ExpectLastSubjectSeqFilter))
	case p.ExpectLastSubjectSeq != nil:
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(*p.ExpectLastSubjectSeq))
	}
	if !p.ScheduleAt.IsZero() {
		opts = append(opts, jetstream.WithScheduleAt(p.ScheduleAt), jetstream.WithScheduleTarget(p.ScheduleTarget))
	}
	return &outgoing{subject: p.Subject, msg: msg, opts: opts, span: span}, nil
}

// send publishes synchronously, trying transient failures again.
func (o *outgoing) send(ctx context.Context, js jetstream.JetStream) (*jetstream.PubAck, error) {
	ack, err := js.PublishMsg(ctx, o.msg, o.opts...)
	for tries, backoff, giveUp := 1, publishBackoffMin, time.Now().Add(PublishRetryBound); err != nil && Transient(err); tries++ {
		// The message id makes trying again safe: a publish that was
		// stored after all is acknowledged as a duplicate.
		if time.Now().Add(backoff).After(giveUp) {
			err = fmt.Errorf("gave up after %d tries: %w", tries, err)
			break
		}
		o.span.AddEvent("retry", trace.WithAttributes(attribute.Int("planex.tries", tries), attribute.String("error", err.Error())))
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			err = fmt.Errorf("%w (after %d tries: %w)", ctx.Err(), tries, err)
		}
		if ctx.Err() != nil {
			break
		}
		backoff = min(2*backoff, publishBackoffMax)
		ack, err = js.PublishMsg(ctx, o.msg, o.opts...)
	}
	return ack, err
}

// finish records the outcome on the span.
func (o *outgoing) finish(ack *jetstream.PubAck, err error) (*jetstream.PubAck, error) {
	if err != nil {
		err = fmt.Errorf("publish to %s: %w", o.subject, err)
		recordErr(o.span, err)
		return nil, err
	}
	o.span.SetAttributes(attribute.Int64("messaging.nats.stream.sequence", int64(ack.Sequence)),
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
