package console

import (
	"context"
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// jsFunction returns the source of the top-level function name in src:
// from "function name(" to the first line that is a lone "}".
func jsFunction(t *testing.T, src, name string) string {
	t.Helper()
	loc := regexp.MustCompile(`(?m)^function ` + regexp.QuoteMeta(name) + `\(`).FindStringIndex(src)
	if loc == nil {
		return ""
	}
	end := strings.Index(src[loc[0]:], "\n}\n")
	if end < 0 {
		t.Fatalf("app.js: function %s has no closing line", name)
	}
	return src[loc[0] : loc[0]+end+3]
}

// TestBudgetEventsOfAPlannerCallReadApart: a planner call appends two
// budgetUsed events, the token reservation before it and the settlement
// after it; with a planner that spends no tokens both carry the same
// steps, replans and tokens, and the run page's timeline showed two
// identical "Budget used" rows. The timeline's own description function
// (run in Node) must tell them apart.
func TestBudgetEventsOfAPlannerCallReadApart(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node on PATH: the timeline's JavaScript is checked with Node (.ci/run installs it with Chromium)")
	}
	b, err := webFS.ReadFile("web/assets/app.js")
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	describe := jsFunction(t, src, "describe")
	if describe == "" {
		t.Fatal("app.js has no function describe(kind, p)")
	}
	// The helper describe calls for a budget event (absent before it existed).
	var helpers strings.Builder
	for _, name := range []string{"describeBudget"} {
		helpers.WriteString(jsFunction(t, src, name))
		helpers.WriteString("\n")
	}
	events := []map[string]any{
		{"usage": map[string]any{"steps": 1, "tokensReserved": "200000"}},
		{"usage": map[string]any{"steps": 1}},
		{"usage": map[string]any{"steps": 3, "replans": 1, "tokens": "812", "tokensReserved": "199188"}},
		{"usage": map[string]any{"steps": 3, "replans": 1, "tokens": "1650"}},
	}
	in, err := json.Marshal(events)
	if err != nil {
		t.Fatal(err)
	}
	script := helpers.String() + describe + "\nconsole.log(JSON.stringify(" + string(in) + ".map((p) => describe('budgetUsed', p))));\n"
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, node, "-e", script).CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	var rows []string
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("node printed %q: %v", out, err)
	}
	if rows[0] == rows[1] || rows[2] == rows[3] {
		t.Fatalf("a planner call's two budget events read the same:\n%s", strings.Join(rows, "\n"))
	}
	for i, want := range []string{"200000 tokens reserved", "settled", "199188 tokens reserved", "tokens 1650"} {
		if !strings.Contains(rows[i], want) {
			t.Errorf("budget row %d: %q, want it to say %q", i, rows[i], want)
		}
	}
}
