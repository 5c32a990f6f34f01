package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/trigger"
	"github.com/planex-dev/planex/services/supervisor/api"
)

// Event triggers (docs/triggers.md). Each tenant's cell keeps its
// triggers in the planex-triggers bucket of the tenant's account; events
// on their subjects land in the PLANEX_TRIGGER_EVENTS work queue (the
// webhook publishes into it too, after the signature check), which every
// replica consumes through one durable consumer. An event is evaluated
// against every trigger whose subject matches it; its outcome for each is
// published to PLANEX_TRIGGER_OUTCOMES with the message id
// "<trigger>:<event sequence>" before the event is acknowledged, so that a
// redelivered event (a replica died before its ack) is evaluated again
// but counted once: the outcome stream deduplicates, and a run the event
// already started is found by its idempotency key and recognised by its
// planex.trigger.event label.

// Trigger stream settings.
const (
	triggerEventsMaxAge   = 7 * 24 * time.Hour
	triggerOutcomesMaxAge = 30 * 24 * time.Hour
	// triggerDuplicates is the deduplication window of both streams:
	// webhook replays within it and outcome records of redelivered events.
	triggerDuplicates = time.Hour
	// rejectionsPerTrigger bounds the rejection records kept per trigger.
	rejectionsPerTrigger = 10_000
	// triggerAckWait is how long a replica may hold an event before it
	// goes to another one.
	triggerAckWait = 30 * time.Second
	// triggerWorkers bounds the events a replica evaluates at once.
	triggerWorkers = 16
	// triggerRetry is the delay before an event whose run could not be
	// started (planex unavailable, a quota) is tried again.
	triggerRetry = 5 * time.Second
)

// Rejection records: one subject per trigger in their own stream, bounded
// per trigger.
const (
	streamRejections = trigger.StreamRejections
	rejectionsPrefix = "planex.trigger-rejections."
)

// TriggerHooks are test seams of the trigger consumer (crash points).
type TriggerHooks struct {
	// AfterStart runs once an event's run was started (or found), before
	// its outcome is recorded and the event acknowledged; it returns when
	// the consumer may go on.
	AfterStart func(ctx context.Context, triggerName string, seq uint64, runID string)
	// AckWait, when set, replaces how long a replica may hold an event
	// before another gets it (the consumer is shared: the last replica
	// started sets it).
	AckWait time.Duration
}

// triggers is one cell's trigger store, consumer and TriggerService.
type triggers struct {
	planexv1.UnimplementedTriggerServiceServer

	js       jetstream.JetStream
	kv       jetstream.KeyValue
	outcomes jetstream.Stream
	rejected jetstream.Stream
	api      *api.Server
	logger   *slog.Logger
	hooks    TriggerHooks
	events   metric.Int64Counter

	mu    sync.RWMutex
	specs map[string]*compiled // by name, from the bucket's watch

	cancel context.CancelFunc
	done   chan struct{}
}

// compiled is a stored trigger with its compiled program.
type compiled struct {
	spec *planexv1.Trigger
	prg  *trigger.Program
}

