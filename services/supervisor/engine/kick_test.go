package engine

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/catalog"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// stubPlanner answers every plan request with a final answer and records
// the requests.
type stubPlanner struct {
	planexv1.PlannerServiceClient

	mu   sync.Mutex
	reqs []*planexv1.PlanRequest
}

func (p *stubPlanner) Plan(_ context.Context, req *planexv1.PlanRequest, _ ...grpc.CallOption) (*planexv1.PlanResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reqs = append(p.reqs, req)
	return &planexv1.PlanResponse{Stop: true, FinalAnswer: structpb.NewStringValue("42"), Backend: "stub",
		Usage: &planexv1.TokenUsage{InputTokens: 10, OutputTokens: 5}}, nil
}

func (p *stubPlanner) requests() []*planexv1.PlanRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*planexv1.PlanRequest(nil), p.reqs...)
}

// kickFixture is an engine (not started: the test hands it messages) over
// an embedded JetStream, with a run whose log the test writes.
type kickFixture struct {
	t       *testing.T
	ctx     context.Context
	res     *bus.Resources
	log     *runlog.Log
	e       *Engine
	planner *stubPlanner
	now     time.Time
	logs    *syncBuffer
}

// syncBuffer is a log sink the engine's goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newKickFixture(t *testing.T) *kickFixture {
	t.Helper()
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	log, err := runlog.New(ctx, res, logger, runlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := &kickFixture{t: t, ctx: ctx, res: res, log: log, planner: &stubPlanner{}, now: time.Now(), logs: logs}
	tools := catalog.StaticCache(catalog.Static([]*planexv1.ToolSpec{{Name: "test.echo", Description: "echo"}}))
	f.e, err = New(ctx, Config{Now: func() time.Time { return f.now }, SweepInterval: -1}, res, log, tools, f.planner, logger)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// commit appends events to the run's log on top of st and returns the new
// state, as a replica's decision would.
func (f *kickFixture) commit(st *runlog.State, runID string, payloads ...proto.Message) *runlog.State {
	f.t.Helper()
	tx := f.log.Begin(st)
	for _, p := range payloads {
		ev := Event(p)
		ev.RunId = runID
		if err := tx.Emit(ev); err != nil {
			f.t.Fatal(err)
		}
	}
	next, err := f.log.Commit(f.ctx, tx)
	if err != nil {
		f.t.Fatal(err)
	}
	return next
}

// handleKick publishes a planning kick with msgID, fetches it as the
// engine's consumer would and hands it to the engine. It reports whether
// the engine settled it for good (acked: it leaves the work queue) rather
// than asking for it again (nak: it is delivered again).
func (f *kickFixture) handleKick(runID, msgID string) (acked bool) {
	f.t.Helper()
	subject := bus.EngineSubject(runID, bus.KindKick)
	if _, err := bus.Publish(f.ctx, f.res.JS, bus.Publication{
		Subject: subject, Msg: &planexv1.EngineKick{RunId: runID, Reason: "test"}, MsgID: msgID,
	}); err != nil {
		f.t.Fatal(err)
	}
	cons, err := f.res.JS.CreateOrUpdateConsumer(f.ctx, bus.StreamEngine, jetstream.ConsumerConfig{
		Durable: "kick-test", FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	msg := fetchOne(f.t, cons)
	if msg == nil {
		f.t.Fatalf("kick %s not delivered", msgID)
	}
	f.e.process(f.ctx, msg)
	// A nak (with its short delay) brings the kick back; an ack removes it
	// from the work queue. Wait for either.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := f.e.inbox.GetLastMsgForSubject(f.ctx, subject); errors.Is(err, jetstream.ErrMsgNotFound) {
			return true
		}
		if again := fetchOne(f.t, cons, jetstream.FetchMaxWait(100*time.Millisecond)); again != nil {
			if md, err := again.Metadata(); err != nil || md.NumDelivered < 2 {
				f.t.Fatalf("redelivered kick: metadata %v, %v", md, err)
			}
			_ = again.Nak()
			return false
		}
	}
	f.t.Fatalf("kick %s neither acked nor redelivered within 10s", msgID)
	return false
}

func fetchOne(t *testing.T, cons jetstream.Consumer, opts ...jetstream.FetchOpt) jetstream.Msg {
	t.Helper()
	if opts == nil {
		opts = []jetstream.FetchOpt{jetstream.FetchMaxWait(5 * time.Second)}
	}
	batch, err := cons.Fetch(1, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var msg jetstream.Msg
	for m := range batch.Messages() {
		msg = m
	}
	return msg
}

// testBudget is a run budget with room for a few replans.
func testBudget() *planexv1.Budget {
	return &planexv1.Budget{MaxSteps: 10, MaxReplans: 3, MaxParallelism: 2, MaxTokens: 10_000, Deadline: durationpb.New(time.Hour)}
}

// rejectedRound builds a run that went through one planning round whose
// plan was rejected: created, budget reserved for round (1, 0) — the state
// returned as reserved —, then settled and rejected, so that the log is in
// round (1, 1) and that round's kick is PlanKickID(id, 1, 1).
func (f *kickFixture) rejectedRound(id string) (reserved, now *runlog.State) {
	f.t.Helper()
	created := f.commit(&runlog.State{}, id, &planexv1.RunCreated{Goal: "How many open tickets?", Budget: testBudget()})
	reserved = f.commit(created, id, &planexv1.BudgetUsed{Usage: &planexv1.BudgetUsage{TokensReserved: 10_000}})
	now = f.commit(reserved, id,
		&planexv1.BudgetUsed{Usage: &planexv1.BudgetUsage{Tokens: 100}},
		&planexv1.PlanRejected{Revision: 1, Errors: []string{`steps[0].tool: unknown tool "sql.magic"`}})
	if r := roundOf(now.Run); r != (round{revision: 1, replans: 1}) || !planning(now.Run) {
		f.t.Fatalf("fixture: run %s in round %+v, status %s; want planning round {1 1}", id, r, now.Run.GetStatus())
	}
	return reserved, now
}

// The chaos test's lost kick (1 of 800 runs), made deterministic: a
// replica whose cached run (trusted: it produced it) is still in an
// earlier planning round gets the kick of the round another replica
// started. Deciding on that state asked the planner about the old round,
// dropped its answer as out of round and acked the kick: the run stayed
// PLANNING until the sweeper. The kick must drive the round the log is in.
func TestPlanKickOnAStaleCachedRunDrivesTheLogsRound(t *testing.T) {
	t.Parallel()
	f := newKickFixture(t)
	const id = "stalekick1"
	reserved, _ := f.rejectedRound(id)
	// Inject the stale state: this replica's cache as it was after its own
	// reservation of round (1, 0), before the other replica's appends.
	f.log.Forget(id)
	f.log.MarkVerified(reserved)
	if c := f.log.Cached(id); c == nil || !c.Verified || roundOf(c.Run) != (round{revision: 1, replans: 0}) {
		t.Fatalf("stale state not injected: %+v", c)
	}

	if !f.handleKick(id, PlanKickID(id, 1, 1)) {
		t.Fatal("the kick was not acked after the round was planned")
	}
	reqs := f.planner.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d planner calls, want 1", len(reqs))
	}
	if req := reqs[0]; req.GetConstraints().GetRemainingReplans() != 2 || len(req.GetHistory().GetValidationErrors()) == 0 ||
		!strings.Contains(strings.Join(req.GetHistory().GetValidationErrors(), "; "), "sql.magic") {
		t.Errorf("planner asked about the stale round: remaining replans %d, validation errors %q; want 2 and the rejection",
			req.GetConstraints().GetRemainingReplans(), req.GetHistory().GetValidationErrors())
	}
	st, err := f.log.Load(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run %s %s %q, want SUCCEEDED with the planner's answer", st.Run.GetStatus(), st.Run.GetStopReason(), st.Run.GetStopMessage())
	}
}

// A kick whose round the log read does not show yet (a read served by a
// stream replica that lags the leader) comes back instead of being acked
// as irrelevant, and drives its round once the read shows it.
func TestPlanKickAheadOfTheLogReadComesBack(t *testing.T) {
	t.Parallel()
	f := newKickFixture(t)
	const id = "stalekick2"
	created := f.commit(&runlog.State{}, id, &planexv1.RunCreated{Goal: "How many open tickets?", Budget: testBudget()})

	// The kick of round (1, 1), while every read of the log shows (1, 0).
	if f.handleKick(id, PlanKickID(id, 1, 1)) {
		t.Fatal("a kick ahead of the log read was acked: the round it starts would be stranded")
	}
	if n := len(f.planner.requests()); n != 0 {
		t.Fatalf("%d planner calls on a stale read, want none", n)
	}
	if st, err := f.log.Load(f.ctx, id); err != nil || st.Run.GetLastSequence() != created.Run.GetLastSequence() {
		t.Fatalf("the stale decision appended: %v, last sequence %d, want %d", err, st.Run.GetLastSequence(), created.Run.GetLastSequence())
	}
	if !strings.Contains(f.logs.String(), "revision 1 (replans 1), but the run read shows RUN_STATUS_PENDING at revision 1 (replans 0)") {
		t.Errorf("the stale read is not explained in the log:\n%s", f.logs.String())
	}

	// The read catches up: the same kick, redelivered, plans round (1, 1).
	reserved := f.commit(created, id, &planexv1.BudgetUsed{Usage: &planexv1.BudgetUsage{TokensReserved: 10_000}})
	f.commit(reserved, id, &planexv1.BudgetUsed{Usage: &planexv1.BudgetUsage{Tokens: 100}}, &planexv1.PlanRejected{Revision: 1, Errors: []string{"bad plan"}})
	if !f.handleKick(id, PlanKickID(id, 1, 1)) {
		t.Fatal("the kick was not acked once its round was planned")
	}
	if reqs := f.planner.requests(); len(reqs) != 1 || reqs[0].GetConstraints().GetRemainingReplans() != 2 {
		t.Fatalf("planner requests %v, want one for round (1, 1)", reqs)
	}
}

// A kick of a round the run has left, or of a round it has not reached as
// a planning round, is told apart from the kick of its current round.
func TestKickRound(t *testing.T) {
	const id = "run1"
	if r, ok := kickRound(id, PlanKickID(id, 3, 2)); !ok || r != (round{revision: 3, replans: 2}) {
		t.Errorf("kickRound(PlanKickID(3, 2)) = %+v, %v", r, ok)
	}
	for _, msgID := range []string{"", bus.MsgID(id, "repair", "17"), PlanKickID("run2", 1, 0), bus.MsgID(id, "plan", "x", "0"), bus.MsgID(id, "plan", "1")} {
		if r, ok := kickRound(id, msgID); ok {
			t.Errorf("kickRound(%q) = %+v, want none", msgID, r)
		}
	}
	planningAt := func(rev, replans int32) *planexv1.Run {
		run := &planexv1.Run{Status: planexv1.RunStatus_RUN_STATUS_PLANNING, Usage: &planexv1.BudgetUsage{Replans: replans}}
		for r := int32(1); r < rev; r++ {
			run.Plans = append(run.Plans, &planexv1.Plan{Revision: r})
		}
		return run
	}
	running := func(run *planexv1.Run) *planexv1.Run { run.Status = planexv1.RunStatus_RUN_STATUS_RUNNING; return run }
	cases := []struct {
		name string
		run  *planexv1.Run
		want bool
	}{
		{"planning in the kick's round", planningAt(2, 1), true},
		{"planning in a later round", planningAt(3, 1), true},
		{"running a later revision", running(planningAt(3, 1)), true},
		{"an earlier revision", planningAt(1, 1), false},
		{"fewer replans", planningAt(2, 0), false},
		{"the kick's round, not planning yet", running(planningAt(2, 1)), false},
	}
	for _, tc := range cases {
		if got := reached(tc.run, round{revision: 2, replans: 1}); got != tc.want {
			t.Errorf("%s: reached = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A planning run whose kick is lost is found by the sweeper within
// seconds, not after StrandedAfter, and said so at WARN; a planning run
// whose kick waits in the inbox is left alone.
func TestSweepWarnsOfAPlanningRunWithoutKick(t *testing.T) {
	t.Parallel()
	f := newKickFixture(t)
	f.commit(&runlog.State{}, "lostkick", &planexv1.RunCreated{Goal: "How many open tickets?", Budget: testBudget()})
	f.commit(&runlog.State{}, "keptkick", &planexv1.RunCreated{Goal: "How many open tickets?", Budget: testBudget()})
	if _, err := bus.Publish(f.ctx, f.res.JS, bus.Publication{
		Subject: bus.EngineSubject("keptkick", bus.KindKick), Msg: &planexv1.EngineKick{RunId: "keptkick"}, MsgID: PlanKickID("keptkick", 1, 0),
	}); err != nil {
		t.Fatal(err)
	}

	f.now = time.Now().Add(planningStrandedAfter / 2)
	if n, err := f.e.Sweep(f.ctx); err != nil || n != 0 {
		t.Fatalf("sweep before the grace: %d runs, %v; want none", n, err)
	}
	f.now = time.Now().Add(planningStrandedAfter + time.Second)
	if n, err := f.e.Sweep(f.ctx); err != nil || n != 1 {
		t.Fatalf("sweep: %d runs re-driven, %v; want the one without its kick", n, err)
	}
	logs := f.logs.String()
	var warned []string
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "a planning run has no planning kick in flight") {
			warned = append(warned, line)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "run_id=lostkick") {
		t.Fatalf("WARN lines %q, want one naming run lostkick", warned)
	}
	if _, err := f.e.inbox.GetLastMsgForSubject(f.ctx, bus.EngineSubject("lostkick", bus.KindKick)); err != nil {
		t.Fatalf("no repair kick for the stranded run: %v", err)
	}
}
