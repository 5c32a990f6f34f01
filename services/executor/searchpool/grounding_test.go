package searchpool_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/services/executor/searchpool"
)

// demoPool is a pool holding the demo runbooks and policies.
func demoPool(t testing.TB) *searchpool.Pool {
	t.Helper()
	p := openPool(t, filepath.Join(t.TempDir(), "index"))
	var docs []searchpool.Document
	for _, d := range demo.Runbooks() {
		docs = append(docs, searchpool.Document{ID: d.ID, Title: d.Title, Body: d.Body, Tags: d.Tags})
	}
	if _, err := p.Index(context.Background(), docs); err != nil {
		t.Fatal(err)
	}
	return p
}

// The thresholds the demo send-runbook playbook uses.
const (
	demoMinScore    = 0.5
	demoMinCoverage = 0.5
)

// TestGroundingOnDemoCorpus: on-topic queries find their runbook with full
// coverage; off-topic ones, whose words only occur in some body, pass no
// hit and name what came closest.
func TestGroundingOnDemoCorpus(t *testing.T) {
	p := demoPool(t)
	tests := []struct {
		query string
		want  string // "" for off-topic
	}{
		{"failed payment retries", "runbook-failed-payment-retries"},
		{"database failover", "runbook-database-failover"},
		{"overdue invoices", "runbook-overdue-invoices"},
		{"security incident", "runbook-security-incident"},
		{"password resets", "runbook-password-reset"},
		{"on-call handoff", "runbook-on-call-handoff"},
		{"coffee machine cleaning", ""},
		{"holiday party planning", ""},
		{"office plant watering", ""},
		{"team lunch orders", ""},
		{"quantum teleportation", ""},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			all, err := p.Search(context.Background(), searchpool.Query{Text: tt.query, Limit: 3})
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range all.Hits {
				t.Logf("%-40s score %.3f coverage %.2f", h.ID, h.Score, h.Coverage)
			}
			out, err := p.Search(context.Background(), searchpool.Query{Text: tt.query, Limit: 3, MinScore: demoMinScore, MinCoverage: demoMinCoverage})
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "" {
				if len(out.Hits) != 0 {
					t.Fatalf("off-topic query passed %+v", out.Hits[0])
				}
				if len(all.Hits) > 0 && (len(out.Below) == 0 || out.Below[0].ID != all.Hits[0].ID) {
					t.Fatalf("below = %+v, want the best rejected hit %s first", out.Below, all.Hits[0].ID)
				}
				return
			}
			if len(out.Hits) == 0 || out.Hits[0].ID != tt.want || out.Hits[0].Coverage != 1 {
				t.Fatalf("hits %+v, want %s first with coverage 1", out.Hits, tt.want)
			}
		})
	}
}

func TestGetReturnsWholeDocument(t *testing.T) {
	p := demoPool(t)
	var want demo.Doc
	for _, d := range demo.Runbooks() {
		if d.ID == "runbook-failed-payment-retries" {
			want = d
		}
	}
	out, terr := run(t, p, "search.get", map[string]any{"id": want.ID})
	if terr != nil {
		t.Fatal(terr)
	}
	doc := out.(*searchpool.Document)
	if doc.Title != want.Title || doc.Body != want.Body || strings.Join(doc.Tags, ",") != strings.Join(want.Tags, ",") {
		t.Fatalf("got %+v, want the indexed document", doc)
	}
	if !strings.Contains(doc.Body, "| 2 | day 3 |") {
		t.Fatal("the table did not survive")
	}

	_, terr = run(t, p, "search.get", map[string]any{"id": "no-such-doc"})
	if terr == nil || terr.Code != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || terr.Field != "args.id" || !strings.Contains(terr.Message, "no-such-doc") {
		t.Fatalf("unknown id: %v", terr)
	}
	if _, err := p.Get(context.Background(), "no-such-doc"); !errors.Is(err, searchpool.ErrNotFound) {
		t.Fatalf("Get: %v, want ErrNotFound", err)
	}
}

func TestQueryThresholdArguments(t *testing.T) {
	p := demoPool(t)
	for _, args := range []map[string]any{
		{"query": "x", "min_coverage": 1.5},
		{"query": "x", "min_score": -1},
		{"query": "x", "min_coverage": "high"},
	} {
		if _, terr := run(t, p, "search.query", args); terr == nil || terr.Code != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT {
			t.Errorf("%v: %v, want INVALID_ARGUMENT", args, terr)
		}
	}
}

// TestSnippetsStartAndEndOnWords: fragments do not begin or end in the
// middle of a word, and a cut is marked with an ellipsis.
func TestSnippetsStartAndEndOnWords(t *testing.T) {
	p := demoPool(t)
	out, err := p.Search(context.Background(), searchpool.Query{Text: "failed payment retries", Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[string]string{}
	for _, d := range demo.Runbooks() {
		bodies[d.ID] = " " + strings.Join(strings.Fields(d.Body), " ") + " "
	}
	for _, h := range out.Hits {
		plain := strings.ReplaceAll(h.Snippet, "**", "")
		core := strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(plain, "…"), "…"))
		// Whole words: the text sits between spaces (or the body's ends).
		if !strings.Contains(bodies[h.ID], " "+core+" ") {
			t.Errorf("%s: snippet does not start and end on whole words: %q", h.ID, h.Snippet)
		}
		if !strings.HasPrefix(strings.TrimSpace(bodies[h.ID]), core) && !strings.HasPrefix(plain, "… ") {
			t.Errorf("%s: cut start without an ellipsis: %q", h.ID, h.Snippet)
		}
	}
}