// startTriggers sets up the cell's trigger bucket and streams, watches
// the bucket and starts consuming events.
func startTriggers(ctx context.Context, res *bus.Resources, srv *api.Server, logger *slog.Logger, hooks TriggerHooks) (*triggers, error) {
	logger = logger.With("component", "triggers")
	js := res.JS
	// The trigger streams follow the run log's replicas and storage.
	ev, err := js.Stream(ctx, bus.StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("triggers: read %s: %w", bus.StreamEvents, err)
	}
	base := ev.CachedInfo().Config
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: trigger.Bucket, Description: "event triggers (planex.v1.Trigger as protobuf JSON)",
		History: 1, Storage: base.Storage, Replicas: base.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("triggers: bucket %s: %w", trigger.Bucket, err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: trigger.StreamEvents, Description: "events of trigger subjects, until a supervisor evaluated them",
		Subjects: []string{trigger.SubjectPrefix + ">"}, Retention: jetstream.WorkQueuePolicy,
		MaxAge: triggerEventsMaxAge, MaxMsgSize: trigger.MaxPayload + 64<<10, Duplicates: triggerDuplicates,
		Storage: base.Storage, Replicas: base.Replicas, Discard: jetstream.DiscardNew,
	}); err != nil {
		return nil, fmt.Errorf("triggers: stream %s: %w", trigger.StreamEvents, err)
	}
	outcomes, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: trigger.StreamOutcomes, Description: "one outcome per evaluated event and trigger (the counters), and rejection records",
		Subjects: []string{trigger.OutcomesPrefix + ">"}, MaxAge: triggerOutcomesMaxAge, Duplicates: triggerDuplicates,
		Storage: base.Storage, Replicas: base.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("triggers: stream %s: %w", trigger.StreamOutcomes, err)
	}
	rejected, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: streamRejections, Description: "why trigger events were rejected (no payloads: their digests)",
		Subjects: []string{rejectionsPrefix + ">"}, MaxAge: triggerOutcomesMaxAge, Duplicates: triggerDuplicates,
		MaxMsgsPerSubject: rejectionsPerTrigger, Storage: base.Storage, Replicas: base.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("triggers: stream %s: %w", streamRejections, err)
	}
	events, err := otel.Meter("github.com/planex-dev/planex/services/supervisor").Int64Counter("planex.trigger.events",
		metric.WithDescription("Trigger events evaluated, by outcome (started, duplicate, rejected, filtered)."))
	if err != nil {
		return nil, err
	}
	t := &triggers{js: js, kv: kv, outcomes: outcomes, rejected: rejected, api: srv, logger: logger, hooks: hooks, events: events,
		specs: map[string]*compiled{}, done: make(chan struct{})}
	ackWait := triggerAckWait
	if hooks.AckWait > 0 {
		ackWait = hooks.AckWait
	}
	ccfg := jetstream.ConsumerConfig{
		Durable: trigger.ConsumerEvents, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
		MaxAckPending: 4 * triggerWorkers * 8, MaxDeliver: -1,
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t.cancel = cancel
	watcher, err := kv.WatchAll(rctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("triggers: watch %s: %w", trigger.Bucket, err)
	}
	// The specs are loaded before the first event is evaluated.
	for e := range watcher.Updates() {
		if e == nil {
			break
		}
		t.apply(e)
	}
	sem := make(chan struct{}, triggerWorkers)
	var wg sync.WaitGroup
	// Kept consumed when the server deletes the consumer: it delivers all
	// of a work queue, so one made again loses no event.
	cc, err := bus.Consume(ctx, js, trigger.StreamEvents, ccfg, func(m jetstream.Msg) {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			// An event in hand is finished on shutdown (stop drains the
			// consumer first), bounded by the time it may be held.
			hctx, done := context.WithTimeout(context.WithoutCancel(rctx), ackWait)
			defer done()
			t.handle(hctx, m)
		}()
	}, logger, nil, bus.PullOptions{Batch: triggerWorkers})
	if err != nil {
		cancel()
		_ = watcher.Stop()
		return nil, fmt.Errorf("triggers: %w", err)
	}
	go func() {
		defer close(t.done)
		for {
			select {
			case <-rctx.Done():
				cc.Drain()
				<-cc.Closed()
				wg.Wait()
				_ = watcher.Stop()
				return
			case e, ok := <-watcher.Updates():
				if !ok {
					return
				}
				if e != nil {
					t.apply(e)
				}
			}
		}
	}()
	return t, nil
}

// stop stops consuming, waiting (bounded by ctx) for the events in hand.
func (t *triggers) stop(ctx context.Context) error {
	t.cancel()
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("triggers: stop: %w", ctx.Err())
	}
}

// apply updates the cache with a bucket entry.
func (t *triggers) apply(e jetstream.KeyValueEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(t.specs, e.Key())
		return
	}
	spec, err := decodeTrigger(e)
	if err == nil {
		var prg *trigger.Program
		if prg, err = trigger.Compile(spec); err == nil {
			t.specs[e.Key()] = &compiled{spec: spec, prg: prg}
			return
		}
	}
	// Stored specs were validated; one that no longer compiles (a CEL
	// upgrade) evaluates nothing, loudly.
	delete(t.specs, e.Key())
	t.logger.Error("stored trigger does not compile; its events are not evaluated", "trigger", e.Key(), "err", err)
}

