package searchpool_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/demo"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/executor/runner/runnertest"
	"github.com/planex-dev/planex/services/executor/searchpool"
)

// inRun calls tool as a step of run.
func inRun(t *testing.T, p *searchpool.Pool, run, tool string, args map[string]any) (any, *runner.Error) {
	t.Helper()
	return runnertest.Call(t, p.Tools(), tool, runner.Call{RunID: run, StepID: "s", Attempt: 1}, args)
}

// wantWeakRefusal fails the test unless terr is search.get's refusal of
// a weak match naming the document, the query and the missing word.
func wantWeakRefusal(t *testing.T, terr *runner.Error, id, query, missing string) {
	t.Helper()
	if terr == nil {
		t.Fatalf("search.get of the weak match %s succeeded", id)
	}
	if terr.Code != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || terr.Field != "args.id" {
		t.Fatalf("error %+v, want INVALID_ARGUMENT on args.id", terr)
	}
	for _, want := range []string{id, query, missing, "browse"} {
		if !strings.Contains(terr.Message, want) {
			t.Errorf("message %q lacks %q", terr.Message, want)
		}
	}
}

// TestGetRefusesWeakMatches: a document a run's query found only as a
// weak match (in below, or a browsing hit with grounded false) cannot be
// fetched in that run unless the step says it browses; a grounded hit,
// another run, or a document the run never searched for can.
func TestGetRefusesWeakMatches(t *testing.T) {
	p := demoPool(t)
	const weak = "runbook-slow-database-queries"

	t.Run("below", func(t *testing.T) {
		out, terr := inRun(t, p, "r-below", "search.query", map[string]any{"query": "database migration", "limit": 3})
		if terr != nil {
			t.Fatal(terr)
		}
		if q := out.(*searchpool.QueryOutput); len(q.Hits) != 0 || len(q.Below) == 0 || q.Below[0].ID != weak {
			t.Fatalf("query: %+v, want no hits and %s first in below", q, weak)
		}
		_, terr = inRun(t, p, "r-below", "search.get", map[string]any{"id": weak})
		wantWeakRefusal(t, terr, weak, "database migration", "migration")

		out, terr = inRun(t, p, "r-below", "search.get", map[string]any{"id": weak, "browse": true})
		if terr != nil || out.(*searchpool.Document).ID != weak {
			t.Fatalf("browse: %v %v", out, terr)
		}
		// Another run never searched: a plain get by id.
		if _, terr := inRun(t, p, "r-other", "search.get", map[string]any{"id": weak}); terr != nil {
			t.Fatalf("get in a run without a query: %v", terr)
		}
	})

	t.Run("browsing hit", func(t *testing.T) {
		out, terr := inRun(t, p, "r-browse", "search.query", map[string]any{"query": "database migration", "limit": 3, "require_all_terms": false})
		if terr != nil {
			t.Fatal(terr)
		}
		q := out.(*searchpool.QueryOutput)
		if q.RequireAllTerms || len(q.Hits) == 0 || q.Hits[0].ID != weak || q.Hits[0].Grounded {
			t.Fatalf("browsing query: %+v, want %s first among the hits, grounded false", q, weak)
		}
		if !strings.Contains(q.Note, "not about every word") {
			t.Errorf("note %q does not say the hits are not grounded", q.Note)
		}
		_, terr = inRun(t, p, "r-browse", "search.get", map[string]any{"id": q.Hits[0].ID})
		wantWeakRefusal(t, terr, weak, "database migration", "migration")
	})

	t.Run("grounded later", func(t *testing.T) {
		if _, terr := inRun(t, p, "r-later", "search.query", map[string]any{"query": "database migration"}); terr != nil {
			t.Fatal(terr)
		}
		out, terr := inRun(t, p, "r-later", "search.query", map[string]any{"query": "slow database queries"})
		if terr != nil {
			t.Fatal(terr)
		}
		if q := out.(*searchpool.QueryOutput); len(q.Hits) != 1 || q.Hits[0].ID != weak {
			t.Fatalf("hits %+v, want %s", q.Hits, weak)
		}
		if _, terr := inRun(t, p, "r-later", "search.get", map[string]any{"id": weak}); terr != nil {
			t.Fatalf("get of a document a later query found grounded: %v", terr)
		}
		// Once grounded in the run, a later weak sighting does not undo it.
		if _, terr := inRun(t, p, "r-later", "search.query", map[string]any{"query": "database migration"}); terr != nil {
			t.Fatal(terr)
		}
		if _, terr := inRun(t, p, "r-later", "search.get", map[string]any{"id": weak}); terr != nil {
			t.Fatalf("get after a later weak sighting: %v", terr)
		}
	})

	t.Run("grounded hit", func(t *testing.T) {
		out, terr := inRun(t, p, "r-hit", "search.query", map[string]any{"query": "database failover"})
		if terr != nil {
			t.Fatal(terr)
		}
		id := out.(*searchpool.QueryOutput).Hits[0].ID
		doc, terr := inRun(t, p, "r-hit", "search.get", map[string]any{"id": id})
		if terr != nil || doc.(*searchpool.Document).ID != "runbook-database-failover" {
			t.Fatalf("get of the grounded hit: %v %v", doc, terr)
		}
	})
}

// TestWeakMatchesSurviveRestart: the record lives in the index, so a pool
// reopened on the same directory (a restart between a run's query and its
// get) still refuses the weak match.
func TestWeakMatchesSurviveRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "index")
	var docs []searchpool.Document
	for _, d := range demo.Runbooks() {
		docs = append(docs, searchpool.Document{ID: d.ID, Title: d.Title, Body: d.Body, Tags: d.Tags})
	}
	if _, err := searchpool.IndexDocuments(context.Background(), dir, docs); err != nil {
		t.Fatal(err)
	}
	p, err := searchpool.Open(searchpool.Config{IndexDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, terr := inRun(t, p, "r-restart", "search.query", map[string]any{"query": "kubernetes upgrade"}); terr != nil {
		t.Fatal(terr)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// planex dev indexes the corpus again at every start.
	if _, err := searchpool.IndexDocuments(context.Background(), dir, docs); err != nil {
		t.Fatal(err)
	}
	p = openPool(t, dir)
	_, terr := inRun(t, p, "r-restart", "search.get", map[string]any{"id": "runbook-kubernetes-node-failure"})
	wantWeakRefusal(t, terr, "runbook-kubernetes-node-failure", "kubernetes upgrade", "upgrade")
}
