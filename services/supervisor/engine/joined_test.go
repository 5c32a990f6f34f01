package engine

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/telemetry/metrictest"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// The results of a fan-out that arrive while their run is locked are
// decided in one transaction — one append — and each message is settled
// with its own outcome: here a, b and c's results and a result of an
// attempt of c the log never showed (stale: it comes back, and the others
// are decided without it). The log reads as if they had been decided one
// after another (Replay finds no divergence), and d, which needs all
// three, is dispatched once, in the same append. The handling that
// decided them says so on its span, and the others link to it.
func TestFanOutResultsAreDecidedTogether(t *testing.T) {
	f := newKickFixture(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	e, err := New(f.ctx, Config{SweepInterval: -1, MeterProvider: mp}, f.res, f.log,
		catalog.StaticCache(catalog.Static([]*planexv1.ToolSpec{{Name: "test.echo", Description: "echo"}})), f.planner, f.e.logger)
	if err != nil {
		t.Fatal(err)
	}
	f.e = e
	const id = "01JDJOINED0000000000000000"
	f.commit(&runlog.State{}, id, fanOut()...)
	// The engine dispatches a, b and c.
	if err := f.e.transact(f.ctx, id, func(context.Context, *runlog.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		appends [][]*planexv1.RunEvent
	)
	f.e.cfg.Hooks.AfterAppend = func(_ string, evs []*planexv1.RunEvent) {
		mu.Lock()
		defer mu.Unlock()
		appends = append(appends, evs)
	}

	result := func(step string, attempt int32) { publishResult(t, f.ctx, f.res.JS, id, step, attempt) }
	result("a", 1)
	result("b", 1)
	result("c", 7) // an attempt the log never showed
	result("c", 1)
	cons, err := f.res.JS.CreateOrUpdateConsumer(f.ctx, bus.StreamEngine, jetstream.ConsumerConfig{
		Durable: "joined-test", FilterSubject: bus.EngineSubject(id, bus.KindResult), AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(4, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != 4 {
		t.Fatalf("%d results fetched, want 4", len(msgs))
	}

	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev); _ = tp.Shutdown(context.Background()) })

	unlock := sync.OnceFunc(f.e.locks.lock(id))
	t.Cleanup(unlock)
	var wg sync.WaitGroup
	for _, m := range msgs {
		wg.Go(func() { f.e.process(f.ctx, m) })
	}
	waitFor(t, 10*time.Second, "the four results waiting for the run's lock", func() bool {
		f.e.locks.mu.Lock()
		defer f.e.locks.mu.Unlock()
		return len(f.e.locks.m[id].joined) == 4
	})
	unlock()
	wg.Wait()

	mu.Lock()
	got := appends
	mu.Unlock()
	if len(got) != 1 {
		t.Fatalf("%d appends for the fan-out's results, want 1: %v", len(got), names(got))
	}
	var decided []string
	for _, ev := range got[0] {
		decided = append(decided, runlog.PayloadName(ev)+" "+stepOf(ev))
	}
	// Each result's events in the order its handler joined, then d.
	var order []string
	for i := 0; i+1 < len(decided); i += 2 {
		s := stepOf(got[0][i])
		if decided[i] != "step_started "+s || decided[i+1] != "step_succeeded "+s {
			break
		}
		order = append(order, s)
	}
	slices.Sort(order)
	if len(decided) != 7 || !slices.Equal(order, []string{"a", "b", "c"}) || decided[6] != "step_dispatched d" {
		t.Fatalf("the append holds %q, want the start and success of a, b and c, then d dispatched", decided)
	}

	// One handling decided the four it took (the stale one among them);
	// the other three link to it.
	var decider trace.SpanContext
	var joinedLinks []trace.SpanContext
	for _, sp := range spans.GetSpans() {
		for _, a := range sp.Attributes {
			switch {
			case a.Key == "planex.decisions" && a.Value.AsInt64() == 4:
				if decider.IsValid() {
					t.Fatal("two handlings decided the results")
				}
				decider = sp.SpanContext
			case a.Key == "planex.joined" && a.Value.AsBool():
				if len(sp.Links) != 1 {
					t.Fatalf("a joined result's span has %d links, want 1", len(sp.Links))
				}
				joinedLinks = append(joinedLinks, sp.Links[0].SpanContext)
			}
		}
	}
	if !decider.IsValid() || len(joinedLinks) != 3 {
		t.Fatalf("spans: decider %v, %d joined; want one handling with planex.decisions=4 and three joined", decider.IsValid(), len(joinedLinks))
	}
	for _, l := range joinedLinks {
		if l.SpanID() != decider.SpanID() {
			t.Fatalf("a joined result links to %s, want the deciding handling %s", l.SpanID(), decider.SpanID())
		}
	}

	if n := metrictest.Sum(t, reader, "planex.engine.results.joined"); n != 2 {
		t.Fatalf("planex.engine.results.joined = %d, want 2 (three results decided in one transaction)", n)
	}

	// a, b and c's results are acked; the stale one comes back.
	again, err := cons.Fetch(4, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var back []string
	for m := range again.Messages() {
		var res planexv1.StepResult
		if err := bus.Decode(bus.NatsMsg(m), &res); err != nil {
			t.Fatal(err)
		}
		back = append(back, res.GetStepId()+"/"+string(rune('0'+res.GetAttempt())))
		_ = m.Ack()
	}
	if !slices.Equal(back, []string{"c/7"}) {
		t.Fatalf("redelivered results %q, want only the stale c/7", back)
	}

	// The log replays as recorded.
	st, err := f.log.Load(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var events []*planexv1.RunEvent
	errEnd := errors.New("end")
	werr := f.log.Watch(f.ctx, id, 1, func(ev *planexv1.RunEvent) error {
		events = append(events, ev)
		if ev.GetSequence() == st.Run.GetLastSequence() {
			return errEnd
		}
		return nil
	})
	if !errors.Is(werr, errEnd) {
		t.Fatal(werr)
	}
	rep, err := Replay(f.ctx, events, ReplayConfig{Tools: []*planexv1.ToolSpec{{Name: "test.echo", Description: "echo"}}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Divergence != nil {
		t.Fatalf("the joined decisions do not replay: %v", rep.Divergence)
	}
}

// fanOut is the events that create the tests' run: a, b and c in
// parallel, then d after all three.
func fanOut() []proto.Message {
	step := func(id string, deps ...string) *planexv1.Step {
		return &planexv1.Step{Id: id, Tool: "test.echo", Args: &structpb.Struct{}, DependsOn: deps}
	}
	return []proto.Message{
		&planexv1.RunCreated{Goal: "fan out", Budget: &planexv1.Budget{MaxSteps: 10, MaxParallelism: 4, MaxReplans: 1, MaxTokens: 1000, Deadline: durationpb.New(time.Hour)}},
		&planexv1.PlanRevised{Plan: &planexv1.Plan{Revision: 1, Steps: []*planexv1.Step{step("a"), step("b"), step("c"), step("d", "a", "b", "c")}}},
	}
}

// publishResult publishes an executor's success of a step's attempt, as
// the engine receives it.
func publishResult(t *testing.T, ctx context.Context, js jetstream.JetStream, runID, step string, attempt int32) {
	t.Helper()
	if _, err := bus.Publish(ctx, js, bus.Publication{
		Subject: bus.EngineSubject(runID, bus.KindResult),
		Msg: &planexv1.StepResult{RunId: runID, StepId: step, Attempt: attempt, ExecutorId: "x1",
			Status: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED, Output: structpb.NewStringValue(step)},
		MsgID: bus.MsgID(runID, "result", step, strconv.Itoa(int(attempt))),
	}); err != nil {
		t.Fatal(err)
	}
}

func stepOf(ev *planexv1.RunEvent) string {
	switch p := ev.GetPayload().(type) {
	case *planexv1.RunEvent_StepStarted:
		return p.StepStarted.GetStepId()
	case *planexv1.RunEvent_StepSucceeded:
		return p.StepSucceeded.GetStepId()
	case *planexv1.RunEvent_StepDispatched:
		return p.StepDispatched.GetStepId()
	}
	return ""
}

func names(appends [][]*planexv1.RunEvent) [][]string {
	var out [][]string
	for _, evs := range appends {
		var n []string
		for _, ev := range evs {
			n = append(n, runlog.PayloadName(ev)+" "+stepOf(ev))
		}
		out = append(out, n)
	}
	return out
}

// A replica killed right after the one append of results decided together
// (the hook closes its connection: nothing performed, nothing acked from
// there on) loses none of them: they come back to the next replica, which
// finds them recorded, performs what the log calls for — d's request,
// once — and acks them. The log holds each result once and d dispatched
// once.
func TestJoinedResultsSurviveACrashAfterTheirAppend(t *testing.T) {
	srv := natstest.Start(t)
	victimNC, victimRes := srv.Setup(t)
	_, res := srv.Setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	logger := natstest.Logger(t)
	tools := catalog.StaticCache(catalog.Static([]*planexv1.ToolSpec{{Name: "test.echo", Description: "echo"}}))
	newEngine := func(res *bus.Resources, hooks Hooks) *Engine {
		t.Helper()
		l, err := runlog.New(ctx, res, logger, runlog.Options{})
		if err != nil {
			t.Fatal(err)
		}
		e, err := New(ctx, Config{SweepInterval: -1, AckWait: 2 * time.Second, NoDirectDispatch: true, Hooks: hooks}, res, l, tools, &stubPlanner{}, logger)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	crashed := make(chan []*planexv1.RunEvent, 1)
	victim := newEngine(victimRes, Hooks{AfterAppend: func(_ string, evs []*planexv1.RunEvent) {
		n := 0
		for _, ev := range evs {
			if ev.GetStepSucceeded() != nil {
				n++
			}
		}
		if n > 1 {
			victimNC.Close() // kill -9 after the append
			crashed <- evs
		}
	}})

	const id = "01JDJOINEDCRASH00000000000"
	tx := victim.log.Begin(&runlog.State{})
	for _, p := range fanOut() {
		ev := Event(p)
		ev.RunId = id
		emit(t, tx, ev)
	}
	if _, err := victim.log.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := victim.transact(ctx, id, func(context.Context, *runlog.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// The results wait for the run's lock together on the victim.
	unlock := sync.OnceFunc(victim.locks.lock(id))
	t.Cleanup(unlock)
	if err := victim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"a", "b", "c"} {
		publishResult(t, ctx, res.JS, id, s, 1)
	}
	waitFor(t, 10*time.Second, "the three results waiting for the run's lock", func() bool {
		victim.locks.mu.Lock()
		defer victim.locks.mu.Unlock()
		return len(victim.locks.m[id].joined) == 3
	})
	unlock()
	var appended []*planexv1.RunEvent
	select {
	case appended = <-crashed:
	case <-time.After(10 * time.Second):
		t.Fatal("the victim never appended the results together")
	}
	requestsOf := func(step string) int {
		t.Helper()
		st, err := res.JS.Stream(ctx, bus.StreamSteps)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := st.GetMsg(ctx, seq)
			if err != nil {
				continue
			}
			if m.Header.Get(jetstream.MsgIDHeader) == bus.MsgID(id, step, "1") {
				n++
			}
		}
		return n
	}
	if n := requestsOf("d"); n != 0 {
		t.Fatalf("d requested %d times before the takeover: the crash did not land before the side effects", n)
	}

	survivor := newEngine(res, Hooks{})
	if err := survivor.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = survivor.Stop(context.Background()) })
	waitFor(t, 20*time.Second, "d requested by the survivor", func() bool { return requestsOf("d") > 0 })
	engineStream, err := res.JS.Stream(ctx, bus.StreamEngine)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the three results acked", func() bool {
		_, err := engineStream.GetLastMsgForSubject(ctx, bus.EngineSubject(id, bus.KindResult))
		return errors.Is(err, jetstream.ErrMsgNotFound)
	})
	if n := requestsOf("d"); n != 1 {
		t.Fatalf("d requested %d times, want 1", n)
	}
	st, err := survivor.log.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	errEnd := errors.New("end")
	if err := survivor.log.Watch(ctx, id, 1, func(ev *planexv1.RunEvent) error {
		count[runlog.PayloadName(ev)+" "+stepOf(ev)]++
		if ev.GetSequence() == st.Run.GetLastSequence() {
			return errEnd
		}
		return nil
	}); !errors.Is(err, errEnd) {
		t.Fatal(err)
	}
	for _, want := range []string{"step_succeeded a", "step_succeeded b", "step_succeeded c", "step_dispatched d"} {
		if count[want] != 1 {
			t.Fatalf("the log holds %q %d times, want once (events %v; the crashed append %v)", want, count[want], count, names([][]*planexv1.RunEvent{appended}))
		}
	}
}