func decodeTrigger(e jetstream.KeyValueEntry) (*planexv1.Trigger, error) {
	var spec planexv1.Trigger
	if err := protojson.Unmarshal(e.Value(), &spec); err != nil {
		return nil, fmt.Errorf("decode trigger %s: %w", e.Key(), err)
	}
	spec.Revision = e.Revision()
	return &spec, nil
}

// matching are the triggers whose subject matches subject.
func (t *triggers) matching(subject string) []*compiled {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []*compiled
	for _, c := range t.specs {
		if trigger.Matches(c.spec.GetSubject(), subject) {
			out = append(out, c)
		}
	}
	return out
}

// errRetry marks an event to be delivered again later.
type errRetry struct{ err error }

func (e *errRetry) Error() string { return e.err.Error() }
func (e *errRetry) Unwrap() error { return e.err }

// handle evaluates one event against every matching trigger and
// acknowledges it once every outcome is recorded.
func (t *triggers) handle(ctx context.Context, m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		t.logger.ErrorContext(ctx, "trigger event without metadata", "err", err)
		_ = m.Term()
		return
	}
	seq := meta.Sequence.Stream
	headers := map[string]string{}
	for k, v := range m.Headers() {
		if len(v) > 0 && !strings.HasPrefix(k, "Nats-") {
			headers[k] = v[0]
		}
	}
	for _, c := range t.matching(m.Subject()) {
		if err := t.evaluate(ctx, c, m.Subject(), headers, m.Data(), seq); err != nil {
			t.logger.WarnContext(ctx, "trigger event not evaluated; it will be redelivered", "trigger", c.spec.GetName(), "event_sequence", seq, "err", err)
			_ = m.NakWithDelay(triggerRetry)
			return
		}
	}
	if err := m.DoubleAck(ctx); err != nil && ctx.Err() == nil {
		t.logger.WarnContext(ctx, "ack trigger event", "event_sequence", seq, "err", err)
	}
}

// evaluate evaluates an event for one trigger, starts its run and
// records the outcome; an error leaves the event to be redelivered.
func (t *triggers) evaluate(ctx context.Context, c *compiled, subject string, headers map[string]string, data []byte, seq uint64) error {
	name := c.spec.GetName()
	if c.spec.GetPaused() {
		return t.record(ctx, name, seq, trigger.OutcomeFiltered)
	}
	run, err := c.prg.Evaluate(subject, headers, data)
	var rej *trigger.Rejection
	switch {
	case errors.Is(err, trigger.ErrFiltered):
		return t.record(ctx, name, seq, trigger.OutcomeFiltered)
	case errors.As(err, &rej):
		return t.reject(ctx, name, subject, rej.Reason, data, seq)
	case err != nil:
		return err
	}
	labels := map[string]string{trigger.LabelTrigger: name, trigger.LabelEvent: strconv.FormatUint(seq, 10)}
	for k, v := range run.Labels {
		labels[k] = v
	}
	req := &planexv1.StartRunRequest{Goal: run.Goal, Inputs: run.Inputs, Labels: labels, IdempotencyKey: trigger.RunKey(name, run.Key)}
	sctx := authn.WithIdentity(ctx, authn.Identity{Subject: "trigger:" + name, Roles: []authn.Role{authn.RoleRunner}})
	resp, err := t.api.StartRun(sctx, req)
	outcome := trigger.OutcomeStarted
	switch st := status.Convert(err); {
	case err == nil && resp.GetExisting():
		// The key started a run before: this event's own (it was
		// redelivered) or an earlier event's.
		if resp.GetRun().GetLabels()[trigger.LabelEvent] != labels[trigger.LabelEvent] {
			outcome = trigger.OutcomeDuplicate
		}
	case err == nil:
	case st.Code() == codes.FailedPrecondition && keyReused(st):
		// The key was used by another event (other labels, so other
		// parameters): a duplicate.
		outcome = trigger.OutcomeDuplicate
	case st.Code() == codes.InvalidArgument:
		return t.reject(ctx, name, subject, "start run: "+st.Message(), data, seq)
	default:
		return &errRetry{err: fmt.Errorf("start run: %w", err)}
	}
	if t.hooks.AfterStart != nil {
		t.hooks.AfterStart(ctx, name, seq, resp.GetRun().GetId())
	}
	return t.record(ctx, name, seq, outcome)
}

