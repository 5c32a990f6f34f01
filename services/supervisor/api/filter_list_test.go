package api_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// TestListRunsFilterPages: a filter selects through the index, pages
// follow with their token, and a token is refused with another filter.
func TestListRunsFilterPages(t *testing.T) {
	t.Parallel()
	b := startBatchStack(t)
	var want []string
	for i := range 7 {
		env := "prod"
		if i%2 == 1 {
			env = "dev"
		}
		id := b.start(t, "apikey:alice", map[string]string{"env": env})
		if env == "prod" {
			want = append(want, id)
		}
	}
	b.start(t, "apikey:bob", map[string]string{"env": "prod"})
	slices.Reverse(want) // newest first
	ctx := as("apikey:alice", authn.RoleViewer)
	req := &planexv1.ListRunsRequest{PageSize: 3, Filter: &planexv1.RunFilter{LabelSelector: "env in (prod, qa)", StartedBy: "apikey:alice"}}
	var got []string
	for pages := 0; ; pages++ {
		resp, err := b.api.ListRuns(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.GetRuns() {
			got = append(got, r.GetId())
		}
		if resp.GetNextPageToken() == "" {
			break
		}
		if pages == 0 {
			other := &planexv1.ListRunsRequest{PageToken: resp.GetNextPageToken(), Filter: &planexv1.RunFilter{LabelSelector: "env=dev"}}
			_, err := b.api.ListRuns(ctx, other)
			if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), "page_token: made for another filter") {
				t.Fatalf("token with another filter: %v", err)
			}
		}
		req.PageToken = resp.GetNextPageToken()
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages %v, want %v", got, want)
	}
	_, err := b.api.ListRuns(ctx, &planexv1.ListRunsRequest{Filter: &planexv1.RunFilter{LabelSelector: "env=prod,"}})
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != "filter.label_selector: at position 10: want a label key, found the end" {
		t.Fatalf("bad selector: %v", err)
	}
}

// TestListRunsBasicView: RUN_VIEW_BASIC pages the same runs as the full
// view, with the same tokens, each as the index holds it (BasicRun of its
// snapshot: no steps, plans or inputs, but step counts), and an unknown
// view is refused naming the field.
func TestListRunsBasicView(t *testing.T) {
	t.Parallel()
	b := startBatchStack(t)
	var ids []string
	for i := range 5 {
		ids = append(ids, b.start(t, "apikey:alice", map[string]string{"team": []string{"ops", "billing"}[i%2]}))
	}
	for _, id := range ids {
		b.wait(t, id, "waiting at its plan gate", func(r *planexv1.Run) bool { return r.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING })
	}
	ctx := as("apikey:alice", authn.RoleViewer)
	list := func(view planexv1.RunView) ([]*planexv1.Run, error) {
		req := &planexv1.ListRunsRequest{PageSize: 2, View: view, Filter: &planexv1.RunFilter{GoalContains: "BATCH"}}
		var runs []*planexv1.Run
		for {
			resp, err := b.api.ListRuns(ctx, req)
			if err != nil {
				return nil, err
			}
			runs = append(runs, resp.GetRuns()...)
			if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
				return runs, nil
			}
		}
	}
	// The index follows the snapshots: wait until it shows them waiting.
	deadline := time.Now().Add(20 * time.Second)
	for {
		basic, err := list(planexv1.RunView_RUN_VIEW_BASIC)
		if err != nil {
			t.Fatal(err)
		}
		full, err := list(planexv1.RunView_RUN_VIEW_UNSPECIFIED)
		if err != nil {
			t.Fatal(err)
		}
		if len(basic) != len(ids) || len(full) != len(ids) {
			t.Fatalf("basic %d runs, full %d, want %d", len(basic), len(full), len(ids))
		}
		same := true
		for i := range basic {
			want := ids[len(ids)-1-i] // newest first
			if basic[i].GetId() != want || full[i].GetId() != want {
				t.Fatalf("page order: basic %s, full %s, want %s", basic[i].GetId(), full[i].GetId(), want)
			}
			if basic[i].GetStepCounts() == nil {
				t.Fatalf("run %s: a basic view without step counts", want)
			}
			snap, err := b.log.Snapshot(context.Background(), want)
			if err != nil {
				t.Fatal(err)
			}
			same = same && proto.Equal(basic[i], runlog.BasicRun(snap))
		}
		if same {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the basic views never matched the snapshots: %v", basic)
		}
		time.Sleep(20 * time.Millisecond)
	}
	basic, _ := list(planexv1.RunView_RUN_VIEW_BASIC)
	for _, r := range basic {
		if r.GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING || r.GetGoal() != "batch goal" || r.GetLabels()["team"] == "" ||
			r.GetStartedBy() != "apikey:alice" || r.GetCreatedAt() == nil || r.GetUpdatedAt() == nil {
			t.Fatalf("basic view %v: misses a field a list shows", r)
		}
		if len(r.GetSteps()) > 0 || len(r.GetPlans()) > 0 || r.GetInputs() != nil || len(r.GetGates()) > 0 {
			t.Fatalf("basic view %v: carries what only the full view reads", r)
		}
	}
	// A page token is the last id listed: it continues in either view.
	req := &planexv1.ListRunsRequest{PageSize: 2, View: planexv1.RunView_RUN_VIEW_BASIC}
	first, err := b.api.ListRuns(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	req.PageToken, req.View = first.GetNextPageToken(), planexv1.RunView_RUN_VIEW_FULL
	second, err := b.api.ListRuns(ctx, req)
	if err != nil || len(second.GetRuns()) != 2 || second.GetRuns()[0].GetId() != ids[2] || len(second.GetRuns()[0].GetPlans()) == 0 {
		t.Fatalf("the full page after a basic one: %v %v", err, second)
	}
	_, err = b.api.ListRuns(ctx, &planexv1.ListRunsRequest{View: 7})
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != "view 7: not a RunView (RUN_VIEW_FULL or RUN_VIEW_BASIC)" {
		t.Fatalf("unknown view: %v", err)
	}
}
