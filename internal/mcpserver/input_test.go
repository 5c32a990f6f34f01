package mcpserver_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/mcpserver"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// askingRun is a SupervisorService whose run r1 asks which customer to
// report on (an input gate) and succeeds once answered "acme"; other
// answers are refused as the API refuses a wrong answer.
type askingRun struct {
	planexv1.UnimplementedSupervisorServiceServer
	mu       sync.Mutex
	answers  []string
	answered chan struct{}
}

func (*askingRun) StartRun(context.Context, *planexv1.StartRunRequest) (*planexv1.StartRunResponse, error) {
	return &planexv1.StartRunResponse{Run: &planexv1.Run{Id: "r1", Status: planexv1.RunStatus_RUN_STATUS_PENDING}}, nil
}

func (a *askingRun) events(decided bool) []*planexv1.RunEvent {
	args, _ := structpb.NewStruct(map[string]any{"question": "Which customer?"})
	plan := &planexv1.Plan{Revision: 1, Steps: []*planexv1.Step{{Id: "ask", Tool: "human.input", Args: args}}}
	schema, _ := structpb.NewStruct(map[string]any{"type": "string"})
	gate := &planexv1.Gate{Id: "ask.r1", Kind: planexv1.GateKind_GATE_KIND_INPUT, StepId: "ask", PlanRevision: 1,
		Input: &planexv1.HumanInput{Question: "Which customer?", Schema: schema}}
	evs := []*planexv1.RunEvent{
		{Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "ask", Budget: &planexv1.Budget{MaxSteps: 5}}}},
		{Payload: &planexv1.RunEvent_PlanRevised{PlanRevised: &planexv1.PlanRevised{Plan: plan}}},
		{Payload: &planexv1.RunEvent_GateOpened{GateOpened: &planexv1.GateOpened{Gate: gate}}},
	}
	if decided {
		answer := structpb.NewStringValue("acme")
		evs = append(evs,
			&planexv1.RunEvent{Payload: &planexv1.RunEvent_GateDecided{GateDecided: &planexv1.GateDecided{GateId: "ask.r1", Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE, Answer: answer}}},
			&planexv1.RunEvent{Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{StepId: "ask", Attempt: 1, PlanRevision: 1, Tool: "human.input"}}},
			&planexv1.RunEvent{Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{StepId: "ask", Attempt: 1, Output: answer}}},
			&planexv1.RunEvent{Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{Status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, StopReason: planexv1.StopReason_STOP_REASON_SUCCEEDED, Result: answer}}},
		)
	}
	for i, ev := range evs {
		ev.RunId, ev.Sequence = "r1", uint64(i+1)
	}
	return evs
}

func (a *askingRun) decided() bool {
	select {
	case <-a.answered:
		return true
	default:
		return false
	}
}

func (a *askingRun) GetRun(context.Context, *planexv1.GetRunRequest) (*planexv1.GetRunResponse, error) {
	var run *planexv1.Run
	for _, ev := range a.events(a.decided()) {
		var err error
		if run, err = runlog.Fold(run, ev); err != nil {
			return nil, err
		}
	}
	return &planexv1.GetRunResponse{Run: run}, nil
}

func (a *askingRun) WatchRun(in *planexv1.WatchRunRequest, stream grpc.ServerStreamingServer[planexv1.WatchRunResponse]) error {
	evs := a.events(true)
	for i, ev := range evs {
		if i == 3 {
			select {
			case <-a.answered:
			case <-stream.Context().Done():
				return stream.Context().Err()
			}
		}
		if err := stream.Send(&planexv1.WatchRunResponse{Event: ev}); err != nil {
			return err
		}
	}
	return nil
}

func (a *askingRun) Decide(_ context.Context, req *planexv1.DecideRequest) (*planexv1.DecideResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answers = append(a.answers, req.GetAnswer().GetStringValue())
	if req.GetGateId() != "ask.r1" || req.GetAnswer().GetStringValue() != "acme" {
		return nil, status.Error(codes.InvalidArgument, "answer: no customer is named "+req.GetAnswer().GetStringValue())
	}
	if !a.decided() {
		close(a.answered)
	}
	return &planexv1.DecideResponse{}, nil
}

// TestStartRunElicitsTheAnswer: a client that supports elicitation is
// asked the question of the input gate the run waits at, with the gate's
// schema; a refused answer is asked again with the API's message; the
// accepted one lets start_run follow the run to its end.
func TestStartRunElicitsTheAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	runner := authn.Identity{Subject: "apikey:ci", Roles: []authn.Role{authn.RoleRunner, authn.RoleApprover}}
	api := &askingRun{answered: make(chan struct{})}
	srv := mcpserver.New(mcpserver.Local(api, runner), mcpserver.Options{Fold: runlog.Fold})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	var messages []string
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v1"}, &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			messages = append(messages, req.Params.Message)
			answer := "initech"
			if len(messages) > 1 {
				answer = "acme"
			}
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"answer": answer}}, nil
		},
	})
	// Elicitation inside a tool call needs a protocol before 2026-07-28.
	cs, err := client.Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "start_run", Arguments: map[string]any{"goal": "ask"}})
	if err != nil || res.IsError {
		t.Fatalf("start_run: %v %+v %s", err, res, res.Content[0].(*mcp.TextContent).Text)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	if !strings.Contains(text, "RUN_STATUS_SUCCEEDED") {
		t.Fatalf("start_run returned %s, want the succeeded run", text)
	}
	if len(messages) != 2 || messages[0] != "Which customer?" || !strings.Contains(messages[1], "The previous answer was refused: answer: no customer is named initech") {
		t.Fatalf("elicitation messages %q", messages)
	}
	if strings.Join(api.answers, ",") != "initech,acme" {
		t.Fatalf("answers %v", api.answers)
	}

	// answer_input answers a waiting run directly; a wrong answer is the
	// API's refusal.
	api2 := &askingRun{answered: make(chan struct{})}
	srv2 := mcpserver.New(mcpserver.Local(api2, runner), mcpserver.Options{Fold: runlog.Fold})
	st2, ct2 := mcp.NewInMemoryTransports()
	ss2, err := srv2.Connect(ctx, st2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss2.Close()
	cs2, err := mcp.NewClient(&mcp.Implementation{Name: "plain", Version: "v1"}, nil).Connect(ctx, ct2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs2.Close()
	res, err = cs2.CallTool(ctx, &mcp.CallToolParams{Name: "answer_input", Arguments: map[string]any{"run_id": "r1", "answer": "globex"}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "no customer is named globex") {
		t.Fatalf("wrong answer_input: %v %+v", err, res)
	}
	res, err = cs2.CallTool(ctx, &mcp.CallToolParams{Name: "answer_input", Arguments: map[string]any{"run_id": "r1", "gate_id": "ask", "answer": "acme"}})
	if err != nil || res.IsError {
		t.Fatalf("answer_input: %v %+v", err, res)
	}
}