// reject records a rejection: its record (reason, subject, time, the
// payload's digest), then its outcome.
func (t *triggers) reject(ctx context.Context, name, subject, reason string, data []byte, seq uint64) error {
	rec := &planexv1.TriggerRejection{Trigger: name, Subject: subject, Reason: reason, Time: timestamppb.Now(),
		PayloadSha256: trigger.Digest(data), EventSequence: seq}
	b, err := proto.Marshal(rec)
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: rejectionsPrefix + name, Data: b, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, bus.MsgID("rejection", name, strconv.FormatUint(seq, 10)))
	if _, err := t.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("record rejection: %w", err)
	}
	t.logger.InfoContext(ctx, "trigger event rejected", "trigger", name, "event_sequence", seq, "subject", subject, "reason", reason)
	return t.record(ctx, name, seq, trigger.OutcomeRejected)
}

// record publishes an event's outcome for a trigger (once per event:
// the stream deduplicates redeliveries) and counts it.
func (t *triggers) record(ctx context.Context, name string, seq uint64, outcome string) error {
	msg := &nats.Msg{Subject: trigger.OutcomeSubject(name, outcome), Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, bus.MsgID("outcome", name, strconv.FormatUint(seq, 10)))
	ack, err := t.js.PublishMsg(ctx, msg)
	if err != nil {
		return fmt.Errorf("record outcome: %w", err)
	}
	if !ack.Duplicate {
		t.events.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
	}
	return nil
}

// counters reads a trigger's counters from the outcome stream.
func (t *triggers) counters(ctx context.Context, name string) (*planexv1.TriggerCounters, error) {
	info, err := t.outcomes.Info(ctx, jetstream.WithSubjectFilter(trigger.OutcomesPrefix+name+".*"))
	if err != nil {
		return nil, fmt.Errorf("read counters: %w", err)
	}
	c := &planexv1.TriggerCounters{}
	for subj, n := range info.State.Subjects {
		switch subj[strings.LastIndexByte(subj, '.')+1:] {
		case trigger.OutcomeStarted:
			c.Started = n
		case trigger.OutcomeDuplicate:
			c.Duplicates = n
		case trigger.OutcomeRejected:
			c.Rejected = n
		case trigger.OutcomeFiltered:
			c.Filtered = n
		}
	}
	c.Received = c.Started + c.Duplicates + c.Rejected + c.Filtered
	return c, nil
}

// rejections reads a trigger's newest rejection records, newest first.
func (t *triggers) rejections(ctx context.Context, name string, limit int) ([]*planexv1.TriggerRejection, error) {
	subj := rejectionsPrefix + name
	info, err := t.rejected.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return nil, fmt.Errorf("read rejections: %w", err)
	}
	total := int(info.State.Subjects[subj])
	if total == 0 {
		return nil, nil
	}
	oc, err := t.rejected.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		return nil, fmt.Errorf("read rejections: %w", err)
	}
	// Only the last `limit` of the (bounded) records are kept.
	skip := max(total-limit, 0)
	var out []*planexv1.TriggerRejection
	for read := 0; read < total; read++ {
		m, err := oc.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			return nil, fmt.Errorf("read rejections: %w", err)
		}
		if read < skip {
			continue
		}
		var r planexv1.TriggerRejection
		if err := proto.Unmarshal(m.Data(), &r); err != nil {
			continue
		}
		out = append(out, &r)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// keyReused reports whether a StartRun refusal says its idempotency key
// started another run with other parameters (api.ReasonIdempotencyKeyReused).
func keyReused(st *status.Status) bool {
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == api.ErrorDomain && ei.GetReason() == api.ReasonIdempotencyKeyReused {
			return true
		}
	}
	return false
}
