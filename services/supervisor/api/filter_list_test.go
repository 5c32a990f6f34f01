package api_test

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
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
