package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSetupIsIdempotent(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	ctx := ctxT(t)
	for i := range 2 {
		res, err := bus.Setup(ctx, nc, bus.Options{EventsMaxAge: time.Hour})
		if err != nil {
			t.Fatalf("setup #%d: %v", i+1, err)
		}
		if err := bus.Check(ctx, nc, res.JS); err != nil {
			t.Fatalf("check after setup #%d: %v", i+1, err)
		}
		if res.Drafts == nil {
			t.Fatalf("setup #%d: no drafts bucket handle", i+1)
		}
	}
	js, _ := jetstream.New(nc)
	st, err := js.Stream(ctx, bus.StreamSteps)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.Retention; got != jetstream.WorkQueuePolicy {
		t.Fatalf("steps retention = %v, want work queue", got)
	}
	ev, _ := js.Stream(ctx, bus.StreamEvents)
	if got := ev.CachedInfo().Config.MaxAge; got != time.Hour {
		t.Fatalf("events max age = %v, want 1h", got)
	}
	drafts, err := js.KeyValue(ctx, bus.BucketDrafts)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := drafts.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ds.TTL() != 7*24*time.Hour || ds.History() != 1 {
		t.Fatalf("drafts bucket TTL %v history %d, want 7 days and 1", ds.TTL(), ds.History())
	}
}

func TestCheckFailsWithoutStreams(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	js, _ := jetstream.New(nc)
	if err := bus.Check(ctxT(t), nc, js); err == nil {
		t.Fatal("check passed before the streams exist")
	}
}

func TestConnectUnreachableNamesURL(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err := bus.Connect(ctx, "nats://user:secret@127.0.0.1:1", "test", natstest.Logger(t))
	if err == nil {
		t.Fatal("connect to a closed port succeeded")
	}
	msg := err.Error()
	if want := "127.0.0.1:1"; !contains(msg, want) {
		t.Fatalf("error %q does not name %q", msg, want)
	}
	if contains(msg, "secret") {
		t.Fatalf("error %q leaks the password", msg)
	}
}

func TestPublishDeduplicatesAndChecksSubjectSequence(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	ctx := ctxT(t)
	subj := bus.EventSubject("run1")
	ev := &planexv1.RunEvent{RunId: "run1", Sequence: 1}
	zero := uint64(0)
	ack, err := bus.Publish(ctx, res.JS, bus.Publication{Subject: subj, Msg: ev, MsgID: "run1:1", ExpectLastSubjectSeq: &zero})
	if err != nil {
		t.Fatalf("first append: %v", err)
	}
	dup, err := bus.Publish(ctx, res.JS, bus.Publication{Subject: subj, Msg: ev, MsgID: "run1:1"})
	if err != nil {
		t.Fatalf("duplicate publish: %v", err)
	}
	if !dup.Duplicate || dup.Sequence != ack.Sequence {
		t.Fatalf("duplicate publish not deduplicated: %+v", dup)
	}
	// A second writer that still believes the subject is empty must lose.
	_, err = bus.Publish(ctx, res.JS, bus.Publication{Subject: subj, Msg: &planexv1.RunEvent{RunId: "run1", Sequence: 1}, MsgID: "run1:1b", ExpectLastSubjectSeq: &zero})
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("stale append: err = %v, want wrong last sequence", err)
	}
	if _, err := bus.Publish(ctx, res.JS, bus.Publication{Subject: subj, Msg: ev}); err == nil {
		t.Fatal("publish without message id succeeded")
	}
}

