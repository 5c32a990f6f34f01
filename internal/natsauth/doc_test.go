package natsauth_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/planex-dev/planex/internal/natsauth"
)

var update = flag.Bool("update", false, "rewrite docs/security.md's permission table from natsauth.Table")

const (
	docTableBegin = "<!-- natsauth:permissions:begin -->\n"
	docTableEnd   = "<!-- natsauth:permissions:end -->"
)

// TestSecurityDocTable: docs/security.md carries the permission table
// natsauth.Markdown renders, so the documented grants cannot drift from
// the ones the servers enforce. -update rewrites it.
func TestSecurityDocTable(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "security.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	before, rest, ok := strings.Cut(doc, docTableBegin)
	if !ok {
		t.Fatalf("%s: no %q marker", path, strings.TrimSpace(docTableBegin))
	}
	current, after, ok := strings.Cut(rest, docTableEnd)
	if !ok {
		t.Fatalf("%s: no %q marker", path, docTableEnd)
	}
	want := natsauth.Markdown()
	if current == want {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(before+docTableBegin+want+docTableEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s: the permission table differs from natsauth.Table; run go test ./internal/natsauth -run TestSecurityDocTable -update\n got:\n%s\nwant:\n%s", path, current, want)
}

// Every subject of the table is in some identity's permissions, with the
// pool substituted, and no executor's permissions name another pool.
func TestTableIsWhatForServiceGrants(t *testing.T) {
	for _, svc := range natsauth.Services("sql", "email") {
		p, err := natsauth.ForService(svc)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range append(p.Publish, p.Subscribe...) {
			if strings.Contains(s, "{pool}") {
				t.Errorf("%s: subject %q keeps the pool placeholder", svc, s)
			}
			if svc == "executor-sql" && strings.Contains(s, "email") {
				t.Errorf("executor-sql: subject %q names the email pool", s)
			}
			if strings.HasPrefix(svc, "executor-") {
				for _, forbidden := range []string{"$JS.API.STREAM.PURGE", "$JS.API.STREAM.DELETE", "$JS.API.STREAM.UPDATE", "$JS.API.STREAM.MSG.GET", "$JS.API.STREAM.MSG.DELETE", "$JS.API.>", "$JS.API.CONSUMER.DURABLE"} {
					if strings.HasPrefix(s, forbidden) {
						t.Errorf("%s: grant %q", svc, s)
					}
				}
			}
		}
	}
	seen := map[string]bool{}
	for _, g := range natsauth.Table() {
		if g.Resource == "" || g.Access == "" || len(g.Publish)+len(g.Subscribe) == 0 {
			t.Errorf("table row %+v: want a resource, an access and subjects", g)
		}
		seen[g.Identity] = true
	}
	for _, id := range []string{natsauth.Supervisor, natsauth.Planner, natsauth.Executor} {
		if !seen[id] {
			t.Errorf("table has no row for %s", id)
		}
	}
}
