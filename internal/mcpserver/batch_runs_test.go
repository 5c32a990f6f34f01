package mcpserver_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/mcpserver"
)

// batchServer records ListRuns and RunBatch requests and answers a batch
// in two progress messages.
type batchServer struct {
	planexv1.UnimplementedSupervisorServiceServer
	mu      sync.Mutex
	lists   []*planexv1.ListRunsRequest
	batches []*planexv1.RunBatchRequest
}

func (b *batchServer) ListRuns(_ context.Context, req *planexv1.ListRunsRequest) (*planexv1.ListRunsResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lists = append(b.lists, req)
	return &planexv1.ListRunsResponse{}, nil
}

func (b *batchServer) RunBatch(req *planexv1.RunBatchRequest, s grpc.ServerStreamingServer[planexv1.RunBatchResponse]) error {
	b.mu.Lock()
	b.batches = append(b.batches, req)
	b.mu.Unlock()
	if req.GetDryRun() {
		return s.Send(&planexv1.RunBatchResponse{BatchId: "b1", Matched: 2, DryRun: true, Finished: true, SampleRunIds: []string{"r1", "r2"}})
	}
	if err := s.Send(&planexv1.RunBatchResponse{BatchId: "b1", Matched: 2, Done: 1, Items: []*planexv1.BatchItem{{RunId: "r1", Outcome: "done"}}}); err != nil {
		return err
	}
	return s.Send(&planexv1.RunBatchResponse{BatchId: "b1", Matched: 2, Done: 2, Finished: true, Items: []*planexv1.BatchItem{{RunId: "r2", Outcome: "skipped"}}})
}

// TestListRunsFilterAndBatchRuns: list_runs passes its filter arguments
// as a RunFilter; batch_runs needs expected_count after its dry run and
// returns every run's outcome.
func TestListRunsFilterAndBatchRuns(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	fake := &batchServer{}
	op := authn.Identity{Subject: "apikey:op", Roles: []authn.Role{authn.RoleOperator}}
	srv := mcpserver.New(mcpserver.Local(fake, op), mcpserver.Options{})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	call := func(name string, args map[string]any) (*mcp.CallToolResult, string) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		text := ""
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text += tc.Text
			}
		}
		return res, text
	}

	if res, text := call("list_runs", map[string]any{"label_selector": "env=prod", "goal_contains": "acme", "stop_reasons": []any{"step_failed"},
		"created_after": "2026-01-02T03:04:05Z", "waiting_for_decision": true}); res.IsError {
		t.Fatalf("list_runs: %s", text)
	}
	f := fake.lists[0].GetFilter()
	if f.GetLabelSelector() != "env=prod" || f.GetGoalContains() != "acme" || f.GetStopReasons()[0] != planexv1.StopReason_STOP_REASON_STEP_FAILED ||
		f.GetCreatedAfter().AsTime().Year() != 2026 || !f.GetWaitingForDecision() {
		t.Fatalf("filter %v", f)
	}
	if res, text := call("list_runs", map[string]any{"view": "basic"}); res.IsError || fake.lists[len(fake.lists)-1].GetView() != planexv1.RunView_RUN_VIEW_BASIC {
		t.Fatalf("list_runs view basic: %s", text)
	}
	if res, text := call("list_runs", map[string]any{"view": "summary"}); !res.IsError || !strings.Contains(text, `view "summary": want basic or full`) {
		t.Fatalf("a bad view: %s", text)
	}
	if res, text := call("list_runs", map[string]any{"stop_reasons": []any{"nope"}}); !res.IsError || !strings.Contains(text, `stop_reasons: "nope"`) {
		t.Fatalf("a bad stop reason: %s", text)
	}

	if res, text := call("batch_runs", map[string]any{"operation": "cancel", "label_selector": "env=prod", "reason": "x"}); !res.IsError || !strings.Contains(text, "expected_count: required") {
		t.Fatalf("batch without count: %s", text)
	}
	res, text := call("batch_runs", map[string]any{"operation": "approve", "label_selector": "env=prod", "dry_run": true})
	if res.IsError || !strings.Contains(text, `"matched":"2"`) {
		t.Fatalf("dry run: %s", text)
	}
	res, text = call("batch_runs", map[string]any{"operation": "approve", "label_selector": "env=prod", "expected_count": 2, "reason": "ok"})
	if res.IsError {
		t.Fatalf("batch: %s", text)
	}
	var out struct {
		Finished bool `json:"finished"`
		Items    []struct {
			RunID   string `json:"runId"`
			Outcome string `json:"outcome"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(text), &out); err != nil {
		t.Fatalf("%v: %s", err, text)
	}
	if !out.Finished || len(out.Items) != 2 {
		t.Fatalf("batch result: %s", text)
	}
	last := fake.batches[len(fake.batches)-1]
	if last.GetExpectedCount() != 2 || last.GetDecide().GetDecision() != planexv1.DecisionKind_DECISION_KIND_APPROVE || last.GetActor() != "mcp" || last.GetReason() != "ok" {
		t.Fatalf("batch request %v", last)
	}
}