func TestTraceContextCrossesNATS(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	t.Cleanup(func() { otel.SetTracerProvider(prevTP); otel.SetTextMapPropagator(prevProp) })

	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	ctx := ctxT(t)

	cons, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamSteps, bus.PoolConsumerConfig("sql", 4, 30*time.Second, 3))
	if err != nil {
		t.Fatal(err)
	}

	ctx, parent := tp.Tracer("test").Start(ctx, "dispatch step")
	req := &planexv1.StepRequest{RunId: "r1", StepId: "q", Attempt: 1, Tool: "sql.query"}
	subj, err := bus.StepSubject(req.Tool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Publish(ctx, res.JS, bus.Publication{Subject: subj, Msg: req, MsgID: bus.MsgID("r1", "q", "1")}); err != nil {
		t.Fatal(err)
	}
	parent.End()

	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got *nats.Msg
	for m := range batch.Messages() {
		got = bus.NatsMsg(m)
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if got == nil {
		t.Fatal("no message received")
	}
	var decoded planexv1.StepRequest
	if err := bus.Decode(got, &decoded); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&decoded, req) {
		t.Fatalf("decoded %v, want %v", &decoded, req)
	}
	_, consumer := bus.StartConsumerSpan(context.Background(), got)
	consumer.End()

	spans := rec.Ended()
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = s
	}
	pub, ok := byName["publish planex.steps.sql.query"]
	if !ok {
		t.Fatalf("no producer span among %v", names(spans))
	}
	proc, ok := byName["process planex.steps.sql.query"]
	if !ok {
		t.Fatalf("no consumer span among %v", names(spans))
	}
	if pub.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("producer span's parent = %v, want the dispatch span %v", pub.Parent().SpanID(), parent.SpanContext().SpanID())
	}
	if proc.Parent().SpanID() != pub.SpanContext().SpanID() || proc.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Fatalf("consumer span is not a child of the producer span in the same trace")
	}
	if proc.SpanKind() != trace.SpanKindConsumer || pub.SpanKind() != trace.SpanKindProducer {
		t.Fatalf("span kinds: producer %v consumer %v", pub.SpanKind(), proc.SpanKind())
	}
}

func TestSubjects(t *testing.T) {
	tests := []struct {
		name    string
		tool    string
		want    string
		wantErr bool
	}{
		{name: "sql query", tool: "sql.query", want: "planex.steps.sql.query"},
		{name: "underscore", tool: "email.send_now", want: "planex.steps.email.send_now"},
		{name: "no pool", tool: "query", wantErr: true},
		{name: "wildcard", tool: "sql.>", wantErr: true},
		{name: "upper", tool: "SQL.query", wantErr: true},
		{name: "three tokens", tool: "a.b.c", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := bus.StepSubject(tt.tool)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("StepSubject(%q) = %q, %v", tt.tool, got, err)
			}
		})
	}
	run, kind, err := bus.ParseEngineSubject(bus.EngineSubject("01ABC", bus.KindResult))
	if err != nil || run != "01ABC" || kind != bus.KindResult {
		t.Fatalf("ParseEngineSubject round trip: %q %q %v", run, kind, err)
	}
	if subj := bus.EngineSubject("01ABC", bus.KindTimer); subj != "planex.timers.01ABC" {
		t.Fatalf("timer subject %q, want planex.timers.01ABC", subj)
	}
	run, kind, err = bus.ParseEngineSubject("planex.timers.01ABC")
	if err != nil || run != "01ABC" || kind != bus.KindTimer {
		t.Fatalf("ParseEngineSubject(timer): %q %q %v", run, kind, err)
	}
	for _, bad := range []string{"planex.engine.x", "planex.events.x.y", "planex.engine..result", "planex.engine.r.a.b", "planex.timers.", "planex.timers.a.b"} {
		if _, _, err := bus.ParseEngineSubject(bad); err == nil {
			t.Errorf("ParseEngineSubject(%q) accepted", bad)
		}
	}
}

// The run log's subjects: which are a pool's dispatching decisions, which
// belong to a run's log, and that the requests subject is none of them.
func TestRunLogSubjects(t *testing.T) {
	tests := []struct {
		subject    string
		run, pool  string
		dispatch   bool
		logOf      string
		inRunLog   bool
		filterHits bool // matched by the sql pool's DispatchFilter
	}{
		{subject: bus.DispatchSubject("01RUN", "sql"), run: "01RUN", pool: "sql", dispatch: true, logOf: "01RUN", inRunLog: true, filterHits: true},
		{subject: bus.RunLogSubject("01RUN"), logOf: "01RUN", inRunLog: true},
		{subject: bus.EventSubject("01RUN"), logOf: "01RUN", inRunLog: true},
		{subject: bus.RequestSubject("sql"), filterHits: true},
		{subject: "planex.events.01RUN.step.sql.extra", logOf: "01RUN", inRunLog: true},
		{subject: "planex.events.01RUN.log.sql", logOf: "01RUN", inRunLog: true},
		{subject: "planex.steps.sql.query"},
	}
	for _, tt := range tests {
		t.Run(tt.subject, func(t *testing.T) {
			run, pool, ok := bus.ParseDispatchSubject(tt.subject)
			if ok != tt.dispatch || run != tt.run || pool != tt.pool {
				t.Errorf("ParseDispatchSubject = %q %q %v, want %q %q %v", run, pool, ok, tt.run, tt.pool, tt.dispatch)
			}
			if got, ok := bus.RunOfLogSubject(tt.subject); ok != tt.inRunLog || (ok && got != tt.logOf) {
				t.Errorf("RunOfLogSubject = %q %v, want %q %v", got, ok, tt.logOf, tt.inRunLog)
			}
			if hit := subjectMatches(bus.DispatchFilter("sql"), tt.subject); hit != tt.filterHits {
				t.Errorf("DispatchFilter(sql) matches: %v, want %v", hit, tt.filterHits)
			}
		})
	}
	if bus.ValidRunID("requests") || !bus.ValidRunID("01RUN") {
		t.Error("ValidRunID: the requests token must never be a run id")
	}
}

