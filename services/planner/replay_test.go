package planner

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/cassette"
	"github.com/planex-dev/planex/services/planner/llm"
	"github.com/planex-dev/planex/services/planner/playbook"
)

type fixedBackend struct {
	resp *planexv1.PlanResponse
	err  error
}

func (f fixedBackend) Name() string { return "fixed" }
func (f fixedBackend) Plan(context.Context, *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
	return f.resp, f.err
}

func TestReplayBackendServesRecordedAnswers(t *testing.T) {
	cas, err := cassette.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	plan := &planexv1.PlanResponse{Backend: "playbook", Plan: &planexv1.Plan{Steps: []*planexv1.Step{{Id: "a", Tool: "sql.query"}}}}
	req := &planexv1.PlanRequest{RunId: "R1", Goal: "count", Revision: 1, Constraints: &planexv1.PlanConstraints{RemainingTokens: 100}}
	if _, err := RecordBackend(fixedBackend{resp: plan}, cas).Plan(ctx, req); err != nil {
		t.Fatal(err)
	}
	giveUp := &planexv1.PlanRequest{RunId: "R1", Goal: "count", Revision: 2}
	noBranch := errors.Join(playbook.ErrNoBranch, errors.New("no on_failure branch matches"))
	if _, err := RecordBackend(fixedBackend{err: noBranch}, cas).Plan(ctx, giveUp); err == nil {
		t.Fatal("want the error")
	}

	rep := ReplayBackend(cas, nil)
	// Another run, another budget: the same request to the planner.
	got, err := rep.Plan(ctx, &planexv1.PlanRequest{RunId: "R2", Goal: "count", Revision: 1, Constraints: &planexv1.PlanConstraints{RemainingTokens: 7}})
	if err != nil || !proto.Equal(got, plan) {
		t.Fatalf("replayed %v, %v", got, err)
	}
	if _, err := rep.Plan(ctx, &planexv1.PlanRequest{RunId: "R2", Goal: "count", Revision: 2}); !errors.Is(err, playbook.ErrNoBranch) || !strings.Contains(err.Error(), "no on_failure branch matches") {
		t.Fatalf("replayed error %v: want ErrNoBranch (the server gives up on it)", err)
	}
	_, err = rep.Plan(ctx, &planexv1.PlanRequest{RunId: "R2", Goal: "something else"})
	if st := toStatus(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), `no recorded answer for plan "something else"`) {
		t.Fatalf("miss answers %v: %v", st, err)
	}
	// Another failure is answered again as the server answered it.
	broken := &planexv1.PlanRequest{Goal: "broken"}
	if _, err := RecordBackend(fixedBackend{err: errors.New("connection reset by peer at 10.0.0.7")}, cas).Plan(ctx, broken); err == nil {
		t.Fatal("want the error")
	}
	if _, err := rep.Plan(ctx, broken); toStatus(err).Code() != codes.Internal || toStatus(err).Message() != "planner: internal error" {
		t.Fatalf("replayed internal error: %v", toStatus(err))
	}
	if got, err := ReplayBackend(cas, fixedBackend{resp: plan}).Plan(ctx, &planexv1.PlanRequest{Goal: "something else"}); err != nil || got != plan {
		t.Fatalf("miss falls through to live: %v %v", got, err)
	}
	n := 0
	inv := InvalidPlanFault(rep, func(*planexv1.PlanRequest) bool { n++; return n == 1 })
	_, ferr := inv.Plan(ctx, req)
	second, _ := inv.Plan(ctx, req)
	if !errors.Is(ferr, llm.ErrInvalidAnswer) || toStatus(ferr).Code() != codes.Aborted || !proto.Equal(second, plan) {
		t.Fatalf("invalid once: %v then %v", ferr, second)
	}
}

