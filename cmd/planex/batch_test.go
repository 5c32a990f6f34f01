package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// fakeBatchClient answers RunBatch with canned messages: the dry run's
// count, then the batch's messages; it records the requests.
type fakeBatchClient struct {
	planexv1.SupervisorServiceClient
	matched int64
	batch   []*planexv1.RunBatchResponse
	reqs    []*planexv1.RunBatchRequest
}

type fakeBatchStream struct {
	grpc.ClientStream
	msgs []*planexv1.RunBatchResponse
}

func (s *fakeBatchStream) Recv() (*planexv1.RunBatchResponse, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

func (c *fakeBatchClient) RunBatch(_ context.Context, req *planexv1.RunBatchRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[planexv1.RunBatchResponse], error) {
	c.reqs = append(c.reqs, req)
	if req.GetDryRun() {
		return &fakeBatchStream{msgs: []*planexv1.RunBatchResponse{{BatchId: "b", Matched: c.matched, DryRun: true, Finished: true, SampleRunIds: []string{"01A", "01B"}}}}, nil
	}
	return &fakeBatchStream{msgs: c.batch}, nil
}

// runFakeBatch runs runBatch against c with stdin in, at a terminal or not.
func runFakeBatch(t *testing.T, c *fakeBatchClient, in string, tty bool, o batchOpts) (string, string, error) {
	t.Helper()
	old := confirmTerminal
	confirmTerminal = func() bool { return tty }
	t.Cleanup(func() { confirmTerminal = old })
	var out, errOut bytes.Buffer
	cmd := &cobra.Command{}
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetIn(strings.NewReader(in))
	cmd.SetContext(t.Context())
	req := &planexv1.RunBatchRequest{Filter: &planexv1.RunFilter{LabelSelector: "x"}, Reason: "r",
		Operation: &planexv1.RunBatchRequest_Cancel{Cancel: &planexv1.BatchCancel{}}}
	err := runBatch(cmd, c, clientFlags{}, req, o)
	return out.String(), errOut.String(), err
}

// TestRunsBatchConfirms: without --yes a batch asks at a terminal for
// the count and refuses elsewhere; a confirmed batch sends the dry run's
// count; a failed item is a non-zero exit.
func TestRunsBatchConfirms(t *testing.T) {
	done := []*planexv1.RunBatchResponse{
		{BatchId: "b", Matched: 2, Done: 1, Items: []*planexv1.BatchItem{{RunId: "01A", Outcome: "done", Message: "cancel requested"}}},
		{BatchId: "b", Matched: 2, Done: 2, Finished: true, Items: []*planexv1.BatchItem{{RunId: "01B", Outcome: "skipped", Message: "already finished"}}},
	}
	c := &fakeBatchClient{matched: 2, batch: done}
	_, _, err := runFakeBatch(t, c, "", false, batchOpts{verb: "Cancel"})
	if exitCode(err) != exitUsage || !strings.Contains(err.Error(), "Cancel 2 runs: not confirmed; stdin is not a terminal") || !strings.Contains(err.Error(), "--yes") {
		t.Fatalf("no terminal, no --yes: %v", err)
	}
	if len(c.reqs) != 1 {
		t.Fatalf("%d requests, want the dry run only", len(c.reqs))
	}

	c = &fakeBatchClient{matched: 2, batch: done}
	_, errOut, err := runFakeBatch(t, c, "3\n", true, batchOpts{verb: "Cancel"})
	if err == nil || !strings.Contains(errOut, "Cancel 2 runs? Type 2 to confirm: ") || len(c.reqs) != 1 {
		t.Fatalf("wrong answer: %v, %d requests\n%s", err, len(c.reqs), errOut)
	}

	c = &fakeBatchClient{matched: 2, batch: done}
	out, _, err := runFakeBatch(t, c, "2\n", true, batchOpts{verb: "Cancel"})
	if err != nil || len(c.reqs) != 2 || c.reqs[1].GetExpectedCount() != 2 || c.reqs[1].GetDryRun() {
		t.Fatalf("confirmed: %v, requests %v", err, c.reqs)
	}
	if out != "01A done: cancel requested\n01B skipped: already finished\n" {
		t.Fatalf("output %q", out)
	}

	c = &fakeBatchClient{matched: 2, batch: []*planexv1.RunBatchResponse{
		{BatchId: "b", Matched: 2, Done: 2, Failed: 1, Finished: true, Items: []*planexv1.BatchItem{
			{RunId: "01A", Outcome: "done"}, {RunId: "01B", Outcome: "failed", Message: "permission denied: self-approval"}}},
	}}
	out, _, err = runFakeBatch(t, c, "", false, batchOpts{verb: "Cancel", yes: true})
	if exitCode(err) != exitFailed || !strings.Contains(err.Error(), "batch b: 2 runs, 1 failed") || !strings.Contains(out, "01B failed: permission denied: self-approval") {
		t.Fatalf("a failed item: %v\n%s", err, out)
	}

	c = &fakeBatchClient{matched: 2, batch: []*planexv1.RunBatchResponse{{BatchId: "b", Matched: 2, Done: 1}}}
	_, _, err = runFakeBatch(t, c, "", false, batchOpts{verb: "Cancel", yes: true})
	if exitCode(err) != exitFailed || !strings.Contains(err.Error(), "the stream ended before the batch finished") {
		t.Fatalf("a stream cut short: %v", err)
	}

	c = &fakeBatchClient{matched: 2}
	out, _, err = runFakeBatch(t, c, "", false, batchOpts{verb: "Cancel", dryRun: true})
	if err != nil || len(c.reqs) != 1 || !strings.HasPrefix(out, "2 runs selected\n01A\n01B\n") {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
}

func TestFilterFlags(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	f := filterFlags{goal: "acme refund", selector: "env=prod", tools: []string{"sql.query"}, since: "2h", until: "2026-05-01T11:00:00Z",
		stopReasons: []string{"step_failed"}, waiting: true, statuses: []string{"failed"}, labels: []string{"team=ops"}}
	rf, err := f.filter(now, true)
	if err != nil {
		t.Fatal(err)
	}
	if !rf.GetCreatedAfter().AsTime().Equal(now.Add(-2*time.Hour)) || !rf.GetCreatedBefore().AsTime().Equal(now.Add(-time.Hour)) ||
		rf.GetStopReasons()[0] != planexv1.StopReason_STOP_REASON_STEP_FAILED || rf.GetStatuses()[0] != planexv1.RunStatus_RUN_STATUS_FAILED ||
		rf.GetLabels()["team"] != "ops" || !rf.GetWaitingForDecision() || rf.GetGoalContains() != "acme refund" {
		t.Fatalf("filter %v", rf)
	}
	for _, bad := range []filterFlags{{since: "yesterday"}, {until: "-2h"}, {stopReasons: []string{"nope"}}} {
		if _, err := bad.filter(now, true); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// TestRunsListAndBatchOnTheDevStack: runs list filters by label selector,
// goal words and waiting; runs batch cancel --yes cancels what the
// filter selects, prints each run, and the same --batch-id again skips
// them.
func TestRunsListAndBatchOnTheDevStack(t *testing.T) {
	ctx, stack, client := startDefaultDevStack(t)
	addr := stack.Addr
	goal := "How many open support tickets does Acme Corp have?"
	var batch []string
	for i := range 4 {
		labels := map[string]string{"cli": "batch"}
		if i == 3 {
			labels = map[string]string{"cli": "other"}
		}
		resp, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: goal, Labels: labels, ApprovePlans: true})
		if err != nil {
			t.Fatal(err)
		}
		id := resp.GetRun().GetId()
		waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return r.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING })
		if i < 3 {
			batch = append(batch, id)
		}
	}
	slices.Sort(batch)

	listed := func(args ...string) []string {
		t.Helper()
		out, err := planexIn(t, append([]string{"runs", "list", "--addr", addr, "--json"}, args...)...)
		if err != nil {
			t.Fatalf("runs list %v: %v\n%s", args, err, out)
		}
		var resp struct {
			Runs []struct{ ID string } `json:"runs"`
		}
		if err := json.Unmarshal([]byte(out), &resp); err != nil {
			t.Fatalf("runs list %v: %v\n%s", args, err, out)
		}
		var ids []string
		for _, r := range resp.Runs {
			ids = append(ids, r.ID)
		}
		slices.Sort(ids)
		return ids
	}
	if got := listed("-l", "cli in (batch)", "--goal", "ACME tickets", "--waiting", "--since", "1h"); !slices.Equal(got, batch) {
		t.Fatalf("runs list -l 'cli in (batch)': %v, want %v", got, batch)
	}
	// The basic view lists the same runs, from the index the full view
	// selects them with.
	if got := listed("-l", "cli in (batch)", "--goal", "ACME tickets", "--waiting", "--view", "basic"); !slices.Equal(got, batch) {
		t.Fatalf("runs list --view basic: %v, want %v", got, batch)
	}
	if _, err := planexIn(t, "runs", "list", "--addr", addr, "--view", "summary"); err == nil || !strings.Contains(err.Error(), `--view "summary": want basic or full`) {
		t.Fatalf("runs list --view summary: %v", err)
	}
	if got := listed("-l", "cli", "--goal", "globex"); len(got) != 0 {
		t.Fatalf("runs list --goal globex: %v", got)
	}
	if _, err := planexIn(t, "runs", "list", "--addr", addr, "-l", "cli in (batch"); err == nil || !strings.Contains(err.Error(), "filter.label_selector: at position 14: want ',' or ')' in the values, found the end") {
		t.Fatalf("a bad selector: %v", err)
	}

	out, err := planexIn(t, "runs", "batch", "cancel", "--addr", addr, "-l", "cli=batch", "--reason", "cli test", "--yes", "--batch-id", "cli-1")
	if err != nil {
		t.Fatalf("runs batch cancel: %v\n%s", err, out)
	}
	for _, id := range batch {
		if !strings.Contains(out, id+" done: cancel requested") {
			t.Fatalf("runs batch cancel: %s not done:\n%s", id, out)
		}
		run := waitForRun(ctx, t, client, id, func(r *planexv1.Run) bool { return isTerminal(r.GetStatus()) })
		if !strings.Contains(run.GetStopMessage(), "batch cli-1: cli test") {
			t.Fatalf("run %s: stop message %q", id, run.GetStopMessage())
		}
	}
	if got := listed("--waiting"); len(got) != 1 {
		t.Fatalf("waiting after the batch: %v, want the run labelled cli=other", got)
	}
	out, err = planexIn(t, "runs", "batch", "cancel", "--addr", addr, "-l", "cli=batch", "--reason", "cli test", "--yes", "--batch-id", "cli-1", "--json")
	if err != nil || strings.Count(out, `"outcome":"skipped"`) != 3 {
		t.Fatalf("the same batch again: %v\n%s", err, out)
	}
}
