package searchpool_test

import (
	"path/filepath"
	"strings"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/executor/runner/runnertest"
	"github.com/planex-dev/planex/services/executor/searchpool"
)

func openPool(t testing.TB, dir string) *searchpool.Pool {
	t.Helper()
	p, err := searchpool.Open(searchpool.Config{IndexDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func run(t testing.TB, p *searchpool.Pool, tool string, args map[string]any) (any, *runner.Error) {
	t.Helper()
	return runnertest.Call(t, p.Tools(), tool, runner.Call{}, args)
}

var corpus = []any{
	map[string]any{"id": "retries", "title": "Failed payment retries", "body": "When a card payment fails, the billing system retries it three times over five days.", "tags": []any{"billing", "payments"}},
	map[string]any{"id": "refunds", "title": "Refund policy", "body": "Refunds for failed deliveries are issued within 14 days. Payment disputes go to finance.", "tags": []any{"billing"}},
	map[string]any{"id": "oncall", "title": "On-call handoff", "body": "Hand over open incidents & pages at 09:00 <UTC>.", "tags": []any{"oncall"}},
}

func TestIndexAndQuery(t *testing.T) {
	p := openPool(t, filepath.Join(t.TempDir(), "index"))
	out, terr := run(t, p, "search.index", map[string]any{"documents": corpus})
	if terr != nil {
		t.Fatal(terr)
	}
	if n := out.(map[string]any)["indexed"]; n != 3 {
		t.Fatalf("indexed %v", n)
	}

	tests := []struct {
		name    string
		query   string
		first   string
		total   uint64
		snippet string
	}{
		{name: "title beats body", query: "payment retries", first: "retries", total: 2, snippet: "**retries**"},
		{name: "stemmed", query: "refunded", first: "refunds", total: 1, snippet: "**Refunds**"},
		{name: "tag", query: "oncall", first: "oncall", total: 1},
		{name: "no match", query: "kubernetes", total: 0},
		{name: "html is plain text", query: "incidents", first: "oncall", total: 1, snippet: "& pages at 09:00 <UTC>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Ranking and snippets, not grounding (grounded_test.go):
			// browse, so that body-only matches are hits too.
			out, terr := run(t, p, "search.query", map[string]any{"query": tt.query, "require_all_terms": false})
			if terr != nil {
				t.Fatal(terr)
			}
			q := out.(*searchpool.QueryOutput)
			if q.Total != tt.total || uint64(len(q.Hits)) != tt.total {
				t.Fatalf("total %d hits %d, want %d", q.Total, len(q.Hits), tt.total)
			}
			if tt.total == 0 {
				return
			}
			h := q.Hits[0]
			if h.ID != tt.first || h.Title == "" || h.Score <= 0 || !strings.Contains(h.Snippet, tt.snippet) {
				t.Fatalf("first hit %+v, want %s with snippet containing %q", h, tt.first, tt.snippet)
			}
			for i := 1; i < len(q.Hits); i++ {
				if q.Hits[i].Score > q.Hits[i-1].Score {
					t.Fatalf("hits not ranked: %+v", q.Hits)
				}
			}
		})
	}

	// Indexing an existing id replaces the document.
	if _, terr := run(t, p, "search.index", map[string]any{"documents": []any{
		map[string]any{"id": "oncall", "title": "On-call rotation", "body": "Rotation changes on Mondays."},
	}}); terr != nil {
		t.Fatal(terr)
	}
	out, _ = run(t, p, "search.query", map[string]any{"query": "rotation"})
	if q := out.(*searchpool.QueryOutput); q.Total != 1 || q.Hits[0].ID != "oncall" || q.Hits[0].Title != "On-call rotation" {
		t.Fatalf("replaced document not found: %+v", q)
	}
	out, _ = run(t, p, "search.query", map[string]any{"query": "incidents"})
	if q := out.(*searchpool.QueryOutput); q.Total != 0 {
		t.Fatalf("old version still matches: %+v", q)
	}

	out, _ = run(t, p, "search.query", map[string]any{"query": "billing payment", "limit": 1})
	if q := out.(*searchpool.QueryOutput); len(q.Hits) != 1 || q.Total != 2 {
		t.Fatalf("limit 1: %d hits of %d", len(q.Hits), q.Total)
	}
}

func TestBadArguments(t *testing.T) {
	p := openPool(t, filepath.Join(t.TempDir(), "index"))
	tests := []struct {
		name  string
		tool  string
		args  map[string]any
		field string
	}{
		{name: "blank query", tool: "search.query", args: map[string]any{"query": "   "}, field: "args.query"},
		{name: "empty query", tool: "search.query", args: map[string]any{"query": ""}, field: "args.query"},
		{name: "huge query", tool: "search.query", args: map[string]any{"query": strings.Repeat("a", searchpool.MaxQueryBytes+1)}, field: "args.query"},
		{name: "limit too high", tool: "search.query", args: map[string]any{"query": "x", "limit": 500}, field: "args.limit"},
		{name: "blank id", tool: "search.index", args: map[string]any{"documents": []any{map[string]any{"id": " ", "title": "t", "body": "b"}}}, field: "args.documents[0].id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, terr := run(t, p, tt.tool, tt.args)
			if terr == nil || terr.Code != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || terr.Field != tt.field {
				t.Fatalf("error %+v, want INVALID_ARGUMENT on %s", terr, tt.field)
			}
		})
	}
}

// TestDemoCorpus indexes the corpus `planex dev` ships the way it does, in
// a closed index, then serves it.
func TestDemoCorpus(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "index")
	var docs []searchpool.Document
	for _, d := range demo.Runbooks() {
		docs = append(docs, searchpool.Document{ID: d.ID, Title: d.Title, Body: d.Body, Tags: d.Tags})
	}
	n, err := searchpool.IndexDocuments(runnertest.Context(t), dir, docs)
	if err != nil || n != len(docs) {
		t.Fatalf("IndexDocuments = %d, %v", n, err)
	}
	p := openPool(t, dir) // reopened from disk
	out, terr := run(t, p, "search.query", map[string]any{"query": "failed payment retries", "limit": 3})
	if terr != nil {
		t.Fatal(terr)
	}
	q := out.(*searchpool.QueryOutput)
	if len(q.Hits) == 0 || q.Hits[0].ID != "runbook-failed-payment-retries" {
		t.Fatalf("hits %+v, want runbook-failed-payment-retries first", q.Hits)
	}
}
