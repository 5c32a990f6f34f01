package engine

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
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
	const id = "01JDJOINED0000000000000000"
	step := func(id string, deps ...string) *planexv1.Step {
		return &planexv1.Step{Id: id, Tool: "test.echo", Args: &structpb.Struct{}, DependsOn: deps}
	}
	f.commit(&runlog.State{}, id,
		&planexv1.RunCreated{Goal: "fan out", Budget: &planexv1.Budget{MaxSteps: 10, MaxParallelism: 4, MaxReplans: 1, MaxTokens: 1000}},
		&planexv1.PlanRevised{Plan: &planexv1.Plan{Revision: 1, Steps: []*planexv1.Step{
			step("a"), step("b"), step("c"), step("d", "a", "b", "c"),
		}}})
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

	result := func(step string, attempt int32) {
		t.Helper()
		if _, err := bus.Publish(f.ctx, f.res.JS, bus.Publication{
			Subject: bus.EngineSubject(id, bus.KindResult),
			Msg: &planexv1.StepResult{RunId: id, StepId: step, Attempt: attempt, ExecutorId: "x1",
				Status: planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED, Output: structpb.NewStringValue(step)},
			MsgID: bus.MsgID(id, "result", step, string(rune('0'+attempt))),
		}); err != nil {
			t.Fatal(err)
		}
	}
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