// subjectMatches is NATS subject matching of a literal subject against a
// filter with * and > wildcards.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(f) == len(s)
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestSetupConcurrentReplicas(t *testing.T) {
	srv := natstest.Start(t)
	ctx := ctxT(t)
	errs := make(chan error, 5)
	for range 5 {
		nc := srv.Connect(t)
		go func() {
			_, err := bus.Setup(ctx, nc, bus.Options{})
			errs <- err
		}()
	}
	for range 5 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent setup: %v", err)
		}
	}
}

func TestSetupWithoutUpdateKeepsOwnersSettings(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	ctx := ctxT(t)
	if _, err := bus.Setup(ctx, nc, bus.Options{EventsMaxAge: 48 * time.Hour, Update: true}); err != nil {
		t.Fatal(err)
	}
	// An executor starting later with default options must not reset the
	// supervisor's retention.
	if _, err := bus.Setup(ctx, nc, bus.Options{}); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ev, err := js.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if got := ev.CachedInfo().Config.MaxAge; got != 48*time.Hour {
		t.Fatalf("events max age = %v after a non-owner setup, want 48h", got)
	}
	// The owner may change it.
	if _, err := bus.Setup(ctx, nc, bus.Options{EventsMaxAge: 24 * time.Hour, Update: true}); err != nil {
		t.Fatal(err)
	}
	ev, _ = js.Stream(ctx, bus.StreamEvents)
	if got := ev.CachedInfo().Config.MaxAge; got != 24*time.Hour {
		t.Fatalf("events max age = %v after the owner's update, want 24h", got)
	}
}

// A publish that finds no stream answering — a stream leader change, a
// NATS node being lost — is tried again with backoff: once the stream is
// back (here: created 1.5s later, beyond the client's own 0.5s of
// retries), the publish succeeds instead of failing the caller.
func TestPublishRetriesWhileNoStreamAnswers(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	created := make(chan error, 1)
	go func() {
		select {
		case <-time.After(1500 * time.Millisecond):
		case <-ctx.Done():
		}
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LATE", Subjects: []string{"late.>"}})
		created <- err
	}()
	ack, err := bus.Publish(ctx, js, bus.Publication{Subject: "late.x", Msg: &planexv1.EngineKick{RunId: "r1"}, MsgID: "r1:late"})
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("publish while the stream was missing: %v", err)
	}
	if ack.Stream != "LATE" || ack.Duplicate {
		t.Fatalf("ack %+v", ack)
	}

	// Without a stream at all it gives up within the bound, saying why.
	start := time.Now()
	_, err = bus.Publish(ctx, js, bus.Publication{Subject: "nowhere.x", Msg: &planexv1.EngineKick{RunId: "r1"}, MsgID: "r1:nowhere"})
	if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("publish without a stream: %v, want no response from stream", err)
	}
	if !strings.Contains(err.Error(), "gave up after") || time.Since(start) > bus.PublishRetryBound+5*time.Second {
		t.Fatalf("publish without a stream: %v after %v", err, time.Since(start))
	}
}

func TestTransientPublishErrors(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{&jetstream.APIError{Code: 409, ErrorCode: 10158, Description: "duplicate message id is in process"}, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{jetstream.ErrNoStreamResponse, true},
		{nats.ErrNoResponders, true},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, false},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamMessageExceedsMaximum}, false},
		{context.DeadlineExceeded, false},
	} {
		if got := bus.Transient(fmt.Errorf("publish: %w", tt.err)); got != tt.want {
			t.Errorf("Transient(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
