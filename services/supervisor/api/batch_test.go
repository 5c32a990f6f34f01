package api_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor"
	"github.com/planex-dev/planex/services/supervisor/api"
	"github.com/planex-dev/planex/services/supervisor/engine"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// batchPlanner plans one step of batch.echo for every goal.
type batchPlanner struct {
	planexv1.UnimplementedPlannerServiceServer
}

func (batchPlanner) Plan(context.Context, *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
	args, _ := structpb.NewStruct(map[string]any{"value": 1})
	return &planexv1.PlanResponse{
		Plan:  &planexv1.Plan{Steps: []*planexv1.Step{{Id: "a", Tool: "batch.echo", Args: args}}, Confidence: 0.9, Rationale: "scripted"},
		Usage: &planexv1.TokenUsage{InputTokens: 1, OutputTokens: 1}, Backend: "fake",
	}, nil
}

// batchStack is a real supervisor replica (engine and API, embedded
// JetStream, a planner over gRPC, the tool batch.echo registered but no
// pool running it: runs wait at their plan gate, or run forever once
// approved) and a second API on the same bus, called in process with the
// identities a test chooses.
type batchStack struct {
	api *api.Server
	log *runlog.Log
}

func startBatchStack(t *testing.T) *batchStack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	spec := &planexv1.ToolSpec{Name: "batch.echo", Pool: "batch", Description: "echo", SideEffect: planexv1.SideEffect_SIDE_EFFECT_READ}
	spec.ArgsSchema, _ = structpb.NewStruct(map[string]any{"type": "object"})
	data, err := proto.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := res.Tools.Put(ctx, bus.ToolKey("batch.echo", "fake-1"), data); err != nil {
		t.Fatal(err)
	}

	gs := grpc.NewServer()
	planexv1.RegisterPlannerServiceServer(gs, batchPlanner{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	logger := natstest.Logger(t)
	stop, err := supervisor.Start(ctx, supervisor.Components{
		Bus: res, Logger: logger, Planner: planexv1.NewPlannerServiceClient(conn), GRPC: grpc.NewServer(),
		Engine: engine.Config{Workers: 8, AckWait: 2 * time.Second, MaxAckPending: 512},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = stop(sctx)
	})
	log, err := runlog.New(ctx, res, slog.New(slog.DiscardHandler), runlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := log.WaitIndexed(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := api.New(api.Config{Wait: 10 * time.Second}, res, log, logger)
	if err != nil {
		t.Fatal(err)
	}
	return &batchStack{api: s, log: log}
}

func as(subject string, role authn.Role) context.Context {
	return authn.WithIdentity(context.Background(), authn.Identity{Subject: subject, Method: authn.MethodAPIKey, Roles: []authn.Role{role}})
}

// start starts a run gated at its plan, as subject, with labels.
func (b *batchStack) start(t *testing.T, subject string, labels map[string]string) string {
	t.Helper()
	resp, err := b.api.StartRun(as(subject, authn.RoleRunner), &planexv1.StartRunRequest{Goal: "batch goal", Labels: labels, ApprovePlans: true})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetRun().GetId()
}

// wait polls a run until cond holds.
func (b *batchStack) wait(t *testing.T, id, what string, cond func(*planexv1.Run) bool) *planexv1.Run {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := b.log.Load(context.Background(), id)
		var run *planexv1.Run
		if err == nil {
			run = st.Run
		}
		if err == nil && cond(run) {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s: not %s within 20s (err %v; last %s %s %q)", id, what, err, run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitingAtGate(r *planexv1.Run) bool {
	for _, g := range r.GetGates() {
		if runlog.GateOpen(r, g) {
			return true
		}
	}
	return false
}

// batchStream is the server side of a RunBatch stream, in process.
type batchStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*planexv1.RunBatchResponse
}

func (s *batchStream) Context() context.Context { return s.ctx }

func (s *batchStream) Send(m *planexv1.RunBatchResponse) error {
	s.msgs = append(s.msgs, proto.CloneOf(m))
	return nil
}

// batch runs a RunBatch and returns its messages.
func (b *batchStack) batch(ctx context.Context, req *planexv1.RunBatchRequest) ([]*planexv1.RunBatchResponse, error) {
	st := &batchStream{ctx: ctx}
	err := b.api.RunBatch(req, st)
	return st.msgs, err
}

// outcomes sums a batch's items by run; it checks the stream's shape.
func outcomes(t *testing.T, msgs []*planexv1.RunBatchResponse) (map[string]*planexv1.BatchItem, *planexv1.RunBatchResponse) {
	t.Helper()
	if len(msgs) == 0 {
		t.Fatal("no message")
	}
	out := map[string]*planexv1.BatchItem{}
	for i, m := range msgs {
		if m.GetFinished() != (i == len(msgs)-1) {
			t.Fatalf("message %d of %d: finished %v", i+1, len(msgs), m.GetFinished())
		}
		for _, it := range m.GetItems() {
			if out[it.GetRunId()] != nil {
				t.Fatalf("run %s reported twice", it.GetRunId())
			}
			out[it.GetRunId()] = it
		}
	}
	last := msgs[len(msgs)-1]
	if int(last.GetDone()) != len(out) {
		t.Fatalf("done %d, %d items", last.GetDone(), len(out))
	}
	return out, last
}

func TestRunBatchValidation(t *testing.T) {
	b := &batchStack{}
	s, err := api.New(api.Config{}, nil, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	b.api = s
	sel := &planexv1.RunFilter{LabelSelector: "team=a"}
	cancel := &planexv1.RunBatchRequest_Cancel{Cancel: &planexv1.BatchCancel{}}
	for _, tc := range []struct {
		req  *planexv1.RunBatchRequest
		want string
	}{
		{&planexv1.RunBatchRequest{Operation: cancel, Reason: "x"}, "filter: empty: a batch needs at least one condition; to mean every run, set created_before"},
		{&planexv1.RunBatchRequest{Filter: &planexv1.RunFilter{}, Operation: cancel, Reason: "x"}, "filter: empty"},
		{&planexv1.RunBatchRequest{Filter: sel, Reason: "x"}, "operation: required"},
		{&planexv1.RunBatchRequest{Filter: sel, Reason: "x", Operation: &planexv1.RunBatchRequest_Decide{Decide: &planexv1.BatchDecide{Decision: planexv1.DecisionKind_DECISION_KIND_EDIT}}}, "decide.decision DECISION_KIND_EDIT: want DECISION_KIND_APPROVE or DECISION_KIND_REJECT"},
		{&planexv1.RunBatchRequest{Filter: sel, Reason: "x", Operation: &planexv1.RunBatchRequest_Decide{Decide: &planexv1.BatchDecide{}}}, "decide.decision DECISION_KIND_UNSPECIFIED"},
		{&planexv1.RunBatchRequest{Filter: sel, Operation: cancel}, "reason: required"},
		{&planexv1.RunBatchRequest{Filter: sel, Operation: cancel, Reason: strings.Repeat("x", 1025)}, "reason: 1025 bytes, at most 1024"},
		{&planexv1.RunBatchRequest{Filter: sel, Operation: cancel, Reason: "x", BatchId: "no spaces"}, `batch_id "no spaces": want 1 to 64 of [A-Za-z0-9_-]`},
		{&planexv1.RunBatchRequest{Filter: sel, Operation: cancel, Reason: "x", BatchId: strings.Repeat("a", 65)}, "batch_id"},
		{&planexv1.RunBatchRequest{Filter: &planexv1.RunFilter{LabelSelector: "team in (a"}, Operation: cancel, Reason: "x"}, "filter.label_selector: at position 11"},
	} {
		_, err := b.batch(context.Background(), tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("RunBatch(%v) = %v, want InvalidArgument containing %q", tc.req, err, tc.want)
		}
	}
}

// TestRunBatchCancel: a dry run counts the runs a label selects; a wrong
// count is refused; the batch cancels those 10 of 20 runs, each run's log
// names the batch, the others are untouched; the same batch again does
// nothing twice.
func TestRunBatchCancel(t *testing.T) {
	t.Parallel()
	b := startBatchStack(t)
	var group, others []string
	for i := range 20 {
		team := "a"
		if i%2 == 1 {
			team = "b"
		}
		id := b.start(t, "apikey:alice", map[string]string{"team": team})
		if team == "a" {
			group = append(group, id)
		} else {
			others = append(others, id)
		}
	}
	op := as("apikey:oscar", authn.RoleOperator) // not the runs' owner
	filter := &planexv1.RunFilter{LabelSelector: "team=a"}
	cancel := &planexv1.RunBatchRequest_Cancel{Cancel: &planexv1.BatchCancel{}}

	msgs, err := b.batch(op, &planexv1.RunBatchRequest{Filter: filter, Operation: cancel, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || !msgs[0].GetDryRun() || !msgs[0].GetFinished() || msgs[0].GetMatched() != 10 || len(msgs[0].GetSampleRunIds()) != 10 {
		t.Fatalf("dry run: %v", msgs)
	}
	slices.Sort(group)
	sample := slices.Sorted(slices.Values(msgs[0].GetSampleRunIds()))
	if !slices.Equal(sample, group) {
		t.Fatalf("sample %v, want %v", sample, group)
	}

	_, err = b.batch(op, &planexv1.RunBatchRequest{Filter: filter, Operation: cancel, Reason: "cleanup", ExpectedCount: 9})
	if status.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != "the filter now selects 10 runs, not 9: run the dry run again" {
		t.Fatalf("wrong count: %v", err)
	}
	_, err = b.batch(op, &planexv1.RunBatchRequest{Filter: filter, Operation: cancel, Reason: "cleanup"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "expected_count: required") {
		t.Fatalf("no count: %v", err)
	}

	req := &planexv1.RunBatchRequest{Filter: filter, Operation: cancel, Reason: "cleanup", ExpectedCount: 10, BatchId: "cleanup-1"}
	msgs, err = b.batch(op, req)
	if err != nil {
		t.Fatal(err)
	}
	items, last := outcomes(t, msgs)
	if last.GetMatched() != 10 || last.GetFailed() != 0 || len(items) != 10 || last.GetBatchId() != "cleanup-1" {
		t.Fatalf("batch: %v", last)
	}
	for _, id := range group {
		if it := items[id]; it.GetOutcome() != "done" {
			t.Fatalf("run %s: item %v", id, it)
		}
		run := b.wait(t, id, "cancelled", func(r *planexv1.Run) bool { return runlog.Terminal(r.GetStatus()) })
		if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_CANCELLED || !strings.Contains(run.GetStopMessage(), "batch cleanup-1: cleanup") {
			t.Fatalf("run %s: %s %q, want cancelled by the batch", id, run.GetStatus(), run.GetStopMessage())
		}
	}
	for _, id := range others {
		run := b.wait(t, id, "at its plan gate", waitingAtGate)
		if runlog.Terminal(run.GetStatus()) {
			t.Fatalf("run %s outside the filter: %s", id, run.GetStatus())
		}
	}

	// Again: every run is finished, nothing is done twice.
	msgs, err = b.batch(op, req)
	if err != nil {
		t.Fatal(err)
	}
	items, _ = outcomes(t, msgs)
	for _, id := range group {
		if it := items[id]; it.GetOutcome() != "skipped" || !strings.Contains(it.GetMessage(), "already finished") {
			t.Fatalf("run %s again: %v", id, it)
		}
	}

	// A reset skips the runs that are not finished.
	msgs, err = b.batch(op, &planexv1.RunBatchRequest{Filter: &planexv1.RunFilter{LabelSelector: "team=b"}, Reason: "retry", ExpectedCount: 10,
		Operation: &planexv1.RunBatchRequest_Reset_{Reset_: &planexv1.BatchReset{}}})
	if err != nil {
		t.Fatal(err)
	}
	items, _ = outcomes(t, msgs)
	for _, id := range others {
		if it := items[id]; it.GetOutcome() != "skipped" || !strings.Contains(it.GetMessage(), "not finished") {
			t.Fatalf("reset of live run %s: %v", id, it)
		}
	}
}

// TestRunBatchDecide: approving the open gates of runs selected by label
// and waiting; the operator's own runs are failed items (self-approval),
// not a failed batch; the same batch again decides nothing twice.
func TestRunBatchDecide(t *testing.T) {
	t.Parallel()
	b := startBatchStack(t)
	var bobs, alices []string
	for i := range 6 {
		bobs = append(bobs, b.start(t, "apikey:bob", map[string]string{"review": "yes", "n": fmt.Sprint(i)}))
	}
	for range 2 {
		alices = append(alices, b.start(t, "apikey:alice", map[string]string{"review": "yes"}))
	}
	b.start(t, "apikey:bob", map[string]string{"review": "no"})
	for _, id := range append(slices.Clone(bobs), alices...) {
		b.wait(t, id, "at its plan gate", waitingAtGate)
	}
	op := as("apikey:alice", authn.RoleOperator)
	filter := &planexv1.RunFilter{Labels: map[string]string{"review": "yes"}, WaitingForDecision: true}
	decide := &planexv1.RunBatchRequest_Decide{Decide: &planexv1.BatchDecide{Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE}}
	req := &planexv1.RunBatchRequest{Filter: filter, Operation: decide, Reason: "reviewed", ExpectedCount: 8, BatchId: "rev-1", Actor: "alice"}
	msgs, err := b.batch(op, req)
	if err != nil {
		t.Fatal(err)
	}
	items, last := outcomes(t, msgs)
	if last.GetMatched() != 8 || last.GetFailed() != 2 {
		t.Fatalf("batch: matched %d, failed %d; want 8, 2", last.GetMatched(), last.GetFailed())
	}
	for _, id := range alices {
		if it := items[id]; it.GetOutcome() != "failed" || !strings.Contains(it.GetMessage(), "self-approval is not allowed") {
			t.Fatalf("alice's run %s: %v", id, it)
		}
	}
	for _, id := range bobs {
		if it := items[id]; it.GetOutcome() != "done" {
			t.Fatalf("bob's run %s: %v", id, it)
		}
		run := b.wait(t, id, "approved", func(r *planexv1.Run) bool {
			return r.GetGates()[0].GetDecision() != planexv1.DecisionKind_DECISION_KIND_UNSPECIFIED
		})
		g := run.GetGates()[0]
		if g.GetDecision() != planexv1.DecisionKind_DECISION_KIND_APPROVE || g.GetDecidedVia() != "batch rev-1" || g.GetComment() != "batch rev-1: reviewed" || g.GetActor() != "alice" {
			t.Fatalf("run %s: gate %v", id, g)
		}
	}

	// Again without the waiting condition: bob's runs have no open gate.
	req.Filter = &planexv1.RunFilter{Labels: map[string]string{"review": "yes"}}
	msgs, err = b.batch(op, req)
	if err != nil {
		t.Fatal(err)
	}
	items, _ = outcomes(t, msgs)
	for _, id := range bobs {
		if it := items[id]; it.GetOutcome() != "skipped" || it.GetMessage() != "no open gate" {
			t.Fatalf("bob's run %s again: %v", id, it)
		}
		if run := b.wait(t, id, "loaded", func(*planexv1.Run) bool { return true }); len(run.GetGates()) != 1 {
			t.Fatalf("run %s: gates %v", id, run.GetGates())
		}
	}
}