// TestReplayBackendFlags builds the backends of `planex planner
// --planner-backend replay --replay DIR`: recorded requests are answered
// from the cassette; with --replay-miss live, the others by the playbooks.
func TestReplayBackendFlags(t *testing.T) {
	dir := t.TempDir()
	cas, err := cassette.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	plan := &planexv1.PlanResponse{Backend: "playbook", Plan: &planexv1.Plan{Steps: []*planexv1.Step{{Id: "a", Tool: "sql.query"}}}}
	recorded := &planexv1.PlanRequest{Goal: "count", Revision: 1}
	if _, err := RecordBackend(fixedBackend{resp: plan}, cas).Plan(t.Context(), recorded); err != nil {
		t.Fatal(err)
	}
	build := func(args ...string) *backends {
		t.Helper()
		bs, err := backendsFromFlags(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		return bs
	}
	miss := &planexv1.PlanRequest{Goal: "How many open support tickets does Acme Corp have?", Revision: 1,
		Tools: []*planexv1.ToolSpec{{Name: "sql.query", Pool: "sql"}}}
	offline := build("--planner-backend=replay", "--replay="+dir)
	if got, err := offline.byName[offline.def].Plan(t.Context(), recorded); err != nil || !proto.Equal(got, plan) {
		t.Fatalf("recorded request: %v %v", got, err)
	}
	if _, err := offline.byName[offline.def].Plan(t.Context(), miss); !errors.Is(err, cassette.ErrMiss) {
		t.Fatalf("miss: %v", err)
	}
	live := build("--planner-backend=replay", "--replay="+dir, "--replay-miss=live", "--playbooks="+BuiltinDemoPlaybooks)
	if got, err := live.byName[live.def].Plan(t.Context(), miss); err != nil || len(got.GetPlan().GetSteps()) == 0 {
		t.Fatalf("miss answered live by the demo playbooks: %v %v", got, err)
	}
	var cfg BackendConfig
	cfg.RegisterFlags(pflag.NewFlagSet("x", pflag.ContinueOnError))
	cfg.Backend, cfg.Replay = BackendReplay, filepath.Join(dir, "absent")
	if _, err := buildBackends(cfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "not a cassette directory") {
		t.Fatalf("missing cassette: %v", err)
	}
}

// TestRecordFlag: `planex planner --record DIR` records the answers of
// its live backend, and `planex planner --planner-backend replay --replay
// DIR` answers the same requests from that cassette; --record with the
// replay backend is refused naming the flag.
func TestRecordFlag(t *testing.T) {
	dir := t.TempDir()
	req := &planexv1.PlanRequest{Goal: "How many open support tickets does Acme Corp have?", Revision: 1,
		Tools: []*planexv1.ToolSpec{{Name: "sql.query", Pool: "sql"}}}
	rec, err := backendsFromFlags(t, "--playbooks="+BuiltinDemoPlaybooks, "--record="+dir)
	if err != nil {
		t.Fatal(err)
	}
	live, err := rec.byName[rec.def].Plan(t.Context(), req)
	if err != nil || len(live.GetPlan().GetSteps()) == 0 {
		t.Fatalf("live answer: %v %v", live, err)
	}
	offline, err := backendsFromFlags(t, "--planner-backend=replay", "--replay="+dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := offline.byName[offline.def].Plan(t.Context(), req)
	if err != nil || !proto.Equal(got, live) {
		t.Fatalf("replayed %v, %v; recorded %v", got, err, live)
	}
	if _, err := backendsFromFlags(t, "--planner-backend=replay", "--replay="+dir, "--record="+t.TempDir()); err == nil || !strings.Contains(err.Error(), "--record") {
		t.Fatalf("--record with the replay backend: %v", err)
	}
}

// backendsFromFlags builds the backends `planex planner ARGS` would
// serve: the flags parsed, validated (the error returned) and built.
func backendsFromFlags(t *testing.T, args ...string) (*backends, error) {
	t.Helper()
	var cfg Config
	fs := pflag.NewFlagSet("planner", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Backend.Validate(); err != nil {
		return nil, err
	}
	return buildBackends(cfg.Backend, slog.New(slog.DiscardHandler))
}
