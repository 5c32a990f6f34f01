package mcpserver_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/mcpserver"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// finishedRun is a SupervisorService whose run r1 has already succeeded
// when it is followed: GetRun answers the final state, WatchRun streams
// the whole log from its creation.
type finishedRun struct {
	planexv1.UnimplementedSupervisorServiceServer
}

func (finishedRun) StartRun(context.Context, *planexv1.StartRunRequest) (*planexv1.StartRunResponse, error) {
	return &planexv1.StartRunResponse{Run: &planexv1.Run{Id: "r1", Status: planexv1.RunStatus_RUN_STATUS_PENDING}}, nil
}

func (finishedRun) GetRun(context.Context, *planexv1.GetRunRequest) (*planexv1.GetRunResponse, error) {
	return &planexv1.GetRunResponse{Run: &planexv1.Run{Id: "r1", Status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED,
		Steps: []*planexv1.StepState{{StepId: "count", Status: planexv1.StepStatus_STEP_STATUS_SUCCEEDED}}}}, nil
}

func (finishedRun) WatchRun(in *planexv1.WatchRunRequest, stream grpc.ServerStreamingServer[planexv1.WatchRunResponse]) error {
	plan := &planexv1.Plan{Revision: 1, Steps: []*planexv1.Step{{Id: "count", Tool: "sql.query"}}}
	for i, ev := range []*planexv1.RunEvent{
		{Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "count", Budget: &planexv1.Budget{MaxSteps: 5}}}},
		{Payload: &planexv1.RunEvent_PlanRevised{PlanRevised: &planexv1.PlanRevised{Plan: plan}}},
		{Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{StepId: "count", Attempt: 1, PlanRevision: 1, Tool: "sql.query"}}},
		{Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{StepId: "count", Attempt: 1}}},
		{Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{Status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, StopReason: planexv1.StopReason_STOP_REASON_SUCCEEDED}}},
	} {
		ev.RunId, ev.Sequence = in.GetRunId(), uint64(i+1)
		if err := stream.Send(&planexv1.WatchRunResponse{Event: ev}); err != nil {
			return err
		}
	}
	return nil
}

// TestProgressTellsTheStatusAtEachEvent: start_run's progress
// notifications say what the run was doing at each event, not the status
// it has reached when the events are followed (a fast run has already
// succeeded: every notification said "succeeded").
func TestProgressTellsTheStatusAtEachEvent(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	runner := authn.Identity{Subject: "apikey:ci", Roles: []authn.Role{authn.RoleRunner}}
	srv := mcpserver.New(mcpserver.Local(finishedRun{}, runner), mcpserver.Options{Fold: runlog.Fold})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()

	var (
		mu       sync.Mutex
		messages []string
		all      = make(chan struct{})
	)
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			defer mu.Unlock()
			messages = append(messages, req.Params.Message)
			if len(messages) == 5 {
				close(all)
			}
		},
	})
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "start_run", Arguments: map[string]any{"goal": "count"}, Meta: mcp.Meta{"progressToken": "p"}})
	if err != nil || res.IsError {
		t.Fatalf("start_run: %v %+v", err, res)
	}
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("got %d progress notifications, want 5: %q", len(messages), messages)
	}
	mu.Lock()
	got := slices.Clone(messages)
	mu.Unlock()
	want := []string{"pending: created", "running: plan_revised (0 of 1", "running: step_dispatched (0 of 1", "running: step_succeeded (1 of 1", "succeeded: finished"}
	for i, w := range want {
		if !strings.Contains(got[i], w) {
			t.Errorf("progress %d: %q, want it to hold %q", i+1, got[i], w)
		}
	}
	for i, m := range got[:4] {
		if strings.HasPrefix(m, "succeeded") {
			t.Errorf("progress %d says %q: the status the run reached later", i+1, m)
		}
	}
}
