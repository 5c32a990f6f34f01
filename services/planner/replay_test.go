package planner

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `no recorded answer for plan "something else"`) {
		t.Fatalf("miss: %v", err)
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
